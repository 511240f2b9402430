/**
 * The agent runtime (docs/agents.md, "How the work is found and claimed"). It finds conversations with work in
 * `agent_work` (migration 0018), so that looking costs what there is to do, not what the database holds; it
 * looks when the outbox announces a commit (`parley_events`, the one change channel) and every `AGENT_POLL_MS`
 * as a safety net (a lease that ran out announces nothing). A conversation is claimed through its `agent_turns`
 * lease (`FOR UPDATE SKIP LOCKED`, renewed while a turn runs, taken over by another worker when it runs out),
 * so its turns run one at a time and never twice. A turn's reply, the conversation's changes and the moved
 * cursor commit in one transaction, only while the lease is still held (checked under lock), and the reply's
 * `item_id` is derived from the user item's (`reply_<id>`): a turn takes effect exactly once.
 *
 * A turn that cannot be stored is retried at most `AGENT_MAX_ATTEMPTS` times for the same user item, then
 * handed to an operator (docs/agents.md, "What a turn may store"). What a visitor controls is made to fit
 * before anything is stored, so that no retried turn calls the model again for the same refusal.
 */
import { randomUUID } from 'node:crypto';
import { type Selectable, sql } from 'kysely';
import type { Logger } from 'pino';
import type { Config } from '../config/index.js';
import { type DatabaseHandle, inTransaction } from '../db/connection.js';
import type { Db, Schema } from '../db/schema.js';
import { WorkLoop } from '../db/work-loop.js';
import { systemActor } from '../jsonapi/actor.js';
import { EVENTS_CHANNEL } from '../jsonapi/outbox.js';
import { createRecords, type Records } from '../jsonapi/records.js';
import type { Registry } from '../jsonapi/query/parse.js';
import { buildRegistry } from '../jsonapi/routes.js';
import type { AppServices } from '../jsonapi/index.js';
import type { Workflow } from '../resources/ai-agent-workflow.js';
import { CONTENT_MAX_BYTES } from '../resources/conversation-item.js';
import { CONVERSATION_METADATA_MAX_BYTES } from '../resources/conversation.js';
import { resources } from '../resources/index.js';
import { checkGuardrails, parseGuardrails, quotesInstructions, REFUSAL_TEXT, type GuardrailTrip } from './guardrails.js';
import { DEFAULT_RESULTS, formatHits, knowledgeMode, MAX_SEARCHES_PER_TURN, searchKnowledge, sourcesOf } from './knowledge.js';
import type { KnowledgeHit } from './knowledge.js';
import { createChatModel, ModelFailure, type ChatMessage, type ChatModel, type ModelAnswer } from './llm.js';
import { Analyst } from './analysis.js';
import { assignQueued, handOff } from './routing.js';
import { isCall, mockTools, offeredTools, runToolCall, TOOL_WAIT_CHANNEL } from './tools.js';
import type { ToolEffect, ToolEnvironment, ToolOutcome, TransferTarget } from './tools.js';
import { HANDOFF_TEXT, planTurn, type WorkflowState } from './workflow.js';

export interface TurnTiming {
  conversationId: string;
  userItemId: string;
  /** performance.now() marks: turn started (claimed), model request sent, last token, reply committed. */
  startedAt: number;
  requestSentAt?: number;
  lastTokenAt?: number;
  committedAt: number;
}

export interface RuntimeOptions {
  db: Db;
  services: AppServices;
  config: Config;
  logger?: Logger;
  /** The model; default: the one the configuration names (none without LLM_BASE_URL / LLM_API_KEY). */
  model?: ChatModel | null;
  /** Called after each committed turn (benchmarks). */
  onTurn?: (timing: TurnTiming) => void;
  /** The database's notifications: the runtime looks for work when a commit is announced, and polls only as a safety net. */
  listen?: DatabaseHandle['listen'];
}

/**
 * Each commit of a conversation's turn is announced here with the conversation's id, so that a call waiting for
 * the reply (src/voice/runtime.ts) reads it once, when it is there, instead of polling (docs/voice.md, "A call").
 */
export const TURN_CHANNEL = 'parley_turns';

/** Under a stream of commits (one notification each), the runtime looks at most this often. */
const WAKE_GAP_MS = 25;

/** What the end of a conversation's run does with its `agent_work` row. */
type Outcome = 'more' | 'done' | 'park';

/** The columns of a conversation, its agent and its items that a turn reads (their JSON with their declared shapes). */
type Row<Table extends keyof Schema> = Selectable<Schema[Table]>;
export type Conversation = Pick<Row<'conversations'>, 'id' | 'organisation_id' | 'status' | 'channel' | 'mode' | 'ai_agent_id'> & {
  metadata: Record<string, unknown>;
};
export type Agent = Pick<Row<'ai_agents'>, 'id' | 'published' | 'name' | 'tone' | 'languages' | 'system_prompt' | 'safety_guardrails'> & {
  workflow: Workflow;
};
export type Item = Pick<Row<'conversation_items'>, 'id' | 'item_id' | 'role' | 'modality' | 'content' | 'content_index'>;

/** A tool call a turn made, as the conversation records it (a `tool` item operators see and visitors do not). */
export interface RecordedToolCall extends Pick<ToolOutcome, 'ok' | 'result' | 'refused' | 'status'> {
  id: string;
  name: string;
  arguments: Record<string, unknown>;
  duration_ms: number;
  /** transfer_call's target: where the voice runtime sends the call once the reply is spoken. */
  transfer?: TransferTarget & { reason: string };
}

