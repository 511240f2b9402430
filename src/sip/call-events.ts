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
import { type Selectable, sql } from 'kysely';
import type { Database, Db, Schema } from '../db/schema.js';
import { systemActor, type Actor } from '../jsonapi/actor.js';
import type { Records } from '../jsonapi/records.js';
import { memo } from '../jsonapi/memo.js';
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
  /**
   * A call relayed to the voice runtime: the AI agent answering it (route[VOICE]). Its Conversation is the
   * agent's, and the answering leg is the agent (role `agent`, member_uuid the agent's id).
   */
  ai_agent_id?: string;
  /** `refused` only: the Call's status and why. */
  status?: 'no_answer' | 'failed' | 'busy';
  reason?: string;
  /**
   * A transfer (RFC 3515): the SIP Call-ID of this event's own dialog when it is the transferee's new call to
   * the transfer target (`call_id` is then the transferred call's), so the target joins that Call.
   */
  leg?: string;
  /** The party of this dialog that transferred the call (its REFER was accepted): it leaves when the dialog ends. */
  transferor?: 'caller' | 'callee';
  /**
   * `ended` only: an attended transfer's call (INVITE with Replaces, RFC 3891) replaced this dialog; the Call-ID
   * that call is recorded under. This call (the consultation) ends with `end_reason` `transferred`.
   */
  replaced_by?: string;
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
  /** A field that may be absent or empty (then undefined). */
  const optional = (name: string, max?: number) => (b[name] === undefined || b[name] === '' ? undefined : str(name, max));
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
  for (const [name, value] of Object.entries({ caller_sip_user_id: caller, callee_sip_user_id: callee }))
    if (value !== '' && !UUID.test(value)) problems.push(`${name} must be a UUID or empty`);
  const from = str('from');
  const to = str('to');
  const aiAgentId = optional('ai_agent_id', 36);
  if (aiAgentId !== undefined && !UUID.test(aiAgentId)) problems.push('ai_agent_id must be a UUID or absent');
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
  const leg = b.leg === undefined ? undefined : str('leg');
  if (leg === '') problems.push('leg must not be empty when given');
  const transferor = optional('transferor') as CallEvent['transferor'];
  if (transferor !== undefined && transferor !== 'caller' && transferor !== 'callee') problems.push('transferor must be caller or callee');
  const replacedBy = optional('replaced_by');
  if (replacedBy !== undefined && event !== 'ended') problems.push('replaced_by is for ended events only');
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
      ...(aiAgentId ? { ai_agent_id: aiAgentId.toLowerCase() } : {}),
      ...(status ? { status, reason } : {}),
      ...(leg ? { leg } : {}),
      ...(transferor ? { transferor } : {}),
      ...(replacedBy ? { replaced_by: replacedBy } : {}),
    },
  };
}

/** A call event as the queue's rows and the voice runtime's X-Parley-Call header carry it (JSON, base64), validated. */
export function decodeCallEvent(base64: string): ReturnType<typeof parseCallEvent> {
  try {
    return parseCallEvent(JSON.parse(Buffer.from(base64, 'base64').toString('utf8')));
  } catch {
    return { problems: ['the body is not base64-encoded JSON'] };
  }
}

/** The terminal status of a failed INVITE transaction, by its final response code. */
export function failureStatus(code: number): 'busy' | 'no_answer' | 'canceled' | 'failed' {
  if (code === 486 || code === 600) return 'busy';
  if (code === 408 || code === 480) return 'no_answer';
  if (code === 487) return 'canceled';
  return 'failed';
}

/** A call's key: its organisation and SIP Call-ID. */
const keyOf = (e: Pick<CallEvent, 'organisation_id' | 'call_id'>) => `${e.organisation_id}/${e.call_id}`;
const RANK: Record<string, number> = { initiated: 0, ringing: 1, in_progress: 2 };
const isTerminal = (status: string) => (TERMINAL_CALL_STATUSES as readonly string[]).includes(status);
const later = (a: Date, b: Date | null) => (b && a < b ? b : a);
/** A party's leg member: its SIP user, or `sip:<number>` for one without (a trunk's party). */
const memberOf = (e: CallEvent, party: 'caller' | 'callee') =>
  (party === 'caller' ? e.caller_sip_user_id : e.callee_sip_user_id) || `sip:${party === 'caller' ? e.from : e.to}`;
