/**
 * Agent runtime overhead (issue 12), in-process on PostgreSQL with a model
 * server that answers instantly: 50 conversations talk at once, each sending
 * its next user message as soon as the previous one is answered.
 *
 *   before the model: user item committed -> model request sent (claim, load, prompt)
 *   after the model:  last token received -> assistant item committed
 *   replies/s over the whole run
 *
 * Targets: p99 under 50 ms each. Run alone: `npx tsx bench/agents.ts`
 * (BENCH_AGENTS_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/parley_bench_agent_turns, recreated).
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { AgentRuntime, type TurnTiming } from '../src/agents/runtime.js';
import { createServices } from '../src/app.js';
import { createOrganisation } from '../src/auth/accounts.js';
import { loadConfig } from '../src/config/index.js';
import { openDatabase } from '../src/db/connection.js';
import { migrate } from '../src/db/migrate.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { recreateDatabase } from './database.js';

export interface AgentBenchResult {
  conversations: number;
  turns: number;
  before: { p50: number; p99: number };
  after: { p50: number; p99: number };
  repliesPerSecond: number;
}

/** An OpenAI-compatible server that streams a fixed short answer at once. */
async function instantModel(): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (delta: unknown, finish: string | null) =>
        `data: ${JSON.stringify({ id: 'b', object: 'chat.completion.chunk', created: 0, model: 'instant', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      res.end(`${chunk({ role: 'assistant', content: 'Noted, thank you.' }, null) + chunk({}, 'stop')}data: [DONE]\n\n`);
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];

export async function agentBenchmark(databaseUrl: string, conversations = 50, messagesEach = 20): Promise<AgentBenchResult> {
  await recreateDatabase(databaseUrl);

  const model = await instantModel();
  const config = loadConfig({
    DATABASE_URL: databaseUrl,
    LOG_LEVEL: 'silent',
    LLM_BASE_URL: model.url,
    LLM_API_KEY: 'bench',
    LLM_MODEL: 'instant',
    AGENT_CONCURRENCY: String(conversations),
    DATABASE_POOL_SIZE: '20',
  } as NodeJS.ProcessEnv);
  const database = await openDatabase(config);
  await migrate(database.db);
  const services = await createServices(database, config);
  const organisation = await createOrganisation(services.records!, { name: 'Bench' });
  const actor = systemActor(organisation.id, 'cli');
  const agent = await services.records!.create(actor, 'AiAgent', { name: 'Bench', published: true });

  const committedAt = new Map<string, number>();
  const waiting = new Map<string, () => void>();
  const before: number[] = [];
  const after: number[] = [];
  const runtime = new AgentRuntime({
    db: database.db,
    services,
    config,
    listen: database.listen,
    onTurn: (t: TurnTiming) => {
      const t0 = committedAt.get(t.userItemId);
      if (t0 !== undefined && t.requestSentAt !== undefined) before.push(t.requestSentAt - t0);
      if (t.lastTokenAt !== undefined) after.push(t.committedAt - t.lastTokenAt);
      waiting.get(t.userItemId)?.();
    },
  });
  // The runtime learns of these writes from the outbox's notification, as it does of the API's in `serve`.
  const records = services.records!;
  runtime.start();
  const ids = [];
  for (let i = 0; i < conversations; i++) ids.push((await records.create(actor, 'Conversation', { ai_agent_id: agent.id })).id);

  const started = performance.now();
  await Promise.all(
    ids.map(async (conversationId) => {
      for (let m = 0; m < messagesEach; m++) {
        let answered!: () => void;
        const done = new Promise<void>((resolve) => (answered = resolve));
        // The item id is known only after the commit; the turn cannot finish before the create returns its id and
        // the runtime's own read, so the waiter is registered right after.
        const written = await records.create(actor, 'ConversationItem', {
          conversation_id: conversationId,
          role: 'user',
          content: `message ${m}`,
        });
        committedAt.set(written.id, performance.now());
        waiting.set(written.id, answered);
        await done;
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  await runtime.stop();
  await database.close();
  await model.close();

  before.sort((a, b) => a - b);
  after.sort((a, b) => a - b);
  const round = (n: number) => Math.round(n * 10) / 10;
  return {
    conversations,
    turns: after.length,
    before: { p50: round(percentile(before, 50)), p99: round(percentile(before, 99)) },
    after: { p50: round(percentile(after, 50)), p99: round(percentile(after, 99)) },
    repliesPerSecond: Math.round(after.length / elapsed),
  };
}

export function agentChecks(r: AgentBenchResult): string[] {
  return [
    `${r.before.p99 < 50 ? 'PASS' : 'FAIL'} agent turn overhead before the model at ${r.conversations} conversations: p50 ${r.before.p50} ms, p99 ${r.before.p99} ms (target p99 < 50)`,
    `${r.after.p99 < 50 ? 'PASS' : 'FAIL'} agent turn overhead after the model: p50 ${r.after.p50} ms, p99 ${r.after.p99} ms (target p99 < 50)`,
    `INFO agent replies/s with an instant model: ${r.repliesPerSecond} (${r.turns} turns)`,
  ];
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const url = process.env.BENCH_AGENTS_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/parley_bench_agent_turns';
  const result = await agentBenchmark(url);
  console.log(JSON.stringify(result));
  console.log(agentChecks(result).join('\n'));
}