/** What a turn decided, before anything is stored. */
export interface TurnResult {
  userItem: Item;
  /** The tool calls the model made, in order. */
  tools?: RecordedToolCall[];
  /** The assistant item (a reply or a refusal); absent when a failure hands off without one. */
  reply?: { content: string; metadata: Record<string, unknown> };
  /** `detail`: what went wrong, for the log and `agent run` (operators); never stored in an item. */
  handoff?: { reason: string; metadata: Record<string, unknown>; detail?: string };
  answers: Record<string, string>;
  close: boolean;
  state: WorkflowState;
  requestSentAt?: number;
  lastTokenAt?: number;
}

class LeaseLost extends Error {}

/** A user item's turn failed after the lease was taken: decided or stored, it did not commit. */
class TurnFailed extends Error {
  constructor(
    readonly item: Item,
    readonly reason: unknown,
  ) {
    super(String((reason as Error)?.message ?? reason));
  }
}

/**
 * Room kept in a conversation's metadata for what a handoff and an assignment add after the answers
 * (`handoff_reason`, at most 500 characters, `assigned_operator`, `assigned_at`).
 */
const METADATA_RESERVE_BYTES = 2048;

/** What the reply says when the model ended the conversation, or asked for a transfer, without a word of its own. */
const GOODBYE_TEXT = 'Thank you for contacting us. Goodbye!';
const TRANSFER_TEXT = 'I am transferring you now. Please hold.';

const PAUSED = (metadata: Record<string, unknown>) => metadata.agent_paused === true;
/** Characters per token, for bounding the history without a tokenizer. */
const CHARS_PER_TOKEN = 4;

export class AgentRuntime {
  private readonly db: Db;
  private readonly registry: Registry;
  private readonly model: ChatModel | undefined;
  /** Analyses of closed conversations (src/agents/analysis.ts), claimed by the same ticks as the turns. */
  private readonly analyst: Analyst;
  private readonly inFlight = new Set<string>();
  /**
   * Ticks on each commit announced (at most every WAKE_GAP_MS), at once after a turn ends, every AGENT_POLL_MS,
   * and again at once while a tick found work and there is room for more.
   */
  private readonly loop: WorkLoop;
  private lastAnalysisLook = 0;
  /** In-process subscribers to committed turns (a voice runtime beside this one), by `onCommit`. */
  private readonly committed = new Set<(conversationId: string) => void>();
  /** Crashed (tests): stop renewing leases and never commit, as a killed process would. */
  private dead = false;
  /** Where failed polls and turns are logged (`serve` sets the server's logger once it is built). */
  logger: Logger | undefined;

  constructor(private readonly options: RuntimeOptions) {
    this.db = options.db;
    this.logger = options.logger;
    this.registry = buildRegistry(resources);
    this.model = options.model === undefined ? createChatModel(options.config) : (options.model ?? undefined);
    this.analyst = new Analyst({
      db: this.db,
      config: options.config,
      model: this.model,
      records: (trx) => this.records(trx),
      logger: () => this.logger,
    });
    this.loop = new WorkLoop({
      work: async () => (await this.tick()) > 0 && this.inFlight.size < options.config.agentConcurrency,
      pollMs: options.config.agentPollMs,
      gapMs: WAKE_GAP_MS,
      listen: options.listen,
      channel: EVENTS_CHANNEL,
      onError: (error, during) =>
        during === 'listen'
          ? this.logger?.warn({ err: error }, 'agent runtime: cannot listen for commits; polling only')
          : this.logger?.error({ err: error }, 'agent runtime: poll failed'),
    });
  }

  private records(trx: Db): Records {
    return createRecords({ db: trx, registry: this.registry, services: this.options.services });
  }

  start(): void {
    void this.loop.start();
  }

  /** Finishes the turns in flight, then stops. */
  async stop(): Promise<void> {
    await this.loop.stop();
    while (this.inFlight.size > 0) await new Promise((r) => setTimeout(r, 10));
    await this.analyst.idle();
  }

  /** As if the process were killed: nothing more is committed and leases are left to expire. */
  crash(): void {
    this.dead = true;
    void this.loop.stop();
  }

  /** Calls `listener` with the conversation's id after each commit of a turn (what TURN_CHANNEL announces). */
  onCommit(listener: (conversationId: string) => void): () => void {
    this.committed.add(listener);
    return () => this.committed.delete(listener);
  }

  /** Look for work now instead of at the next poll. */
  wake(): void {
    this.loop.wake(true);
  }

  /** One poll: offer queued handoffs, then claim conversations with work and run them in the background. */
  async tick(): Promise<number> {
    const queued = await this.db
      .selectFrom('agent_handoffs')
      .select('conversation_id')
      .where('assigned_user_id', 'is', null)
      .limit(1)
      .executeTakeFirst();
    if (queued) await assignQueued(this.db, (trx) => this.records(trx));
    // Analyses run beside the turns, bounded by the same concurrency on their own. They are looked for once per
    // AGENT_POLL_MS, not at every wake-up: a closed conversation waits at most that long for its analysis, and
    // the turns' hot path (a look per commit announcement) pays no extra statement.
    if (!this.dead && Date.now() - this.lastAnalysisLook >= this.options.config.agentPollMs) {
      this.lastAnalysisLook = Date.now();
      await this.analyst.tick(this.options.config.agentConcurrency);
    }
    const room = this.options.config.agentConcurrency - this.inFlight.size;
    if (room <= 0) return 0;
    const claimed = await this.claim(room);
    for (const turn of claimed) {
      this.inFlight.add(turn.conversation_id);
      void this.runConversation(turn.conversation_id, turn.lease_token)
        .catch((error) => this.logger?.error({ err: error, conversation: turn.conversation_id }, 'agent runtime: turn failed'))
        .finally(() => {
          this.inFlight.delete(turn.conversation_id);
          this.wake();
        });
    }
    return claimed.length;
  }

