/**
 * The idle scenario: a very large database with nothing to do, and what Parley's background loops cost the
 * database meanwhile. Generates (once; `--reuse` keeps it) one organisation with N conversations, every one
 * bound to a published AI agent and caught up (no item waits for a turn), in SQL with generate_series; then
 * starts `parley serve` on it with everything that runs in the background on (the agent runtime, the webhook
 * worker, event retention) and measures, over a window, the CPU time of the PostgreSQL backends serving that
 * database (from /proc), the rows the loops read from `conversations` (pg_stat_user_tables) and, when the
 * server has pg_stat_statements loaded, the statements' total execution time. Target: <= 1% of a core.
 *
 *   npx tsx bench/idle.ts                                   10,000,000 conversations, a 60 s window
 *   npx tsx bench/idle.ts --conversations 100000 --window 20
 *   npm run bench -- --only idle --reuse                    the same from the benchmark
 */
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { freePort } from '../test/helpers/ports.js';
import { recreateDatabase } from './database.js';
import { serveNodeFlags } from './serve-flags.js';

export interface IdleResult {
  conversations: number;
  windowSeconds: number;
  /** CPU time of the database's backends during the window, in ms, and as a share of one core. */
  backendCpuMs: number;
  coreShare: number;
  /** Rows read from `conversations` (sequential and by index) during the window. */
  conversationRowsRead: number;
  /** The statements that ran during the window, by total execution time (pg_stat_statements), if loaded. */
  statements?: { query: string; calls: number; totalMs: number }[];
  /** The agent claim's plan on this data (EXPLAIN ANALYZE execution time, ms). */
  claimMs: number;
  /** The same for the claim before the work queue (migration 0018), which joined every agent-bound conversation. */
  previousClaimMs: number;
}

/** The agent runtime's look for work before migration 0018 (for comparison on the same data). */
const PREVIOUS_CLAIM = `
  SELECT c.id, c.organisation_id, t.conversation_id IS NOT NULL AS has_turn
  FROM conversations c
  JOIN ai_agents a ON a.id = c.ai_agent_id
  LEFT JOIN agent_turns t ON t.conversation_id = c.id
  WHERE c.ai_agent_id IS NOT NULL
    AND c.next_content_index - 1 > COALESCE(t.last_handled_index, -1)
    AND (t.lease_until IS NULL OR t.lease_until < now())
    AND (a.published OR c.status = 'pending' OR c.metadata->>'agent_paused' = 'true')
    AND c.status <> 'closed'
  ORDER BY t.updated_at NULLS FIRST
  LIMIT 8`;

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');

/** Total CPU (user + system) of a process so far, in ms (Linux /proc, 100 ticks a second); 0 once it is gone. */
function cpuMs(pid: number): number {
  try {
    const fields = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
  } catch {
    return 0;
  }
}