/** The SIP user a Call names (`sip_username`): the caller of an outbound call, the callee of an inbound one. */
const sipUserOf = (e: CallEvent) => (e.direction === 'outbound' ? e.caller_sip_user_id : e.callee_sip_user_id);
/** What no event has changed yet in a call's state. */
const unchanged = () => ({ patch: {}, closeConversation: false, busy: [] as string[], restore: [] as string[] });
/** Whether the events left anything to write (a create, attributes, new legs or legs that left). */
const changed = (state: CallState) =>
  Boolean(state.create) || Object.keys(state.patch).length > 0 || state.legs.some((l) => !l.id || l.changed);

/** One leg (CallParticipant): stored (`id`) or new; `changed` when its `left_at` is to be written. */
interface Leg {
  id?: string;
  member_uuid: string;
  role: 'caller' | 'callee' | 'agent' | 'operator';
  joined_at: Date;
  left_at: Date | null;
  changed?: boolean;
}

/** The SIP users a call's events name: the Call's `sip_username`, and operator presence (`user_id`, status). */
type SipUserRow = Pick<Selectable<Schema['sip_users']>, 'id' | 'sip_username' | 'user_id'> & { status: string | null };

/**
 * A call as its events leave it, kept in memory while a batch of its events is applied and written at the end
 * in one transaction: a status that ringing, answered and ended each moved is one update (or part of the
 * create), not three.
 */
interface CallState {
  organisationId: string;
  /** Stored: its id and conversation; new: the event its create is made of. */
  stored?: { id: string; conversation_id: string | null; conversation_status: string | null };
  create?: CallEvent;
  status: string;
  started_at: Date | null;
  answered_at: Date | null;
  /** Call attributes to write (update, or with the create). */
  patch: Record<string, unknown>;
  legs: Leg[];
  closeConversation: boolean;
  /** SIP users to set busy, then those whose status to restore, after the commit (operators only). */
  busy: string[];
  restore: string[];
}

/**
 * Applies call events. Events of one call are applied one batch at a time (in arrival order) in this
 * process; the queue consumer (call-queue.ts) hands a call's queued events over together, in the order
 * Kamailio raised them, and they are written in one transaction.
 *
 * Cost (docs/sip.md): one read of the call with its legs, one of the SIP users the events name (when a create,
 * an answer or an end needs them), then the records service's writes for what changed, in one transaction.
 */
export class CallEvents {
  private readonly queues = new Map<string, Promise<unknown>>();
  private readonly observers = new Set<(events: CallEvent[]) => void>();

  constructor(private readonly options: { db: Db; records: Records }) {}

  /**
   * Tells `listener` of each batch of a call's events once it has been applied (written, or found already
   * terminal, or failed: the call's SIP dialog did what the events say either way). The voice runtime's
   * transcriber forks a call's media on `answered` and stops at `ended` (src/voice/transcriber.ts).
   * A listener must be quick and must not throw; it may see a batch again when the queue retries it.
   */
  observe(listener: (events: CallEvent[]) => void): () => void {
    this.observers.add(listener);
    return () => this.observers.delete(listener);
  }

  apply(event: CallEvent): Promise<void> {
    return this.applyAll([event]);
  }

  /** Applies events in order; consecutive events of one call are applied (and written) together. */
  async applyAll(events: CallEvent[]): Promise<void> {
    for (let i = 0, j = 0; i < events.length; i = j) {
      const key = keyOf(events[i]);
      while (j < events.length && keyOf(events[j]) === key) j++;
      await this.serialised(key, events.slice(i, j));
    }
  }

