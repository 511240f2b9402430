/**
 * Webhooks (docs/events.md): WebhookEndpoint and WebhookDelivery over the API (roles, the secret shown once,
 * URL checks against private targets, unknown event types), and the delivery worker against a real local
 * receiver: Standard Webhooks signatures checked with the `standardwebhooks` package and by hand from the
 * specification, retries after 500s, timeouts, dropped connections and a receiver that is down, no
 * duplicate sends by two workers, and an endpoint disabled once its deliveries keep failing.
 */
import { createHmac } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config/index.js';
import { retryDelaySeconds, WebhookWorker } from '../src/events/webhooks.js';
import { client, resourceDocument, type Client } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

interface Received {
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** A local receiver; `answer` decides each request's fate. */
async function receiver(answer: (n: number, req: http.IncomingMessage, res: http.ServerResponse) => void) {
  const received: Received[] = [];
  let n = 0;
  const server = http.createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (c: string) => (body += c));
    req.on('end', () => {
      received.push({ headers: req.headers, body });
      answer(n++, req, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`;
  return {
    url,
    received,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

let t: TestApp;
let tenant: Tenant;
let admin: Client;
const workers: WebhookWorker[] = [];
const closers: (() => Promise<void>)[] = [];

const ENV = { WEBHOOK_ALLOW_PRIVATE_URLS: 'true', WEBHOOK_TIMEOUT_MS: '700', WEBHOOK_RETRY_BASE_SECONDS: '1', WEBHOOK_POLL_MS: '100' };

beforeAll(async () => {
  t = await startTestApp(ENV);
  tenant = await seedTenant(t, 'Hooks');
  admin = client(t.app, tenant.admin.token);
});
afterAll(async () => {
  for (const w of workers) await w.stop();
  for (const c of closers) await c();
  await t?.close();
});

function startWorker(): WebhookWorker {
  const worker = new WebhookWorker({ database: t.database, config: t.config, records: t.services.records! });
  workers.push(worker);
  void worker.start();
  return worker;
}

async function endpoint(url: string, eventTypes: string[] = ['Conversation.created']) {
  const created = await admin.post(
    '/api/webhook_endpoints',
    resourceDocument('WebhookEndpoint', { url, event_types: eventTypes, description: 'test' }),
  );
  expect(created.status).toBe(201);
  return { id: created.body.data.id as string, secret: created.body.data.attributes.secret as string };
}

async function deliveriesOf(endpointId: string) {
  const list = await admin.get(`/api/webhook_deliveries?filter[webhook_endpoint_id]=${endpointId}&page[limit]=100`);
  expect(list.status).toBe(200);
  return list.body.data as { id: string; attributes: Record<string, any> }[];
}

describe('WebhookEndpoint and WebhookDelivery over the API', () => {
  it('shows the secret once, to owners and admins only', async () => {
    const { id, secret } = await endpoint('https://1.1.1.1/hook');
    expect(secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    expect(Buffer.from(secret.slice(6), 'base64')).toHaveLength(32);
    const got = await admin.get(`/api/webhook_endpoints/${id}`);
    expect(got.body.data.attributes).toMatchObject({
      url: 'https://1.1.1.1/hook',
      secret: null,
      enabled: true,
      event_types: ['Conversation.created'],
      consecutive_failures: 0,
    });
    const list = await client(t.app, tenant.owner.token).get('/api/webhook_endpoints?sort=-url&filter[enabled]=true');
    expect(list.body.data.map((e: { id: string }) => e.id)).toContain(id);
    expect(JSON.stringify(list.body)).not.toContain(secret);
    const operator = client(t.app, tenant.operator.token);
    expect((await operator.get('/api/webhook_endpoints')).status).toBe(403);
    expect((await operator.get('/api/webhook_deliveries')).status).toBe(403);
    expect((await operator.post('/api/webhook_endpoints', resourceDocument('WebhookEndpoint', { url: 'https://1.1.1.1/x' }))).status).toBe(
      403,
    );
    const patched = await admin.patch(`/api/webhook_endpoints/${id}`, resourceDocument('WebhookEndpoint', { enabled: false }, id));
    expect(patched.body.data.attributes.enabled).toBe(false);
    const removed = await admin.request('DELETE', `/api/webhook_endpoints/${id}`);
    expect(removed.status).toBe(200);
    expect(removed.body.meta.removed.WebhookEndpoint).toBe(1);
  });

  it('refuses unknown event types with 422 naming them', async () => {
    const refused = await admin.post(
      '/api/webhook_endpoints',
      resourceDocument('WebhookEndpoint', {
        url: 'https://1.1.1.1/hook',
        event_types: ['Conversation.created', 'Conversation.exploded', 'Nope'],
      }),
    );
    expect(refused.status).toBe(422);
    expect(refused.body.errors[0].source.pointer).toBe('/data/attributes/event_types');
    expect(refused.body.errors[0].detail).toContain('Conversation.exploded, Nope');
  });
});

describe('URL checks (SSRF)', () => {
  let strict: TestApp;
  let strictAdmin: Client;
  beforeAll(async () => {
    strict = await startTestApp();
    const other = await seedTenant(strict, 'Strict');
    strictAdmin = client(strict.app, other.admin.token);
  });
  afterAll(async () => strict?.close());

  it('refuses loopback, private, link-local and non-https targets', async () => {
    for (const url of [
      'http://1.1.1.1/hook',
      'https://127.0.0.1/hook',
      'https://localhost:8443/hook',
      'https://10.1.2.3/hook',
      'https://192.168.0.10/hook',
      'https://172.16.5.4/hook',
      'https://169.254.169.254/latest/meta-data',
      'https://[::1]/hook',
      'https://[::ffff:127.0.0.1]/hook',
      'https://[fd00::1]/hook',
      'https://100.64.0.1/hook',
      'https://0.0.0.0/hook',
      'https://user:pw@1.1.1.1/hook',
      'ftp://1.1.1.1/hook',
      'not a url',
    ]) {
      const refused = await strictAdmin.post('/api/webhook_endpoints', resourceDocument('WebhookEndpoint', { url }));
      expect(refused.status, url).toBe(422);
      expect(refused.body.errors[0].source.pointer, url).toBe('/data/attributes/url');
    }
    const ok = await strictAdmin.post('/api/webhook_endpoints', resourceDocument('WebhookEndpoint', { url: 'https://1.1.1.1/hook' }));
    expect(ok.status).toBe(201);
    const id = ok.body.data.id;
    const moved = await strictAdmin.patch(
      `/api/webhook_endpoints/${id}`,
      resourceDocument('WebhookEndpoint', { url: 'https://127.0.0.1/hook' }, id),
    );
    expect(moved.status).toBe(422);
  });

  it('refuses at connection time an address that is not public', async () => {
    const { postEvent } = await import('../src/events/webhooks.js');
    const outcome = await postEvent('https://localhost:9/hook', `whsec_${Buffer.alloc(32).toString('base64')}`, 'e1', '{}', {
      timeoutMs: 2000,
      allowPrivate: false,
    });
    expect(outcome.ok).toBe(false);
    expect(outcome.error).toContain('not a public address');
  });
});

describe('the delivery worker', () => {
  it('delivers signed events that standardwebhooks and the specification verify', async () => {
    const r = await receiver((_n, _req, res) => res.writeHead(204).end());
    closers.push(r.close);
    const { id, secret } = await endpoint(r.url);
    startWorker();
    const conversation = await admin.post('/api/conversations', resourceDocument('Conversation', { channel: 'sms' }));
    await expect.poll(() => r.received.length, { timeout: 5000 }).toBe(1);
    const { headers, body } = r.received[0];
    const event = JSON.parse(body);
    expect(event).toMatchObject({ type: 'Conversation.created', organisation_id: tenant.organisationId });
    expect(event.data.id).toBe(conversation.body.data.id);
    expect(headers['webhook-id']).toBe(event.id);
    expect(headers['content-type']).toBe('application/json');
    // An independent implementation verifies it...
    const verified = new Webhook(secret).verify(body, {
      'webhook-id': headers['webhook-id'] as string,
      'webhook-timestamp': headers['webhook-timestamp'] as string,
      'webhook-signature': headers['webhook-signature'] as string,
    });
    expect(verified).toEqual(event);
    // ...and so does the specification's formula: base64 HMAC-SHA256(secret bytes, "<id>.<timestamp>.<body>").
    const expected = createHmac('sha256', Buffer.from(secret.slice('whsec_'.length), 'base64'))
      .update(`${headers['webhook-id']}.${headers['webhook-timestamp']}.${body}`)
      .digest('base64');
    expect(headers['webhook-signature']).toBe(`v1,${expected}`);
    expect(Math.abs(Number(headers['webhook-timestamp']) - Date.now() / 1000)).toBeLessThan(10);
    // A tampered body does not verify.
    expect(() => new Webhook(secret).verify(body.replace('sms', 'chat'), headers as Record<string, string>)).toThrow();
    await expect.poll(async () => (await deliveriesOf(id))[0]?.attributes.status).toBe('succeeded');
    const [delivery] = await deliveriesOf(id);
    expect(delivery.attributes).toMatchObject({
      event_id: event.id,
      event_type: 'Conversation.created',
      attempts: 1,
      last_status_code: 204,
      next_attempt_at: null,
    });
    // Only the types asked for: an update is not sent to this endpoint.
    await admin.patch(`/api/conversations/${event.data.id}`, resourceDocument('Conversation', { status: 'closed' }, event.data.id));
    await new Promise((res) => setTimeout(res, 500));
    expect(r.received).toHaveLength(1);
    await admin.request('DELETE', `/api/webhook_endpoints/${id}`);
  });

  it('retries a receiver that answers 500, hangs, or drops the connection, until it recovers', async () => {
    const r = await receiver((n, req, res) => {
      if (n === 0) res.writeHead(500).end('broken');
      else if (n === 1)
        return; // hangs past the timeout
      else if (n === 2) req.socket.destroy();
      else res.writeHead(200).end('ok');
    });
    closers.push(r.close);
    const { id } = await endpoint(r.url);
    if (workers.length === 0) startWorker();
    await admin.post('/api/conversations', resourceDocument('Conversation', {}));
    await expect.poll(async () => (await deliveriesOf(id))[0]?.attributes.status, { timeout: 30_000, interval: 250 }).toBe('succeeded');
    const [delivery] = await deliveriesOf(id);
    expect(delivery.attributes.attempts).toBe(4);
    expect(r.received).toHaveLength(4);
    // Every attempt carries the same webhook-id, so the receiver can de-duplicate.
    expect(new Set(r.received.map((x) => x.headers['webhook-id'])).size).toBe(1);
    const endpointNow = await admin.get(`/api/webhook_endpoints/${id}`);
    expect(endpointNow.body.data.attributes.consecutive_failures).toBe(0);
    await admin.request('DELETE', `/api/webhook_endpoints/${id}`);
  }, 40_000);

  it('keeps retrying a receiver that is down, and disables an endpoint whose deliveries fail for the whole window', async () => {
    const r = await receiver(() => {});
    const downUrl = r.url;
    await r.close();
    const { id } = await endpoint(downUrl);
    if (workers.length === 0) startWorker();
    await admin.post('/api/conversations', resourceDocument('Conversation', {}));
    await expect.poll(async () => (await deliveriesOf(id))[0]?.attributes.attempts ?? 0, { timeout: 10_000 }).toBeGreaterThanOrEqual(2);
    const [pending] = await deliveriesOf(id);
    expect(pending.attributes.status).toBe('pending');
    expect(pending.attributes.last_error).toMatch(/ECONNREFUSED|connect/);
    expect(pending.attributes.next_attempt_at).not.toBeNull();
    // The retry window is over (as if it were queued a day ago): the next failure ends it.
    await sql`UPDATE webhook_deliveries SET created_at = now() - interval '25 hours', next_attempt_at = now() WHERE webhook_endpoint_id = ${id}`.execute(
      t.db,
    );
    await expect.poll(async () => (await deliveriesOf(id))[0]?.attributes.status, { timeout: 10_000 }).toBe('failed');
    await expect.poll(async () => (await admin.get(`/api/webhook_endpoints/${id}`)).body.data.attributes.enabled).toBe(false);
    const disabled = await admin.get(`/api/webhook_endpoints/${id}`);
    expect(disabled.body.data.attributes.disabled_reason).toContain('failed');
    // Disabled: new events queue nothing for it.
    await admin.post('/api/conversations', resourceDocument('Conversation', {}));
    expect(await deliveriesOf(id)).toHaveLength(1);
    // Enabled again: the count starts afresh.
    const again = await admin.patch(`/api/webhook_endpoints/${id}`, resourceDocument('WebhookEndpoint', { enabled: true }, id));
    expect(again.body.data.attributes).toMatchObject({ enabled: true, disabled_reason: null, consecutive_failures: 0 });
    await admin.request('DELETE', `/api/webhook_endpoints/${id}`);
  }, 30_000);

  it('two workers share the queue without sending any event twice', async () => {
    const r = await receiver((_n, _req, res) => res.writeHead(200).end());
    closers.push(r.close);
    const { id } = await endpoint(r.url);
    while (workers.length < 2) startWorker();
    const created = [];
    for (let i = 0; i < 30; i++) created.push((await admin.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id);
    await expect.poll(() => r.received.length, { timeout: 15_000 }).toBe(30);
    await new Promise((res) => setTimeout(res, 500));
    const ids = r.received.map((x) => JSON.parse(x.body).data.id);
    expect(ids.sort()).toEqual([...created].sort());
    await admin.request('DELETE', `/api/webhook_endpoints/${id}`);
  }, 30_000);

  it('backs off exponentially with jitter: the first retry within 30 s, later ones at most an hour apart', () => {
    const base = loadConfig({}).events.webhookRetryBaseSeconds;
    expect(retryDelaySeconds(1, base, 0)).toBe(base);
    expect(retryDelaySeconds(1, base, 0.999)).toBeLessThan(30);
    expect(retryDelaySeconds(2, base, 0)).toBe(2 * base);
    expect(retryDelaySeconds(40, base, 0.5)).toBe(3600);
    // Enough attempts fit in 24 h: the window, not a count, ends the retries.
    let total = 0;
    let attempts = 0;
    while (total < 24 * 3600) total += retryDelaySeconds(++attempts, base, 0.5);
    expect(attempts).toBeGreaterThan(20);
  });
});
