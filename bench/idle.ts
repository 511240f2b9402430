/**
 * The idle scenario: a very large database with nothing to do, and what Parley's background loops cost the
 * database meanwhile (issue 26: <= 1% of a core). It starts its own PostgreSQL cluster (initdb in a temporary
 * directory, a free port in 41500-41999, `pg_stat_statements` preloaded; the shared server is never touched),
 * generates one organisation with N conversations, every one bound to a published AI agent and caught up
 * (its `agent_turns` row at its last item), with a history of finished SIP calls, recent events and their
 * delivered webhooks (N/10 each), in SQL with generate_series; then starts `parley serve` on it with
 * everything that runs in the background on (the agent runtime with the analysis queue, the webhook worker,
 * event retention), and runs the SIP edge's database loops beside it (the call event queue and
 * reconciliation at their periods: `sip serve` itself needs Kamailio). After a warm-up it resets
 * pg_stat_statements, waits a window with nothing to do, and reports each statement's execution and planning
 * time per second of the window (a fraction of one core), the CPU time of the database's backends from /proc,
 * and the rows read from `conversations`.
 *
 *   npm run bench:idle                                       10,000,000 conversations, a 60 s window
 *   npm run bench:idle -- --conversations 100000 --window 20
 *   npm run bench:idle -- --database-url postgres://...      on a server of your own instead (kept; --reuse)
 */
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { freePort } from '../test/helpers/ports.js';
import { PrivatePostgres } from '../test/support/private-postgres.js';
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
  /**
   * Every statement that ran during the window, by total time (execution and planning, pg_stat_statements), with
   * its share of one core over the window; undefined on a server without pg_stat_statements.
   */
  statements?: { query: string; calls: number; totalMs: number; coreShare: number }[];
  /** All the statements' time as a share of one core. */
  statementsCoreShare?: number;
  /** Seconds the data took to generate (undefined when reused). */
  generationSeconds?: number;
  /** Where it ran: `private` (a cluster of its own) or the server the URL names. */
  server: string;
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

/** Tables loaded in bulk, whose secondary indexes are built once after the load (much faster than row by row). */
const BULK_TABLES = ['conversations', 'calls', 'events', 'webhook_deliveries'];

