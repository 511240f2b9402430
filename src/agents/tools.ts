/**
 * The agents' tools (docs/agents.md, "Tools"): the built-in ones in `BUILT_IN_TOOLS`, and those an agent's
 * `workflow.tools` declares, POSTed to the organisation's own HTTPS endpoints, signed as webhooks are, under the
 * same address rules. A call reaches its tool only when its name is offered and its arguments are valid against
 * its `parameters`; a tool that failed is not called again in that turn (the model is told once).
 */
import { type Selectable, sql } from 'kysely';
import type { FunctionDefinition } from 'openai/resources/shared';
import type { ChatCompletionTool } from 'openai/resources/chat/completions';
import type { Config } from '../config/index.js';
import type { Db, Schema } from '../db/schema.js';
import { formatHits, type KnowledgeHit, MAX_SEARCHES_PER_TURN, searchKnowledge } from './knowledge.js';
import { type BUILT_IN_TOOL_NAMES, compileParameters, TOOL_TIMEOUT_MS, type WorkflowTool } from '../resources/ai-agent-workflow.js';
import { newWebhookSecret } from '../resources/webhook-endpoint.js';
import { signedPost } from '../resources/webhook-url.js';
import type { ToolCall } from './llm.js';

/**
 * The NOTIFY channel on which a turn announces a declared tool's `say_while_waiting` line as its request starts;
 * payload `{conversation_id, in_reply_to, tool, text}` (JSON). The voice runtime, which may run in another
 * process (`sip serve`), speaks it on the conversation's call.
 */
export const TOOL_WAIT_CHANNEL = 'parley_tool_wait';

/** Bytes of a tool's answer read and given to the model; a longer answer is a failed call. */
export const TOOL_RESPONSE_MAX_BYTES = 64 * 1024;
const USER_AGENT = 'Parley-Tools/1';
/** An E.164 number (ITU-T E.164: at most 15 digits after the +). */
const E164 = /^\+[1-9]\d{6,14}$/;

/** What the conversation is, for the tools that depend on it. */
export type ToolConversation = Pick<Selectable<Schema['conversations']>, 'id' | 'organisation_id' | 'channel' | 'mode'>;

/** What a call does to the turn, beyond its answer to the model. */
export type ToolEffect =
  | { kind: 'handoff'; reason: string; rule: string; metadata?: Record<string, unknown> }
  | { kind: 'close'; reason?: string }
  | { kind: 'answer'; key: string; value: string }
  /** transfer_call on a call: the voice runtime REFERs the caller to `target` once the reply is spoken. */
  | { kind: 'transfer'; reason: string; target: TransferTarget };

/** Where transfer_call sends a call: an E.164 number (the organisation's own or out through its gateway) or a SIP user. */
export type TransferTarget = { kind: 'number'; to: string } | { kind: 'sip_user'; to: string; sip_user_id: string };

export interface ToolOutcome {
  ok: boolean;
  /** What the model is told (the tool message's content). */
  result: string;
  effect?: ToolEffect;
  /** The turn ends with this call: no further model round. */
  final?: boolean;
  /** HTTP status of a declared tool's answer. */
  status?: number;
  /** The call was refused before anything was sent (unknown tool, arguments not valid, failed before). */
  refused?: boolean;
}

export interface ToolEnvironment {
  db: Db;
  config: Config;
  conversation: ToolConversation;
  /** The agent's knowledge base when it is offered as a tool: its passages found this turn are the reply's sources. */
  knowledge?: { agentId: string; maxResults: number; found: KnowledgeHit[]; searches: number };
  /** Replaces the HTTP call of declared tools (an agent test suite's `mock_tools`). */
  callDeclared?: (tool: WorkflowTool, args: Record<string, unknown>) => Promise<ToolOutcome | undefined>;
  /** Told just before a declared tool with `say_while_waiting` is requested (a live call: the line is spoken meanwhile). */
  announce?: (tool: WorkflowTool & { say_while_waiting: string }) => Promise<void>;
}

