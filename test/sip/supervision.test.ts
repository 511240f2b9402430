/**
 * The SIP edge under faults: a SIP port already taken, `kill -9` of Kamailio and of `sip serve` in the middle of
 * a call, and phones that vanish without BYE. PostgreSQL, Kamailio and SIPp (skipped, with the reason, without).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { assertSipPortFree } from '../../src/sip/edge.js';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import { DOMAIN, freeUdpPort, register, type SipStack, sipp, sipSkipReason, startSipStack, until } from './harness.js';

const skip = sipSkipReason();
if (skip) console.warn(`SIP supervision tests skipped: ${skip}`);

/** Whether any process of the group `pgid` is alive. */
function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

describe.skipIf(skip !== undefined)('SIP edge supervision (Kamailio + SIPp)', () => {
  let t: TestApp;
  let tenant: Tenant;
  let admin: Client;
  let n = 0;
  const cleanup: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    t = await startTestApp();
    tenant = await seedTenant(t, 'Supervised');
    admin = client(t.app, tenant.admin.token);
  }, 60_000);
  afterAll(async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
    await t?.close();
  });

  async function sipUser() {
    const name = `s${Date.now().toString(36)}${n++}`;
    const password = `pw-${name}-secret`;
    const response = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: name, sip_password: password }));
    expect(response.status).toBe(201);
    return { id: response.body.data.id as string, name, password };
  }

  async function callRow(from: string) {
    return t.db
      .selectFrom('calls')
      .select(['id', 'status', 'call_uuid', 'ended_at', 'duration_seconds'])
      .where('organisation_id', '=', tenant.organisationId)
      .where('from_number', '=', from)
      .executeTakeFirst();
  }

  const terminal = ['completed', 'busy', 'no_answer', 'canceled', 'failed'];

  /** A call answered by `callee` (registered through `port`) and hung up by the caller after `holdMs`. */
  async function placeCall(port: number, holdMs: number) {
    const caller = await sipUser();
    const callee = await sipUser();
    const calleePort = await freeUdpPort();
    expect((await register({ port } as SipStack, callee.name, callee.password, calleePort)).code).toBe(0);
    const answering = sipp('callee_answer', undefined, { localPort: calleePort, timeoutSeconds: 60 });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const placing = sipp('caller_call', port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name },
      timeoutSeconds: 60,
      args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password, '-d', String(holdMs)],
    });
    const answered = await until(async () => {
      const row = await callRow(caller.name);
      return row?.status === 'in_progress' ? row : undefined;
    }, 'the call to be answered');
    // The dialog is in sip_dialogs within a second (db_mode 2).
    await until(async () => {
      const { rows } = await sql<{ n: number }>`SELECT count(*)::int AS n FROM sip_dialogs WHERE callid = ${answered.call_uuid}`.execute(
        t.db,
      );
      return rows[0].n > 0 ? true : undefined;
    }, 'the dialog in sip_dialogs');
    return { caller, callee, answering, placing };
  }

  it('refuses to start, saying so, when the SIP port is taken (a second Kamailio would share it silently)', async () => {
    const port = await freeUdpPort();
    const holder = dgram.createSocket('udp4');
    await new Promise<void>((resolve) => holder.bind(port, '127.0.0.1', resolve));
    try {
      await expect(startSipStack(t, {}, port)).rejects.toThrow(/SIP port udp:127\.0\.0\.1:\d+ is taken by another process/);
    } finally {
      holder.close();
    }
    const running = await startSipStack(t, {}, port);
    try {
      await expect(startSipStack(t, {}, port)).rejects.toThrow(/is taken/);
      // The running edge is untouched by the refused start.
      expect(await running.edge.kamailio.rpc('core.uptime')).toContain('uptime');
    } finally {
      await running.stop();
    }
  }, 60_000);

  it('kill -9 of Kamailio mid-call: its workers go with it; restarted, the registration holds, the call talks on and is recorded at its BYE', async () => {
    const port = await freeUdpPort();
    const first = await startSipStack(t, {}, port);
    const { caller, callee, answering, placing } = await placeCall(port, 9000);
    const pid = first.edge.kamailio.pid()!;
    expect(groupAlive(pid)).toBe(true);
    process.kill(pid, 'SIGKILL');
    await first.edge.kamailio.exited;
    // No worker left holding the port or a database connection.
    await until(async () => (groupAlive(pid) ? undefined : true), "Kamailio's process group to be gone", 5000);
    await assertSipPortFree(`udp:127.0.0.1:${port}`);
    await first.stop();

    const second = await startSipStack(t, {}, port);
    cleanup.push(() => second.stop());
    // Reconciliation reads Kamailio's dialogs, not the restart: the call is still talking.
    await second.edge.reconcile(0);
    expect((await callRow(caller.name))?.status).toBe('in_progress');
    // The registration survived (written through, loaded again by the new Kamailio).
    // (Registrations are kept by user and domain: the dump lists every address of record.)
    expect(await second.edge.kamailio.rpc('ul.dump')).toContain(callee.name);
    const [placed, answered] = await Promise.all([placing, answering]);
    expect(placed.errors + answered.errors).toBe('');
    expect(placed.code).toBe(0);
    const ended = await until(async () => {
      const row = await callRow(caller.name);
      return row && terminal.includes(row.status) ? row : undefined;
    }, 'the call to end');
    expect(ended.status).toBe('completed');
    expect(ended.duration_seconds).toBeGreaterThanOrEqual(8);
  }, 90_000);

  it('kill -9 of `sip serve` mid-call: Kamailio stops with it; restarted, the call talks on and is recorded at its BYE', async () => {
    const port = await freeUdpPort();
    // `sip serve` starts the voice runtime too: on a port of this test's own, not the default 5070.
    const voicePort = await freeUdpPort();
    const runDir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-sip-serve-'));
    cleanup.push(async () => fs.rmSync(runDir, { recursive: true, force: true }));
    const serve = async (): Promise<ChildProcess> => {
      const child = spawn(process.execPath, ['--import', 'tsx', path.resolve('src/cli/main.ts'), 'sip', 'serve'], {
        env: {
          ...process.env,
          DATABASE_URL: t.config.databaseUrl,
          SIP_LISTEN: `udp:127.0.0.1:${port}`,
          SIP_DOMAIN: DOMAIN,
          SIP_RUN_DIR: runDir,
          SIP_CHILDREN: '2',
          VOICE_SIP_PORT: String(voicePort),
          LOG_LEVEL: 'silent',
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      cleanup.push(async () => child.kill('SIGKILL'));
      let output = '';
      child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
      let printed = '';
      await new Promise<void>((resolve, reject) => {
        child.stdout!.on('data', (chunk: Buffer) => {
          printed += chunk.toString();
          // Kamailio runs, and the voice runtime listens behind it, taking requests from Kamailio's address only.
          if (printed.includes(`Parley voice runtime: AI agent calls on 127.0.0.1:${voicePort} (taken from 127.0.0.1:${port})`)) resolve();
        });
        child.on('exit', (code) => reject(new Error(`sip serve exited (${code}): ${output}`)));
      });
      return child;
    };
    const first = await serve();
    const { caller, answering, placing } = await placeCall(port, 10_000);
    const kamailioPid = Number(fs.readFileSync(path.join(runDir, 'kamailio.pid'), 'utf8'));
    first.kill('SIGKILL');
    // The supervisor sees its pipe close: Kamailio (and every worker) ends, the port is free.
    await until(async () => (groupAlive(kamailioPid) ? undefined : true), 'Kamailio to end with sip serve', 15_000);
    await assertSipPortFree(`udp:127.0.0.1:${port}`);
    expect((await callRow(caller.name))?.status).toBe('in_progress');

    const second = await serve();
    const [placed, answered] = await Promise.all([placing, answering]);
    expect(placed.errors + answered.errors).toBe('');
    expect(placed.code).toBe(0);
    const ended = await until(async () => {
      const row = await callRow(caller.name);
      return row && terminal.includes(row.status) ? row : undefined;
    }, 'the call to end');
    expect(ended.status).toBe('completed');
    expect(ended.duration_seconds).toBeGreaterThanOrEqual(9);
    second.kill('SIGTERM');
    await new Promise((resolve) => second.once('exit', resolve));
  }, 120_000);

  it('ends a call whose phones vanished without BYE within the keep-alive time (OPTIONS unanswered)', async () => {
    const stack = await startSipStack(t, { SIP_KEEPALIVE_SECONDS: '30' });
    cleanup.push(() => stack.stop());
    const caller = await sipUser();
    const callee = await sipUser();
    const calleePort = await freeUdpPort();
    expect((await register(stack, callee.name, callee.password, calleePort)).code).toBe(0);
    const answering = sipp('callee_vanish', undefined, { localPort: calleePort });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const placed = await sipp('caller_vanish', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name },
      args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password],
    });
    expect(placed.code).toBe(0);
    expect((await answering).code).toBe(0);
    const vanished = Date.now();
    // Both phones are gone. The first keep-alive goes 30 s after the answer, is unanswered for 5 s (fr_timer),
    // and the dialog ends 10 s later: well within the 2 minutes the edge promises.
    const ended = await until(
      async () => {
        const row = await callRow(caller.name);
        return row && terminal.includes(row.status) ? row : undefined;
      },
      'the call to end',
      80_000,
    );
    expect(ended.status).toBe('completed');
    expect(Date.now() - vanished).toBeLessThan(60_000);
    expect(ended.duration_seconds).toBeGreaterThanOrEqual(30);
  }, 120_000);
});