async function generateIdle(databaseUrl: string, conversations: number): Promise<number> {
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
  const started = Date.now();
  const say = (what: string) => console.log(`  ${what} (${((Date.now() - started) / 1000).toFixed(0)} s)`);
  try {
    await client.query('SET synchronous_commit = off');
    await client.query("SET maintenance_work_mem = '512MB'");
    // Rows consistent by construction: foreign-key and queueing triggers are skipped for the bulk load (nothing
    // is pending, so agent_work stays empty, as it is on a database whose agents are caught up).
    await client.query('SET session_replication_role = replica');
    await client.query(`INSERT INTO organisations (id, name, slug) VALUES (gen_random_uuid(), 'Idle', 'idle')`);
    await client.query(`INSERT INTO ai_agents (id, organisation_id, name, languages, workflow, published)
      SELECT gen_random_uuid(), id, 'Idle agent', ARRAY['en'], '{"steps":[]}', true FROM organisations`);
    await client.query(`INSERT INTO webhook_endpoints (id, organisation_id, url, secret)
      SELECT gen_random_uuid(), id, 'https://1.1.1.1/idle', 'whsec_idle' FROM organisations`);
    const { rows: indexes } = await client.query(
      `SELECT i.indexname, i.indexdef FROM pg_indexes i
       WHERE i.tablename = ANY($1) AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)`,
      [BULK_TABLES],
    );
    for (const index of indexes) await client.query(`DROP INDEX ${index.indexname}`);
    const batch = 1_000_000;
    // Ids and public ids ascend, so the unique indexes kept grow at their right edge. Every conversation has had
    // two items (a user's and the agent's answer) and its turn row's cursor is at the second: caught up. The
    // items themselves are not generated: no loop reads them (test/background-plans.test.ts checks the plans).
    for (let from = 1; from <= conversations; from += batch) {
      const to = Math.min(conversations, from + batch - 1);
      await client.query(
        `INSERT INTO conversations (id, organisation_id, channel, mode, status, public_id, ai_agent_id, next_content_index)
         SELECT (lpad(to_hex(g), 12, '0') || '70008000' || lpad(to_hex(g), 12, '0'))::uuid, a.organisation_id, 'chat', 'text',
                (ARRAY['active','pending','closed'])[1 + g % 3], 'idle-' || lpad(g::text, 10, '0'), a.id, 2
         FROM ai_agents a, generate_series($1::int, $2::int) g`,
        [from, to],
      );
      await client.query(
        `INSERT INTO agent_turns (conversation_id, organisation_id, last_handled_index)
         SELECT (lpad(to_hex(g), 12, '0') || '70008000' || lpad(to_hex(g), 12, '0'))::uuid, a.organisation_id, 1
         FROM ai_agents a, generate_series($1::int, $2::int) g`,
        [from, to],
      );
      say(`${to} conversations and their turn rows`);
    }
    // History the other loops could trip over: finished SIP calls (reconciliation), recent events inside the
    // retention (pruning) and their delivered webhooks (the webhook claim).
    const history = Math.max(1, Math.floor(conversations / 10));
    for (let from = 1; from <= history; from += batch) {
      const to = Math.min(history, from + batch - 1);
      await client.query(
        `INSERT INTO calls (id, organisation_id, direction, status, call_uuid, call_source, started_at, ended_at, updated_at)
         SELECT gen_random_uuid(), o.id, 'inbound', 'completed', 'idle-call-' || g, 'sip', now() - interval '1 day',
                now() - interval '1 day', now() - interval '1 day'
         FROM organisations o, generate_series($1::int, $2::int) g`,
        [from, to],
      );
      await client.query(
        `INSERT INTO events (id, organisation_id, type, occurred_at, data)
         SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - g), 12, '0') || '70008000' || lpad(to_hex(g), 12, '0'))::uuid,
                o.id, 'Conversation.updated', now(), '{}'::jsonb
         FROM organisations o, generate_series($1::int, $2::int) g`,
        [from, to],
      );
      say(`${to} calls and events`);
    }
    await client.query(`INSERT INTO webhook_deliveries (id, organisation_id, webhook_endpoint_id, event_id, event_type, status, attempts)
      SELECT gen_random_uuid(), e.organisation_id, w.id, e.id, e.type, 'succeeded', 1 FROM events e JOIN webhook_endpoints w USING (organisation_id)`);
    say('webhook deliveries');
    for (const index of indexes) await client.query(index.indexdef);
    say('indexes built');
    await client.query('VACUUM ANALYZE');
    say('vacuumed');
    return (Date.now() - started) / 1000;
  } finally {
    await client.end();
  }
}

