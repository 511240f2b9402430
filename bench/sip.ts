/**
 * npm run bench:sip: the SIP edge against a bare Kamailio with the same authentication, on PostgreSQL, with
 * SIPp (Debian's kamailio*, sip-tester). Figures, not assertions; docs/benchmarks.md keeps the latest.
 *
 * Both targets run the configuration `sip serve` renders, on the same database, one after the other: the bare
 * Kamailio's copy has every call event (`route(EVENT)`) and the dialogs' database copy taken out, so what it
 * does is digest authentication against the same view, registrations written through to `sip_locations`,
 * and relaying with the dialog module. For each target:
 *   1. REGISTERs per second with digest authentication (challenge + authenticated REGISTER + 200) from
 *      --users SIP users made through the records service, offered at --register-rate for --register-seconds.
 *   2. Calls offered at --call-rate for --call-seconds (authenticated INVITE to one answering phone, which
 *      rings at once and answers 300 ms later; held --hold-ms, hung up). SIPp times the INVITE -> 180 and the
 *      180 -> 200 of each call (-trace_rtt): the edge's added relay latency is the difference of the two
 *      targets' percentiles. On the edge, the run then waits until every Call is terminal in the database:
 *      call setups per second with records written = calls completed / (time until the last was recorded -
 *      the hold time).
 *
 *   3. What a call and a REGISTER cost, counts the machine's load changes less than it changes throughput: CPU
 *      time of Kamailio's and rtpengine's process groups, of this Node process and of this database's
 *      PostgreSQL backends, and the transactions and rows written in the database.
 * Targets `bare+media`, `bare+events`, `bare+dlgdb` (combinable) put one part of the edge back into the bare
 * Kamailio, so that each part's cost shows apart.
 *
 *   npm run bench:sip -- --call-rate 100 --call-seconds 60
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { sql } from 'kysely';
import pg from 'pg';
import { startApp } from '../src/app.js';
import { createOrganisation } from '../src/auth/accounts.js';
import { loadConfig } from '../src/config/index.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { loadSipSettings, mediaListenAddress, renderKamailioConfig, type SipSettings } from '../src/sip/config.js';
import { startSipEdge } from '../src/sip/edge.js';
import { startKamailio } from '../src/sip/kamailio.js';
import { startRtpengine } from '../src/sip/rtpengine.js';
import { freeUdpPort, SCENARIOS } from '../test/sip/harness.js';

const { values: args } = parseArgs({
  options: {
    users: { type: 'string', default: '500' },
    'register-rate': { type: 'string', default: '2000' },
    'register-seconds': { type: 'string', default: '5' },
    'call-rate': { type: 'string', default: '100' },
    'call-seconds': { type: 'string', default: '60' },
    'hold-ms': { type: 'string', default: '1000' },
    targets: { type: 'string', default: 'bare,parley' },
    // Kamailio's UDP workers, the same for every target (SIP_CHILDREN).
    children: { type: 'string', default: process.env.SIP_CHILDREN ?? '4' },
    // The edge's consumer paused while SIPp calls (the events wait in sip_call_events) and resumed after:
    // separates what Kamailio adds from what applying the records costs the machine meanwhile.
    'defer-records': { type: 'boolean', default: false },
    'database-url': { type: 'string', default: process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres' },
  },
});

const DOMAIN = 'bench.parley.test';
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-sipbench-'));

function sipp(argv: string[], timeoutMs = 900_000, signal?: AbortSignal): Promise<{ code: number; stdout: string }> {
  return new Promise((resolve) => {
    execFile('sipp', argv, { cwd: work, timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024, signal }, (error, stdout) =>
      resolve({ code: error ? (typeof error.code === 'number' ? error.code : 1) : 0, stdout }),
    );
  });
}

/** A counter of SIPp's final statistics screen: `Successful call | <periodic> | <cumulated>`. */
function stat(stdout: string, label: string): number {
  const lines = stdout.split('\n').filter((l) => l.includes(label));
  const cells = lines.at(-1)?.split('|') ?? [];
  return Number((cells[2] ?? '').trim().split(/\s+/)[0]);
}

/** Kamailio's warnings and errors, counted per target and the first few printed (a blocked worker shows there). */
const kamailioMessages: Record<string, number> = {};
const kamailioLog = (target: string) => (line: string) => {
  if (!/ERROR|WARNING|CRITICAL/.test(line)) return;
  kamailioMessages[target] = (kamailioMessages[target] ?? 0) + 1;
  if (kamailioMessages[target] <= 5 || process.env.BENCH_SIP_DEBUG) console.log(`${target} kamailio: ${line}`);
};

