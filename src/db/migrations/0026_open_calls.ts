/**
 * An index of the calls that are not over yet, and only those, for the loops that look for calls left open:
 * SIP reconciliation (src/sip/reconcile.ts: SIP and trunk calls not updated for a while, in `(updated_at, id)`
 * pages, every `SIP_RECONCILE_INTERVAL_MS`) and the voice runtime's start (src/voice/runtime.ts: its own calls
 * a previous run left open). Neither names an organisation, so the per-organisation indexes of migration 0007
 * do not serve them, and each look read every call the database ever held: its cost grew with the history,
 * not with the calls still open. A finished call (`completed`, `failed`, ...) leaves this index when its status
 * changes, so the index holds the open calls and the loops' cost follows them.
 */
export const up = /* sql */ `
CREATE INDEX calls_open_idx ON calls (updated_at, id) WHERE status IN ('initiated', 'ringing', 'in_progress');
`;
