/**
 * The analysis of finished conversations and calls (docs/agents.md, "Analysis"). A closing conversation that names
 * an agent is queued in `analysis_work` by a trigger (migration 0025); the runtime claims queued rows with FOR
 * UPDATE SKIP LOCKED and analyses them in the background, never in the request that closed the conversation. A
 * model that answers outside the workflow's `analysis.schema` is asked again, a bounded number of times; the
 * result goes through the records service (a `Conversation.analysed` event).
 */
import { sql } from 'kysely';
import type { Logger } from 'pino';
import type { ChatCompletionTool } from 'openai/resources/chat/completions';
import type { Config } from '../config/index.js';
import { inTransaction } from '../db/connection.js';
import type { Db } from '../db/schema.js';
import { systemActor } from '../jsonapi/actor.js';
import type { Records } from '../jsonapi/records.js';
import { compileAnalysisSchema, type Workflow } from '../resources/ai-agent-workflow.js';
import { type ChatMessage, type ChatModel, ModelFailure, parseObject } from './llm.js';
import { strictObject } from './tools.js';

/** How long a claimed analysis is held before another runtime may take it (a crashed worker's). */
const LEASE_MS = 120_000;
/** Characters of the transcript the model reads (the end of a longer conversation is kept). */
const TRANSCRIPT_MAX_CHARS = 48_000;
/** Characters of the summary that are stored. */
const SUMMARY_MAX_CHARS = 4000;
/** Bytes of JSON the data may take (the attribute holds 64 KiB in all). */
const DATA_MAX_BYTES = 32 * 1024;

export interface Analysis {
  summary: string | null;
  data: Record<string, unknown> | null;
  success: boolean | null;
  analysed_at: string;
  model?: string;
  /** Why there is no analysis (no model configured, nothing said). */
  skipped?: string;
  /** What went wrong when the model failed or answered outside the schema after every attempt. */
  error?: string;
}

interface Claimed {
  conversation_id: string;
  organisation_id: string;
  version: string;
  attempts: number;
}

export interface AnalystOptions {
  db: Db;
  config: Config;
  model: ChatModel | undefined;
  records: (trx: Db) => Records;
  logger?: () => Logger | undefined;
}

export class Analyst {
  private readonly running = new Set<Promise<void>>();

  constructor(private readonly options: AnalystOptions) {}

  /** Claims due analyses (as many as `room` allows) and runs them in the background. */
  async tick(room: number): Promise<void> {
    const free = Math.min(room, this.options.config.agentConcurrency - this.running.size);
    if (free <= 0) return;
    const { rows } = await sql<Claimed>`
      UPDATE analysis_work SET lease_until = now() + ${LEASE_MS} * interval '1 millisecond', attempts = attempts + 1
      WHERE conversation_id IN (
        SELECT conversation_id FROM analysis_work
        WHERE available_at <= now() AND (lease_until IS NULL OR lease_until < now())
        ORDER BY available_at LIMIT ${free}
        FOR UPDATE SKIP LOCKED)
      RETURNING conversation_id, organisation_id, version::text AS version, attempts`.execute(this.options.db);
    for (const row of rows) {
      const work = this.run(row)
        .catch((error) => this.options.logger?.()?.error({ err: error, conversation: row.conversation_id }, 'analysis failed'))
        .finally(() => this.running.delete(work));
      this.running.add(work);
    }
  }

  /** Waits for the analyses in flight. */
  async idle(): Promise<void> {
    while (this.running.size > 0) await Promise.allSettled([...this.running]);
  }