export interface BuiltInTool extends Omit<FunctionDefinition, 'name'> {
  run: (args: Record<string, unknown>, env: ToolEnvironment) => Promise<ToolOutcome> | ToolOutcome;
}

export const isCall = (c: ToolConversation) => c.channel === 'voice' || c.mode === 'voice';

/** The call's `reason`, trimmed and cut to `max` characters; `otherwise` when it gave none. */
const reasonOf = (args: Record<string, unknown>, max: number, otherwise: string) =>
  typeof args.reason === 'string' && args.reason.trim() !== '' ? args.reason.trim().slice(0, max) : otherwise;

/** A call refused before anything was done; `result` tells the model why. */
const refused = (result: string): ToolOutcome => ({ ok: false, refused: true, result });

/** The JSON Schema of an object of these fields and no others (a tool's arguments, a suite's parts). */
export function strictObject(properties: object, required: string[] = []) {
  return { type: 'object', additionalProperties: false, required, properties };
}

/**
 * The built-in tools, by name. Adding one: an entry here (its JSON Schema is checked against the model's
 * arguments before `run`), and its name in `BUILT_IN_TOOL_NAMES` (src/resources/ai-agent-workflow.ts), which
 * keeps declared tools from taking it.
 */
export const BUILT_IN_TOOLS: Record<string, BuiltInTool> = {
  handoff_to_operator: {
    description: 'Hand the conversation to a human operator, when the user asks for one or you cannot help.',
    parameters: strictObject({ reason: { type: 'string', description: 'Why a human is needed, in one sentence.' } }, ['reason']),
    run: (args) => {
      const reason = reasonOf(args, 500, 'The model asked for an operator.');
      return { ok: true, result: 'Handed to an operator.', effect: { kind: 'handoff', reason, rule: 'model_tool' }, final: true };
    },
  },
  end_conversation: {
    description: 'End the conversation (on a phone call: hang up) once the user has what they came for or says goodbye.',
    parameters: strictObject({ reason: { type: 'string', maxLength: 500, description: 'Why the conversation ends, in a few words.' } }),
    run: (args) => ({
      ok: true,
      result: 'The conversation is closed.',
      effect: { kind: 'close', ...(typeof args.reason === 'string' ? { reason: args.reason.slice(0, 500) } : {}) },
      final: true,
    }),
  },
  transfer_call: {
    description:
      'Transfer a phone call to a telephone number (E.164, such as +442071234567) or to a SIP user of the organisation (its user name). Only on phone calls.',
    parameters: strictObject(
      {
        to: { type: 'string', minLength: 1, maxLength: 128, description: 'An E.164 number or a SIP user name.' },
        reason: { type: 'string', maxLength: 500 },
      },
      ['to'],
    ),
    run: async (args, env) => {
      if (!isCall(env.conversation))
        return refused('transfer_call works on phone calls only; this is a chat. Offer handoff_to_operator instead.');
      const to = String(args.to).trim();
      let target: TransferTarget;
      if (E164.test(to)) target = { kind: 'number', to };
      else {
        const user = await env.db
          .selectFrom('sip_users')
          .select(['id', 'sip_username'])
          .where('organisation_id', '=', env.conversation.organisation_id)
          .where('sip_username', '=', to)
          .executeTakeFirst();
        if (!user) return { ok: false, result: `${to} is neither an E.164 number nor a SIP user of this organisation.` };
        target = { kind: 'sip_user', to: user.sip_username, sip_user_id: user.id };
      }
      // The turn ends here: its reply is spoken, then the voice runtime REFERs the caller to the target
      // (src/voice/runtime.ts, the same path as a handoff to an operator's phone).
      const reason = reasonOf(args, 400, `Transfer requested to ${to}.`);
      return { ok: true, result: `Transferring the call to ${to}.`, effect: { kind: 'transfer', reason, target }, final: true };
    },
  },
  store_answer: {
    description: "Store something the user told you (their name, an order number...) in the conversation's stored answers.",
    parameters: strictObject(
      {
        key: { type: 'string', pattern: '^[A-Za-z0-9_.-]{1,64}$', description: 'A short name, such as order_number.' },
        value: { type: 'string', maxLength: 2000 },
      },
      ['key', 'value'],
    ),
    run: (args) => {
      const key = String(args.key);
      // The runtime's own metadata keys are not answers.
      if (['agent_paused', 'handoff_reason', 'assigned_operator', 'assigned_at'].includes(key))
        return { ok: false, result: `${key} is reserved; choose another key.` };
      return { ok: true, result: `Stored ${key}.`, effect: { kind: 'answer', key, value: String(args.value) } };
    },
  },
  search_knowledge: {
    // Offered when the agent's knowledge mode is `tool` (docs/agents.md, "Knowledge").
    description:
      "Search the organisation's knowledge documents for passages that answer a question. Returns the best passages with their document ids and titles. Answer from them, and say so when nothing relevant is found.",
    parameters: strictObject({ query: { type: 'string', description: 'What to look for, in a few words or the question itself.' } }, [
      'query',
    ]),
    run: async (args, env) => {
      const knowledge = env.knowledge;
      if (!knowledge) return refused('This agent has no knowledge base to search.');
      if (knowledge.searches >= MAX_SEARCHES_PER_TURN)
        return refused('No more searches in this turn: answer from what you found, or say you do not know.');
      knowledge.searches += 1;
      const query = String(args.query).trim();
      if (query === '') return refused('search_knowledge needs a non-empty `query`.');
      const hits = await searchKnowledge(env.db, env.conversation.organisation_id, knowledge.agentId, query, knowledge.maxResults);
      knowledge.found.push(...hits);
      return { ok: true, result: formatHits(hits) };
    },
  },
} satisfies Record<(typeof BUILT_IN_TOOL_NAMES)[number], BuiltInTool>;