/** A port in 41500-41999 nothing listens on. */
async function clusterPort(): Promise<number> {
  for (let port = 41500; port < 42000; port++) {
    const free = await new Promise<boolean>((resolve) => {
      const probe = net.createServer();
      probe.once('error', () => resolve(false));
      probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
    });
    if (free) return port;
  }
  throw new Error('no free port in 41500-41999');
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

/**
 * The scenario. `databaseUrl` names the database (its path); with `server: 'given'` it runs on the server the URL
 * names (a database kept between runs: `reuse`), else (the default) in a cluster of its own, started for the run
 * and removed after it.
 */
export async function idleBenchmark(
  databaseUrl: string,
  options: { conversations: number; windowSeconds: number; reuse: boolean; server?: 'private' | 'given' },
): Promise<IdleResult> {
  const name = new URL(databaseUrl).pathname.slice(1) || 'parley_idle';
  let cluster: PrivatePostgres | undefined;
  let url = databaseUrl;
  let generationSeconds: number | undefined;
  if (options.server !== 'given') {
    const port = await clusterPort();
    cluster = new PrivatePostgres(port).init();
    // pg_stat_statements with planning time; memory for the bulk load. fsync is off (a throwaway cluster: the
    // loops' statements read, and nothing measured here waits on a flush).
    cluster.start([
      'shared_preload_libraries=pg_stat_statements',
      'pg_stat_statements.track_planning=on',
      'shared_buffers=512MB',
      'max_wal_size=8GB',
      'checkpoint_timeout=30min',
      'max_connections=50',
    ]);
    url = `postgres://postgres@127.0.0.1:${port}/${name}`;
    console.log(
      `PostgreSQL cluster of its own on port ${port}${options.reuse ? ' (generated afresh: --reuse keeps only a database on a server you name)' : ''}`,
    );
  }
  try {
    const marker = path.join(root, 'bench', `.idle.${name}.json`);
    const cached = fs.existsSync(marker) ? (JSON.parse(fs.readFileSync(marker, 'utf8')) as { conversations: number }) : undefined;
    if (cluster || !options.reuse || cached?.conversations !== options.conversations) {
      console.log(`Generating ${options.conversations} idle conversations in ${name}`);
      generationSeconds = await generateIdle(url, options.conversations);
      if (!cluster) fs.writeFileSync(marker, JSON.stringify({ conversations: options.conversations }));
    } else console.log(`Reusing ${name} (${options.conversations} conversations)`);
    return { ...(await measure(url, name, options)), generationSeconds, server: cluster ? 'private' : new URL(databaseUrl).host };
  } finally {
    cluster?.destroy();
  }
}

async function measure(url: string, name: string, options: { conversations: number; windowSeconds: number }) {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const statementsLoaded =
    (await client.query(`SELECT 1 FROM pg_settings WHERE name = 'shared_preload_libraries' AND setting LIKE '%pg_stat_statements%'`))
      .rowCount === 1;
  if (statementsLoaded) await client.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');

  const port = await freePort();
  const parley: ChildProcess = spawn(process.execPath, [...serveNodeFlags(), 'dist/cli/main.js', 'serve'], {
    cwd: root,
    env: { ...process.env, DATABASE_URL: url, PORT: String(port), HOST: '127.0.0.1', LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const sip = await sipLoops(url);
  try {
    const deadline = Date.now() + 120_000;
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
    // The harness's own statements name pg_stat_* (read below or above): left out.
    const statements = statementsLoaded
      ? (
          await client.query(
            `SELECT query, calls::int, total_exec_time + total_plan_time AS total FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = $1 AND s.query NOT LIKE '%pg_stat%' ORDER BY 3 DESC`,
            [name],
          )
        ).rows.map((r) => ({
          query: String(r.query).replace(/\s+/g, ' ').slice(0, 110),
          calls: r.calls,
          totalMs: Number(r.total),
          coreShare: Number(r.total) / elapsed,
        }))
      : undefined;
    // pg_stat_user_tables is updated when a backend reports its counters (at most every 500 ms, on idle).
    await new Promise((r) => setTimeout(r, 1000));
    const conversationRowsRead = (await conversationReads(client)) - readsBefore;
    const { claimCandidates } = await import('../src/agents/runtime.js');
    const { Kysely, PostgresDialect } = await import('kysely');
    const db = new Kysely<never>({ dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: url, max: 1 }) }) });
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
      statementsCoreShare: statements?.reduce((sum, s) => sum + s.coreShare, 0),
      claimMs: plan.rows[0]['QUERY PLAN'][0]['Execution Time'],
    };
  } finally {
    parley.kill('SIGTERM');
    await new Promise((r) => parley.once('exit', r));
    await sip.stop();
    await client.end();
  }
}

