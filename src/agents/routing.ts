/**
 * Handoff to a human operator (docs/agents.md, "Handoff and the operator queue"): a handed-off conversation goes
 * `pending`, gets a `system` item saying why, and joins the queue (`agent_handoffs`). Queued conversations are
 * offered, oldest first, to an available operator who holds no other pending conversation and has been idle
 * longest; with nobody available the conversation waits for the runtime's next look at the queue.
 */
import { sql } from 'kysely';
import { inTransaction } from '../db/connection.js';
import type { Db } from '../db/schema.js';
import { systemActor } from '../jsonapi/actor.js';
import type { Records } from '../jsonapi/records.js';

/** Inside the turn's transaction: the system item, then the `hand_off` action (pending, the queue entry). */
export async function handOff(
  records: Records,
  conversation: { id: string; organisation_id: string },
  reason: string,
  itemId: string,
  metadata: Record<string, unknown>,
): Promise<void> {
  const actor = systemActor(conversation.organisation_id, 'agent');
  await records.create(actor, 'ConversationItem', {
    conversation_id: conversation.id,
    role: 'system',
    content: `Handed to an operator: ${reason}`,
    item_id: itemId,
    metadata: { handoff: { reason, ...metadata } },
  });
  await records.perform(actor, 'Conversation', 'hand_off', conversation.id, { reason });
}

/** The operator `os` is available and holds no handed-off conversation that is still pending. */
const isFree = sql`os.status = 'available' AND os.user_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM agent_handoffs b JOIN conversations bc ON bc.id = b.conversation_id
                  WHERE b.assigned_user_id = os.user_id AND bc.status = 'pending')`;

/**
 * Offers queued conversations to available operators, one conversation per transaction; several workers may run it at
 * once (queue rows and operators are claimed with SKIP LOCKED). Returns how many were assigned.
 */
export async function assignQueued(db: Db, makeRecords: (trx: Db) => Records, limit = 20): Promise<number> {
  let assigned = 0;
  for (let i = 0; i < limit; i++) {
    const done = await inTransaction(db, async (trx) => {
      const queued = await sql<{ conversation_id: string; organisation_id: string }>`
        SELECT h.conversation_id, h.organisation_id FROM agent_handoffs h
        JOIN conversations c ON c.id = h.conversation_id AND c.status = 'pending'
        WHERE h.assigned_user_id IS NULL
          AND EXISTS (SELECT 1 FROM operator_statuses os WHERE os.organisation_id = h.organisation_id AND ${isFree})
        ORDER BY h.requested_at, h.conversation_id
        LIMIT 1 FOR UPDATE OF h SKIP LOCKED`.execute(trx);
      const entry = queued.rows[0];
      if (!entry) return false;
      const operator = await sql<{ id: string; user_id: string }>`
        SELECT os.id, os.user_id FROM operator_statuses os
        WHERE os.organisation_id = ${entry.organisation_id} AND ${isFree}
        ORDER BY GREATEST(
                   COALESCE((SELECT max(e.occurred_at) FROM operator_status_events e WHERE e.operator_status_id = os.id), os.updated_at),
                   COALESCE((SELECT max(h.assigned_at) FROM agent_handoffs h WHERE h.assigned_user_id = os.user_id), '-infinity'::timestamptz)),
                 os.id
        LIMIT 1 FOR UPDATE OF os SKIP LOCKED`.execute(trx);
      const chosen = operator.rows[0];
      // Every available operator holds a handed-off conversation already: the queue waits.
      if (!chosen) return false;
      const actor = systemActor(entry.organisation_id, 'agent');
      await makeRecords(trx).perform(actor, 'Conversation', 'assign', entry.conversation_id, { user_id: chosen.user_id });
      return true;
    });
    if (done !== true) break;
    assigned++;
  }
  return assigned;
}