/** The tools offered to the model: the built-in ones (search_knowledge only with `search`), then the agent's own. */
export function offeredTools(declared: WorkflowTool[], search: boolean): ChatCompletionTool[] {
  return [
    ...Object.entries(BUILT_IN_TOOLS)
      .filter(([name]) => search || name !== 'search_knowledge')
      .map(([name, { description, parameters }]) => ({ name, description, parameters })),
    ...declared.map(({ name, description, parameters }) => ({ name, description, parameters })),
  ].map((definition) => ({ type: 'function' as const, function: definition }));
}

/** Answers the tools named in `mocks` with their values instead of calling them (`agent run --mock-tools`, `mock_tools`). */
export function mockTools(mocks: Record<string, unknown>): ToolEnvironment['callDeclared'] {
  return async (tool) =>
    Object.hasOwn(mocks, tool.name) ? { ok: true, status: 200, result: JSON.stringify(mocks[tool.name]) } : undefined;
}

/** The organisation's secret for signing tool calls, made on first use. */
export async function toolSecret(db: Db, organisationId: string): Promise<string> {
  await sql`INSERT INTO tool_secrets (organisation_id, secret) VALUES (${organisationId}, ${newWebhookSecret()})
            ON CONFLICT (organisation_id) DO NOTHING`.execute(db);
  const row = await db.selectFrom('tool_secrets').select('secret').where('organisation_id', '=', organisationId).executeTakeFirstOrThrow();
  return row.secret;
}

/**
 * Runs one call the model made. `failed` holds the tools that failed earlier in the turn: they are not called
 * again (the model was told once). Never throws for what the model or the tool did.
 */