  /**
   * Leases the candidates (`claimCandidates`). A conversation seen for the first time starts its cursor at its last
   * non-user item: what came before the runtime took it up is history, answered already. Whether it still needs a
   * turn is decided by `step` under the lease, which then deletes or parks its `agent_work` row.
   */
  private async claim(limit: number): Promise<{ conversation_id: string; lease_token: string }[]> {
    const candidates = await claimCandidates(limit, [...this.inFlight]).execute(this.db);
    if (candidates.rows.length === 0) return [];
    for (const c of candidates.rows.filter((r) => !r.has_turn)) {
      await sql`
        INSERT INTO agent_turns (conversation_id, organisation_id, last_handled_index)
        VALUES (${c.id}, ${c.organisation_id},
                (SELECT COALESCE(max(content_index), -1) FROM conversation_items WHERE conversation_id = ${c.id} AND role <> 'user'))
        ON CONFLICT (conversation_id) DO NOTHING`.execute(this.db);
    }
    const token = randomUUID();
    const ids = candidates.rows.map((r) => r.id);
    const claimed = await sql<{ conversation_id: string }>`
      UPDATE agent_turns SET lease_until = now() + ${this.options.config.agentLeaseMs} * interval '1 millisecond',
             lease_token = ${token}, attempts = attempts + 1, updated_at = now()
      WHERE conversation_id IN (
        SELECT conversation_id FROM agent_turns
        WHERE conversation_id IN (${sql.join(ids)}) AND (lease_until IS NULL OR lease_until < now())
        FOR UPDATE SKIP LOCKED)
      RETURNING conversation_id`.execute(this.db);
    return claimed.rows.map((r) => ({ conversation_id: r.conversation_id, lease_token: token }));
  }

  /** Runs a claimed conversation's turns one at a time until it is caught up, then lets the lease go. */
  private async runConversation(conversationId: string, token: string): Promise<void> {
    const renewMs = Math.max(50, Math.floor(this.options.config.agentLeaseMs / 3));
    const renew = setInterval(() => {
      if (this.dead) return;
      void sql`UPDATE agent_turns SET lease_until = now() + ${this.options.config.agentLeaseMs} * interval '1 millisecond'
               WHERE conversation_id = ${conversationId} AND lease_token = ${token}`
        .execute(this.db)
        .catch(() => {});
    }, renewMs);
    try {
      let last: { outcome: Outcome; version: string | null };
      for (;;) {
        if (this.dead) return;
        last = await this.step(conversationId, token);
        if (last.outcome !== 'more') break;
      }
      if (this.dead) return;
      await this.release(conversationId, token);
      await this.settle(conversationId, last.outcome, last.version);
    } catch (error) {
      if (error instanceof LeaseLost) return;
      const message = String((error as Error)?.message ?? error);
      if (!(error instanceof TurnFailed)) {
        await this.db
          .updateTable('agent_turns')
          .set({ last_error: message })
          .where('conversation_id', '=', conversationId)
          .execute()
          .catch(() => {});
        throw error;
      }
      // Failures are counted per user item, so a turn that can never be stored ends after a bounded number of
      // leases instead of calling the model again every lease for ever.
      const counted = await sql<{ failures: number }>`
        UPDATE agent_turns SET last_error = ${message},
               failures = CASE WHEN failed_index = ${error.item.content_index} THEN failures + 1 ELSE 1 END,
               failed_index = ${error.item.content_index}
        WHERE conversation_id = ${conversationId} AND lease_token = ${token}
        RETURNING failures`
        .execute(this.db)
        .catch(() => undefined);
      const failures = counted?.rows[0]?.failures;
      if (failures === undefined || failures < this.options.config.agentMaxAttempts || this.dead) throw error;
      this.logger?.warn(
        { err: error.reason, conversation: conversationId, item: error.item.id, attempts: failures },
        'agent runtime: a turn failed on every attempt; handing the conversation to an operator',
      );
      await this.giveUp(conversationId, token, error.item, failures);
      await this.release(conversationId, token);
    } finally {
      clearInterval(renew);
    }
  }

  /** Lets the lease go (and resets its attempts): the conversation is caught up or handed over. */
  private async release(conversationId: string, token: string): Promise<void> {
    await this.db
      .updateTable('agent_turns')
      .set({ lease_until: null, lease_token: null, attempts: 0, updated_at: sql`now()` })
      .where('conversation_id', '=', conversationId)
      .where('lease_token', '=', token)
      .execute();
  }