  /**
   * Several calls' events at once (`groups`: each one call's events, in order; no call twice): the calls are read
   * in one statement, the SIP users they name in another, and every call's records are written in one
   * transaction, so a consumer keeping up with many calls (one or two events each per batch) pays the reads,
   * BEGIN and COMMIT once per batch rather than once per event. All or nothing: when it fails, nothing was
   * written, and the caller applies the calls one at a time (applyAll) to find the one at fault.
   */
  async applyMany(groups: CallEvent[][]): Promise<void> {
    const list = groups.filter((g) => g.length > 0);
    if (list.length === 0) return;
    if (list.some((g) => g.some((e) => keyOf(e) !== keyOf(g[0])))) throw new Error('applyMany: a group holds events of several calls');
    const keys = list.map((g) => keyOf(g[0]));
    if (new Set(keys).size !== keys.length) throw new Error('applyMany: a call appears in two groups');
    // Calls being applied in this process already (applyAll): those wait their turn as before, the rest go together.
    const busy = list.filter((g) => this.queues.has(keyOf(g[0])));
    const free = list.filter((g) => !this.queues.has(keyOf(g[0])));
    const applied =
      free.length > 1
        ? this.statesOf(free).then((states) => this.write(states))
        : free.length === 1
          ? this.applyCall(free[0])
          : Promise.resolve();
    // Observers see every call's batch whichever way it was applied (together here, or one by one in serialised).
    const together = applied.finally(() => {
      for (const group of free) this.notify(group);
    });
    this.hold(free, together);
    await Promise.all([together, ...busy.map((g) => this.applyAll(g))]);
  }

  /** The calls of `groups` are being applied until `work` settles: applyAll of one of them waits for it. */
  private hold(groups: CallEvent[][], work: Promise<unknown>): void {
    const keys = groups.map((g) => keyOf(g[0]));
    for (const key of keys) this.queues.set(key, work);
    void work
      .finally(() => {
        for (const key of keys) if (this.queues.get(key) === work) this.queues.delete(key);
      })
      .catch(() => {});
  }

  /**
   * The queue's usual path (call-queue.ts): `claim` takes queued events (deleting their rows) inside the records
   * service's transaction and returns them as calls, each one call's events in order, no call twice; their
   * records are written in that same transaction. So a queue row goes exactly when the records it became are
   * stored, with no lease written for it, and a drain is one transaction. Throws, with nothing written (the
   * claim rolled back too), when anything fails or a claimed call is being applied in this process already;
   * the caller then takes the leased path. Operator presence is written after the commit; when that fails, the
   * error is thrown too, the records and the rows' deletion stay. The number of events applied.
   */
  async applyClaimed(claim: (trx: Database) => Promise<CallEvent[][]>): Promise<number> {
    let groups: CallEvent[][] = [];
    let states: CallState[] = [];
    let users = new Map<string, SipUserRow>();
    // The claimed calls are this drain's until it is done.
    let release = () => {};
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    try {
      await this.options.records.transaction(async (records, trx) => {
        groups = (await claim(trx)).filter((g) => g.length > 0);
        if (groups.length === 0) return;
        if (groups.some((g) => this.queues.has(keyOf(g[0])))) throw new Error('a claimed call is being applied already');
        this.hold(groups, held);
        states = await this.statesOf(groups, trx);
        users = await this.sipUsersOf(states, trx);
        await this.writeRecords(records, states, users);
      });
    } catch (error) {
      release();
      throw error;
    }
    try {
      for (const state of states) await this.afterCommit(state, users);
    } finally {
      for (const group of groups) this.notify(group);
      release();
    }
    return groups.reduce((n, g) => n + g.length, 0);
  }

  /** The calls' states after their events (stored ones read in one statement), terminal ones left out. */
  private async statesOf(groups: CallEvent[][], db: Database = this.options.db): Promise<CallState[]> {
    const stored = await this.loadMany(
      groups.map((g) => g[0]),
      db,
    );
    const states: CallState[] = [];
    for (const group of groups) {
      const first = group[0];
      const state = stored.get(keyOf(first)) ?? this.fresh(first);
      if (isTerminal(state.status)) continue;
      for (const event of group) this.step(state, event);
      states.push(state);
    }
    return states;
  }

  private serialised(key: string, events: CallEvent[]): Promise<void> {
    const next = (this.queues.get(key) ?? Promise.resolve())
      .catch(() => {})
      .then(() => this.applyCall(events))
      .finally(() => this.notify(events));
    this.hold([events], next);
    return next;
  }

  private notify(events: CallEvent[]): void {
    for (const listener of this.observers) {
      try {
        listener(events);
      } catch {}
    }
  }

