/**
 * Live events (docs/events.md), on PostgreSQL, against real server processes (bench/events-server.ts):
 *
 *   item-create throughput with events on / off   autocannon, POST /api/conversation_items at c=32, runs
 *                                                 alternated off/on so that a loaded machine hurts both alike
 *   commit -> SSE message latency p50/p99          100 open GET /api/events streams while items are created
 *                                                 at full rate; latency = arrival - the event's occurred_at
 *                                                 (stamped just before COMMIT, so it slightly overstates)
 *   webhook deliveries/s                           queued deliveries to a local receiver, worked off by one
 *                                                 server process's worker
 *
 * Targets: p99 <= 1000 ms; throughput ratio >= 0.85. Run alone:
 *   npx tsx bench/events.ts [--duration 5] [--rounds 4] [--streams 100] [--deliveries 2000]
 * (BENCH_EVENTS_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/parley_bench_events, recreated).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { parseArgs } from 'node:util';
import autocannon from 'autocannon';
import { createServices } from '../src/app.js';
import { createOrganisation, createUserInOrganisation } from '../src/auth/accounts.js';
import { createApiKey } from '../src/auth/api-keys.js';
import { loadConfig } from '../src/config/index.js';
import { openDatabase } from '../src/db/connection.js';
import { migrate } from '../src/db/migrate.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { freePort } from '../test/helpers/ports.js';
import { recreateDatabase } from './database.js';
import { serveNodeFlags } from './serve-flags.js';

export interface EventsBenchResult {
  connections: number;
  createdOff: number;
  createdOn: number;
  ratio: number;
  /** The machine's CPU time per created item (Parley, PostgreSQL and the load generator), events off and on. */
  cpuOff: number;
  cpuOn: number;
  streams: number;
  messages: number;
  latency: { p50: number; p99: number; max: number };
  createdDuringStreams: number;
  deliveries: number;
  deliveriesPerSecond: number;
}

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');
const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function server(databaseUrl: string, port: number, env: Record<string, string>): Promise<ChildProcess> {
  const child = spawn(process.execPath, [...serveNodeFlags(), '--import', 'tsx', 'bench/events-server.ts'], {
    cwd: root,
    env: {
      ...process.env,
      DATABASE_URL: databaseUrl,
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      RATE_LIMIT_PER_MINUTE: '100000000',
      EVENTS_STREAMS_PER_CREDENTIAL: '1000',
      WEBHOOK_ALLOW_PRIVATE_URLS: 'true',
      ...env,
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
  throw new Error('bench events server did not start');
}

async function stop(child: ChildProcess): Promise<void> {
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await Promise.race([exited, sleep(5000)]);
  child.kill('SIGKILL');
}

/** CPU time (user + system, every process and core) the machine has spent so far, in ms, from /proc/stat (Linux). */
function machineCpuMs(): number {
  try {
    const [user, nice, system, , , irq, softirq] = fs
      .readFileSync('/proc/stat', 'utf8')
      .split('\n', 1)[0]
      .split(/\s+/)
      .slice(1)
      .map(Number);
    return ((user + nice + system + irq + softirq) * 1000) / 100;
  } catch {
    return Number.NaN;
  }
}

/** One load run: requests/s, and the machine's CPU time per request in us (server, database, load). */
interface Measured {
  rps: number;
  cpuUs: number;
}

/** Creates items for `seconds`. */
async function createItems(url: string, token: string, conversations: string[], seconds: number, connections = 32): Promise<Measured> {
  const cpuBefore = machineCpuMs();
  let n = 0;
  const result = await autocannon({
    url,
    connections,
    duration: seconds,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/vnd.api+json' },
    requests: [
      {
        setupRequest: (request: autocannon.Request) => {
          const conversation_id = conversations[n++ % conversations.length];
          const body = JSON.stringify({
            data: { type: 'ConversationItem', attributes: { conversation_id, role: 'user', content: 'Benchmark message' } },
          });
          return { ...request, method: 'POST', path: '/api/conversation_items', body } as autocannon.Request;
        },
      },
    ],
  });
  const cpuUs = ((machineCpuMs() - cpuBefore) * 1000) / Math.max(1, result.requests.total);
  const errors = result.errors + result.timeouts + result.non2xx;
  if (errors > 0) console.log(`    (${errors} errors)`);
  return { rps: result.requests.average, cpuUs };
}

/** Opens `count` streams; records each message's latency (arrival - occurred_at). */
function openStreams(url: string, token: string, count: number) {
  const latencies: number[] = [];
  const requests: http.ClientRequest[] = [];
  let open = 0;
  const ready = new Promise<void>((resolve, reject) => {
    for (let i = 0; i < count; i++) {
      const request = http.get(
        `${url}/api/events?filter[type]=ConversationItem.created`,
        { headers: { authorization: `Bearer ${token}`, accept: 'text/event-stream' }, agent: false },
        (response) => {
          if (response.statusCode !== 200) reject(new Error(`stream answered ${response.statusCode}`));
          if (++open === count) resolve();
          let buffer = '';
          response.setEncoding('utf8');
          response.on('data', (chunk: string) => {
            const now = Date.now();
            buffer += chunk;
            for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
              const block = buffer.slice(0, end);
              buffer = buffer.slice(end + 2);
              const data = block.split('\n').find((l) => l.startsWith('data: '));
              if (!data) continue;
              const occurred = /"occurred_at" ?: ?"([^"]+)"/.exec(data)?.[1];
              if (occurred) latencies.push(now - Date.parse(occurred));
            }
          });
        },
      );
      request.on('error', reject);
      requests.push(request);
    }
  });
  return {
    ready,
    latencies,
    close: () => {
      for (const r of requests) r.destroy();
    },
  };
}

