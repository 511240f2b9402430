/**
 * Call events from Kamailio turned into records: a `Call` with its voice `Conversation` and one
 * `CallParticipant` per leg, the status machine of CONTRACT section 11, and operator presence.
 * Every write goes through the records service with the system actor (source `sip`); reads are plain SQL.
 *
 * Status (RFC 3261 responses): initiated (INVITE relayed) -> ringing (180/183) -> in_progress (200, the
 * dialog confirmed) -> completed (BYE); busy (486, 600), no_answer (408, 480, and the ring timeout, a
 * local 408), canceled (CANCEL, 487), failed (any other final failure). A status never moves backwards
 * and a terminal one never changes, so late or repeated events are harmless.
 */
import { sql } from 'kysely';
import type { Db } from '../db/schema.js';
import { systemActor, type Actor } from '../jsonapi/actor.js';
import type { Records } from '../jsonapi/records.js';
import { TERMINAL_CALL_STATUSES } from '../resources/values.js';
import { UUID_PATTERN as UUID } from '../jsonapi/validate.js';

/**
 * `refused`: the edge answered the INVITE itself (480 for an unregistered callee or an AI agent, 404 for an
 * unknown user or number...), with the status and reason it chose; the call is recorded and ends at once.
 */
export type CallEventName = 'initiated' | 'ringing' | 'answered' | 'failed' | 'ended' | 'refused';
const EVENT_NAMES: readonly string[] = ['initiated', 'ringing', 'answered', 'failed', 'ended', 'refused'];
const REFUSED_STATUSES: readonly string[] = ['no_answer', 'failed', 'busy'];

/** One event as Kamailio posts it (sip/kamailio.cfg, route[EVENT]); every event carries the whole call. */
export interface CallEvent {
  event: CallEventName;
  call_id: string;
  organisation_id: string;
  direction: 'inbound' | 'outbound';
  source: 'sip' | 'trunk';
  caller_sip_user_id: string;
  callee_sip_user_id: string;
  from: string;
  to: string;
  code: number;
  /** When Kamailio saw it: Unix seconds with microseconds. */
  at: Date;
  /** `refused` only: the Call's status and why. */
  status?: 'no_answer' | 'failed' | 'busy';
  reason?: string;
}

/** Validates a posted body; returns the problems (empty when valid) so that the receiver answers 400 with them. */
export function parseCallEvent(body: unknown): { event?: CallEvent; problems: string[] } {
  const problems: string[] = [];
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return { problems: ['body must be a JSON object'] };
  const b = body as Record<string, unknown>;
  const str = (name: string, max = 512) => {
    const v = b[name];
    if (typeof v !== 'string' || v.length > max) problems.push(`${name} must be a string of at most ${max} characters`);
    return typeof v === 'string' ? v : '';
  };
  const event = str('event');
  if (!EVENT_NAMES.includes(event)) problems.push(`event must be one of ${EVENT_NAMES.join(', ')}`);
  const callId = str('call_id');
  if (!callId) problems.push('call_id must not be empty');
  const organisationId = str('organisation_id');
  if (!UUID.test(organisationId)) problems.push('organisation_id must be a UUID');
  const direction = str('direction');
  if (direction !== 'inbound' && direction !== 'outbound') problems.push('direction must be inbound or outbound');
  const source = str('source');
  if (source !== 'sip' && source !== 'trunk') problems.push('source must be sip or trunk');
  const caller = str('caller_sip_user_id');
  const callee = str('callee_sip_user_id');
  for (const [name, value] of [
    ['caller_sip_user_id', caller],
    ['callee_sip_user_id', callee],
  ]) {
    if (value !== '' && !UUID.test(value)) problems.push(`${name} must be a UUID or empty`);
  }
  const from = str('from');
  const to = str('to');
  const code = b.code;
  if (!Number.isInteger(code) || (code as number) < 0 || (code as number) > 699) problems.push('code must be an integer 0..699');
  const at = Number(str('at', 32));
  if (!Number.isFinite(at) || at <= 0) problems.push('at must be Unix seconds');
  let status: CallEvent['status'];
  let reason: string | undefined;
  if (event === 'refused') {
    status = str('status') as CallEvent['status'];
    if (!REFUSED_STATUSES.includes(status as string)) problems.push(`status must be one of ${REFUSED_STATUSES.join(', ')}`);
    reason = str('reason', 200);
    if (!reason) problems.push('reason must not be empty');
    if (!Number.isInteger(code) || (code as number) < 300) problems.push('code of a refused call must be a final failure (300..699)');
  }
  if (problems.length) return { problems };
  return {
    problems,
    event: {
      event: event as CallEventName,
      call_id: callId,
      organisation_id: organisationId,
      direction: direction as CallEvent['direction'],
      source: source as CallEvent['source'],
      caller_sip_user_id: caller,
      callee_sip_user_id: callee,
      from,
      to,
      code: code as number,
      at: new Date(Math.round(at * 1000)),
      ...(status ? { status, reason } : {}),
    },
  };
}

