/**
 * The voice runtime: agent calls answered by Parley. The SIP endpoint (sip-endpoint.ts) takes calls to
 * `agent-<ai agent id>`; each call gets its voice Conversation (mode `voice`), its Call and participants,
 * written through the records service as the SIP edge writes calls (system actor, source `sip`), and a
 * session (session.ts) that hears and speaks. The agent answers through the agent runtime, exactly as
 * in chat: a caller's utterance is a `user` item, and the runtime's turn (workflow, guardrails, model,
 * handoff, its lease and exactly-once commit) writes the `assistant` reply, which is then spoken. One code
 * path for chat and voice; this file only waits for the reply the turn committed.
 */
import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import type { Logger } from 'pino';
import { handOff } from '../agents/routing.js';
import { TURN_CHANNEL } from '../agents/runtime.js';
import { TOOL_WAIT_CHANNEL, type TransferTarget } from '../agents/tools.js';
import { HANDOFF_TEXT, type WorkflowState } from '../agents/workflow.js';
import type { Config } from '../config/index.js';
import { type DatabaseHandle, inTransaction } from '../db/connection.js';
import type { Db } from '../db/schema.js';
import { systemActor } from '../jsonapi/actor.js';
import { UUID_PATTERN } from '../jsonapi/kinds.js';
import { createRecords, type Records } from '../jsonapi/records.js';
import { buildRegistry } from '../jsonapi/routes.js';
import type { AppServices } from '../jsonapi/index.js';
import { resources } from '../resources/index.js';
import { type CallEvent, CallEvents, decodeCallEvent } from '../sip/call-events.js';
import { type Admission, type CallHandler, type DialogHandle, type InviteInfo, SipEndpoint } from './sip-endpoint.js';
import { type CallSink, type Reply, VoiceSession } from './session.js';
import { createStt, type SpeechToText } from './stt.js';
import { createTts, LocalTts, type TextToSpeech } from './tts.js';

export interface VoiceRuntimeOptions {
  db: Db;
  services: AppServices;
  config: Config;
  logger?: Logger;
  /**
   * The agent runtime in this process: woken at once when a caller's utterance is stored (else it polls), and
   * telling the call of its commits at once (else the database's notification, `listen`, does).
   */
  agents?: { wake(): void; onCommit?(listener: (conversationId: string) => void): () => void };
  stt?: SpeechToText;
  tts?: TextToSpeech;
  /**
   * The SIP edge's call events (`sip serve` passes its own, so one process applies a call's events in
   * order): a call the edge relayed is recorded through them, as one Call with the edge's.
   */
  callEvents?: CallEvents;
  /**
   * The database's notifications: each committed turn (TURN_CHANNEL) and a tool's `say_while_waiting` line
   * (TOOL_WAIT_CHANNEL). Without it or `agents`, a call polls for its reply every 20 ms, and such lines are not
   * spoken (the reply still is).
   */
  listen?: DatabaseHandle['listen'];
  /** The calls between people being transcribed (`sip serve`'s transcriber): they count towards VOICE_MAX_CALLS. */
  forks?: () => number;
  /** Benchmarks: each RTP packet sent, with its due time. */
  onPacketSent?: (callId: string, at: number, due: number) => void;
}

interface ActiveCall {
  callId: string;
  organisationId: string;
  agent: { id: string; voice: string | null; languages: string[] };
  info: InviteInfo;
  /** Resolves when the Call, Conversation and participants are stored. */
  stored?: Promise<{ callRowId: string; conversationId: string; startedAt: Date }>;
  session?: VoiceSession;
  transcriptIndex: number;
  /** The last user item's content_index (the agent runtime's cursor must pass it). */
  lastUserIndex: number;
  /** Relayed by the SIP edge: its account of the call (the Call is the edge's; see storeCall). */
  edge?: CallEvent;
  dialog?: DialogHandle;
  conversationId?: string;
  /** A transfer under way or done (to an operator, or transfer_call's target): the Refer-To SIP URI. */
  transferTo?: string;
}

/** Said when a handed-off call finds no operator to take it; the conversation stays queued for one. */
export const NO_OPERATOR_TEXT = 'Sorry, no one is available to take your call right now. A colleague will get back to you.';
/** How long a transfer may take: the operator's phone ringing, then answering. */
const TRANSFER_TIMEOUT_MS = 45_000;

