/**
 * Live streams at scale (docs/benchmarks.md, "Live streams at scale"), on PostgreSQL, against one real server
 * process (bench/streams-server.ts):
 *
 *   1. `--members` member streams (an admin's key, every ConversationItem.created) and writes at `--rate` items
 *      per second for `--duration` s, to conversations no visitor watches yet: commit -> message latency,
 *      and the server's statements and CPU per write;
 *   2. then `--visitors` visitor streams as well (one conversation each, tokens signed as POST
 *      /api/visitor_sessions signs them), with the server's sockets and memory before and after opening them;
 *   3. the same writes again, now to the visitors' conversations (each write reaches one visitor's stream and
 *      every member stream): latency at members and visitors, statements and CPU per write.
 *
 * The fan-out cost is independent of visitors' streams when phase 3's statements per write equal phase 1's.
 * Latency is arrival - the event's occurred_at (stamped before COMMIT, so it slightly overstates).
 * Targets: 10,000 streams open; p99 <= 250 ms at 200 writes/s. Run alone:
 *   npx tsx bench/streams.ts [--visitors 9900] [--members 100] [--rate 200] [--duration 20] [--writers 2]
 * or `npm run bench -- --only streams` (BENCH_STREAMS_DATABASE_URL, default
 * postgres://postgres@127.0.0.1:5432/parley_bench_streams, recreated). The server is started with its open
 * file limit raised to the hard limit (`ulimit -n`); this process needs one descriptor per stream too.
 */
import { fork, spawn, type ChildProcess } from 'node:child_process';
import http from 'node:http';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { createServices } from '../src/app.js';
import { createOrganisation, createUserInOrganisation } from '../src/auth/accounts.js';
import { createApiKey } from '../src/auth/api-keys.js';
import { signToken } from '../src/auth/tokens.js';
import { loadConfig } from '../src/config/index.js';
import { openDatabase } from '../src/db/connection.js';
import { migrate } from '../src/db/migrate.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { freePort } from '../test/helpers/ports.js';
import { recreateDatabase } from './database.js';
import { serveNodeFlags } from './serve-flags.js';

export interface StreamsPhase {
  writes: number;
  writesPerSecond: number;
  messages: number;
  latency: { p50: number; p99: number; max: number };
  statementsPerWrite: number;
  cpuUsPerWrite: number;
}

export interface StreamsBenchResult {
  members: number;
  visitors: number;
  opened: number;
  refused: number;
  openSeconds: number;
  server: { before: ServerStats; after: ServerStats };
  kbPerStream: number;
  membersOnly: StreamsPhase;
  withVisitors: StreamsPhase & { visitorMessages: number; visitorLatency: { p50: number; p99: number; max: number } };
}

interface ServerStats {
  statements: number;
  cpuMs: number;
  rssMb: number;
  heapMb: number;
  fds: number;
}

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');
const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const summary = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return { p50: percentile(sorted, 50), p99: percentile(sorted, 99), max: sorted.at(-1) ?? 0 };
};