  private async run(claimed: Claimed): Promise<void> {
    const { db, config, model } = this.options;
    const { rows } = await sql<{ agent_name: string | null; workflow: Workflow | null }>`
      SELECT a.name AS agent_name, a.workflow FROM conversations c LEFT JOIN ai_agents a ON a.id = c.ai_agent_id
      WHERE c.id = ${claimed.conversation_id}`.execute(db);
    if (!rows[0]) return; // deleted meanwhile: its row went with it
    /** An analysis that ends without one, saying why. */
    const without = (why: { error: string } | { skipped: string }) =>
      this.store(claimed, { summary: null, data: null, success: null, analysed_at: new Date().toISOString(), ...why });
    // Every attempt ended without storing anything (a crash, a write refused): stop, and say so.
    if (claimed.attempts > config.analysisMaxAttempts) return without({ error: 'The analysis could not be completed.' });
    const transcript = await this.transcript(claimed.conversation_id);
    if (!model) return without({ skipped: 'no model configured' });
    if (transcript === '') return without({ skipped: 'nothing was said' });
    const settings = rows[0].workflow?.analysis ?? {};
    try {
      const analysis = await analyse(model, config.analysisMaxAttempts, rows[0].agent_name ?? 'the agent', settings, transcript);
      await this.store(claimed, analysis);
    } catch (error) {
      if (!(error instanceof ModelFailure)) throw error;
      // The provider's text goes to the log only (it may name a masked key or an internal address).
      this.options
        .logger?.()
        ?.warn(
          { conversation: claimed.conversation_id, attempts: claimed.attempts, error: error.message },
          'analysis: the model did not answer',
        );
      if (claimed.attempts < config.analysisMaxAttempts) {
        // Tried again later, with exponential backoff; the lease is given up.
        const delay = config.analysisRetryMs * 2 ** (claimed.attempts - 1);
        await sql`UPDATE analysis_work SET lease_until = NULL, last_error = ${error.message},
                  available_at = now() + ${delay} * interval '1 millisecond'
                  WHERE conversation_id = ${claimed.conversation_id} AND version = ${claimed.version}::bigint`.execute(db);
        return;
      }
      await without({ error: `The model did not answer after ${claimed.attempts} attempts.` });
    }
  }

  /** The conversation as the model reads it: one line per item, the end kept when it is long. */
  private async transcript(conversationId: string): Promise<string> {
    const { rows } = await sql<{ role: string; content: string }>`
      SELECT role, content FROM conversation_items WHERE conversation_id = ${conversationId}
        AND role IN ('user', 'assistant', 'operator') ORDER BY content_index DESC LIMIT 500`.execute(this.options.db);
    const lines: string[] = [];
    let budget = TRANSCRIPT_MAX_CHARS;
    for (const row of rows) {
      const line = `${row.role === 'user' ? 'Customer' : row.role === 'operator' ? 'Human operator' : 'Agent'}: ${row.content}`;
      if (line.length > budget) break;
      budget -= line.length;
      lines.unshift(line);
    }
    return rows.some((r) => r.role === 'user') ? lines.join('\n') : '';
  }

  /** Writes the analysis (with its event) and takes the conversation off the queue, unless it was closed again since. */
  private async store(claimed: Claimed, analysis: Analysis): Promise<void> {
    const actor = systemActor(claimed.organisation_id, 'agent');
    await inTransaction(this.options.db, async (trx) => {
      await this.options.records(trx).update(actor, 'Conversation', claimed.conversation_id, { analysis }, { event: 'analysed' });
      const gone = await sql`DELETE FROM analysis_work WHERE conversation_id = ${claimed.conversation_id}
                             AND version = ${claimed.version}::bigint`.execute(trx);
      if (Number(gone.numAffectedRows ?? 0) === 0)
        await sql`UPDATE analysis_work SET lease_until = NULL WHERE conversation_id = ${claimed.conversation_id}`.execute(trx);
    });
  }
}

const RECORD_TOOL = 'record_analysis';

/**
 * Asks the model for the analysis, at most `maxAttempts` times while its answer does not fit: summary a
 * string, success a boolean, data valid against the schema. After the last, what it gave is stored with an
 * error note (the data only when it is valid). Throws `ModelFailure` when the model does not answer at all.
 */