const percentile = (sorted: number[], p: number) =>
  sorted.length ? sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] : Number.NaN;

/**
 * The bare Kamailio: the edge's configuration without call events and without the dialogs' database copy.
 * A target `bare+<part>+...` puts parts of the edge back, to tell their costs apart: `media` (rtpengine runs
 * and anchors each call's media, as the edge's does), `events` (call events queued and written to
 * sip_call_events, with no consumer), `dlgdb` (dialogs written to sip_dialogs every second).
 */
function bareConfig(rendered: string, parts: Set<string>): string {
  let bare = rendered;
  if (!parts.has('events')) bare = bare.replace(/^\s*route\(EVENT\);\s*$/gm, '');
  if (!parts.has('dlgdb')) bare = bare.replace('modparam("dialog", "db_mode", 2)', 'modparam("dialog", "db_mode", 0)');
  if ((!parts.has('events') && bare.includes('route(EVENT);')) || (!parts.has('dlgdb') && !bare.includes('"db_mode", 0)')))
    throw new Error('the bare configuration still sends events');
  return bare;
}

interface Hooks {
  beforeCalls?: () => Promise<void>;
  afterCalls?: () => Promise<void>;
  /** The process groups whose CPU time is counted (Kamailio's and rtpengine's main pids lead their groups). */
  groups?: () => { kamailio?: number; rtpengine?: number };
}

/** CPU time (ms, user + system) of every process in each group, read from /proc/<pid>/stat. */
function groupCpu(groups: Record<string, number | undefined>): Record<string, number> {
  const ticks = 1000 / 100; // CLK_TCK is 100 on Linux
  const out: Record<string, number> = {};
  const wanted = new Map(
    Object.entries(groups)
      .filter(([, pid]) => pid !== undefined)
      .map(([name, pid]) => [pid!, name]),
  );
  for (const name of wanted.values()) out[name] = 0;
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue;
    }
    // Fields after the command name (which may hold spaces): state, ppid, pgrp, ..., utime (14), stime (15).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const name = wanted.get(Number(fields[2]));
    if (name) out[name] += (Number(fields[11]) + Number(fields[12])) * ticks;
  }
  return out;
}

/** CPU time (ms) of this database's PostgreSQL backends, and its committed transactions and written rows. */
async function databaseWork(db: import('../src/db/connection.js').Database) {
  const { rows } = await sql<{ pids: number[]; xacts: string; writes: string }>`
    SELECT (SELECT array_agg(pid) FROM pg_stat_activity WHERE datname = current_database()) AS pids,
           (xact_commit + xact_rollback)::text AS xacts, (tup_inserted + tup_updated + tup_deleted)::text AS writes
    FROM pg_stat_database WHERE datname = current_database()`.execute(db);
  let cpu = 0;
  for (const pid of rows[0].pids ?? []) {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      cpu += (Number(fields[11]) + Number(fields[12])) * 10;
    } catch {}
  }
  return { pids: new Set(rows[0].pids ?? []), cpu, xacts: Number(rows[0].xacts), writes: Number(rows[0].writes) };
}

interface Cost {
  kamailioMs: number;
  rtpengineMs: number;
  nodeMs: number;
  postgresMs: number;
  transactions: number;
  rowsWritten: number;
}

const formatCost = (c: Cost) =>
  `CPU ms: Kamailio ${c.kamailioMs.toFixed(2)}, rtpengine ${c.rtpengineMs.toFixed(2)}, Node ${c.nodeMs.toFixed(2)}, PostgreSQL ${c.postgresMs.toFixed(2)}; ` +
  `${c.transactions.toFixed(1)} transactions, ${c.rowsWritten.toFixed(1)} rows written`;

interface TargetResult {
  registers: { ok: number; failed: number; perSecond: number; cost: Cost };
  calls: { offered: number; ok: number; failed: number; seconds: number; ring: number[]; answer: number[]; cost?: Cost };
  recorded?: { completed: number; nonTerminal: number; perSecond: number; waitedSeconds: number };
}