export class VoiceRuntime implements CallHandler {
  readonly endpoint: SipEndpoint;
  private readonly calls = new Map<string, ActiveCall>();
  private readonly stt: SpeechToText;
  private readonly tts: TextToSpeech;
  private readonly fallbackTts = new LocalTts();
  private readonly registry = buildRegistry(resources);
  private readonly endings = new Set<Promise<void>>();
  private readonly callEvents: CallEvents;
  private unlisten: (() => unknown)[] = [];
  /** Calls waiting for a turn of their conversation to commit, by conversation id (`whenCommitted`). */
  private readonly waiting = new Map<string, Set<() => void>>();

  constructor(private readonly o: VoiceRuntimeOptions) {
    const v = o.config.voice;
    this.stt = o.stt ?? createStt(v);
    this.tts = o.tts ?? createTts(v);
    this.callEvents = o.callEvents ?? new CallEvents({ db: o.db, records: o.services.records! });
    if (v.sipTrusted.length === 0)
      throw new Error('the voice runtime needs VOICE_SIP_TRUSTED: the addresses of the SIP edge in front of it (it answers no one else)');
    this.endpoint = new SipEndpoint({
      host: v.sipHost,
      port: v.sipPort,
      advertisedAddress: v.advertisedAddress,
      rtpPortMin: v.rtpPortMin,
      rtpPortMax: v.rtpPortMax,
      handler: this,
      trusted: v.sipTrusted,
      logger: o.logger,
    });
  }

  private get records(): Records {
    return this.o.services.records!;
  }

  /** Ends calls a previous run left open (the process stopped mid-call), then takes calls. */
  async start(): Promise<void> {
    await this.reconcile();
    const wake = (conversationId: string) => this.committed(conversationId);
    if (this.o.agents?.onCommit) this.unlisten.push(this.o.agents.onCommit(wake));
    if (this.o.listen)
      this.unlisten.push(
        await this.o.listen(TOOL_WAIT_CHANNEL, (payload) => this.toolWaiting(payload)),
        // A lost listening connection may have missed an announcement: every waiting call looks again.
        await this.o.listen(TURN_CHANNEL, wake, () => [...this.waiting.keys()].forEach(wake)),
      );
    await this.endpoint.start();
  }

  /** A turn of one of this runtime's calls started a tool with `say_while_waiting`: the caller hears the line. */
  private toolWaiting(payload: string): void {
    let wait: { conversation_id?: unknown; in_reply_to?: unknown; tool?: unknown; text?: unknown };
    try {
      wait = JSON.parse(payload);
    } catch {
      return;
    }
    if (typeof wait.text !== 'string' || wait.text === '') return;
    for (const call of this.calls.values())
      if (call.conversationId === wait.conversation_id && call.session)
        call.session.interject(wait.text, { source: 'agent', say_while_waiting: wait.tool, in_reply_to: wait.in_reply_to });
  }

  /** Hangs up every call (BYE), records their end, and stops listening. */
  async stop(): Promise<void> {
    await Promise.all(this.unlisten.splice(0).map((stop) => Promise.resolve(stop()).catch(() => {})));
    await this.endpoint.stop();
    await Promise.all([...this.endings]);
  }

  get activeCalls(): number {
    return this.calls.size;
  }

  /** The calls being (or that were) transferred (to an operator, or by transfer_call), and the Refer-To SIP URI. */
  transfers(): { callId: string; target: string }[] {
    return [...this.calls.values()].flatMap((c) => (c.transferTo ? [{ callId: c.callId, target: c.transferTo }] : []));
  }

  sessions(): VoiceSession[] {
    return [...this.calls.values()].flatMap((c) => (c.session ? [c.session] : []));
  }

  // ------------------------------------------------------------ SIP handler