  /**
   * The last attempt at a user item failed too: the conversation goes to an operator with a system item
   * saying so (no assistant reply), and the cursor passes the item. Should even that be refused, the cursor
   * passes the item alone: nothing is retried again.
   */
  private async giveUp(conversationId: string, token: string, item: Item, attempts: number): Promise<void> {
    const { conversation, state } = await this.load(conversationId);
    if (!conversation) return;
    const reason = 'The agent could not store its answer; an operator will take over.';
    const key = item.id.replaceAll('-', '');
    try {
      await this.commit(conversationId, token, item.content_index, state, async (_trx, records) => {
        await handOff(records, conversation, reason, `handoff_${key}`, { rule: 'turn_failed', attempts });
      });
    } catch (error) {
      if (error instanceof LeaseLost) throw error;
      this.logger?.error({ err: error, conversation: conversationId }, 'agent runtime: the handoff after failed attempts failed too');
      await this.commit(conversationId, token, item.content_index, state, async () => {});
      return;
    }
    await assignQueued(this.db, (trx) => this.records(trx));
  }

  /**
   * Caught up: the `agent_work` row goes; the agent unpublished: it is parked until the agent is published again.
   * Either only at the version read before the items were last looked at: a commit since bumped it, and the row
   * stays for the next claim (made at once: `runConversation`'s caller wakes the runtime).
   */
  private async settle(conversationId: string, outcome: Outcome, version: string | null): Promise<void> {
    if (version === null) return;
    const at = { conversation_id: conversationId, version };
    if (outcome === 'park')
      await this.db
        .updateTable('agent_work')
        .set({ parked: true })
        .where((w) => w.and(at))
        .execute();
    else
      await this.db
        .deleteFrom('agent_work')
        .where((w) => w.and(at))
        .execute();
  }

  private async load(conversationId: string) {
    // One read for the conversation, its agent, its turn state and its work row's version, then one for the
    // items past the cursor (a later statement: an item it misses committed after the version was read).
    const { rows } = await sql<
      Conversation & { last_handled_index: number | null; workflow_state: WorkflowState | null; work_version: string | null } & {
        agent: Agent | null;
      }
    >`
      SELECT c.id, c.organisation_id, c.status, c.channel, c.mode, c.metadata, c.ai_agent_id, t.last_handled_index, t.workflow_state,
             w.version::text AS work_version,
             CASE WHEN a.id IS NULL THEN NULL ELSE json_build_object('id', a.id, 'published', a.published, 'name', a.name, 'tone', a.tone,
               'languages', a.languages, 'workflow', a.workflow, 'system_prompt', a.system_prompt, 'safety_guardrails', a.safety_guardrails) END AS agent
      FROM conversations c
      LEFT JOIN agent_turns t ON t.conversation_id = c.id
      LEFT JOIN ai_agents a ON a.id = c.ai_agent_id
      LEFT JOIN agent_work w ON w.conversation_id = c.id
      WHERE c.id = ${conversationId}`.execute(this.db);
    const row = rows[0];
    if (!row) return { conversation: undefined, agent: undefined, taken: false, state: {}, pending: [] as Item[], version: null };
    const { last_handled_index, workflow_state, work_version, agent, ...conversation } = row;
    const cursor = last_handled_index ?? -1;
    const pending = await sql<Item>`
      SELECT id, item_id, role, modality, content, content_index FROM conversation_items
      WHERE conversation_id = ${conversationId} AND content_index > ${cursor}
      ORDER BY content_index LIMIT 50`.execute(this.db);
    return {
      conversation: conversation as Conversation,
      agent: agent ?? undefined,
      // Taken up already: the conversation has its `agent_turns` row (its cursor is never NULL).
      taken: last_handled_index !== null,
      state: workflow_state ?? {},
      pending: pending.rows,
      version: work_version,
    };
  }

  /**
   * Deals with the items past the cursor up to and including the next turn: `more` when it did something,
   * else what becomes of the conversation's work row (with the version read before the items were).
   */
  private async step(conversationId: string, token: string): Promise<{ outcome: Outcome; version: string | null }> {
    const { conversation, agent, state, pending, version } = await this.load(conversationId);
    const more = { outcome: 'more' as const, version };
    // Nothing past the cursor, or closed (a closed conversation takes no items; reopening it queues it again).
    if (!conversation || pending.length === 0 || conversation.status === 'closed') return { outcome: 'done', version };
    const last = pending[pending.length - 1].content_index;
    // Pending, paused or unpublished: nothing to answer; the cursor follows the conversation.
    if (conversation.status !== 'active' || PAUSED(conversation.metadata) || !agent?.published) {
      if (conversation.status === 'active' && !PAUSED(conversation.metadata)) {
        // Unpublished: the items wait for the agent (publishing it makes the row ready again); no agent at all:
        // attaching one queues the conversation again.
        return { outcome: agent ? 'park' : 'done', version };
      }
      await this.commit(conversationId, token, last, state, async () => {});
      return more;
    }
    const item = pending.find((i) => i.role === 'user' || i.role === 'operator');
    if (!item) {
      await this.commit(conversationId, token, last, state, async () => {});
      return { outcome: 'done', version };
    }
    if (item.role === 'operator') {
      // An operator wrote: they took the conversation over, and the agent stays quiet until it is handed back.
      await this.commit(conversationId, token, item.content_index, state, async (_trx, records) => {
        await records.perform(systemActor(conversation.organisation_id, 'agent'), 'Conversation', 'take_over', conversationId, {});
      });
      return more;
    }
    const startedAt = performance.now();
    let result: TurnResult;
    try {
      result = await this.turn(conversation, agent, state, item, { live: true });
      if (this.dead) throw new LeaseLost();
      await this.store(conversation, token, result);
    } catch (error) {
      if (error instanceof LeaseLost) throw error;
      throw new TurnFailed(item, error);
    }
    const { requestSentAt, lastTokenAt } = result;
    this.options.onTurn?.({ conversationId, userItemId: item.id, startedAt, requestSentAt, lastTokenAt, committedAt: performance.now() });
    return more;
  }