/** The terminal status of a failed INVITE transaction, by its final response code. */
export function failureStatus(code: number): 'busy' | 'no_answer' | 'canceled' | 'failed' {
  if (code === 486 || code === 600) return 'busy';
  if (code === 408 || code === 480) return 'no_answer';
  if (code === 487) return 'canceled';
  return 'failed';
}

const RANK: Record<string, number> = { initiated: 0, ringing: 1, in_progress: 2 };
const isTerminal = (status: string) => (TERMINAL_CALL_STATUSES as readonly string[]).includes(status);

interface CallRow {
  id: string;
  organisation_id: string;
  status: string;
  conversation_id: string | null;
  started_at: Date | null;
  answered_at: Date | null;
}

export interface CallEventsOptions {
  db: Db;
  records: Records;
}

/**
 * Applies call events. Events of one call are applied one at a time (in arrival order) in this
 * process; the queue consumer (call-queue.ts) hands them over in the order Kamailio raised them.
 */
export class CallEvents {
  private readonly queues = new Map<string, Promise<unknown>>();

  constructor(private readonly options: CallEventsOptions) {}

  apply(event: CallEvent): Promise<void> {
    const key = `${event.organisation_id}/${event.call_id}`;
    const previous = this.queues.get(key) ?? Promise.resolve();
    const next = previous.catch(() => {}).then(() => this.applyNow(event));
    this.queues.set(key, next);
    void next
      .finally(() => {
        if (this.queues.get(key) === next) this.queues.delete(key);
      })
      .catch(() => {});
    return next;
  }

  private async applyNow(event: CallEvent): Promise<void> {
    const actor = systemActor(event.organisation_id, 'sip');
    const call = await this.ensureCall(actor, event);
    if (isTerminal(call.status)) return;
    switch (event.event) {
      case 'initiated':
        return;
      case 'ringing':
        if (RANK[call.status] < RANK.ringing) await this.options.records.update(actor, 'Call', call.id, { status: 'ringing' });
        return;
      case 'answered':
        if (RANK[call.status] < RANK.in_progress) await this.answer(actor, call, event);
        return;
      case 'failed':
        // A failure after the answer (a later branch's) does not end an established call.
        if (call.status !== 'in_progress')
          await this.end(actor, call, failureStatus(event.code), event.at, event.code >= 300 ? { sip_code: event.code } : {});
        return;
      case 'refused':
        if (call.status !== 'in_progress') {
          await this.end(actor, call, event.status ?? 'failed', event.at, { sip_code: event.code, end_reason: event.reason ?? null });
        }
        return;
      case 'ended':
        await this.end(actor, call, call.status === 'in_progress' ? 'completed' : 'failed', event.at);
        return;
    }
  }

  private async findCall(organisationId: string, callId: string): Promise<CallRow | undefined> {
    const { rows } = await sql<CallRow>`
      SELECT c.id, c.organisation_id, c.status, c.conversation_id, c.started_at,
             coalesce(c.answered_at, (SELECT min(p.joined_at) FROM call_participants p WHERE p.call_id = c.id AND p.role <> 'caller')) AS answered_at
      FROM calls c WHERE c.organisation_id = ${organisationId} AND c.call_uuid = ${callId}`.execute(this.options.db);
    return rows[0];
  }

  /** The Call of this Call-ID; created (with its conversation and the caller's leg) by whichever event comes first. */
  private async ensureCall(actor: Actor, event: CallEvent): Promise<CallRow> {
    const existing = await this.findCall(event.organisation_id, event.call_id);
    if (existing) return existing;
    const sipUsername = await this.sipUsername(
      event.organisation_id,
      event.direction === 'outbound' ? event.caller_sip_user_id : event.callee_sip_user_id,
    );
    try {
      await this.options.records.transaction(async (records) => {
        const conversation = await records.create(actor, 'Conversation', {
          channel: 'voice',
          mode: 'voice',
          status: 'active',
          metadata: { sip: { call_id: event.call_id, from: event.from, to: event.to } },
        });
        const call = await records.create(actor, 'Call', {
          direction: event.direction,
          from_number: event.from || null,
          to_number: event.to || null,
          sip_username: sipUsername,
          status: 'initiated',
          call_uuid: event.call_id,
          call_source: event.source,
          started_at: event.at,
          conversation_id: conversation.id,
        });
        await records.create(actor, 'CallParticipant', {
          call_id: call.id,
          member_uuid: event.caller_sip_user_id || `sip:${event.from}`,
          role: 'caller',
          joined_at: event.at,
        });
      });
    } catch (error) {
      // Two events of one call racing in from two receivers: the unique Call-ID lets one win.
      if ((error as { status?: number }).status !== 409) throw error;
    }
    const created = await this.findCall(event.organisation_id, event.call_id);
    if (!created) throw new Error(`call ${event.call_id} was not stored`);
    return created;
  }

