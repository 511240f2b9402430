/**
 * Events across real `parley serve` processes on one PostgreSQL database (LISTEN/NOTIFY): a write made
 * through one process reaches a stream held open on another, live; and the processes killed with SIGKILL
 * while deliveries are in flight and queued lose none: after a restart every event reaches the receiver.
 * PostgreSQL only: the embedded database belongs to one process.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import http from 'node:http';
import type net from 'node:net';
import path from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openSse } from './helpers/sse.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { freePort } from './helpers/ports.js';

const onPostgres = Boolean(process.env.DATABASE_URL);
const cli = path.resolve('src/cli/main.ts');
const SECRET = 'events-processes-test-signing-secret-0123456789';
const children = new Set<ChildProcess>();
let t: TestApp;
let tenant: Tenant;

/** `parley serve` on the test's database; resolves once /healthz answers. */
async function serve(): Promise<{ child: ChildProcess; url: string; exited: Promise<void> }> {
  const port = await freePort();
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: t.config.databaseUrl,
    SIGNING_SECRET: SECRET,
    PORT: String(port),
    HOST: '127.0.0.1',
    LOG_LEVEL: 'warn',
    AGENT_RUNTIME: 'false',
    WEBHOOK_ALLOW_PRIVATE_URLS: 'true',
    WEBHOOK_TIMEOUT_MS: '2000',
    WEBHOOK_RETRY_BASE_SECONDS: '1',
    WEBHOOK_POLL_MS: '200',
  };
  delete env.PUBLIC_URL;
  const child = spawn(process.execPath, ['--import', 'tsx', cli, 'serve'], { env, stdio: ['ignore', 'ignore', 'pipe'] });
  children.add(child);
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  const exited = new Promise<void>((r) =>
    child.on('exit', () => {
      children.delete(child);
      r();
    }),
  );
  const url = `http://127.0.0.1:${port}`;
  const started = Date.now();
  for (;;) {
    if (Date.now() - started > 60_000) throw new Error(`serve did not start: ${stderr}`);
    const ok = await fetch(`${url}/healthz`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return { child, url, exited };
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function post(url: string, token: string, path: string, type: string, attributes: Record<string, unknown>) {
  const response = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/vnd.api+json' },
    body: JSON.stringify({ data: { type, attributes } }),
  });
  expect(response.status).toBe(201);
  return (await response.json()) as { data: { id: string; attributes: Record<string, unknown> } };
}

beforeAll(async () => {
  if (!onPostgres) return;
  t = await startTestApp({ SIGNING_SECRET: SECRET });
  tenant = await seedTenant(t, 'Processes');
});
afterAll(async () => {
  for (const child of children) child.kill('SIGKILL');
  await t?.close();
});

describe.runIf(onPostgres)('events across server processes', () => {
  it('a write on one process reaches a stream on another, live', async () => {
    const [a, b] = await Promise.all([serve(), serve()]);
    const stream = await openSse(a.url, '/api/events?filter[type]=Conversation.created', tenant.admin.token);
    expect(stream.status).toBe(200);
    const latencies: number[] = [];
    for (let i = 0; i < 5; i++) {
      const started = Date.now();
      const created = await post(b.url, tenant.admin.token, '/api/conversations', 'Conversation', { channel: 'chat' });
      await stream.waitFor(1, (m) => JSON.parse(m.data).data.id === created.data.id, 2000);
      latencies.push(Date.now() - started);
    }
    expect(Math.max(...latencies)).toBeLessThan(1000);
    stream.close();
    for (const p of [a, b]) {
      p.child.kill('SIGTERM');
      await p.exited;
    }
  }, 120_000);

  it('loses no delivery when the servers are killed mid-delivery (SIGKILL), once one is back', async () => {
    let recovered = false;
    const hanging = new Set<http.ServerResponse>();
    const seen = new Map<string, number>();
    const receiver = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        if (!recovered) {
          hanging.add(res);
          return;
        }
        const id = JSON.parse(body).id as string;
        seen.set(id, (seen.get(id) ?? 0) + 1);
        res.writeHead(200).end();
      });
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
    const hookUrl = `http://127.0.0.1:${(receiver.address() as net.AddressInfo).port}/hook`;
    try {
      const a = await serve();
      await post(a.url, tenant.admin.token, '/api/webhook_endpoints', 'WebhookEndpoint', {
        url: hookUrl,
        event_types: ['Conversation.created'],
      });
      for (let i = 0; i < 10; i++) await post(a.url, tenant.admin.token, '/api/conversations', 'Conversation', { channel: 'sms' });
      // Attempts are in flight (the receiver holds them) when the process dies.
      await expect.poll(() => hanging.size, { timeout: 10_000 }).toBeGreaterThan(0);
      a.child.kill('SIGKILL');
      await a.exited;
      for (const res of hanging) res.socket?.destroy();
      recovered = true;
      const { rows: events } = await sql<{ id: string }>`
        SELECT id FROM events WHERE organisation_id = ${tenant.organisationId} AND type = 'Conversation.created' AND data->'attributes'->>'channel' = 'sms'`.execute(
        t.db,
      );
      expect(events).toHaveLength(10);
      const b = await serve();
      await expect.poll(() => events.filter((e) => seen.has(e.id)).length, { timeout: 45_000, interval: 500 }).toBe(10);
      const { rows } = await sql<{ status: string; count: string }>`
        SELECT status, count(*) AS count FROM webhook_deliveries WHERE organisation_id = ${tenant.organisationId} GROUP BY status`.execute(
        t.db,
      );
      await expect
        .poll(
          async () =>
            (await sql<{ n: string }>`SELECT count(*) AS n FROM webhook_deliveries WHERE status <> 'succeeded'`.execute(t.db)).rows[0].n,
          { timeout: 5000 },
        )
        .toBe('0');
      expect(rows.length).toBeGreaterThan(0);
      b.child.kill('SIGTERM');
      await b.exited;
    } finally {
      receiver.closeAllConnections();
      receiver.close();
    }
  }, 150_000);
});
