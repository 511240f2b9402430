/**
 * A server that closes while event streams are open, writes are in flight and a commit's notification is still
 * waiting for its batch (`NOTIFY_BATCH_MS`) finishes closing within a bound, and a new server on the same port
 * serves streams again: the console's "reconnects after the server restarts" test, without a browser, repeated.
 * The clients keep their connections alive between requests as browsers do (the close must not wait for a
 * connection a client keeps after its stream was ended).
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { buildServer } from '../src/http/server.js';
import { client, resourceDocument } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

let t: TestApp;
let tenant: Tenant;
beforeAll(async () => {
  t = await startTestApp({});
  tenant = await seedTenant(t, 'Restarting');
});
afterAll(async () => {
  await t?.close();
});

const within = <T>(promise: Promise<T>, ms: number) =>
  Promise.race([promise, new Promise<'timed out'>((resolve) => setTimeout(() => resolve('timed out'), ms))]);

interface Stream {
  /** Everything received so far. */
  text: () => string;
  /** Resolves when the response ends or fails. */
  done: Promise<void>;
  request: http.ClientRequest;
}

function openStream(port: number, agent: http.Agent, token: string, lastEventId?: string): Stream {
  let text = '';
  let finish = () => {};
  const done = new Promise<void>((resolve) => (finish = resolve));
  const headers: Record<string, string> = { Authorization: `Bearer ${token}` };
  if (lastEventId) headers['Last-Event-ID'] = lastEventId;
  const request = http.get({ port, host: '127.0.0.1', path: '/api/events', agent, headers }, (res) => {
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => (text += chunk));
    res.on('end', finish);
    res.on('error', finish);
  });
  request.on('error', finish);
  return { text: () => text, done, request };
}

async function until(probe: () => boolean, ms: number, what: string): Promise<void> {
  const deadline = Date.now() + ms;
  while (!probe()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** A conversation created through the server's socket; resolves with its status, or 0 when the connection failed. */
function createOverHttp(port: number, agent: http.Agent): Promise<number> {
  const body = JSON.stringify(resourceDocument('Conversation', { channel: 'sms' }));
  return new Promise((resolve) => {
    const request = http.request(
      {
        port,
        host: '127.0.0.1',
        method: 'POST',
        path: '/api/conversations',
        agent,
        headers: { Authorization: `Bearer ${tenant.admin.token}`, 'Content-Type': 'application/vnd.api+json' },
      },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
        res.on('error', () => resolve(0));
      },
    );
    request.on('error', () => resolve(0));
    request.end(body);
  });
}

it('closes within a bound with streams open, writes in flight and a notification pending; the same port serves streams again', async () => {
  const agent = new http.Agent({ keepAlive: true });
  let port = 0;
  let lastId: string | undefined;
  for (let round = 0; round < 6; round++) {
    const server = await buildServer({ ...t.services, database: t.database });
    await server.listen({ port, host: '127.0.0.1' });
    port = (server.server.address() as AddressInfo).port;

    // The restarted server serves streams: a new one, and one resuming after the last event seen before.
    const streams = [
      openStream(port, agent, tenant.admin.token),
      openStream(port, agent, tenant.operator.token),
      openStream(port, agent, tenant.admin.token, lastId),
    ];
    await until(() => streams.every((s) => s.text().includes(': connected')), 10_000, `round ${round}: streams connected`);
    const created = await createOverHttp(port, agent);
    expect(created, `round ${round}: a write through the new server`).toBe(201);
    await until(() => streams.every((s) => /event: Conversation\.created/.test(s.text())), 10_000, `round ${round}: event delivered`);
    lastId = [...streams[0].text().matchAll(/^id: (.+)$/gm)].at(-1)?.[1];

    // Writes in flight through the closing server, and one committed just before the close whose notification
    // waits for the batch timer (the first of a quiet spell goes at once, the next within NOTIFY_BATCH_MS).
    const writes = Array.from({ length: 8 }, () => createOverHttp(port, agent));
    await client(t.app, tenant.admin.token).post('/api/conversations', resourceDocument('Conversation', { channel: 'sms' }));
    await client(t.app, tenant.admin.token).post('/api/conversations', resourceDocument('Conversation', { channel: 'sms' }));
    // Close at moments that move through the writes' arrival.
    await new Promise((resolve) => setTimeout(resolve, round % 3));
    const started = Date.now();
    const outcome = await within(
      server.close().then(() => 'closed' as const),
      5000,
    );
    expect(outcome, `round ${round}: the close`).toBe('closed');
    expect(Date.now() - started, `round ${round}: close took`).toBeLessThan(5000);
    // Every write answered (201) or refused (a connection the close ended), none left hanging.
    const statuses = await within(Promise.all(writes), 5000);
    expect(statuses, `round ${round}: writes settled`).not.toBe('timed out');
    for (const status of statuses as number[]) expect([0, 201]).toContain(status);
    expect(await within(Promise.all(streams.map((s) => s.done)), 5000), `round ${round}: streams ended`).not.toBe('timed out');
  }
  agent.destroy();
}, 180_000);
