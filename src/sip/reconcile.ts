/**
 * Reconciliation: SIP calls left non-terminal whose dialog Kamailio no longer holds are ended (answered ones
 * `completed`, others `failed`) through the records service, so that every call reaches a terminal status.
 *
 * Kamailio keeps its dialogs in `sip_dialogs` (dialog module, db_mode 2: written within a second, loaded at
 * its start), so "has a dialog" is one indexed lookup per call, whatever the number of open calls, and holds
 * across restarts of Kamailio and of `sip serve`: a call still talking keeps its row and stays open. A call
 * whose events still wait in `sip_call_events` is left to them (they carry the true end time). A transferred
 * call is held by the transferee's dialog with the target too (its `callid` dialog variable names the call).
 */
import { sql } from 'kysely';
import type { Db } from '../db/schema.js';
import type { CallEvents } from './call-events.js';

export interface ReconcileOptions {
  /** Answered calls not updated since then and without a dialog are ended. */
  answeredBefore: Date;
  /** Unanswered calls (initiated, ringing) not updated since then and without a dialog are ended. */
  unansweredBefore: Date;
  /** Calls read per page. */
  pageSize?: number;
}

export async function reconcileCalls(db: Db, events: CallEvents, options: ReconcileOptions): Promise<number> {
  const now = new Date();
  const pageSize = options.pageSize ?? 500;
  let ended = 0;
  // Pages in (updated_at, id) order; each page's calls are ended (so they leave the condition), and the
  // cursor moves past those that could not be, so a failing call does not stop the others.
  let after: { updatedAt: Date; id: string } | undefined;
  for (;;) {
    const { rows } = await sql<{ id: string; organisation_id: string; call_uuid: string; status: string; updated_at: Date }>`
      SELECT c.id, c.organisation_id, c.call_uuid, c.status, c.updated_at
      FROM calls c
      WHERE c.call_source IN ('sip', 'trunk')
        AND ((c.status = 'in_progress' AND c.updated_at < ${options.answeredBefore})
          OR (c.status IN ('initiated', 'ringing') AND c.updated_at < ${options.unansweredBefore}))
        AND NOT EXISTS (SELECT 1 FROM sip_dialogs d WHERE d.callid = c.call_uuid)
        -- A transferee's call to the transfer target is another dialog carrying this call's Call-ID as its
        -- callid variable (sip/kamailio.cfg, route[INITIAL]); read only for the few calls that got this far.
        AND NOT EXISTS (SELECT 1 FROM sip_dialog_vars v WHERE v.dialog_key = 'callid' AND v.dialog_value = c.call_uuid)
        AND NOT EXISTS (SELECT 1 FROM sip_call_events q WHERE q.call_key = md5(c.call_uuid) AND q.error IS NULL)
        ${after ? sql`AND (c.updated_at, c.id) > (${after.updatedAt}, ${after.id}::uuid)` : sql``}
      ORDER BY c.updated_at, c.id
      LIMIT ${pageSize}`.execute(db);
    for (const call of rows) {
      await events.end(call, call.status === 'in_progress' ? 'completed' : 'failed', now);
      ended++;
    }
    if (rows.length < pageSize) return ended;
    const last = rows[rows.length - 1];
    after = { updatedAt: last.updated_at, id: last.id };
  }
}