/** SIPp's response times (-trace_rtt): "ring" is rtd 1, "answer" rtd 2, in milliseconds. */
function responseTimes(prefix: string): { ring: number[]; answer: number[] } {
  const ring: number[] = [];
  const answer: number[] = [];
  for (const file of fs.readdirSync(work).filter((f) => f.startsWith(prefix) && f.endsWith('_rtt.csv'))) {
    const text = fs.readFileSync(path.join(work, file), 'utf8');
    if (process.env.BENCH_SIP_DEBUG) console.log(text.split('\n').slice(0, 5).join('\n'));
    for (const line of text.split('\n').slice(1)) {
      const [, ms, rtd] = line.split(';');
      if (rtd === undefined) continue;
      // SIPp names the timer (or numbers it, in the order the scenario starts them).
      const name = rtd.trim();
      (name === 'ring' || name === '1' ? ring : answer).push(Number(ms));
    }
    fs.rmSync(path.join(work, file));
  }
  return { ring: ring.sort((a, b) => a - b), answer: answer.sort((a, b) => a - b) };
}

async function main() {
  const base = new URL(args['database-url']!);
  const name = `parley_sipbench_${Date.now()}`;
  const admin = new pg.Client({ connectionString: base.toString() });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = new URL(base);
  url.pathname = `/${name}`;
  const config = loadConfig({
    ...process.env,
    DATABASE_URL: url.toString(),
    PORT: '0',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'warn',
    RATE_LIMIT_PER_MINUTE: '1000000',
  });
  const app = await startApp(config);
  const records = app.services.records!;
  const results: Record<string, TargetResult> = {};
  try {
    const org = await createOrganisation(records, { name: 'SIP bench' });
    const actor = systemActor(org.id, 'cli');
    const users = Number(args.users);
    const csv = ['SEQUENTIAL'];
    for (let i = 0; i < users; i++) {
      const username = `bench${String(i).padStart(5, '0')}`;
      const password = `pw-${username}-secret`;
      await records.create(actor, 'SipUser', { sip_username: username, sip_password: password });
      csv.push(`${username};[authentication username=${username} password=${password}]`);
    }
    await records.create(actor, 'SipUser', { sip_username: 'sink', sip_password: 'sink-password-1' });
    fs.writeFileSync(path.join(work, 'users.csv'), `${csv.join('\n')}\n`);

    for (const target of args.targets!.split(',')) {
      const port = await freeUdpPort();
      const settings: SipSettings = loadSipSettings({
        SIP_LISTEN: `udp:127.0.0.1:${port}`,
        SIP_DOMAIN: DOMAIN,
        SIP_FLOOD_REQUESTS: '0',
        SIP_CHILDREN: args.children!,
      });
      let stop: () => Promise<void>;
      let hooks: Hooks = {};
      if (target.split('+')[0] === 'bare') {
        const parts = new Set(target.split('+').slice(1));
        for (const part of parts)
          if (!['media', 'events', 'dlgdb'].includes(part)) throw new Error(`unknown part ${part} of ${target} (media, events, dlgdb)`);
        // The domain the views derive every SIP domain from, as `sip serve` writes it when it starts: the bare
        // Kamailio may run first, before the edge ever did (then no REGISTER found its user).
        await app.database.db.updateTable('sip_settings').set({ domain: settings.domain }).where('id', '=', 1).execute();
        const runDir = fs.mkdtempSync(path.join(work, 'bare-'));
        const configFile = path.join(runDir, 'kamailio.cfg');
        const rtpengine = parts.has('media')
          ? await startRtpengine({
              binary: settings.media.rtpengineBinary,
              runDir,
              listenAddress: mediaListenAddress(settings),
              portMin: settings.media.rtpPortMin,
              portMax: settings.media.rtpPortMax,
              timeoutSeconds: settings.media.timeoutSeconds,
              logLevel: settings.media.logLevel,
            })
          : undefined;
        const rendered = renderKamailioConfig({
          settings,
          databaseUrl: config.databaseUrl!,
          runDir,
          ...(rtpengine ? { rtpengineSocket: rtpengine.ngSocket } : {}),
        });
        fs.writeFileSync(configFile, bareConfig(rendered, parts), { mode: 0o600 });
        const kamailio = await startKamailio({
          binary: settings.kamailioBinary,
          kamcmd: settings.kamcmdBinary,
          configFile,
          runDir,
          onLog: kamailioLog(target),
        });
        stop = async () => {
          await kamailio.stop();
          await rtpengine?.stop();
        };
        hooks.groups = () => ({ kamailio: kamailio.pid(), rtpengine: rtpengine?.pid() });
      } else if (target === 'parley') {
        const edge = await startSipEdge({
          settings,
          databaseUrl: config.databaseUrl,
          db: app.database.db,
          records,
          listen: (channel, onNotify, onResumed) => app.database.listen(channel, onNotify, onResumed),
          runDir: fs.mkdtempSync(path.join(work, 'edge-')),
          onKamailioLog: kamailioLog(target),
        });
        if (args['defer-records']) hooks = { beforeCalls: () => edge.queue.stop(), afterCalls: () => edge.queue.start() };
        hooks.groups = () => ({ kamailio: edge.kamailio.pid(), rtpengine: edge.rtpengine.pid() });
        stop = () => edge.stop();
      } else throw new Error(`unknown target ${target} (bare, bare+media..., parley)`);
      try {
        results[target] = await measure(target, `127.0.0.1:${port}`, app.database.db, org.id, hooks);
      } finally {
        await stop();
      }
    }
  } finally {
    await app.close();
    const cleanup = new pg.Client({ connectionString: base.toString() });
    await cleanup.connect();
    await cleanup.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await cleanup.end();
    fs.rmSync(work, { recursive: true, force: true });
  }
  report(results);
  process.exit(0);
}

