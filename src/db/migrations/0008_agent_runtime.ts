/**
 * The agent runtime's own bookkeeping (not resources: nothing in the API reads
 * or writes them). `agent_turns` is one row per conversation the runtime has
 * taken up: the cursor of items it has dealt with, the workflow's position,
 * and a lease so that one worker at a time runs a conversation's turn and a
 * crashed worker's turn is taken over once the lease runs out.
 * `agent_handoffs` is the queue of conversations waiting for an operator and
 * the record of whom each was offered to (for "idle longest").
 */
export const up = /* sql */ `
CREATE TABLE agent_turns (
  conversation_id uuid PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  last_handled_index integer NOT NULL DEFAULT -1,
  workflow_state jsonb NOT NULL DEFAULT '{}'::jsonb,
  lease_until timestamptz,
  lease_token text,
  attempts integer NOT NULL DEFAULT 0,
  last_error text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX conversations_active_agent_idx ON conversations (ai_agent_id) WHERE ai_agent_id IS NOT NULL;

CREATE TABLE agent_handoffs (
  conversation_id uuid PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  reason text NOT NULL,
  requested_at timestamptz NOT NULL DEFAULT now(),
  assigned_user_id uuid,
  assigned_at timestamptz
);
CREATE INDEX agent_handoffs_queue_idx ON agent_handoffs (organisation_id, requested_at) WHERE assigned_user_id IS NULL;
CREATE INDEX agent_handoffs_assigned_idx ON agent_handoffs (organisation_id, assigned_user_id, assigned_at);
`;