  private async applyCall(events: CallEvent[], retried = false): Promise<void> {
    const [state] = await this.statesOf([events]);
    if (!state) return;
    try {
      await this.write([state]);
    } catch (error) {
      // Another process created the Call meanwhile (the unique Call-ID let it win): applied again onto it.
      if ((error as { status?: number }).status === 409 && state.create && !retried) return this.applyCall(events, true);
      throw error;
    }
  }

  /** A call no event has created yet: made by whichever event comes first, with the caller's leg. */
  private fresh(event: CallEvent): CallState {
    return {
      organisationId: event.organisation_id,
      create: event,
      status: 'initiated',
      started_at: event.at,
      answered_at: null,
      legs: [{ member_uuid: memberOf(event, 'caller'), role: 'caller', joined_at: event.at, left_at: null }],
      ...unchanged(),
    };
  }

  /** Stored calls with their legs, in one statement, by `keyOf`; a call not stored is absent. */
  private async loadMany(
    calls: Pick<CallEvent, 'organisation_id' | 'call_id'>[],
    db: Database = this.options.db,
  ): Promise<Map<string, CallState>> {
    const { rows } = await sql<{
      id: string;
      organisation_id: string;
      call_uuid: string;
      status: string;
      conversation_id: string | null;
      conversation_status: string | null;
      started_at: Date | null;
      answered_at: Date | null;
      legs: { id: string; member_uuid: string; role: 'caller' | 'callee'; joined_at: string; left_at: string | null }[];
    }>`
      SELECT c.id, c.organisation_id, c.call_uuid, c.status, c.conversation_id, c.started_at,
             (SELECT v.status FROM conversations v WHERE v.id = c.conversation_id) AS conversation_status,
             coalesce(c.answered_at, (SELECT min(p.joined_at) FROM call_participants p
               WHERE p.organisation_id = c.organisation_id AND p.call_id = c.id AND p.role <> 'caller')) AS answered_at,
             coalesce((SELECT json_agg(json_build_object('id', p.id, 'member_uuid', p.member_uuid, 'role', p.role,
                 'joined_at', p.joined_at, 'left_at', p.left_at) ORDER BY p.joined_at, p.id)
               FROM call_participants p WHERE p.organisation_id = c.organisation_id AND p.call_id = c.id), '[]'::json) AS legs
      FROM unnest(${calls.map((c) => c.organisation_id)}::uuid[], ${calls.map((c) => c.call_id)}::text[]) AS w(o, u)
      JOIN calls c ON c.organisation_id = w.o AND c.call_uuid = w.u`.execute(db);
    const found = new Map<string, CallState>();
    for (const row of rows) {
      const legs = typeof row.legs === 'string' ? (JSON.parse(row.legs) as typeof row.legs) : row.legs;
      found.set(keyOf({ organisation_id: row.organisation_id, call_id: row.call_uuid }), {
        organisationId: row.organisation_id,
        stored: { id: row.id, conversation_id: row.conversation_id, conversation_status: row.conversation_status },
        status: row.status,
        started_at: row.started_at,
        answered_at: row.answered_at,
        legs: legs.map((l) => ({ ...l, joined_at: new Date(l.joined_at), left_at: l.left_at ? new Date(l.left_at) : null })),
        ...unchanged(),
      });
    }
    return found;
  }

  /** One event, in memory. A status never moves backwards and a terminal one is final. */
  private step(state: CallState, event: CallEvent): void {
    if (isTerminal(state.status)) return;
    if (event.leg) {
      this.transferStep(state, event);
      return;
    }
    switch (event.event) {
      case 'initiated':
        return;
      case 'ringing':
        if (RANK[state.status] < RANK.ringing) this.set(state, { status: 'ringing' });
        return;
      case 'answered':
        if (RANK[state.status] < RANK.in_progress) this.answer(state, event);
        return;
      case 'failed':
        // A failure after the answer (a later branch's) does not end an established call.
        if (state.status !== 'in_progress')
          this.finish(state, failureStatus(event.code), event.at, event.code >= 300 ? { sip_code: event.code } : {});
        return;
      case 'refused':
        if (state.status !== 'in_progress')
          this.finish(state, event.status ?? 'failed', event.at, { sip_code: event.code, end_reason: event.reason ?? null });
        return;
      case 'ended':
        // The dialog of a party that transferred the call ended: that party left; the call goes on with the target.
        if (event.transferor && state.status === 'in_progress') {
          this.leave(state, event.transferor, memberOf(event, event.transferor), event.at);
          return;
        }
        // The consultation call of an attended transfer, replaced by the transferee's call to the target (which
        // that call's Call carries as a leg): it ended because it was transferred, not hung up.
        if (event.replaced_by && state.status === 'in_progress') {
          this.finish(state, 'completed', event.at, { end_reason: 'transferred' });
          return;
        }
        this.finish(state, state.status === 'in_progress' ? 'completed' : 'failed', event.at);
        return;
    }
  }