  async admit(info: InviteInfo): Promise<Admission> {
    const agentId = /^agent-(.*)$/i.exec(info.user ?? '')?.[1] ?? '';
    if (!UUID_PATTERN.test(agentId)) return { reject: 404, reason: 'Not Found' };
    // Past VOICE_MAX_CALLS (agent calls and transcription forks) new calls are refused, so that the running ones
    // keep their pace (486: the agent is busy; the caller may try again).
    const full = () => this.calls.size + (this.o.forks?.() ?? 0) >= this.o.config.voice.maxCalls;
    if (full()) return { reject: 486, reason: 'Busy Here' };
    const agent = await this.o.db
      .selectFrom('ai_agents')
      .select(['id', 'organisation_id', 'published', 'voice', 'languages'])
      .where('id', '=', agentId.toLowerCase())
      .executeTakeFirst();
    if (!agent) return { reject: 404, reason: 'Not Found' };
    if (!agent.published) return { reject: 480, reason: 'Temporarily Unavailable' };
    let edge: CallEvent | undefined;
    if (info.edgeCall !== undefined) {
      // The edge's account of the call (sip/kamailio.cfg, route[VOICE]): the same object as its call events.
      edge = decodeCallEvent(info.edgeCall).event;
      if (!edge || edge.ai_agent_id !== agent.id || edge.organisation_id !== agent.organisation_id || edge.call_id !== info.callId)
        return { reject: 400, reason: 'Bad X-Parley-Call' };
    }
    if (full()) return { reject: 486, reason: 'Busy Here' };
    this.calls.set(info.callId, {
      callId: info.callId,
      organisationId: agent.organisation_id,
      agent: { id: agent.id, voice: agent.voice, languages: agent.languages },
      info,
      transcriptIndex: 0,
      lastUserIndex: -1,
      edge,
    });
    return { accept: true };
  }

  started(info: InviteInfo, dialog: DialogHandle): void {
    const call = this.calls.get(info.callId);
    if (!call) return;
    call.stored = this.storeCall(call);
    call.stored.then((stored) => (call.conversationId = stored.conversationId)).catch(() => {});
    call.stored.catch((error) => {
      this.o.logger?.error({ err: error, callId: info.callId }, 'voice: storing the call failed');
      void dialog.hangup();
    });
    const v = this.o.config.voice;
    const session = new VoiceSession({
      stream: dialog.rtp,
      negotiated: dialog.negotiated,
      remote: { address: dialog.offer.address, port: dialog.offer.port },
      stt: this.stt,
      tts: this.tts,
      fallbackTts: this.fallbackTts,
      sink: this.sink(call),
      voice: call.agent.voice,
      language: call.agent.languages[0],
      silenceTimeoutMs: v.silenceTimeoutMs,
      maxUtteranceMs: v.maxUtteranceMs,
      endpointMs: v.endpointMs,
      hangup: () => dialog.hangup(),
      onPacketSent: this.o.onPacketSent ? (at, due) => this.o.onPacketSent?.(info.callId, at, due) : undefined,
      onError: (error) => this.o.logger?.error({ err: error, callId: info.callId }, 'voice: turn failed'),
    });
    call.session = session;
    call.dialog = dialog;
    this.o.logger?.info({ callId: info.callId, agent: call.agent.id, codec: dialog.negotiated.codec }, 'voice: call answered');
    session.start();
  }

  ended(callId: string, by: 'caller' | 'agent' | 'timeout'): void {
    const call = this.calls.get(callId);
    if (!call) return;
    this.o.logger?.info({ callId, by }, 'voice: call ended');
    call.session?.close();
    if (call.conversationId) this.committed(call.conversationId); // a wait for its reply ends
    const ending = this.finish(call, by)
      .catch((error) => this.o.logger?.error({ err: error, callId }, 'voice: recording the end of a call failed'))
      .finally(() => {
        this.calls.delete(callId);
        this.endings.delete(ending);
      });
    this.endings.add(ending);
  }

  // ------------------------------------------------------------ records