async function generateIdle(databaseUrl: string, conversations: number): Promise<void> {
  await recreateDatabase(databaseUrl);
  // The schema through Parley's own migrations, then the rows in bulk.
  const { loadConfig } = await import('../src/config/index.js');
  const { openDatabase } = await import('../src/db/connection.js');
  const { migrate } = await import('../src/db/migrate.js');
  const database = await openDatabase(loadConfig({ DATABASE_URL: databaseUrl, DATABASE_TIMEOUT_MS: '36000000' } as NodeJS.ProcessEnv));
  await migrate(database.db);
  await database.close();
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    const started = Date.now();
    await client.query('SET synchronous_commit = off');
    // Rows consistent by construction: foreign-key and queueing triggers are skipped for the bulk load (nothing
    // is pending, so agent_work stays empty, as it is on a database whose agents are caught up).
    await client.query('SET session_replication_role = replica');
    await client.query(`INSERT INTO organisations (id, name) VALUES (gen_random_uuid(), 'Idle')`);
    await client.query(`INSERT INTO ai_agents (id, organisation_id, name, languages, workflow, published)
      SELECT gen_random_uuid(), id, 'Idle agent', ARRAY['en'], '{"steps":[]}', true FROM organisations`);
    // The secondary indexes are built once after the load (much faster than row by row); ids and public ids
    // ascend, so the unique indexes kept grow at their right edge.
    const { rows: indexes } = await client.query(
      `SELECT i.indexname, i.indexdef FROM pg_indexes i
       WHERE i.tablename = 'conversations' AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)`,
    );
    for (const index of indexes) await client.query(`DROP INDEX ${index.indexname}`);
    const batch = 1_000_000;
    for (let from = 1; from <= conversations; from += batch) {
      const to = Math.min(conversations, from + batch - 1);
      await client.query(
        `INSERT INTO conversations (id, organisation_id, channel, mode, status, public_id, ai_agent_id, next_content_index)
         SELECT (lpad(to_hex(g), 12, '0') || '70008000' || lpad(to_hex(g), 12, '0'))::uuid, a.organisation_id, 'chat', 'text',
                (ARRAY['active','pending','closed'])[1 + g % 3], 'idle-' || lpad(g::text, 10, '0'), a.id, 0
         FROM ai_agents a, generate_series($1::int, $2::int) g`,
        [from, to],
      );
      console.log(`  ${to} conversations (${((Date.now() - started) / 1000).toFixed(0)} s)`);
    }
    for (const index of indexes) await client.query(index.indexdef);
    console.log(`  indexes built (${((Date.now() - started) / 1000).toFixed(0)} s)`);
    await client.query('VACUUM ANALYZE');
    console.log(`  generated in ${((Date.now() - started) / 1000).toFixed(0)} s`);
  } finally {
    await client.end();
  }
}

async function backendPids(client: pg.Client, database: string): Promise<number[]> {
  const { rows } = await client.query(`SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, [database]);
  return rows.map((r) => r.pid as number);
}

async function conversationReads(client: pg.Client): Promise<number> {
  const { rows } = await client.query(
    `SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) AS n FROM pg_stat_user_tables WHERE relname = 'conversations'`,
  );
  return Number(rows[0]?.n ?? 0);
}

export async function idleBenchmark(
  databaseUrl: string,
  options: { conversations: number; windowSeconds: number; reuse: boolean },
): Promise<IdleResult> {
  const name = new URL(databaseUrl).pathname.slice(1);
  const marker = path.join(root, 'bench', `.idle.${name}.json`);
  const cached = fs.existsSync(marker) ? (JSON.parse(fs.readFileSync(marker, 'utf8')) as { conversations: number }) : undefined;
  if (!options.reuse || cached?.conversations !== options.conversations) {
    console.log(`Generating ${options.conversations} idle conversations in ${name}`);
    await generateIdle(databaseUrl, options.conversations);
    fs.writeFileSync(marker, JSON.stringify({ conversations: options.conversations }));
  } else console.log(`Reusing ${name} (${options.conversations} conversations)`);

  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  const statementsLoaded =
    (await client.query(`SELECT 1 FROM pg_settings WHERE name = 'shared_preload_libraries' AND setting LIKE '%pg_stat_statements%'`))
      .rowCount === 1;
  if (statementsLoaded) await client.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');

  const port = await freePort();
  const parley: ChildProcess = spawn(process.execPath, [...serveNodeFlags(), 'dist/cli/main.js', 'serve'], {
    cwd: root,
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  try {
    const deadline = Date.now() + 60_000;
    for (;;) {
      const up = await fetch(`http://127.0.0.1:${port}/healthz`).then(
        (r) => r.status < 500,
        () => false,
      );
      if (up) break;
      if (Date.now() > deadline) throw new Error('parley serve did not come up');
      await new Promise((r) => setTimeout(r, 200));
    }
    // Past start-up (migrations, the first looks of every loop): the steady state is what is measured.
    await new Promise((r) => setTimeout(r, 5000));
    const pids = await backendPids(client, name);
    const before = new Map(pids.map((pid) => [pid, cpuMs(pid)]));
    const readsBefore = await conversationReads(client);
    if (statementsLoaded) await client.query('SELECT pg_stat_statements_reset()');
    const started = Date.now();
    await new Promise((r) => setTimeout(r, options.windowSeconds * 1000));
    const elapsed = Date.now() - started;
    // Backends opened during the window count from zero.
    const after = await backendPids(client, name);
    let backendCpuMs = 0;
    for (const pid of new Set([...pids, ...after])) backendCpuMs += Math.max(0, cpuMs(pid) - (before.get(pid) ?? 0));
    // pg_stat_user_tables is updated when a backend reports its counters (at most every 500 ms, on idle).
    await new Promise((r) => setTimeout(r, 1000));
    const conversationRowsRead = (await conversationReads(client)) - readsBefore;
    const statements = statementsLoaded
      ? (
          await client.query(
            `SELECT query, calls::int, total_exec_time AS total FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = $1 AND s.query NOT LIKE '%pg_stat%' ORDER BY total_exec_time DESC LIMIT 10`,
            [name],
          )
        ).rows.map((r) => ({ query: String(r.query).replace(/\s+/g, ' ').slice(0, 120), calls: r.calls, totalMs: Number(r.total) }))
      : undefined;
    const { claimCandidates } = await import('../src/agents/runtime.js');
    const { Kysely, PostgresDialect } = await import('kysely');
    const db = new Kysely<never>({ dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: databaseUrl, max: 1 }) }) });
    const { sql } = await import('kysely');
    const plan = await sql<{
      'QUERY PLAN': { 'Execution Time': number }[];
    }>`EXPLAIN (ANALYZE, FORMAT JSON) ${claimCandidates(8, [])}`.execute(db as never);
    const previous = await client.query(`EXPLAIN (ANALYZE, FORMAT JSON) ${PREVIOUS_CLAIM}`);
    await db.destroy();
    return {
      previousClaimMs: previous.rows[0]['QUERY PLAN'][0]['Execution Time'],
      conversations: options.conversations,
      windowSeconds: elapsed / 1000,
      backendCpuMs,
      coreShare: backendCpuMs / elapsed,
      conversationRowsRead,
      statements,
      claimMs: plan.rows[0]['QUERY PLAN'][0]['Execution Time'],
    };
  } finally {
    parley.kill('SIGTERM');
    await new Promise((r) => parley.once('exit', r));
    await client.end();
  }
}