  /**
   * An event of the transferee's new call to the transfer target (`leg`): the target joins when it answers;
   * its end ends the call; its failure ends the call when the transferee is alone in it (the transferor left).
   */
  private transferStep(state: CallState, event: CallEvent): void {
    switch (event.event) {
      case 'initiated':
      case 'ringing':
        return;
      case 'answered':
        if (RANK[state.status] < RANK.in_progress) this.set(state, { status: 'in_progress', answered_at: event.at });
        state.answered_at ??= event.at;
        {
          // An operator the voice runtime handed the call to is already a leg (operatorJoined): not twice.
          const member = memberOf(event, 'callee');
          if (!state.legs.some((l) => l.left_at === null && l.member_uuid === member)) this.join(state, member, event.at);
        }
        if (event.callee_sip_user_id) state.busy.push(event.callee_sip_user_id);
        return;
      case 'failed':
      case 'refused':
        if (state.legs.filter((l) => l.left_at === null).length <= 1) {
          const status =
            state.status === 'in_progress'
              ? 'completed'
              : event.event === 'refused'
                ? (event.status ?? 'failed')
                : failureStatus(event.code);
          this.finish(state, status, event.at, { end_reason: `transfer to ${event.to} failed (${event.code})` });
        }
        return;
      case 'ended':
        this.finish(state, state.status === 'in_progress' ? 'completed' : 'failed', event.at);
        return;
    }
  }

  private set(state: CallState, values: Record<string, unknown>): void {
    Object.assign(state.patch, values);
    if (typeof values.status === 'string') state.status = values.status;
  }

  private join(state: CallState, member: string, at: Date, role: Leg['role'] = 'callee'): void {
    state.legs.push({ member_uuid: member, role, joined_at: at, left_at: null });
  }

  private answer(state: CallState, event: CallEvent): void {
    // The answer time to the millisecond: the callee leg's joined_at is kept to the second.
    this.set(state, { status: 'in_progress', answered_at: event.at });
    state.answered_at = event.at;
    // An agent call is answered by the voice runtime: the agent is the other party.
    if (event.ai_agent_id) this.join(state, event.ai_agent_id, event.at, 'agent');
    else this.join(state, memberOf(event, 'callee'), event.at);
    for (const id of [event.caller_sip_user_id, event.callee_sip_user_id]) if (id) state.busy.push(id);
  }

  private leave(state: CallState, role: 'caller' | 'callee', member: string, at: Date): void {
    // The callee of an agent call is the agent's leg (role `agent`).
    const open = state.legs.filter((l) => l.left_at === null && (l.role === role || (role === 'callee' && l.role === 'agent')));
    const leg = open.find((l) => l.member_uuid === member) ?? open[0];
    if (leg) this.close(state, leg, at);
  }

  /** A leg leaves at `at` (not before it joined); its SIP user's presence is restored after the commit (operators only). */
  private close(state: CallState, leg: Leg, at: Date): void {
    leg.left_at = later(at, leg.joined_at);
    leg.changed = true;
    if (UUID.test(leg.member_uuid)) state.restore.push(leg.member_uuid);
  }

  /** Ends a call: its status, end time, talk time, every leg's left_at, the conversation closed, presence restored. */
  private finish(state: CallState, status: string, at: Date, extra: { sip_code?: number; end_reason?: string | null } = {}): void {
    const ended = later(at, state.started_at);
    const talk = state.answered_at ? Math.max(0, Math.round((ended.getTime() - state.answered_at.getTime()) / 1000)) : 0;
    this.set(state, { status, ended_at: ended, duration_seconds: talk, ...extra });
    for (const leg of state.legs) if (leg.left_at === null) this.close(state, leg, ended);
    state.closeConversation = true;
  }