  private async sipUsername(organisationId: string, sipUserId: string): Promise<string | null> {
    if (!sipUserId) return null;
    const { rows } = await sql<{ sip_username: string }>`
      SELECT sip_username FROM sip_users WHERE organisation_id = ${organisationId} AND id = ${sipUserId}`.execute(this.options.db);
    return rows[0]?.sip_username ?? null;
  }

  private async answer(actor: Actor, call: CallRow, event: CallEvent): Promise<void> {
    await this.options.records.transaction(async (records) => {
      // The answer time to the millisecond: the callee leg's joined_at is kept to the second.
      await records.update(actor, 'Call', call.id, { status: 'in_progress', answered_at: event.at });
      await records.create(actor, 'CallParticipant', {
        call_id: call.id,
        member_uuid: event.callee_sip_user_id || `sip:${event.to}`,
        role: 'callee',
        joined_at: event.at,
      });
    });
    for (const sipUserId of [event.caller_sip_user_id, event.callee_sip_user_id]) {
      if (sipUserId) await this.operatorBusy(actor, sipUserId);
    }
  }

  /** Ends a call: its status, end time, talk time, every leg's left_at, the conversation closed, presence restored. */
  async end(
    actor: Actor,
    call: CallRow,
    status: string,
    at: Date,
    extra: { sip_code?: number; end_reason?: string | null } = {},
  ): Promise<void> {
    const ended = call.started_at && at < call.started_at ? call.started_at : at;
    const talk = call.answered_at ? Math.max(0, Math.round((ended.getTime() - call.answered_at.getTime()) / 1000)) : 0;
    const { rows: legs } = await sql<{ id: string; member_uuid: string; joined_at: Date }>`
      SELECT id, member_uuid, joined_at FROM call_participants WHERE call_id = ${call.id} AND left_at IS NULL`.execute(this.options.db);
    await this.options.records.transaction(async (records) => {
      await records.update(actor, 'Call', call.id, { status, ended_at: ended, duration_seconds: talk, ...extra });
      for (const leg of legs) {
        await records.update(actor, 'CallParticipant', leg.id, { left_at: ended < leg.joined_at ? leg.joined_at : ended });
      }
      if (call.conversation_id) await records.update(actor, 'Conversation', call.conversation_id, { status: 'closed' });
    });
    for (const leg of legs) if (UUID.test(leg.member_uuid)) await this.operatorRestore(actor, leg.member_uuid, call.id);
  }

  /** An operator's SIP user in a call: `busy` (source system), unless already busy. */
  private async operatorBusy(actor: Actor, sipUserId: string): Promise<void> {
    const { rows } = await sql<{ user_id: string | null; status: string | null }>`
      SELECT s.user_id, o.status FROM sip_users s LEFT JOIN operator_statuses o ON o.sip_user_id = s.id
      WHERE s.id = ${sipUserId}`.execute(this.options.db);
    const row = rows[0];
    if (!row?.user_id || row.status === 'busy') return;
    await this.options.records.create(actor, 'OperatorStatus', { sip_user_id: sipUserId, status: 'busy', source: 'system' });
  }

  /**
   * At the end of a call: back to the status the operator had before the SIP edge set `busy`, read from
   * that change's OperatorStatusEvent (`previous_status`). Left alone when someone changed the status during
   * the call, or while the SIP user is still in another answered call.
   */
  private async operatorRestore(actor: Actor, sipUserId: string, endedCallId: string): Promise<void> {
    const { rows } = await sql<{
      status: string;
      source: string;
      previous_status: string | null;
      event_source: string;
      event_status: string;
    }>`
      SELECT o.status, o.source, e.previous_status, e.source AS event_source, e.status AS event_status
      FROM operator_statuses o
      JOIN LATERAL (SELECT * FROM operator_status_events e WHERE e.operator_status_id = o.id ORDER BY e.occurred_at DESC, e.id DESC LIMIT 1) e ON true
      WHERE o.sip_user_id = ${sipUserId}`.execute(this.options.db);
    const row = rows[0];
    if (row?.status !== 'busy' || row.source !== 'system' || row.event_source !== 'system' || row.event_status !== 'busy') return;
    const { rows: other } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM call_participants p JOIN calls c ON c.id = p.call_id
      WHERE p.member_uuid = ${sipUserId} AND p.left_at IS NULL AND c.id <> ${endedCallId} AND c.status = 'in_progress'`.execute(
      this.options.db,
    );
    if (other[0].n > 0) return;
    // No status before the call: the operator was reachable by phone, so `available`.
    await this.options.records.create(actor, 'OperatorStatus', {
      sip_user_id: sipUserId,
      status: row.previous_status ?? 'available',
      source: 'system',
    });
  }
}
