/**
 * npm run bench:sip: the SIP edge under load, on PostgreSQL, with Kamailio and SIPp (Debian's kamailio*,
 * sip-tester). Figures, not assertions; docs/benchmarks.md keeps the latest.
 *   1. REGISTERs per second with digest authentication (challenge + authenticated REGISTER + 200), from
 *      1,000 SIP users made through the records service, at increasing offered rates.
 *   2. Call setups per second with their records written: SIPp callers (authenticated INVITE, answered,
 *      hung up after 1 s) to one answering phone; counted once every Call is `completed` in the database.
 *   3. BYE -> `completed` visible through the API: sequential calls; for each, GET /api/calls/<id> is polled
 *      every 5 ms from Kamailio's BYE time (the call's `ended_at`, taken from the dialog's end event).
 *
 *   npm run bench:sip -- --users 1000 --register-rates 1000,2000,3000 --call-rate 50 --calls 500 --latency-calls 50
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { startApp } from '../src/app.js';
import { createOrganisation, createUserInOrganisation } from '../src/auth/accounts.js';
import { createApiKey } from '../src/auth/api-keys.js';
import { loadConfig } from '../src/config/index.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { loadSipSettings } from '../src/sip/config.js';
import { startSipEdge } from '../src/sip/edge.js';
import { freeUdpPort, SCENARIOS } from '../test/sip/harness.js';

const { values: args } = parseArgs({
  options: {
    users: { type: 'string', default: '1000' },
    'register-rates': { type: 'string', default: '1000,2000,3000,4000' },
    'register-seconds': { type: 'string', default: '5' },
    'call-rate': { type: 'string', default: '40' },
    calls: { type: 'string', default: '400' },
    'latency-calls': { type: 'string', default: '50' },
    'database-url': { type: 'string', default: process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres' },
  },
});

const DOMAIN = 'bench.parley.test';
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-sipbench-'));

function sipp(argv: string[], timeoutMs = 600_000): Promise<{ code: number; stdout: string }> {
  return new Promise((resolve) => {
    execFile('sipp', argv, { cwd: work, timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024 }, (error, stdout) =>
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

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];

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
  const results: string[] = [];
  try {
    // Tenant, an admin with a secret key for the API, and the SIP users.
    const org = await createOrganisation(records, { name: 'SIP bench' });
    const user = await createUserInOrganisation(records, {
      organisationId: org.id,
      email: 'bench@sip.example',
      password: 'bench-password-1',
      fullName: 'Bench',
      role: 'admin',
    });
    const key = await createApiKey(records, { organisationId: org.id, userId: user.id, keyType: 'secret', name: 'bench' });
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

    const port = await freeUdpPort();
    const settings = loadSipSettings({
      SIP_LISTEN: `udp:127.0.0.1:${port}`,
      SIP_DOMAIN: DOMAIN,
      SIP_FLOOD_REQUESTS: '0',
      SIP_CHILDREN: '4',
    });
    const edge = await startSipEdge({ settings, databaseUrl: config.databaseUrl, db: app.database.db, records });
    const target = `127.0.0.1:${port}`;
    try {
      // 1. REGISTER with digest authentication.
      for (const rate of args['register-rates']!.split(',').map(Number)) {
        const count = rate * Number(args['register-seconds']);
        const started = Date.now();
        const run = await sipp([
          target,
          '-sf',
          path.join(SCENARIOS, 'register_csv.xml'),
          '-inf',
          'users.csv',
          '-key',
          'domain',
          DOMAIN,
          '-i',
          '127.0.0.1',
          '-p',
          String(await freeUdpPort()),
          '-r',
          String(rate),
          '-m',
          String(count),
          '-l',
          String(rate * 2),
          '-nostdin',
          '-timeout',
          '120s',
          '-timeout_error',
          '-recv_timeout',
          '5000',
        ]);
        const seconds = (Date.now() - started) / 1000;
        const ok = stat(run.stdout, 'Successful call');
        const failed = stat(run.stdout, 'Failed call');
        const line = `REGISTER offered ${rate}/s: ${ok} ok, ${failed} failed in ${seconds.toFixed(1)} s = ${(ok / seconds).toFixed(0)} successful/s`;
        console.log(line);
        results.push(line);
      }

      // 2. Call setups with records written.
      const sinkPort = await freeUdpPort();
      const reg = await sipp([
        target,
        '-sf',
        path.join(SCENARIOS, 'register.xml'),
        '-key',
        'domain',
        DOMAIN,
        '-i',
        '127.0.0.1',
        '-p',
        String(sinkPort),
        '-s',
        'sink',
        '-au',
        'sink',
        '-ap',
        'sink-password-1',
        '-m',
        '1',
        '-nostdin',
        '-timeout',
        '10s',
        '-timeout_error',
      ]);
      if (reg.code !== 0) throw new Error('the answering phone could not register');
      const calls = Number(args.calls);
      const callRate = Number(args['call-rate']);
      const sink = sipp(
        [
          '-sf',
          path.join(SCENARIOS, 'callee_answer.xml'),
          '-i',
          '127.0.0.1',
          '-p',
          String(sinkPort),
          '-m',
          String(calls + Number(args['latency-calls'])),
          '-nostdin',
        ],
        900_000,
      );
      await new Promise((resolve) => setTimeout(resolve, 300));
      const before = await completedCount(app.database.db, org.id);
      const started = Date.now();
      const run = await sipp([
        target,
        '-sf',
        path.join(SCENARIOS, 'caller_bench.xml'),
        '-inf',
        'users.csv',
        '-key',
        'domain',
        DOMAIN,
        '-s',
        'sink',
        '-i',
        '127.0.0.1',
        '-p',
        String(await freeUdpPort()),
        '-r',
        String(callRate),
        '-m',
        String(calls),
        '-d',
        '1000',
        '-nostdin',
        '-timeout',
        '300s',
      ]);
      const ok = stat(run.stdout, 'Successful call');
      let done = 0;
      for (let i = 0; i < 600 && done < ok; i++) {
        done = (await completedCount(app.database.db, org.id)) - before;
        if (done < ok) await new Promise((resolve) => setTimeout(resolve, 100));
      }
      const seconds = (Date.now() - started) / 1000;
      // Each call is held 1 s: the setup rate is the completed calls over the run, less that 1 s.
      const line = `calls offered ${callRate}/s: ${ok} answered and hung up by SIPp, ${done} completed in the database in ${seconds.toFixed(1)} s = ${(done / (seconds - 1)).toFixed(1)} call setups/s with records`;
      console.log(line);
      results.push(line);

      // 3. BYE -> completed visible through the API.
      const latencies: number[] = [];
      for (let i = 0; i < Number(args['latency-calls']); i++) {
        const caller = `bench${String(i).padStart(5, '0')}`;
        const placing = sipp([
          target,
          '-sf',
          path.join(SCENARIOS, 'caller_call.xml'),
          '-key',
          'domain',
          DOMAIN,
          '-key',
          'from',
          caller,
          '-s',
          'sink',
          '-au',
          caller,
          '-ap',
          `pw-${caller}-secret`,
          '-d',
          '300',
          '-i',
          '127.0.0.1',
          '-p',
          String(await freeUdpPort()),
          '-m',
          '1',
          '-nostdin',
          '-timeout',
          '20s',
        ]);
        let id: string | undefined;
        while (!id) {
          const rows = await app.database.db
            .selectFrom('calls')
            .select(['id'])
            .where('organisation_id', '=', org.id)
            .where('from_number', '=', caller)
            .where('status', 'in', ['initiated', 'ringing', 'in_progress'])
            .execute();
          id = rows[0]?.id as string | undefined;
          if (!id) await new Promise((resolve) => setTimeout(resolve, 5));
        }
        for (;;) {
          const response = await fetch(`${app.url}/api/calls/${id}`, { headers: { authorization: `Bearer ${key.token}` } });
          const body = (await response.json()) as { data: { attributes: { status: string; ended_at: string | null } } };
          if (body.data.attributes.status === 'completed') {
            latencies.push(Date.now() - new Date(body.data.attributes.ended_at!).getTime());
            break;
          }
          await new Promise((resolve) => setTimeout(resolve, 5));
        }
        await placing;
      }
      latencies.sort((a, b) => a - b);
      const lat = `BYE -> completed through the API over ${latencies.length} calls: p50 ${percentile(latencies, 50)} ms, p99 ${percentile(latencies, 99)} ms, max ${latencies.at(-1)} ms`;
      console.log(lat);
      results.push(lat);
      await sink;
    } finally {
      await edge.stop();
    }
  } finally {
    await app.close();
    const cleanup = new pg.Client({ connectionString: base.toString() });
    await cleanup.connect();
    await cleanup.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await cleanup.end();
    fs.rmSync(work, { recursive: true, force: true });
  }
  console.log(`\n${results.join('\n')}`);
  process.exit(0);
}

async function completedCount(db: import('../src/db/connection.js').Database, organisationId: string): Promise<number> {
  const rows = await db
    .selectFrom('calls')
    .select((eb) => eb.fn.countAll<number>().as('n'))
    .where('organisation_id', '=', organisationId)
    .where('status', '=', 'completed')
    .execute();
  return Number(rows[0].n);
}

await main();