  /** What the events changed, through the records service in one transaction; then operator presence. */
  private async write(states: CallState[]): Promise<void> {
    const users = await this.sipUsersOf(states);
    if (states.some(changed)) await this.options.records.transaction((records) => this.writeRecords(records, states, users));
    for (const state of states) await this.afterCommit(state, users);
  }

  /** The SIP users the calls' records and presence need (the callee or caller named on the Call, busy, restored). */
  private async sipUsersOf(
    states: Pick<CallState, 'organisationId' | 'create' | 'busy' | 'restore'>[],
    db: Database = this.options.db,
  ): Promise<Map<string, SipUserRow>> {
    // Each (organisation, SIP user) once.
    const wanted = new Map<string, readonly [string, string]>();
    for (const { organisationId, create, busy, restore } of states) {
      for (const id of [create ? sipUserOf(create) : '', ...busy, ...restore])
        if (UUID.test(id)) wanted.set(`${organisationId}/${id}`, [organisationId, id]);
    }
    const pairs = [...wanted.values()];
    if (pairs.length === 0) return new Map();
    const { rows } = await sql<SipUserRow & { organisation_id: string }>`
      SELECT s.id, s.organisation_id, s.sip_username, s.user_id, o.status
      FROM unnest(${pairs.map((p) => p[0])}::uuid[], ${pairs.map((p) => p[1])}::uuid[]) AS w(o, i)
      JOIN sip_users s ON s.organisation_id = w.o AND s.id = w.i
      LEFT JOIN operator_statuses o ON o.sip_user_id = s.id`.execute(db);
    return new Map(rows.map((r) => [r.id, r]));
  }

  /**
   * The calls' changes through the records service, inside the caller's transaction: per organisation, each kind
   * of write of all its calls as one statement (the conversations created, the calls created, the calls updated,
   * the legs created, the legs updated, the conversations closed), in the order one call's writes take.
   */
  private async writeRecords(records: Records, states: CallState[], users: Map<string, SipUserRow>): Promise<void> {
    const byOrganisation = new Map<string, CallState[]>();
    for (const state of states.filter(changed)) memo(byOrganisation, state.organisationId, () => []).push(state);
    for (const [organisationId, list] of byOrganisation) {
      const actor = systemActor(organisationId, 'sip');
      const creates = list.filter((state): state is CallState & { create: CallEvent } => state.create !== undefined);
      const newLegs = list.map((state) => state.legs.filter((l) => !l.id));
      const conversations = await records.createMany(
        actor,
        'Conversation',
        creates.map(({ create, closeConversation }) => ({
          channel: 'voice',
          mode: 'voice',
          status: closeConversation ? 'closed' : 'active',
          ...(create.ai_agent_id ? { ai_agent_id: create.ai_agent_id } : {}),
          metadata: { sip: { call_id: create.call_id, from: create.from, to: create.to } },
        })),
      );
      const calls = await records.createMany(
        actor,
        'Call',
        creates.map(({ create: event, patch }, i) => ({
          direction: event.direction,
          from_number: event.from || null,
          to_number: event.to || null,
          sip_username: users.get(sipUserOf(event))?.sip_username ?? null,
          status: 'initiated',
          call_uuid: event.call_id,
          call_source: event.source,
          started_at: event.at,
          conversation_id: conversations[i].id,
          ...patch,
        })),
      );
      for (const [i, state] of creates.entries()) {
        const conversation_status = state.closeConversation ? 'closed' : 'active';
        state.stored = { id: calls[i].id, conversation_id: conversations[i].id, conversation_status };
      }
      const updates = list.filter((state) => !state.create && Object.keys(state.patch).length);
      await records.updateMany(
        actor,
        'Call',
        updates.map((state) => ({ id: state.stored!.id, values: state.patch })),
      );
      await records.createMany(
        actor,
        'CallParticipant',
        list.flatMap((state, i) =>
          newLegs[i].map((leg) => ({
            call_id: state.stored!.id,
            member_uuid: leg.member_uuid,
            role: leg.role,
            joined_at: leg.joined_at,
            ...(leg.left_at ? { left_at: leg.left_at } : {}),
          })),
        ),
      );
      const leftLegs = list.flatMap((state) => state.legs.filter((l) => l.id && l.changed));
      await records.updateMany(
        actor,
        'CallParticipant',
        leftLegs.map((leg) => ({ id: leg.id!, values: { left_at: leg.left_at } })),
      );
      // A conversation an agent handed off during the call (pending, or assigned to an operator) stays open for them.
      const closing = list.filter((s) => !s.create && s.closeConversation && s.stored?.conversation_status === 'active');
      await records.updateMany(
        actor,
        'Conversation',
        closing.map((state) => ({ id: state.stored!.conversation_id!, values: { status: 'closed' } })),
      );
    }
  }