  private async storeCall(call: ActiveCall) {
    if (call.edge) return this.storeEdgeCall(call, call.edge);
    const actor = systemActor(call.organisationId, 'sip');
    const startedAt = new Date();
    return this.records.transaction(async (records) => {
      const conversation = await records.create(actor, 'Conversation', {
        channel: 'voice',
        mode: 'voice',
        status: 'active',
        ai_agent_id: call.agent.id,
        metadata: { sip: { call_id: call.callId, from: call.info.from, to: call.info.to } },
      });
      const row = await records.create(actor, 'Call', {
        direction: 'inbound',
        from_number: call.info.from.slice(0, 255),
        to_number: call.info.to.slice(0, 255),
        status: 'in_progress',
        call_uuid: call.callId,
        call_source: 'voice',
        started_at: startedAt,
        conversation_id: conversation.id,
      });
      for (const [role, member] of [
        ['caller', `sip:${call.info.from}`.slice(0, 255)],
        ['agent', call.agent.id],
      ])
        await records.create(actor, 'CallParticipant', { call_id: row.id, member_uuid: member, role, joined_at: startedAt });
      return { callRowId: row.id, conversationId: conversation.id, startedAt };
    });
  }

  /**
   * A call the SIP edge relayed is ONE Call, the edge's (docs/voice.md, "One Call per Call-ID"): the runtime applies
   * the edge's `initiated` event itself (carried in X-Parley-Call), so that the Call, its Conversation and the
   * caller's leg exist when the first turn is stored, whichever of the two gets there first.
   */
  private async storeEdgeCall(call: ActiveCall, edge: CallEvent) {
    await this.callEvents.apply({ ...edge, event: 'initiated' });
    const row = await this.o.db
      .selectFrom('calls')
      .select(['id', 'conversation_id', 'started_at'])
      .where('organisation_id', '=', call.organisationId)
      .where('call_uuid', '=', call.callId)
      .executeTakeFirstOrThrow();
    if (!row.conversation_id) throw new Error(`call ${call.callId} has no conversation`);
    return { callRowId: row.id, conversationId: row.conversation_id, startedAt: row.started_at ?? new Date() };
  }

  /** The call is over: its status, its legs' end, and its conversation closed, in one transaction. */
  private async finish(call: ActiveCall, by: 'caller' | 'agent' | 'timeout'): Promise<void> {
    if (!call.stored) return; // never confirmed: nothing was stored
    const stored = await call.stored;
    // A turn still in flight is left to finish (the session is closed, so nothing more is spoken or
    // waited for), then the agent runtime gets a moment to commit its answer before the conversation closes.
    await Promise.race([call.session?.idle(), new Promise((r) => setTimeout(r, 3000))]);
    const caughtUp = sql<{ ok: boolean }>`SELECT last_handled_index >= ${call.lastUserIndex} AS ok FROM agent_turns
      WHERE conversation_id = ${stored.conversationId}`;
    if (call.lastUserIndex >= 0)
      await this.whenCommitted(
        stored.conversationId,
        Date.now() + 3000,
        async () => (await caughtUp.execute(this.o.db)).rows[0]?.ok || undefined,
      );
    // The edge's call: its end (status, legs, conversation) is the edge's, from the dialog's end.
    if (!call.edge) await this.endCall(call.organisationId, stored, by === 'timeout' ? 'failed' : 'completed');
  }

  /** A call's end, in one transaction: its status (talk time from `startedAt`), its legs left, its conversation closed. */
  private async endCall(organisationId: string, c: { callRowId: string; conversationId: string | null; startedAt?: Date }, status: string) {
    const { callRowId, conversationId, startedAt } = c;
    const actor = systemActor(organisationId, 'sip');
    const ended = new Date();
    // Reads first: the embedded database's one connection belongs to the transaction while it runs.
    const legs = await this.o.db
      .selectFrom('call_participants')
      .select('id')
      .where('call_id', '=', callRowId)
      .where('left_at', 'is', null)
      .execute();
    const conv = conversationId
      ? await this.o.db.selectFrom('conversations').select('status').where('id', '=', conversationId).executeTakeFirst()
      : undefined;
    const duration = startedAt && { duration_seconds: Math.max(0, Math.round((ended.getTime() - startedAt.getTime()) / 1000)) };
    await this.records.transaction(async (records) => {
      await records.update(actor, 'Call', callRowId, { status, ended_at: ended, ...duration });
      for (const leg of legs) await records.update(actor, 'CallParticipant', leg.id, { left_at: ended });
      // A handed-off conversation stays pending for its operator; an active one ends with the call.
      if (conversationId && conv?.status === 'active') await records.update(actor, 'Conversation', conversationId, { status: 'closed' });
    });
  }