  /**
   * Decides the reply to one user item (no writes, but for the calls of the agent's own tools): guardrails, the
   * workflow, the model and its tool calls. `options.history` replaces the conversation's stored items in the
   * prompt (an agent test suite's conversation is not stored); `options.callDeclared` replaces the HTTP call of
   * declared tools (a suite's mocks).
   */
  async turn(
    conversation: Conversation,
    agent: Agent,
    state: WorkflowState,
    item: Item,
    /** `live`: a stored conversation's turn (not `agent run`, not a suite), whose call hears `say_while_waiting`. */
    options: { history?: Item[]; callDeclared?: ToolEnvironment['callDeclared']; live?: boolean } = {},
  ): Promise<TurnResult> {
    const guardrails = parseGuardrails(agent.safety_guardrails);
    const inputTrip = checkGuardrails(guardrails, item.content, 'input');
    if (inputTrip) return { userItem: item, answers: {}, close: false, state, reply: refusal(inputTrip) };

    const plan = planTurn({
      workflow: agent.workflow ?? {},
      state,
      message: item.content,
      metadata: conversation.metadata,
      modelConfigured: this.model !== undefined,
    });
    // A question's answer goes into the conversation's metadata: cut to the room left there, before the model
    // sees it, so that the turn can be stored (a visitor may answer with 32 KiB; the metadata holds 16).
    plan.answers = fitAnswers(conversation.metadata, plan.answers);
    const scripted = plan.decision.texts;
    const out = { userItem: item, answers: plan.answers, state: plan.state, close: false };
    const source = { source: 'workflow', step: (plan.state.step ?? 0) - 1 };
    if (plan.decision.kind === 'scripted')
      return { ...out, close: plan.decision.close, reply: { content: scripted.join('\n\n'), metadata: source } };
    if (plan.decision.kind === 'handoff')
      return {
        ...out,
        reply: { content: [...scripted, HANDOFF_TEXT].join('\n\n'), metadata: source },
        handoff: { reason: plan.decision.reason, metadata: { rule: plan.decision.rule } },
      };

    // The knowledge base (docs/agents.md, "Knowledge"): passages in the prompt, or a tool the model may call.
    const mode = await knowledgeMode(this.db, agent.id, agent.workflow ?? {});
    const maxResults = agent.workflow?.knowledge?.max_results ?? DEFAULT_RESULTS;
    const found: KnowledgeHit[] =
      mode === 'retrieve' ? await searchKnowledge(this.db, conversation.organisation_id, agent.id, item.content, maxResults) : [];
    const messages = await this.prompt(
      conversation,
      agent,
      item,
      { ...conversation.metadata, ...plan.answers },
      guardrails.instructions,
      plan.decision.instructions,
      options.history,
      mode === 'retrieve' ? found : undefined,
    );
    const started = performance.now();
    const declared = Array.isArray(agent.workflow?.tools) ? agent.workflow.tools : [];
    const env: ToolEnvironment = {
      db: this.db,
      config: this.options.config,
      conversation,
      knowledge: mode === 'tool' ? { agentId: agent.id, maxResults, found, searches: 0 } : undefined,
      callDeclared: options.callDeclared,
      announce:
        options.live && isCall(conversation)
          ? async (tool) => {
              const payload = {
                conversation_id: conversation.id,
                in_reply_to: item.item_id,
                tool: tool.name,
                text: tool.say_while_waiting,
              };
              await sql`SELECT pg_notify(${TOOL_WAIT_CHANNEL}, ${JSON.stringify(payload)})`.execute(this.db);
            }
          : undefined,
    };
    const recorded: RecordedToolCall[] = [];
    const failedTools = new Set<string>();
    const answers = { ...plan.answers };
    let answer: ModelAnswer;
    let attempts = 0;
    let final: { effect?: ToolEffect } | undefined;
    let usage: ModelAnswer['usage'];
    // The turn hands off without a reply: the workflow stays where it was, the tool calls so far are recorded.
    const givenUp = (handoff: NonNullable<TurnResult['handoff']>): TurnResult => ({ ...out, answers, tools: recorded, state, handoff });
    try {
      // The model answers; while it calls tools, their results go back to it, up to AGENT_MAX_TOOL_CALLS calls.
      for (;;) {
        // search_knowledge is offered when the agent's knowledge is a tool (it has documents, mode `tool`), and
        // only up to the bound of searches per turn.
        const search = env.knowledge !== undefined && env.knowledge.searches < MAX_SEARCHES_PER_TURN;
        answer = await this.model!.complete(messages, offeredTools(declared, search));
        attempts += answer.attempts;
        if (answer.usage) {
          usage ??= { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
          for (const key of ['prompt_tokens', 'completion_tokens', 'total_tokens'] as const) usage[key] += answer.usage[key];
        }
        if (answer.toolCalls.length === 0) break;
        if (recorded.length + answer.toolCalls.length > this.options.config.agentMaxToolCalls) {
          this.logger?.warn(
            { conversation: conversation.id, item: item.id, calls: recorded.length, asked: answer.toolCalls.map((c) => c.name) },
            'agent runtime: the tool loop was cut; handing the conversation to an operator',
          );
          return givenUp({
            reason: 'The AI agent could not finish its answer; an operator will take over.',
            metadata: { rule: 'tool_loop', tool_calls: recorded.length },
            detail: `The model asked for more than ${this.options.config.agentMaxToolCalls} tool calls in one turn.`,
          });
        }
        messages.push({
          role: 'assistant',
          content: answer.text || null,
          tool_calls: answer.toolCalls.map((c) => ({
            id: c.id,
            type: 'function' as const,
            function: { name: c.name, arguments: c.invalidArguments ?? JSON.stringify(c.arguments) },
          })),
        });
        for (const call of answer.toolCalls) {
          const callStarted = performance.now();
          // After a call that ends the turn (a handoff, an end), the others are answered but not run.
          const outcome = final
            ? { ok: false, refused: true, result: 'Not run: the turn ended with an earlier call.' }
            : await runToolCall(call, declared, env, failedTools, `tool_${item.id.replaceAll('-', '')}_${recorded.length}`);
          recorded.push({
            id: call.id,
            name: call.name,
            arguments: call.invalidArguments !== undefined ? { _invalid: call.invalidArguments } : call.arguments,
            ok: outcome.ok,
            result: outcome.result,
            ...(outcome.refused ? { refused: true } : {}),
            ...(outcome.status !== undefined ? { status: outcome.status } : {}),
            duration_ms: Math.round(performance.now() - callStarted),
            ...(outcome.effect?.kind === 'transfer' ? { transfer: { ...outcome.effect.target, reason: outcome.effect.reason } } : {}),
          });
          messages.push({ role: 'tool', tool_call_id: call.id, content: outcome.result });
          if (outcome.effect?.kind === 'answer')
            Object.assign(answers, fitAnswers({ ...conversation.metadata, ...answers }, { [outcome.effect.key]: outcome.effect.value }));
          if (outcome.final && !final) final = { effect: outcome.effect };
        }
        if (final) break;
      }
    } catch (error) {
      if (!(error instanceof ModelFailure)) throw error;
      // The provider's error text (it may name a masked key or an internal URL) goes to the log only: the
      // system item is read by everyone in the conversation, the website visitor too.
      this.logger?.warn(
        { conversation: conversation.id, item: item.id, attempts: error.attempts, error: error.message },
        'agent runtime: the model did not answer; handing the conversation to an operator',
      );
      // The user item keeps no assistant reply: the system item says what happened and an operator takes over.
      return givenUp({
        reason: 'The AI model did not answer; an operator will take over.',
        metadata: { rule: 'model_failure', attempts: error.attempts },
        detail: error.message,
      });
    }
    const sources = sourcesOf(found);
    const modelMetadata = {
      source: 'model',
      model: answer.model,
      latency_ms: Math.round(performance.now() - started),
      attempts,
      ...(usage ? { usage } : {}),
      ...(recorded.length > 0 ? { tool_calls: recorded.length } : {}),
      // The passages the model was given for this reply (docs/agents.md, "Knowledge").
      ...(sources.length > 0 ? { sources } : {}),
    };
    const { requestSentAt, lastTokenAt } = answer;
    const done = { ...out, answers, ...(recorded.length > 0 ? { tools: recorded } : {}), requestSentAt, lastTokenAt };
    const outputTrip =
      answer.text === ''
        ? undefined
        : (checkGuardrails(guardrails, answer.text, 'output') ??
          quotesInstructions(answer.text, [agent.system_prompt ?? '', ...guardrails.instructions, plan.decision.instructions ?? '']));
    if (outputTrip) return { ...done, reply: refusal(outputTrip, modelMetadata) };
    const effect = final?.effect;
    const fallback = { transfer: TRANSFER_TEXT, handoff: HANDOFF_TEXT, close: GOODBYE_TEXT, answer: '' }[effect?.kind ?? 'answer'];
    const content = [...scripted, answer.text || fallback].filter(Boolean).join('\n\n');
    // Never empty: the last round had text (the model client retries an answer with neither text nor a call), or
    // it ended the turn with a call, whose default text stands in.
    const reply = { content, metadata: modelMetadata };
    if (effect?.kind === 'handoff')
      return { ...done, reply, handoff: { reason: effect.reason, metadata: { rule: effect.rule, ...effect.metadata } } };
    if (effect?.kind === 'close') return { ...done, reply, close: true };
    // transfer_call: the reply is spoken, then the call is transferred (the target is on the tool item).
    return { ...done, reply };
  }

  /** The prompt: the agent's instructions, then as much recent history as the token budget holds. */
  private async prompt(
    conversation: Conversation,
    agent: Agent,
    item: Item,
    metadata: Record<string, unknown>,
    rules: string[],
    stepInstructions?: string,
    history?: Item[],
    /** Passages retrieved for this turn (`knowledge.mode: retrieve`); undefined when the mode is another. */
    passages?: KnowledgeHit[],
  ): Promise<ChatMessage[]> {
    const lines = [agent.system_prompt?.trim() || `You are ${agent.name}, a helpful assistant.`];
    if (agent.tone) lines.push(`Tone: ${agent.tone}.`);
    if (agent.languages.length > 0)
      lines.push(`Answer in the user's language when it is one of: ${agent.languages.join(', ')}; otherwise in ${agent.languages[0]}.`);
    if (rules.length > 0) lines.push('Safety rules you must follow:', ...rules.map((r) => `- ${r}`));
    if (stepInstructions) lines.push(stepInstructions);
    const known = Object.entries(metadata).filter(
      ([k, v]) => typeof v === 'string' && !['handoff_reason', 'assigned_operator', 'assigned_at'].includes(k),
    );
    if (known.length > 0) lines.push('What you know about this conversation:', ...known.map(([k, v]) => `- ${k}: ${String(v)}`));
    if (passages)
      lines.push(
        'Passages from the knowledge base that may answer the user (answer from them when they do; do not invent facts they lack):',
        formatHits(passages),
      );
    lines.push('Call handoff_to_operator when the user asks for a human or you cannot help.');

    const rows = history
      ? history
          .filter((i) => i.content_index <= item.content_index && ['user', 'assistant', 'operator'].includes(i.role))
          .sort((a, b) => b.content_index - a.content_index)
          .slice(0, 200)
      : (
          await sql<Item>`
      SELECT id, item_id, role, modality, content, content_index FROM conversation_items
      WHERE conversation_id = ${conversation.id} AND content_index <= ${item.content_index} AND role IN ('user', 'assistant', 'operator')
      ORDER BY content_index DESC LIMIT 200`.execute(this.db)
        ).rows;
    let budget = this.options.config.llmHistoryTokens;
    const messages: ChatMessage[] = [];
    for (const row of rows) {
      const cost = Math.ceil(row.content.length / CHARS_PER_TOKEN) + 4;
      // The user's message itself always goes, however long.
      if (messages.length > 0 && cost > budget) break;
      budget -= cost;
      const content = row.role === 'operator' ? `(a human operator wrote) ${row.content}` : row.content;
      messages.unshift({ role: row.role === 'user' ? 'user' : 'assistant', content });
    }
    return [{ role: 'system', content: lines.join('\n') }, ...messages];
  }

  /** Stores a turn: items, conversation changes, workflow state and cursor, in one transaction under the lease. */
  private async store(conversation: Conversation, token: string, result: TurnResult): Promise<void> {
    const actor = systemActor(conversation.organisation_id, 'agent');
    const key = result.userItem.id.replaceAll('-', '');
    await this.commit(conversation.id, token, result.userItem.content_index, result.state, async (trx, records) => {
      let handled: number | undefined;
      // Each tool call and its result, before the reply, as `tool` items: operators see them, visitors do not.
      for (const [n, { id, arguments: args, result: told, ...tool }] of (result.tools ?? []).entries()) {
        await records.create(actor, 'ConversationItem', {
          conversation_id: conversation.id,
          role: 'tool',
          modality: 'text',
          content: storableText(`${tool.name}(${JSON.stringify(args)})\n${told}`),
          item_id: `reply_${key}_tool${n}`,
          metadata: { tool: { ...tool, call_id: id.slice(0, 128) }, in_reply_to: result.userItem.item_id },
        });
      }
      if (result.reply) {
        const content = storableText(result.reply.content);
        const written = await records.create(actor, 'ConversationItem', {
          conversation_id: conversation.id,
          role: 'assistant',
          modality: result.userItem.modality,
          content,
          item_id: `reply_${key}`,
          metadata: {
            ...result.reply.metadata,
            in_reply_to: result.userItem.item_id,
            ...(content !== result.reply.content ? { truncated: true } : {}),
          },
        });
        // The cursor may pass the reply itself when no user or operator item came in between (saves a round).
        const replyIndex = written.record.attributes.content_index;
        const between = await sql`SELECT 1 FROM conversation_items WHERE conversation_id = ${conversation.id}
          AND content_index > ${result.userItem.content_index} AND content_index < ${replyIndex}
          AND role IN ('user', 'operator') LIMIT 1`.execute(trx);
        if (between.rows.length === 0) handled = replyIndex;
      }
      if (Object.keys(result.answers).length === 0 && !result.handoff && !result.close) return handled;
      // Locked: a take-over or assignment committed meanwhile is in the copy the answers are added to.
      const current = await sql<{
        metadata: Record<string, unknown>;
      }>`SELECT metadata FROM conversations WHERE id = ${conversation.id} FOR UPDATE`.execute(trx);
      const answers = fitAnswers(current.rows[0].metadata, result.answers);
      const metadata = { ...current.rows[0].metadata, ...answers };
      if (Object.keys(answers).length > 0) await records.update(actor, 'Conversation', conversation.id, { metadata });
      if (result.handoff) await handOff(records, conversation, result.handoff.reason, `handoff_${key}`, result.handoff.metadata);
      else if (result.close) await records.update(actor, 'Conversation', conversation.id, { status: 'closed' });
      return handled;
    });
    if (result.handoff) await assignQueued(this.db, (trx) => this.records(trx));
  }

  private async commit(
    conversationId: string,
    token: string,
    handledIndex: number,
    state: WorkflowState,
    /** The writes; may return a later index the cursor can move to. */
    work: (trx: Db, records: Records) => Promise<number | void>,
  ): Promise<void> {
    await inTransaction(this.db, async (trx) => {
      const held = await trx
        .selectFrom('agent_turns')
        .select('lease_token')
        .where('conversation_id', '=', conversationId)
        .forUpdate()
        .executeTakeFirst();
      if (this.dead || held?.lease_token !== token) throw new LeaseLost();
      const further = await work(trx, this.records(trx));
      await sql`UPDATE agent_turns SET last_handled_index = GREATEST(last_handled_index, ${Math.max(handledIndex, further ?? -1)}),
                workflow_state = ${JSON.stringify(state)}::jsonb, last_error = NULL, updated_at = now()
                WHERE conversation_id = ${conversationId}`.execute(trx);
    });
    // To other processes in a statement of its own, at once: batched with the outbox's (notifyAfterCommit, up to
    // 10 ms and behind a batch in flight) the waiting call heard of its reply later than by the 20 ms poll this
    // replaces (bench:voice, docs/benchmarks.md "The reply's wake-up").
    void sql`SELECT pg_notify(${TURN_CHANNEL}, ${conversationId})`.execute(this.db).catch(() => {});
    for (const listener of this.committed) listener(conversationId);
  }

  /** The reply the next unanswered user item would get, without storing anything (`agent run`). */
  async dryRun(
    conversationId: string,
    /** Answers of declared tools by name (`agent run --mock-tools`): those are not called; the others are. */
    mocks: Record<string, unknown> = {},
  ): Promise<TurnResult | { nothing: string }> {
    const { conversation, agent, state, pending, taken } = await this.load(conversationId);
    if (!conversation) return { nothing: 'No such conversation.' };
    if (!agent) return { nothing: 'The conversation has no agent.' };
    // Not taken up yet: what comes before its last non-user item is history, as `claim` would start its cursor.
    const history = taken ? -1 : Math.max(-1, ...pending.filter((i) => i.role !== 'user').map((i) => i.content_index));
    const item = pending.find((i) => i.role === 'user' && i.content_index > history);
    if (!item) return { nothing: 'No user item is waiting for a reply.' };
    return this.turn(conversation, agent, state, item, { callDeclared: mockTools(mocks) });
  }
}

/** Cuts text to at most `maxBytes` bytes of UTF-8, at a character boundary. */
export function cutToBytes(text: string, maxBytes: number): string {
  if (Buffer.byteLength(text) <= maxBytes) return text;
  // encodeInto writes whole characters only; `read` is the part of the text that fit.
  const { read } = new TextEncoder().encodeInto(text, new Uint8Array(maxBytes));
  return text.slice(0, read);
}

/**
 * A reply as the item can hold it: no NUL characters or lone surrogates (the item refuses both), and at most
 * the item's content limit (a longer answer is cut, and the item says so in `metadata.truncated`).
 */
function storableText(text: string): string {
  return cutToBytes(text.replaceAll('\u0000', '').toWellFormed(), CONTENT_MAX_BYTES);
}

/**
 * Answers cut so that the conversation's metadata with them still fits its limit, with room kept for a
 * handoff: each answer gets what is left after the metadata and the answers before it.
 */
export function fitAnswers(metadata: Record<string, unknown>, answers: Record<string, string>): Record<string, string> {
  const fitted: Record<string, string> = {};
  const limit = CONVERSATION_METADATA_MAX_BYTES - METADATA_RESERVE_BYTES;
  for (const [key, value] of Object.entries(answers)) {
    const clean = value.replaceAll('\u0000', '').toWellFormed();
    const without = Buffer.byteLength(JSON.stringify({ ...metadata, ...fitted, [key]: '' }));
    // JSON escapes at most multiply a character's bytes by 6 (\u0001): cut by the escaped size, then check.
    let room = Math.max(0, limit - without);
    let cut = cutToBytes(clean, room);
    while (cut !== '' && Buffer.byteLength(JSON.stringify(cut)) - 2 > room) {
      room = Math.floor(room * 0.9);
      cut = cutToBytes(clean, room);
    }
    fitted[key] = cut;
  }
  return fitted;
}

/**
 * The claim's look for work (exported for the plan test): queued, not parked, not leased (or the lease ran out),
 * oldest first, skipping the conversations this runtime is running. It reads `agent_work` through its partial
 * index of ready rows and each row's `agent_turns` by key; never `conversations`.
 */
export function claimCandidates(limit: number, busy: string[]) {
  return sql<{ id: string; organisation_id: string; has_turn: boolean }>`
      SELECT w.conversation_id AS id, w.organisation_id, t.conversation_id IS NOT NULL AS has_turn
      FROM agent_work w
      LEFT JOIN agent_turns t ON t.conversation_id = w.conversation_id
      WHERE NOT w.parked
        AND (t.lease_until IS NULL OR t.lease_until < now())
        ${busy.length > 0 ? sql`AND w.conversation_id NOT IN (${sql.join(busy)})` : sql``}
      ORDER BY w.queued_at
      LIMIT ${limit}`;
}

/** The reply a tripped guardrail gives; `metadata` adds to the refusal's own (the model's, on output). */
function refusal(trip: GuardrailTrip, metadata: Record<string, unknown> = {}) {
  return { content: REFUSAL_TEXT, metadata: { source: 'guardrail', guardrail: { rule: trip.rule, stage: trip.stage }, ...metadata } };
}