/**
 * The SIP edge's database loops as `sip serve` runs them (src/sip/edge.ts): the call event queue (NOTIFY, and a
 * poll every second) and reconciliation every SIP_RECONCILE_INTERVAL_MS (30 s). `sip serve` itself needs
 * Kamailio; its loops' statements are the same from here.
 */
async function sipLoops(url: string): Promise<{ stop(): Promise<void> }> {
  const { loadConfig } = await import('../src/config/index.js');
  const { openDatabase } = await import('../src/db/connection.js');
  const { createServices } = await import('../src/app.js');
  const { CallEvents } = await import('../src/sip/call-events.js');
  const { CallEventQueue } = await import('../src/sip/call-queue.js');
  const { reconcileCalls } = await import('../src/sip/reconcile.js');
  const config = loadConfig({ DATABASE_URL: url, LOG_LEVEL: 'silent' } as NodeJS.ProcessEnv);
  const database = await openDatabase(config);
  const services = await createServices(database, config);
  const events = new CallEvents({ db: database.db, records: services.records! });
  const queue = new CallEventQueue({ db: database.db, events, listen: database.listen });
  await queue.start();
  const reconcile = () =>
    reconcileCalls(database.db, events, {
      answeredBefore: new Date(Date.now() - 10_000),
      unansweredBefore: new Date(Date.now() - 90_000),
    }).catch((error: unknown) => console.error('reconciliation failed', error));
  const timer = setInterval(reconcile, 30_000);
  return {
    async stop() {
      clearInterval(timer);
      await queue.stop();
      await database.close();
    },
  };
}

export function idleChecks(result: IdleResult): string[] {
  const percent = (share: number) => `${(share * 100).toFixed(3)}%`;
  const lines = [
    `Idle: ${result.conversations} conversations bound to a published agent, nothing to do; ${result.windowSeconds.toFixed(0)} s window; ` +
      `${result.server === 'private' ? 'a PostgreSQL cluster of its own' : `server ${result.server}`}` +
      (result.generationSeconds !== undefined ? `, data generated in ${result.generationSeconds.toFixed(0)} s` : ''),
    `  PostgreSQL backends' CPU (/proc) ${result.backendCpuMs.toFixed(0)} ms = ${percent(result.coreShare)} of a core; conversation rows read ${result.conversationRowsRead}`,
    `  agent claim on this data: ${result.claimMs.toFixed(3)} ms (the claim before the work queue: ${result.previousClaimMs.toFixed(1)} ms, every AGENT_POLL_MS per runtime)`,
  ];
  if (result.statements) {
    lines.push(`  statements (pg_stat_statements, execution + planning), ${percent(result.statementsCoreShare ?? 0)} of a core in all:`);
    for (const s of result.statements)
      lines.push(
        `  ${s.totalMs.toFixed(2).padStart(9)} ms ${percent(s.coreShare).padStart(8)} ${String(s.calls).padStart(5)} calls  ${s.query}`,
      );
    lines.push(
      `${(result.statementsCoreShare ?? 0) <= 0.01 ? 'PASS' : 'FAIL'} idle statements' database time ${percent(result.statementsCoreShare ?? 0)} of a core (target <= 1%)`,
    );
  } else lines.push('  (pg_stat_statements is not loaded on this server: backend CPU from /proc only)');
  lines.push(
    `${result.coreShare <= 0.01 ? 'PASS' : 'FAIL'} idle database backends' CPU ${percent(result.coreShare)} of a core (target <= 1%)`,
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
      /** A server of your own to run on (the database `<path>_idle` is created there); default: a cluster of its own. */
      'database-url': { type: 'string' },
    },
  });
  const given = values['database-url'];
  const result = await idleBenchmark(given ? `${given}_idle` : 'postgres://postgres@127.0.0.1/parley_idle', {
    conversations: Number(values.conversations),
    windowSeconds: Number(values.window),
    reuse: values.reuse!,
    server: given ? 'given' : 'private',
  });
  console.log(idleChecks(result).join('\n'));
}