  /**
   * Reads `read` until it gives an answer or the deadline passes, again after each announced commit of a turn of
   * the conversation, its call's end, or a safety net (docs/voice.md, "Waiting for the reply"). The wake-up is armed
   * before each read, so that a commit announced while the read runs is not missed.
   */
  private async whenCommitted<T>(conversationId: string, deadline: number, read: () => Promise<T | undefined>): Promise<T | undefined> {
    const safetyMs = this.o.listen || this.o.agents?.onCommit ? 1000 : 20;
    while (Date.now() < deadline) {
      let wake = () => {};
      const woken = new Promise<void>((resolve) => (wake = resolve));
      const waiting = this.waiting.get(conversationId) ?? new Set();
      this.waiting.set(conversationId, waiting.add(wake));
      const timer = setTimeout(wake, Math.min(safetyMs, deadline - Date.now()));
      try {
        const answer = await read();
        if (answer !== undefined) return answer;
        await woken;
      } finally {
        clearTimeout(timer);
        waiting.delete(wake);
        if (waiting.size === 0) this.waiting.delete(conversationId);
      }
    }
    return undefined;
  }

  private committed(conversationId: string): void {
    for (const wake of this.waiting.get(conversationId) ?? []) wake();
  }

  /** Calls a previous run of the voice runtime left open end as `failed` (the runtime stopped, not the caller). */
  private async reconcile(): Promise<void> {
    const open = await this.o.db
      .selectFrom('calls')
      .select(['id', 'organisation_id', 'conversation_id'])
      .where('call_source', '=', 'voice')
      .where('status', 'in', ['initiated', 'ringing', 'in_progress'])
      .execute();
    for (const row of open) await this.endCall(row.organisation_id, { callRowId: row.id, conversationId: row.conversation_id }, 'failed');
  }

  // ------------------------------------------------------------ the session's sink

  private sink(call: ActiveCall): CallSink {
    const actor = () => systemActor(call.organisationId, 'sip');
    const transcript = (
      records: Records,
      speaker: 'caller' | 'agent',
      content: string,
      itemId: string,
      metadata: Record<string, unknown>,
      callRowId: string,
    ) =>
      records.create(actor(), 'CallTranscript', {
        call_id: callRowId,
        speaker,
        content: content.slice(0, 32 * 1024),
        item_id: itemId,
        content_index: call.transcriptIndex++,
        occurred_at: new Date(),
        metadata,
      });
    return {
      userTurn: async ({ text, kind, metadata = {} }) => {
        const stored = await call.stored!;
        const itemId = `voice_${randomUUID().replaceAll('-', '')}`;
        // The caller's words are a user item and a caller transcript line, stored together.
        const index = await this.records.transaction(async (records) => {
          const item = await records.create(actor(), 'ConversationItem', {
            conversation_id: stored.conversationId,
            role: 'user',
            modality: 'audio',
            content: text.slice(0, 32 * 1024),
            item_id: itemId,
            metadata: { source: 'voice', input: kind, ...metadata },
          });
          if (kind !== 'connected') await transcript(records, 'caller', text, itemId, metadata, stored.callRowId);
          return item.record.attributes.content_index;
        });
        call.lastUserIndex = index;
        this.o.logger?.debug({ callId: call.callId, text, kind }, 'voice: caller turn stored');
        this.o.agents?.wake();
        return this.awaitReply(call, stored.conversationId, index, itemId);
      },
      agentLine: async (text, metadata, itemId) => {
        const stored = await call.stored!;
        await this.records.transaction((records) =>
          transcript(records, 'agent', text, itemId ?? `voice_${randomUUID().replaceAll('-', '')}`, metadata, stored.callRowId),
        );
      },
      handoff: (reason) => this.handOff(call, reason, { rule: 'speech_failure' }),
    };
  }