async function startServer(databaseUrl: string, port: number, statsPort: number, streams: number): Promise<ChildProcess> {
  // BENCH_CPU_PROF=1 writes the server's CPU profile to bench/profiles/, as in bench/run.ts.
  const profile = process.env.BENCH_CPU_PROF ? ['--cpu-prof', '--cpu-prof-dir', path.join(root, 'bench', 'profiles')] : [];
  const node = [process.execPath, ...serveNodeFlags(), ...profile, '--import', 'tsx', 'bench/streams-server.ts']
    .map((a) => `'${a}'`)
    .join(' ');
  // One descriptor per stream: raise the soft limit to the hard one (a shell builtin; Node cannot).
  const child = spawn('sh', ['-c', `ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec ${node}`], {
    cwd: root,
    env: {
      ...process.env,
      DATABASE_URL: databaseUrl,
      PORT: String(port),
      STATS_PORT: String(statsPort),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      RATE_LIMIT_PER_MINUTE: '100000000',
      VISITOR_RATE_LIMIT_PER_MINUTE: '100000000',
      VISITOR_ADDRESS_RATE_LIMIT_PER_MINUTE: '100000000',
      AGENT_RUNTIME: 'false',
      WEBHOOK_WORKER: 'false',
      // Every stream comes from this machine's one address: the caps are not what is measured here.
      EVENTS_STREAMS_PER_CREDENTIAL: String(streams + 10),
      EVENTS_STREAMS_PER_USER: String(streams + 10),
      EVENTS_STREAMS_PER_ORGANISATION: String(streams + 10),
      EVENTS_STREAMS_PER_ADDRESS: String(streams + 10),
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const started = Date.now();
  while (Date.now() - started < 60_000) {
    const ok = await fetch(`http://127.0.0.1:${port}/healthz`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return child;
    await sleep(200);
  }
  child.kill('SIGKILL');
  throw new Error('bench streams server did not start');
}

async function stop(child: ChildProcess): Promise<void> {
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await Promise.race([exited, sleep(10_000)]);
  child.kill('SIGKILL');
}

const stats = async (statsPort: number): Promise<ServerStats> =>
  (await fetch(`http://127.0.0.1:${statsPort}/`)).json() as Promise<ServerStats>;

/** Open streams, each recording the latency of every message into `latencies`. */
class Streams {
  readonly requests: http.ClientRequest[] = [];
  latencies: number[] = [];
  opened = 0;
  refused = 0;

  constructor(private readonly url: string) {}

  /** Opens one stream per token, `batch` at a time (the server's accept backlog is finite). */
  async open(tokens: string[], batch = 200): Promise<void> {
    for (let i = 0; i < tokens.length; i += batch) {
      await Promise.all(tokens.slice(i, i + batch).map((token) => this.openOne(token)));
    }
  }

  private openOne(token: string): Promise<void> {
    return new Promise((resolve) => {
      const request = http.get(
        `${this.url}/api/events?filter[type]=ConversationItem.created`,
        { headers: { authorization: `Bearer ${token}`, accept: 'text/event-stream' }, agent: false },
        (response) => {
          if (response.statusCode !== 200) {
            this.refused++;
            response.resume();
            resolve();
            return;
          }
          this.opened++;
          resolve();
          let buffer = '';
          response.setEncoding('utf8');
          response.on('data', (chunk: string) => {
            const now = Date.now();
            buffer += chunk;
            for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
              const block = buffer.slice(0, end);
              buffer = buffer.slice(end + 2);
              const occurred = /"occurred_at" ?: ?"([^"]+)"/.exec(block)?.[1];
              if (occurred) this.latencies.push(now - Date.parse(occurred));
            }
          });
        },
      );
      request.on('error', () => {
        this.refused++;
        resolve();
      });
      this.requests.push(request);
    });
  }

  close(): void {
    for (const r of this.requests) r.destroy();
  }
}

/**
 * Creates items at `rate` per second for `seconds`, round robin over `conversations`, from `writers` processes of
 * their own (bench/streams-writer.mjs), each offering its share of the rate over its share of the conversations.
 */
async function write(url: string, token: string, conversations: string[], rate: number, seconds: number, writers: number): Promise<number> {
  const results = await Promise.all(
    Array.from({ length: writers }, (_, w) => {
      const child = fork(path.join(root, 'bench', 'streams-writer.mjs'), { stdio: 'inherit' });
      const done = new Promise<{ written: number; errors: number }>((resolve, reject) => {
        child.once('message', (message) => resolve(message as { written: number; errors: number }));
        child.once('exit', (code) => reject(new Error(`streams writer exited with ${code}`)));
      });
      child.send({
        url,
        token,
        conversations: conversations.filter((_, i) => i % writers === w),
        rate: rate / writers,
        seconds,
        // A connection waits for its answer before its next write (autocannon): one connection per write a
        // second keeps offering the rate while a write takes up to a second (64 in all reached 50-67/s loaded).
        connections: Math.ceil(Math.max(64, rate) / writers),
      });
      return done;
    }),
  );
  const errors = results.reduce((sum, r) => sum + r.errors, 0);
  if (errors > 0) console.log(`    (${errors} write errors)`);
  return results.reduce((sum, r) => sum + r.written, 0);
}

async function phase(
  url: string,
  statsPort: number,
  token: string,
  conversations: string[],
  rate: number,
  seconds: number,
  members: Streams,
  writers: number,
): Promise<StreamsPhase> {
  members.latencies = [];
  const before = await stats(statsPort);
  const writes = await write(url, token, conversations, rate, seconds, writers);
  await sleep(1500);
  const after = await stats(statsPort);
  return {
    writes,
    writesPerSecond: writes / seconds,
    messages: members.latencies.length,
    latency: summary(members.latencies),
    // The stats requests themselves run no statement; the 1.5 s wait adds the idle loops' few.
    statementsPerWrite: (after.statements - before.statements) / Math.max(1, writes),
    cpuUsPerWrite: ((after.cpuMs - before.cpuMs) * 1000) / Math.max(1, writes),
  };
}

export async function streamsBenchmark(
  databaseUrl: string,
  options: { visitors?: number; members?: number; rate?: number; duration?: number; writers?: number } = {},
): Promise<StreamsBenchResult> {
  const { visitors = 9900, members = 100, rate = 200, duration = 20, writers = 2 } = options;
  await recreateDatabase(databaseUrl);
  const config = loadConfig({ ...process.env, DATABASE_URL: databaseUrl, LOG_LEVEL: 'silent', PASSWORD_HASH_COST_LOG2: '10' });
  const database = await openDatabase(config);
  await migrate(database.db);
  const services = await createServices(database, config);
  const records = services.records!;
  const org = await createOrganisation(records, { name: 'Streams bench' });
  const owner = await createUserInOrganisation(records, {
    organisationId: org.id,
    email: 'bench@streams.example',
    password: 'bench-password-1',
    fullName: 'Bench',
    role: 'owner',
  });
  const { token } = await createApiKey(records, { organisationId: org.id, userId: owner.id, keyType: 'secret', name: 'bench' });
  const publishable = await createApiKey(records, { organisationId: org.id, userId: owner.id, keyType: 'publishable', name: 'widget' });
  const actor = systemActor(org.id, 'widget');
  const conversations: string[] = [];
  const started = Date.now();
  for (let i = 0; i < visitors; i += 16) {
    const batch = await Promise.all(
      Array.from({ length: Math.min(16, visitors - i) }, () =>
        records.create(actor, 'Conversation', { status: 'active', channel: 'chat', mode: 'text' }),
      ),
    );
    conversations.push(...batch.map((c) => c.id));
  }
  const quiet = [];
  for (let i = 0; i < 200; i++) quiet.push((await records.create(actor, 'Conversation', {})).id);
  const expiresAt = new Date(Date.now() + 4 * 3600 * 1000);
  const keyId = JSON.parse(Buffer.from(publishable.token.split('.')[1], 'base64url').toString()).jti as string;
  const visitorTokens = await Promise.all(
    conversations.map((cnv) =>
      signToken({ typ: 'visitor', sub: crypto.randomUUID(), org: org.id, jti: keyId, cnv }, services.signingKey, expiresAt),
    ),
  );
  await database.close();
  console.log(`  streams: ${visitors} conversations and visitor tokens in ${((Date.now() - started) / 1000).toFixed(0)} s`);

  const port = await freePort();
  const statsPort = await freePort();
  const child = await startServer(databaseUrl, port, statsPort, visitors + members);
  const url = `http://127.0.0.1:${port}`;
  const memberStreams = new Streams(url);
  const visitorStreams = new Streams(url);
  try {
    await memberStreams.open(Array.from({ length: members }, () => token));
    await sleep(500);
    const membersOnly = await phase(url, statsPort, token, quiet, rate, duration, memberStreams, writers);
    console.log(
      `  ${members} member streams, ${membersOnly.writesPerSecond.toFixed(0)} writes/s: p50 ${membersOnly.latency.p50} ms, p99 ${membersOnly.latency.p99} ms, ${membersOnly.statementsPerWrite.toFixed(2)} statements and ${membersOnly.cpuUsPerWrite.toFixed(0)} us CPU per write`,
    );

    const before = await stats(statsPort);
    const openStarted = Date.now();
    await visitorStreams.open(visitorTokens);
    const openSeconds = (Date.now() - openStarted) / 1000;
    await sleep(2000);
    const after = await stats(statsPort);
    const kbPerStream = ((after.rssMb - before.rssMb) * 1024) / Math.max(1, visitorStreams.opened);
    console.log(
      `  + ${visitorStreams.opened} visitor streams (${visitorStreams.refused} refused) in ${openSeconds.toFixed(1)} s: server fds ${before.fds} -> ${after.fds}, RSS ${before.rssMb.toFixed(0)} -> ${after.rssMb.toFixed(0)} MB (${kbPerStream.toFixed(1)} kB a stream), heap ${before.heapMb.toFixed(0)} -> ${after.heapMb.toFixed(0)} MB`,
    );

    visitorStreams.latencies = [];
    const withVisitors = await phase(url, statsPort, token, conversations, rate, duration, memberStreams, writers);
    const visitorLatency = summary(visitorStreams.latencies);
    console.log(
      `  ${members + visitorStreams.opened} streams, ${withVisitors.writesPerSecond.toFixed(0)} writes/s: members p50 ${withVisitors.latency.p50} ms, p99 ${withVisitors.latency.p99} ms; visitors p50 ${visitorLatency.p50} ms, p99 ${visitorLatency.p99} ms (${visitorStreams.latencies.length} messages); ${withVisitors.statementsPerWrite.toFixed(2)} statements and ${withVisitors.cpuUsPerWrite.toFixed(0)} us CPU per write`,
    );
    return {
      members,
      visitors,
      opened: memberStreams.opened + visitorStreams.opened,
      refused: memberStreams.refused + visitorStreams.refused,
      openSeconds,
      server: { before, after },
      kbPerStream,
      membersOnly,
      withVisitors: { ...withVisitors, visitorMessages: visitorStreams.latencies.length, visitorLatency },
    };
  } finally {
    memberStreams.close();
    visitorStreams.close();
    await stop(child);
  }
}

export function streamsChecks(r: StreamsBenchResult): string[] {
  const a = r.membersOnly;
  const b = r.withVisitors;
  const worst = Math.max(b.latency.p99, b.visitorLatency.p99);
  return [
    `| streams open on one process | ${r.opened} (${r.members} members, ${r.opened - r.members} visitors; ${r.refused} refused), opened in ${r.openSeconds.toFixed(1)} s |`,
    `| server sockets (open fds) / RSS with the visitors' streams | ${r.server.before.fds} -> ${r.server.after.fds} / ${r.server.before.rssMb.toFixed(0)} -> ${r.server.after.rssMb.toFixed(0)} MB (${r.kbPerStream.toFixed(1)} kB a stream) |`,
    `| ${r.members} member streams, ${a.writesPerSecond.toFixed(0)} writes/s | p50 ${a.latency.p50} ms, p99 ${a.latency.p99} ms, max ${a.latency.max} ms; ${a.statementsPerWrite.toFixed(2)} statements, ${a.cpuUsPerWrite.toFixed(0)} us server CPU per write |`,
    `| ${r.opened} streams, ${b.writesPerSecond.toFixed(0)} writes/s | members p50 ${b.latency.p50} ms, p99 ${b.latency.p99} ms, max ${b.latency.max} ms; visitors p50 ${b.visitorLatency.p50} ms, p99 ${b.visitorLatency.p99} ms (${b.visitorMessages} messages); ${b.statementsPerWrite.toFixed(2)} statements, ${b.cpuUsPerWrite.toFixed(0)} us server CPU per write |`,
    `${r.refused === 0 && r.opened === r.members + r.visitors ? 'PASS' : 'FAIL'} ${r.opened} streams open (target ${r.members + r.visitors})`,
    `${worst <= 250 ? 'PASS' : 'FAIL'} commit -> message p99 ${worst} ms with ${r.opened} streams (target <= 250)`,
    `${b.statementsPerWrite <= a.statementsPerWrite + 0.5 ? 'PASS' : 'FAIL'} statements per write ${a.statementsPerWrite.toFixed(2)} -> ${b.statementsPerWrite.toFixed(2)} with the visitors' streams (target: no growth)`,
  ];
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      visitors: { type: 'string', default: '9900' },
      members: { type: 'string', default: '100' },
      rate: { type: 'string', default: '200' },
      duration: { type: 'string', default: '20' },
      writers: { type: 'string', default: '2' },
    },
  });
  const url = process.env.BENCH_STREAMS_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/parley_bench_streams';
  const result = await streamsBenchmark(url, {
    visitors: Number(values.visitors),
    members: Number(values.members),
    rate: Number(values.rate),
    duration: Number(values.duration),
    writers: Number(values.writers),
  });
  console.log(streamsChecks(result).join('\n'));
}