export async function eventsBenchmark(
  databaseUrl: string,
  options: { duration?: number; rounds?: number; streams?: number; deliveries?: number; connections?: number } = {},
): Promise<EventsBenchResult> {
  const { duration = 5, rounds = 4, streams = 100, deliveries = 2000, connections = 32 } = options;
  await recreateDatabase(databaseUrl);
  const config = loadConfig({
    ...process.env,
    DATABASE_URL: databaseUrl,
    LOG_LEVEL: 'silent',
    PASSWORD_HASH_COST_LOG2: '10',
    WEBHOOK_ALLOW_PRIVATE_URLS: 'true',
  });
  const database = await openDatabase(config);
  await migrate(database.db);
  const services = await createServices(database, config);
  const records = services.records!;
  const org = await createOrganisation(records, { name: 'Events bench' });
  const user = await createUserInOrganisation(records, {
    organisationId: org.id,
    email: 'bench@events.example',
    password: 'bench-password-1',
    fullName: 'Bench',
    role: 'admin',
  });
  const { token } = await createApiKey(records, { organisationId: org.id, userId: user.id, keyType: 'secret', name: 'bench' });
  const actor = systemActor(org.id, 'test');
  const conversations: string[] = [];
  for (let i = 0; i < 200; i++) conversations.push((await records.create(actor, 'Conversation', {})).id);

  // Throughput, events off and on, alternated (off, on, on, off, ...: a drift of the machine, or the tables'
  // growth, falls on both alike), each server warmed up for 3 s first.
  const port = await freePort();
  const runs = { off: [] as Measured[], on: [] as Measured[] };
  for (let round = 0; round < rounds; round++) {
    for (const mode of round % 2 === 0 ? (['off', 'on'] as const) : (['on', 'off'] as const)) {
      const child = await server(databaseUrl, port, { BENCH_EVENTS: mode });
      await createItems(`http://127.0.0.1:${port}`, token, conversations, 3); // warm-up
      const measured = await createItems(`http://127.0.0.1:${port}`, token, conversations, duration, connections);
      runs[mode].push(measured);
      console.log(
        `  create item c=${connections}, events ${mode.padEnd(3)} ${measured.rps.toFixed(0).padStart(6)} req/s, machine CPU ${measured.cpuUs.toFixed(0)} us/item`,
      );
      await stop(child);
    }
  }
  const mean = (list: Measured[], key: keyof Measured) => list.reduce((a, b) => a + b[key], 0) / list.length;
  const createdOff = mean(runs.off, 'rps');
  const createdOn = mean(runs.on, 'rps');
  const cpuOff = mean(runs.off, 'cpuUs');
  const cpuOn = mean(runs.on, 'cpuUs');

  // Latency with open streams while items are created at full rate.
  const child = await server(databaseUrl, port, { BENCH_EVENTS: 'on' });
  const opened = openStreams(`http://127.0.0.1:${port}`, token, streams);
  await opened.ready;
  await sleep(500);
  const createdDuringStreams = (await createItems(`http://127.0.0.1:${port}`, token, conversations, duration)).rps;
  await sleep(1500);
  opened.close();
  await stop(child);
  const sorted = [...opened.latencies].sort((a, b) => a - b);
  console.log(
    `  ${streams} streams: ${sorted.length} messages, commit -> message p50 ${percentile(sorted, 50)} ms, p99 ${percentile(sorted, 99)} ms (items ${createdDuringStreams.toFixed(0)} req/s meanwhile)`,
  );

  // Webhook deliveries per second: queue them, then let one worker work them off.
  let received = 0;
  const receiver = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      received++;
      res.writeHead(204).end();
    });
  });
  receiver.keepAliveTimeout = 60_000;
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  await records.create(actor, 'WebhookEndpoint', {
    url: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`,
    event_types: ['Conversation.created'],
  });
  for (let i = 0; i < deliveries; i++) await records.create(actor, 'Conversation', {});
  const started = Date.now();
  const worker = await server(databaseUrl, port, { BENCH_WEBHOOKS: 'on', WEBHOOK_POLL_MS: '100' });
  while (received < deliveries && Date.now() - started < 300_000) await sleep(50);
  const seconds = (Date.now() - started) / 1000;
  await stop(worker);
  receiver.closeAllConnections();
  receiver.close();
  await database.close();
  const deliveriesPerSecond = received / seconds;
  console.log(`  webhooks: ${received} deliveries in ${seconds.toFixed(1)} s (server start included): ${deliveriesPerSecond.toFixed(0)}/s`);
  return {
    connections,
    createdOff,
    createdOn,
    ratio: createdOn / createdOff,
    cpuOff,
    cpuOn,
    streams,
    messages: sorted.length,
    latency: { p50: percentile(sorted, 50), p99: percentile(sorted, 99), max: sorted.at(-1) ?? 0 },
    createdDuringStreams,
    deliveries: received,
    deliveriesPerSecond,
  };
}

export function eventsChecks(r: EventsBenchResult): string[] {
  return [
    `| item create c=${r.connections}, events off | ${r.createdOff.toFixed(0)} req/s |`,
    `| item create c=${r.connections}, events on | ${r.createdOn.toFixed(0)} req/s (ratio ${r.ratio.toFixed(2)}) |`,
    `| machine CPU per item, events off / on | ${r.cpuOff.toFixed(0)} / ${r.cpuOn.toFixed(0)} us (off / on ${(r.cpuOff / r.cpuOn).toFixed(2)}) |`,
    `| commit -> SSE message, ${r.streams} streams | p50 ${r.latency.p50} ms, p99 ${r.latency.p99} ms, max ${r.latency.max} ms (${r.messages} messages; items ${r.createdDuringStreams.toFixed(0)} req/s meanwhile) |`,
    `| webhook deliveries to a local receiver | ${r.deliveriesPerSecond.toFixed(0)}/s (${r.deliveries}) |`,
    `${r.latency.p99 <= 1000 ? 'PASS' : 'FAIL'} commit -> SSE message p99 ${r.latency.p99} ms (target <= 1000)`,
    `${r.ratio >= 0.85 ? 'PASS' : 'FAIL'} item create with events on / off ${r.ratio.toFixed(2)} (target >= 0.85)`,
  ];
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      duration: { type: 'string', default: '5' },
      rounds: { type: 'string', default: '4' },
      streams: { type: 'string', default: '100' },
      deliveries: { type: 'string', default: '2000' },
      connections: { type: 'string', default: '32' },
    },
  });
  const url = process.env.BENCH_EVENTS_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/parley_bench_events';
  const result = await eventsBenchmark(url, {
    duration: Number(values.duration),
    rounds: Number(values.rounds),
    streams: Number(values.streams),
    deliveries: Number(values.deliveries),
    connections: Number(values.connections),
  });
  console.log(eventsChecks(result).join('\n'));
}