  /** Operator presence, after the call's records are committed: an operator's phone (a SIP user with a user_id) only. */
  private async afterCommit(state: CallState, users: Map<string, SipUserRow>): Promise<void> {
    const actor = systemActor(state.organisationId, 'sip');
    for (const id of new Set(state.busy)) await this.setBusy(actor, id, users);
    for (const id of state.restore) if (users.get(id)?.user_id) await this.operatorRestore(actor, id, state.stored?.id);
  }

  /** Ends a stored call (reconciliation) with `status` at `at`, as its end event would. */
  async end(call: { organisation_id: string; call_uuid: string }, status: string, at: Date): Promise<void> {
    const key = { organisation_id: call.organisation_id, call_id: call.call_uuid };
    const state = (await this.loadMany([key])).get(keyOf(key));
    if (!state || isTerminal(state.status)) return;
    this.finish(state, status, at);
    await this.write([state]);
  }

  /**
   * An operator took over a call the voice runtime transferred to them: their leg (role `operator`) and `busy`.
   * Their phone's own call with the caller is recorded by the edge; when it ends, presence is restored there.
   */
  async operatorJoined(organisationId: string, callRowId: string, sipUserId: string, at: Date): Promise<string> {
    const actor = systemActor(organisationId, 'sip');
    // The edge may have recorded the transfer's answered leg first (route[INITIAL] links it): not twice.
    const open = await this.options.db
      .selectFrom('call_participants')
      .select('id')
      .where('call_id', '=', callRowId)
      .where('member_uuid', '=', sipUserId)
      .where('left_at', 'is', null)
      .executeTakeFirst();
    if (open) return open.id;
    const leg = await this.options.records.create(actor, 'CallParticipant', {
      call_id: callRowId,
      member_uuid: sipUserId,
      role: 'operator',
      joined_at: at,
    });
    await this.setBusy(actor, sipUserId, await this.sipUsersOf([{ organisationId, busy: [sipUserId], restore: [] }]));
    return leg.id;
  }

  /** `busy` for an operator's phone (a SIP user with a user_id) that is not busy already. */
  private async setBusy(actor: Actor, sipUserId: string, users: Map<string, SipUserRow>): Promise<void> {
    const user = users.get(sipUserId);
    if (user?.user_id && user.status !== 'busy')
      await this.options.records.create(actor, 'OperatorStatus', { sip_user_id: sipUserId, status: 'busy', source: 'system' });
  }

  /**
   * At the end of a call: back to the status the operator had before the SIP edge set `busy`, read from
   * that change's OperatorStatusEvent (`previous_status`). Left alone when someone changed the status during
   * the call, or while the SIP user is still in another answered call.
   */
  private async operatorRestore(actor: Actor, sipUserId: string, endedCallId: string | undefined): Promise<void> {
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
      WHERE p.member_uuid = ${sipUserId} AND p.left_at IS NULL AND c.status = 'in_progress'
        ${endedCallId ? sql`AND c.id <> ${endedCallId}` : sql``}`.execute(this.options.db);
    if (other[0].n > 0) return;
    // No status before the call: the operator was reachable by phone, so `available`.
    await this.options.records.create(actor, 'OperatorStatus', {
      sip_user_id: sipUserId,
      status: row.previous_status ?? 'available',
      source: 'system',
    });
  }
}