  /**
   * A handed-off call goes to its operator (docs/voice.md, "Handoff on a call"): the one the agent runtime's queue
   * offered the conversation to (routing.ts, `assigned_operator`), by a blind transfer (`refer`). Resolves with a
   * line to say before hanging up when no operator was offered or the transfer failed; the conversation stays queued.
   */
  private async transfer(call: ActiveCall, conversationId: string): Promise<string | undefined> {
    if (!call.dialog) return NO_OPERATOR_TEXT;
    const operator = await this.assignedOperator(call.organisationId, conversationId, 3000);
    if (!operator) {
      this.o.logger?.info({ callId: call.callId }, 'voice: handoff with no operator available');
      return NO_OPERATOR_TEXT;
    }
    if (!(await this.refer(call, operator.sip_username, operator.domain))) return NO_OPERATOR_TEXT;
    // Behind the edge, the caller's new call to the operator is linked to this Call by the edge (route[INITIAL],
    // docs/sip.md "Transfers"): the operator joins it as the transfer's answered leg, and goes busy there; a call
    // that reached the runtime directly gets the operator's leg (role `operator`) here.
    if (!call.edge) await this.callEvents.operatorJoined(call.organisationId, (await call.stored!).callRowId, operator.id, new Date());
    return undefined;
  }

  /**
   * transfer_call (docs/voice.md, "The agent's tools on a call"): the caller is REFERred to the number or SIP user
   * the model named, in the organisation's SIP domain, so that the edge routes and records the new call as any of
   * the organisation's. A transfer that does not happen hands the conversation to an operator, whose phone is then tried.
   */
  private async transferCall(call: ActiveCall, conversationId: string, target: TransferTarget): Promise<string | undefined> {
    const org = await this.o.db
      .selectFrom('organisations')
      .select(sql<string>`parley_sip_domain(slug)`.as('domain'))
      .where('id', '=', call.organisationId)
      .executeTakeFirstOrThrow();
    if (await this.refer(call, target.to, org.domain)) {
      if (call.edge) return undefined;
      // A call that reached the runtime directly: the target's leg is recorded here (the edge is not there to).
      await this.records.create(systemActor(call.organisationId, 'sip'), 'CallParticipant', {
        call_id: (await call.stored!).callRowId,
        member_uuid: target.kind === 'sip_user' ? target.sip_user_id : `sip:${target.to}`,
        role: 'callee',
        joined_at: new Date(),
      });
      return undefined;
    }
    if (call.session?.isClosed) return undefined; // the caller hung up meanwhile
    await this.handOff(call, `The transfer to ${target.to} did not go through.`, { rule: 'transfer_failed', transfer: target });
    return this.transfer(call, conversationId);
  }

  /**
   * A blind transfer through the edge (RFC 3515): REFER with Refer-To `sip:<user or number>@<organisation
   * domain>`; true once the caller's NOTIFY reports the target's answer (RFC 3515 2.4.5). The caller's leg then
   * ends (BYE, RFC 5589 section 6: the session hangs up after this resolves).
   */
  private async refer(call: ActiveCall, user: string, domain: string): Promise<boolean> {
    const dialog = call.dialog;
    if (!dialog) return false;
    const target = `sip:${user}@${domain}`;
    call.transferTo = target;
    this.o.logger?.info({ callId: call.callId, target }, 'voice: transferring the call (REFER)');
    const status = await dialog.refer(target, `sip:agent-${call.agent.id}@${domain}`, TRANSFER_TIMEOUT_MS);
    if (status >= 200 && status < 300) return true;
    this.o.logger?.info({ callId: call.callId, target, status }, 'voice: transfer failed');
    return false;
  }

  /** Hands the call's conversation to the operator queue (still active only: an operator may have it already). */
  private async handOff(call: ActiveCall, reason: string, metadata: Record<string, unknown>): Promise<void> {
    const stored = await call.stored!;
    await inTransaction(this.o.db, async (trx) => {
      const conv = await trx.selectFrom('conversations').select('status').where('id', '=', stored.conversationId).executeTakeFirst();
      if (conv?.status !== 'active') return;
      const records = createRecords({ db: trx, registry: this.registry, services: this.o.services });
      await handOff(
        records,
        { id: stored.conversationId, organisation_id: call.organisationId },
        reason,
        `handoff_voice_${randomUUID().replaceAll('-', '')}`,
        metadata,
      );
    });
  }

