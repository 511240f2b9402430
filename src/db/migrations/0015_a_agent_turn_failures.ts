/**
 * Failed attempts at a conversation's turn, counted per user item (`failed_index` is its content_index), so
 * that a turn which can never be stored is given up after `AGENT_MAX_ATTEMPTS` leases instead of calling the
 * model again every lease (docs/agents.md).
 */
export const up = /* sql */ `
ALTER TABLE agent_turns ADD COLUMN failures integer NOT NULL DEFAULT 0;
ALTER TABLE agent_turns ADD COLUMN failed_index integer;
`;