export async function analyse(
  model: ChatModel,
  maxAttempts: number,
  agentName: string,
  settings: NonNullable<Workflow['analysis']>,
  transcript: string,
): Promise<Analysis> {
  const schema = settings.schema ?? { type: 'object' };
  const validate = compileAnalysisSchema(schema);
  const tool: ChatCompletionTool = {
    type: 'function',
    function: {
      name: RECORD_TOOL,
      description: 'Record the analysis of the conversation.',
      parameters: strictObject(
        {
          summary: { type: 'string', description: 'What happened, in at most three sentences.' },
          success: { type: 'boolean', description: 'Whether the conversation met its success criteria.' },
          data: schema,
        },
        ['summary', 'success', 'data'],
      ),
    },
  };
  const messages: ChatMessage[] = [
    {
      role: 'system',
      content: [
        `You analyse a finished conversation between a customer and ${agentName}, an AI agent (human operators may have joined).`,
        `Call ${RECORD_TOOL} once with: summary (what happened, at most three sentences), success (true or false), and data (an object matching this JSON Schema: ${JSON.stringify(schema)}).`,
        `Success means: ${settings.success_criteria ?? "the customer's request was resolved or correctly handed to a human."}`,
        ...(settings.instructions ? [settings.instructions] : []),
        'Use only what the conversation says; leave out data it does not give when the schema allows.',
      ].join('\n'),
    },
    { role: 'user', content: `The conversation:\n\n${transcript}` },
  ];
  let problems = '';
  let last: { summary?: unknown; success?: unknown; data?: unknown } = {};
  let modelName = model.name;
  for (let attempt = 1; attempt <= maxAttempts; attempt++) {
    const answer = await model.complete(messages, [tool]);
    modelName = answer.model;
    const call = answer.toolCalls.find((c) => c.name === RECORD_TOOL);
    // A JSON text answer: the object it holds, from its first brace to its last.
    last = call?.arguments ?? parseObject(/\{[\s\S]*\}/.exec(answer.text)?.[0] ?? '') ?? {};
    problems = problemsOf(last, validate);
    if (problems === '' && Buffer.byteLength(JSON.stringify(last.data)) > DATA_MAX_BYTES)
      problems = `\`data\` is longer than ${DATA_MAX_BYTES} bytes of JSON`;
    if (problems === '') break;
    // Asked again, told what was wrong with the answer.
    messages.push(
      { role: 'assistant', content: answer.text || JSON.stringify(last) },
      { role: 'user', content: `That analysis is not valid: ${problems}. Call ${RECORD_TOOL} again with valid arguments.` },
    );
  }
  const dataValid =
    validate(last.data) &&
    typeof last.data === 'object' &&
    last.data !== null &&
    Buffer.byteLength(JSON.stringify(last.data)) <= DATA_MAX_BYTES;
  return {
    summary: typeof last.summary === 'string' ? last.summary.slice(0, SUMMARY_MAX_CHARS) : null,
    data: dataValid ? (last.data as Record<string, unknown>) : null,
    success: typeof last.success === 'boolean' ? last.success : null,
    analysed_at: new Date().toISOString(),
    model: modelName,
    ...(problems === '' ? {} : { error: `The model's analysis was not valid after ${maxAttempts} attempts: ${problems}.`.slice(0, 2000) }),
  };
}

function problemsOf(answer: { summary?: unknown; success?: unknown; data?: unknown }, validate: ReturnType<typeof compileAnalysisSchema>) {
  const found: string[] = [];
  if (typeof answer.summary !== 'string' || answer.summary.trim() === '') found.push('`summary` must be a non-empty string');
  if (typeof answer.success !== 'boolean') found.push('`success` must be true or false');
  if (answer.data === undefined || answer.data === null || typeof answer.data !== 'object' || Array.isArray(answer.data))
    found.push('`data` must be an object');
  else if (!validate(answer.data))
    found.push(
      ...(validate.errors ?? []).slice(0, 10).map((e) => `\`data${e.instancePath.replaceAll('/', '.')}\` ${e.message ?? 'is invalid'}`),
    );
  return found.join('; ');
}