  /** The SIP user (registered ones first) of the operator the handoff queue offered the conversation to. */
  private async assignedOperator(organisationId: string, conversationId: string, waitMs: number) {
    const deadline = Date.now() + waitMs;
    for (;;) {
      const { rows } = await sql<{ id: string; sip_username: string; domain: string }>`
        SELECT s.id, s.sip_username, parley_sip_domain(o.slug) AS domain
        FROM conversations c
        JOIN sip_users s ON s.organisation_id = c.organisation_id AND s.user_id::text = c.metadata->>'assigned_operator'
        JOIN organisations o ON o.id = s.organisation_id
        WHERE c.id = ${conversationId} AND c.organisation_id = ${organisationId}
        ORDER BY EXISTS (SELECT 1 FROM sip_locations l WHERE l.username = s.sip_username AND l.domain = parley_sip_domain(o.slug)) DESC,
                 s.created_at, s.id
        LIMIT 1`.execute(this.o.db);
      if (rows[0]) return rows[0];
      if (Date.now() >= deadline) return undefined;
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /**
   * Waits until the agent runtime has handled the user item (its cursor passed it: the turn committed),
   * then reads what it wrote: the assistant reply, and whether the call should end (the workflow's `end`
   * step, a closed conversation) or be transferred once the reply is said (a handoff: to the operator the queue
   * offers it to; transfer_call: to the target on the turn's tool item).
   */
  private async awaitReply(call: ActiveCall, conversationId: string, userIndex: number, itemId: string): Promise<Reply | undefined> {
    const c = this.o.config;
    const row = await this.whenCommitted(conversationId, Date.now() + c.llmTimeoutMs * (c.llmMaxRetries + 1) + 10_000, async () => {
      if (call.session?.isClosed) return null;
      // One statement: the turn's cursor and what the turn wrote once the cursor has passed the user item (its
      // reply, and the tool item naming transfer_call's target, src/agents/runtime.ts `metadata.tool.transfer`).
      const { rows } = await sql<{
        handled: boolean;
        workflow_state: WorkflowState | null;
        status: string;
        content: string | null;
        item_id: string | null;
        target: TransferTarget | null;
      }>`
        SELECT t.last_handled_index >= ${userIndex} AS handled, t.workflow_state, c.status, r.content, r.item_id, x.target
        FROM conversations c
        LEFT JOIN agent_turns t ON t.conversation_id = c.id
        LEFT JOIN LATERAL (SELECT content, item_id FROM conversation_items WHERE conversation_id = c.id AND role = 'assistant'
          AND content_index > ${userIndex} AND metadata->>'in_reply_to' = ${itemId} ORDER BY content_index LIMIT 1) r
          ON t.last_handled_index >= ${userIndex}
        LEFT JOIN LATERAL (SELECT metadata->'tool'->'transfer' AS target FROM conversation_items WHERE conversation_id = c.id
          AND role = 'tool' AND content_index > ${userIndex} AND metadata->>'in_reply_to' = ${itemId} AND metadata->'tool' ? 'transfer' LIMIT 1) x
          ON t.last_handled_index >= ${userIndex}
        WHERE c.id = ${conversationId}`.execute(this.o.db);
      // Not answered yet while the conversation is active; no answer will come once it is not.
      return rows[0]?.handled ? rows[0] : rows[0]?.status === 'active' ? undefined : null;
    });
    if (!row) return undefined;
    const at = performance.now();
    const hangup = row.status !== 'active' || row.workflow_state?.ended === true;
    this.o.logger?.debug({ callId: call.callId, reply: row.content, hangup }, 'voice: agent answered');
    // Handed off (pending): after the reply, or the handoff line when the turn wrote none (the model
    // failed, or a workflow handoff step), the call goes to the operator the queue offers it to.
    let transfer = row.status === 'pending' ? () => this.transfer(call, conversationId) : undefined;
    const target = row.target;
    if (target && row.status === 'active') transfer = () => this.transferCall(call, conversationId, target);
    if (row.content !== null)
      return { text: row.content, hangup: hangup || transfer !== undefined, at, itemId: row.item_id ?? undefined, transfer };
    if (row.status === 'pending') return { text: HANDOFF_TEXT, hangup: true, at, transfer };
    return undefined;
  }
}