async function measure(
  target: string,
  address: string,
  db: import('../src/db/connection.js').Database,
  organisationId: string,
  hooks: Hooks = {},
): Promise<TargetResult> {
  const snapshot = async () => {
    const database = await databaseWork(db);
    const groups = groupCpu(hooks.groups?.() ?? {});
    return { kamailio: groups.kamailio ?? 0, rtpengine: groups.rtpengine ?? 0, node: process.cpuUsage(), database };
  };
  type Snapshot = Awaited<ReturnType<typeof snapshot>>;
  /** What the interval between two snapshots cost, per operation: CPU ms by process, transactions, rows written. */
  const cost = (a: Snapshot, b: Snapshot, operations: number): Cost => {
    const per = (x: number) => x / Math.max(1, operations);
    return {
      kamailioMs: per((b.kamailio ?? 0) - (a.kamailio ?? 0)),
      rtpengineMs: per((b.rtpengine ?? 0) - (a.rtpengine ?? 0)),
      nodeMs: per((b.node.user + b.node.system - a.node.user - a.node.system) / 1000),
      // Backends that existed at both ends (pooled connections; Kamailio's are opened at its start).
      postgresMs: per(b.database.cpu - a.database.cpu),
      transactions: per(b.database.xacts - a.database.xacts),
      rowsWritten: per(b.database.writes - a.database.writes),
    };
  };
  // 1. REGISTER with digest authentication.
  const beforeRegisters = await snapshot();
  const registerRate = Number(args['register-rate']);
  const registerCount = registerRate * Number(args['register-seconds']);
  let started = Date.now();
  const registering = await sipp([
    address,
    ...['-sf', path.join(SCENARIOS, 'register_csv.xml'), '-inf', 'users.csv', '-key', 'domain', DOMAIN],
    ...['-i', '127.0.0.1', '-p', String(await freeUdpPort())],
    ...['-r', String(registerRate), '-m', String(registerCount), '-l', String(registerRate * 2)],
    ...['-nostdin', '-timeout', '120s', '-timeout_error', '-recv_timeout', '5000'],
  ]);
  const registerSeconds = (Date.now() - started) / 1000;
  const registers = {
    ok: stat(registering.stdout, 'Successful call'),
    failed: stat(registering.stdout, 'Failed call'),
    perSecond: stat(registering.stdout, 'Successful call') / registerSeconds,
    cost: cost(beforeRegisters, await snapshot(), stat(registering.stdout, 'Successful call')),
  };
  console.log(
    `${target}: REGISTER offered ${registerRate}/s: ${registers.ok} ok, ${registers.failed} failed, ${registers.perSecond.toFixed(0)}/s`,
  );

  // 2. Calls to one answering phone.
  const sinkPort = await freeUdpPort();
  const registered = await sipp([
    address,
    ...['-sf', path.join(SCENARIOS, 'register.xml'), '-key', 'domain', DOMAIN, '-i', '127.0.0.1', '-p', String(sinkPort)],
    ...['-s', 'sink', '-au', 'sink', '-ap', 'sink-password-1', '-m', '1', '-nostdin', '-timeout', '10s', '-timeout_error'],
  ]);
  if (registered.code !== 0) throw new Error('the answering phone could not register');
  const callRate = Number(args['call-rate']);
  const offered = callRate * Number(args['call-seconds']);
  const holdMs = Number(args['hold-ms']);
  // Ended when the run stops waiting for it: calls that never reached it would keep it running.
  const sinkStop = new AbortController();
  const sink = sipp(
    ['-sf', path.join(SCENARIOS, 'callee_answer.xml'), '-i', '127.0.0.1', '-p', String(sinkPort), '-m', String(offered), '-nostdin'],
    900_000,
    sinkStop.signal,
  );
  await new Promise((resolve) => setTimeout(resolve, 300));
  const before = await counts(db, organisationId);
  const beforeCalls = await snapshot();
  await hooks.beforeCalls?.();
  started = Date.now();
  const calling = await sipp([
    address,
    ...['-sf', path.join(SCENARIOS, 'caller_bench.xml'), '-inf', 'users.csv', '-key', 'domain', DOMAIN, '-s', 'sink'],
    ...['-i', '127.0.0.1', '-p', String(await freeUdpPort())],
    ...['-r', String(callRate), '-m', String(offered), '-d', String(holdMs), '-l', String(callRate * 10)],
    ...['-nostdin', '-timeout', `${Number(args['call-seconds']) + 120}s`, '-recv_timeout', '10000'],
    ...['-trace_rtt', '-rtt_freq', '1'],
  ]);
  const callSeconds = (Date.now() - started) / 1000;
  await hooks.afterCalls?.();
  const times = responseTimes('caller_bench');
  const calls = {
    offered,
    ok: stat(calling.stdout, 'Successful call'),
    failed: stat(calling.stdout, 'Failed call'),
    seconds: callSeconds,
    ...times,
  };
  console.log(
    `${target}: calls offered ${callRate}/s x ${args['call-seconds']} s: ${calls.ok} answered and hung up, ${calls.failed} failed in ${callSeconds.toFixed(1)} s; ` +
      `INVITE->180 p50 ${percentile(times.ring, 50)} p99 ${percentile(times.ring, 99)} ms, 180->200 p50 ${percentile(times.answer, 50)} p99 ${percentile(times.answer, 99)} ms`,
  );
  // The phone ends when it has answered every call, or stops waiting for those that never came.
  await Promise.race([sink, new Promise((resolve) => setTimeout(resolve, 15_000))]);
  sinkStop.abort();
  if (target !== 'parley') {
    const callCost = cost(beforeCalls, await snapshot(), calls.ok);
    console.log(`${target}: per answered call ${formatCost(callCost)}; per REGISTER ${formatCost(registers.cost)}`);
    return { registers, calls: { ...calls, cost: callCost } };
  }

  // Every call recorded: wait until none is non-terminal and the completed count stops moving.
  let now = await counts(db, organisationId);
  const waitStart = Date.now();
  let lastChange = Date.now();
  let lastRecordedAt = Date.now();
  for (let previous = -1; Date.now() - waitStart < 300_000; ) {
    now = await counts(db, organisationId);
    if (now.completed !== previous) {
      previous = now.completed;
      lastChange = Date.now();
      lastRecordedAt = Date.now();
    }
    if (now.nonTerminal === 0 && now.completed - before.completed >= calls.ok) break;
    if (now.nonTerminal === 0 && Date.now() - lastChange > 5000) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const completed = now.completed - before.completed;
  const recordedSeconds = (lastRecordedAt - started) / 1000;
  const recorded = {
    completed,
    nonTerminal: now.nonTerminal,
    perSecond: completed / (recordedSeconds - holdMs / 1000),
    waitedSeconds: (lastRecordedAt - (started + callSeconds * 1000)) / 1000,
  };
  console.log(
    `${target}: ${completed} calls completed in the database, ${now.nonTerminal} non-terminal; ${recorded.perSecond.toFixed(1)} setups/s with records (last recorded ${recorded.waitedSeconds.toFixed(1)} s after SIPp ended)`,
  );
  // Why calls are still open, when some are: their events still queued (the consumer behind), or their dialogs
  // still held by Kamailio (calls SIPp gave up on end by the ring timeout, noack_timeout or the keep-alives).
  if (now.nonTerminal > 0) {
    const { rows } = await sql<{ queued: number; dialogs: number }>`
      SELECT (SELECT count(*)::int FROM sip_call_events WHERE error IS NULL) AS queued,
             (SELECT count(*)::int FROM sip_dialogs) AS dialogs`.execute(db);
    console.log(`${target}: still open: ${rows[0].queued} call events queued, ${rows[0].dialogs} dialogs in sip_dialogs`);
  }
  // Per call Kamailio carried (completed in the database), records included.
  const callCost = cost(beforeCalls, await snapshot(), completed);
  console.log(`${target}: per completed call ${formatCost(callCost)}; per REGISTER ${formatCost(registers.cost)}`);
  return { registers, calls: { ...calls, cost: callCost }, recorded };
}

async function counts(db: import('../src/db/connection.js').Database, organisationId: string) {
  const rows = await db
    .selectFrom('calls')
    .select((eb) => [
      eb.fn.countAll<number>().filterWhere('status', '=', 'completed').as('completed'),
      eb.fn.countAll<number>().filterWhere('status', 'in', ['initiated', 'ringing', 'in_progress']).as('nonTerminal'),
    ])
    .where('organisation_id', '=', organisationId)
    .execute();
  return { completed: Number(rows[0].completed), nonTerminal: Number(rows[0].nonTerminal) };
}

/** One column per target; the edge's ratios and differences against `bare` (and `bare+media` when it ran). */
function report(results: Record<string, TargetResult>) {
  const targets = Object.keys(results);
  const parley = results.parley;
  const bases = ['bare', 'bare+media'].filter((b) => results[b]);
  const header = [...targets, ...(parley ? bases.map((b) => `parley vs ${b}`) : [])];
  const lines: string[] = ['', `| measure | ${header.join(' | ')} |`, `|---|${header.map(() => '---').join('|')}|`];
  const fmt = (n: number | undefined, digits = 0) => (n === undefined || Number.isNaN(n) ? '-' : n.toFixed(digits));
  const row = (measure: string, value: (r: TargetResult) => number | undefined, digits: number, compare?: 'ratio' | 'difference') => {
    const cells = targets.map((t) => fmt(value(results[t]), digits));
    if (parley)
      for (const b of bases) {
        const e = value(parley);
        const v = value(results[b]);
        if (!compare || e === undefined || v === undefined) cells.push('');
        else if (compare === 'ratio') cells.push(fmt(e / v, 2));
        else cells.push(`${e - v >= 0 ? '+' : ''}${fmt(e - v)} ms`);
      }
    lines.push(`| ${measure} | ${cells.join(' | ')} |`);
  };
  const hold = Number(args['hold-ms']) / 1000;
  row(`REGISTER/s with digest (offered ${args['register-rate']}/s)`, (r) => r.registers.perSecond, 0, 'ratio');
  row(`calls answered, % (offered ${args['call-rate']}/s x ${args['call-seconds']} s)`, (r) => (100 * r.calls.ok) / r.calls.offered, 2);
  row(
    'call setups/s (bare: answered; edge: completed in the database)',
    (r) => r.recorded?.perSecond ?? r.calls.ok / (r.calls.seconds - hold),
    1,
    'ratio',
  );
  for (const [label, key] of [
    ['INVITE -> 180', 'ring'],
    ['180 -> 200', 'answer'],
  ] as const) {
    for (const p of [50, 99]) row(`${label} p${p} (ms)`, (r) => percentile(r.calls[key], p), 0, 'difference');
  }
  row('calls left non-terminal after the run', (r) => r.recorded?.nonTerminal, 0);
  for (const [label, key, digits] of [
    ['Kamailio', 'kamailioMs', 2],
    ['rtpengine', 'rtpengineMs', 2],
    ['Node (edge: the consumer and API)', 'nodeMs', 2],
    ['PostgreSQL (this database)', 'postgresMs', 2],
    ['transactions', 'transactions', 1],
    ['rows written', 'rowsWritten', 1],
  ] as const) {
    row(`per call: ${label}${digits === 2 ? ', CPU ms' : ''}`, (r) => r.calls.cost?.[key], digits, 'ratio');
  }
  row(
    'per REGISTER: CPU ms, all processes',
    (r) => r.registers.cost.kamailioMs + r.registers.cost.nodeMs + r.registers.cost.postgresMs,
    2,
    'ratio',
  );
  console.log(lines.join('\n'));
}

await main();