export async function runToolCall(
  call: ToolCall,
  declared: WorkflowTool[] | undefined,
  env: ToolEnvironment,
  failed: Set<string>,
  /** The request's `webhook-id`: the same for the same call when a turn is run again (receivers deduplicate by it). */
  messageId: string,
): Promise<ToolOutcome> {
  // Own properties only: a model naming `constructor` or `toString` gets "no tool", not Object.prototype's member.
  const builtIn = Object.hasOwn(BUILT_IN_TOOLS, call.name) ? BUILT_IN_TOOLS[call.name] : undefined;
  const own = builtIn ? undefined : declared?.find((t) => t.name === call.name);
  if (!builtIn && !own) return refused(`There is no tool named ${call.name}. Use only the tools you were given.`);
  if (call.invalidArguments !== undefined) return refused(`The arguments of ${call.name} must be a JSON object; nothing was done.`);
  const validate = compileParameters((builtIn ?? own!).parameters);
  if (typeof validate === 'string') return refused(`${call.name} cannot be called: its parameters ${validate}.`);
  if (!validate(call.arguments)) {
    const why = (validate.errors ?? [])
      .slice(0, 5)
      .map((e) => `${e.instancePath || '(arguments)'} ${e.message ?? 'is invalid'}`)
      .join('; ');
    return refused(`The arguments of ${call.name} are not valid: ${why}. Nothing was done; correct them or ask the user.`);
  }
  if (failed.has(call.name))
    return refused(`${call.name} failed earlier in this turn and is not called again. Tell the user it cannot be done right now.`);
  if (builtIn) return builtIn.run(call.arguments, env);
  let outcome = await env.callDeclared?.(own!, call.arguments);
  if (!outcome) {
    const tool = own!;
    // Said to the caller while the request runs; never delays or fails the call itself.
    if (tool.say_while_waiting && env.announce) await env.announce({ ...tool, say_while_waiting: tool.say_while_waiting }).catch(() => {});
    outcome = await callDeclaredTool(tool, call.arguments, env, messageId);
  }
  if (!outcome.ok) failed.add(call.name);
  return outcome;
}

/**
 * POSTs the arguments to the tool's URL, signed with the organisation's tool secret (Standard Webhooks headers;
 * `parley-conversation-id` and `parley-tool` say for whom), under the webhook address rules checked after the
 * name is resolved. The answer must be JSON (or empty) and at most `TOOL_RESPONSE_MAX_BYTES`.
 */
export async function callDeclaredTool(tool: WorkflowTool, args: Record<string, unknown>, env: ToolEnvironment, messageId: string) {
  const secret = await toolSecret(env.db, env.conversation.organisation_id);
  const timeoutMs = Math.min(TOOL_TIMEOUT_MS.max, Math.max(TOOL_TIMEOUT_MS.min, tool.timeout_ms ?? TOOL_TIMEOUT_MS.default));
  const answer = await signedPost(tool.url, secret, messageId, JSON.stringify(args), {
    timeoutMs,
    allowPrivate: env.config.events.webhookAllowPrivateUrls,
    maxResponseBytes: TOOL_RESPONSE_MAX_BYTES,
    keepBody: true,
    userAgent: USER_AGENT,
    headers: { 'parley-conversation-id': env.conversation.id, 'parley-tool': tool.name },
  });
  const status = answer.status !== undefined ? { status: answer.status } : {};
  const failure = (why: string): ToolOutcome => ({
    ok: false,
    ...status,
    result: `The tool ${tool.name} failed: ${why} Do not call it again now; tell the user it cannot be done at the moment.`,
  });
  if (answer.cut) return failure(`its answer was larger than ${TOOL_RESPONSE_MAX_BYTES} bytes and was not read.`);
  if (!answer.ok) return failure(answer.error ?? 'no answer.');
  const text = (answer.body ?? Buffer.alloc(0)).toString('utf8').trim();
  if (text === '') return { ok: true, ...status, result: '(the tool answered with no content)' };
  try {
    // Compact JSON: what the model reads is the tool's data, not its formatting.
    return { ok: true, ...status, result: JSON.stringify(JSON.parse(text)) };
  } catch {
    return failure('its answer is not JSON.');
  }
}