export function idleChecks(result: IdleResult): string[] {
  const lines = [
    `Idle: ${result.conversations} conversations bound to a published agent, nothing to do; ${result.windowSeconds.toFixed(0)} s window`,
    `  PostgreSQL backends' CPU ${result.backendCpuMs.toFixed(0)} ms = ${(result.coreShare * 100).toFixed(2)}% of a core; conversation rows read ${result.conversationRowsRead}`,
    `  agent claim on this data: ${result.claimMs.toFixed(3)} ms (the claim before the work queue: ${result.previousClaimMs.toFixed(1)} ms, every AGENT_POLL_MS per runtime)`,
  ];
  for (const s of result.statements ?? [])
    lines.push(`  ${s.totalMs.toFixed(1).padStart(8)} ms ${String(s.calls).padStart(6)} calls  ${s.query}`);
  if (!result.statements) lines.push('  (pg_stat_statements is not loaded on this server: backend CPU from /proc only)');
  lines.push(
    `${result.coreShare <= 0.01 ? 'PASS' : 'FAIL'} idle database CPU ${(result.coreShare * 100).toFixed(2)}% of a core (target <= 1%)`,
  );
  lines.push(
    `${result.conversationRowsRead === 0 ? 'PASS' : 'FAIL'} idle loops read no conversation rows (${result.conversationRowsRead})`,
  );
  return lines;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      conversations: { type: 'string', default: '10000000' },
      window: { type: 'string', default: '60' },
      reuse: { type: 'boolean', default: false },
      'database-url': { type: 'string', default: process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/parley_bench' },
    },
  });
  const url = `${values['database-url']!}_idle`;
  const result = await idleBenchmark(url, {
    conversations: Number(values.conversations),
    windowSeconds: Number(values.window),
    reuse: values.reuse!,
  });
  console.log(idleChecks(result).join('\n'));
}
