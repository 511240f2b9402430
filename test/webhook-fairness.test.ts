/**
 * Webhook delivery under a hostile or broken tenant (third review, "cost and amplification" and "leaks and
 * bugs"): one organisation's hanging receiver must not delay another's deliveries; an endpoint whose URL is
 * refused at delivery time records why and is retried with backoff (it used to crash on a ReferenceError and
 * stay pending with no error); IP-literal URLs are checked on every attempt, and `::/96` is not public.
 */
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Config } from '../src/config/index.js';
import { postEvent, WebhookWorker } from '../src/events/webhooks.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { isPublicAddress, webhookUrlProblem } from '../src/resources/webhook-url.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant } from './support/seed.js';

let t: TestApp;
const closers: (() => Promise<void>)[] = [];

beforeAll(async () => {
  t = await startTestApp({ WEBHOOK_ALLOW_PRIVATE_URLS: 'true', WEBHOOK_POLL_MS: '100' });
});
afterAll(async () => {
  for (const close of closers.reverse()) await close();
  await t?.close();
});

function workerWith(events: Partial<Config['events']>): WebhookWorker {
  const config = { ...t.config, events: { ...t.config.events, ...events } };
  const worker = new WebhookWorker({ database: t.database, config, records: t.services.records! });
  closers.push(() => worker.stop());
  return worker;
}

/** An organisation with one endpoint for Conversation.created at `url` (stored as is), and a way to make events. */
async function tenantWithEndpoint(name: string, url: string) {
  const tenant = await seedTenant(t, name);
  const endpointId = randomUUID();
  await sql`INSERT INTO webhook_endpoints (id, organisation_id, url, event_types, secret)
            VALUES (${endpointId}, ${tenant.organisationId}, ${url}, ARRAY['Conversation.created'], ${`whsec_${Buffer.alloc(32, 7).toString('base64')}`})`.execute(
    t.db,
  );
  const actor = systemActor(tenant.organisationId, 'test');
  return {
    endpointId,
    organisationId: tenant.organisationId,
    /** Writes `n` conversations: `n` events, each with a delivery to the endpoint. */
    events: async (n: number) => {
      for (let i = 0; i < n; i++) await t.services.records!.create(actor, 'Conversation', { channel: 'chat' });
    },
  };
}

async function deliveries(endpointId: string) {
  const { rows } = await sql<{ status: string; attempts: number; last_error: string | null; next_attempt_at: Date | null }>`
    SELECT status, attempts, last_error, next_attempt_at FROM webhook_deliveries WHERE webhook_endpoint_id = ${endpointId}`.execute(t.db);
  return rows;
}

async function waitFor<T>(
  check: () => Promise<T | undefined | false> | T | undefined | false,
  what: string,
  timeoutMs: number,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('URLs refused at delivery time', () => {
  it('an endpoint whose URL the worker refuses records why and waits for its next attempt (no crash, no silent pending)', async () => {
    // Saved while plain http was allowed; the worker now runs without WEBHOOK_ALLOW_PRIVATE_URLS.
    const org = await tenantWithEndpoint('Refused', 'http://receiver.invalid/hook');
    await org.events(1);
    const worker = workerWith({ webhookAllowPrivateUrls: false, webhookRetryBaseSeconds: 60 });
    await worker.start();
    const [row] = await waitFor(
      async () => {
        const rows = await deliveries(org.endpointId);
        return rows[0]?.last_error ? rows : undefined;
      },
      'the attempt to be recorded',
      5000,
    );
    await worker.stop();
    expect(row).toMatchObject({ status: 'pending', attempts: 1, last_error: 'The URL is not https.' });
    expect(row.next_attempt_at!.getTime()).toBeGreaterThan(Date.now() + 30_000);
  });

  it('an IP-literal URL is checked on every attempt, without connecting; ::/96 is not public', async () => {
    let connections = 0;
    const server = net.createServer((socket) => {
      connections++;
      socket.destroy();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    closers.push(() => new Promise<void>((r) => server.close(() => r())));
    const port = (server.address() as AddressInfo).port;
    const secret = `whsec_${Buffer.alloc(32, 1).toString('base64')}`;
    for (const url of [`https://127.0.0.1:${port}/hook`, `https://[::ffff:127.0.0.1]:${port}/hook`, `https://[::7f00:1]:${port}/hook`]) {
      const outcome = await postEvent(url, secret, randomUUID(), '{}', { timeoutMs: 2000, allowPrivate: false });
      expect(outcome.ok).toBe(false);
      expect(outcome.error).toMatch(/is not a public address/);
    }
    expect(connections).toBe(0);
    for (const address of ['::7f00:1', '::a00:1', '::c0a8:1', '::', '::1']) expect(isPublicAddress(address), address).toBe(false);
    for (const address of ['2606:4700::1111', '1.1.1.1', '::ffff:1.1.1.1']) expect(isPublicAddress(address), address).toBe(true);
    expect(await webhookUrlProblem('https://[::7f00:1]/', false)).toMatch(/not a public address/);
  });
});

describe('fair claiming', () => {
  it("one organisation's hanging receiver holds at most WEBHOOK_ENDPOINT_CONCURRENCY slots; another's deliveries arrive promptly", async () => {
    let open = 0;
    let mostOpen = 0;
    const hanging = http.createServer((req) => {
      open++;
      mostOpen = Math.max(mostOpen, open);
      req.on('close', () => open--);
      // Never answers.
    });
    const arrived: number[] = [];
    const prompt = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        arrived.push(performance.now());
        res.writeHead(204).end();
      });
    });
    for (const server of [hanging, prompt]) {
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      closers.push(
        () =>
          new Promise<void>((r) => {
            server.closeAllConnections();
            server.close(() => r());
          }),
      );
    }
    const url = (server: http.Server) => `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`;
    const noisy = await tenantWithEndpoint('Noisy', url(hanging));
    const quiet = await tenantWithEndpoint('Quiet', url(prompt));

    // The noisy organisation's backlog is older than anything the quiet one writes.
    await noisy.events(12);
    const worker = workerWith({ webhookConcurrency: 4, webhookEndpointConcurrency: 2, webhookTimeoutMs: 30_000 });
    await worker.start();
    await waitFor(() => open >= 2, 'the hanging receiver to hold two requests', 5000);

    const written = performance.now();
    await quiet.events(5);
    await waitFor(() => arrived.length === 5, "the other organisation's five deliveries", 5000);
    const latencies = arrived.map((at) => Math.round(at - written));
    console.log(`another organisation's deliveries with a hanging receiver: ${latencies.join(', ')} ms after the writes began`);
    expect(mostOpen).toBe(2);
    // The receiver answers before the worker records the answer: wait for the rows rather than race the write.
    const rows = await waitFor(
      async () => {
        const found = await deliveries(quiet.endpointId);
        return found.length === 5 && found.every((r) => r.status === 'succeeded') ? found : undefined;
      },
      "the other organisation's deliveries to be recorded succeeded",
      5000,
    );
    expect(rows).toHaveLength(5);
    hanging.closeAllConnections(); // its attempts end now rather than at the 30 s timeout
    await worker.stop();
  }, 60_000);

  it('the claim reads the pending deliveries through their indexes, not the history', async () => {
    const org = await tenantWithEndpoint('History', 'https://1.1.1.1/hook');
    await org.events(1);
    // A long history of finished deliveries, and the statistics that say so.
    await sql`
      INSERT INTO webhook_deliveries (id, organisation_id, webhook_endpoint_id, event_id, event_type, status, attempts)
      SELECT gen_random_uuid(), d.organisation_id, d.webhook_endpoint_id, d.event_id, d.event_type, 'succeeded', 1
      FROM webhook_deliveries d CROSS JOIN generate_series(1, 20000)
      WHERE d.webhook_endpoint_id = ${org.endpointId}`.execute(t.db);
    await sql`ANALYZE webhook_deliveries`.execute(t.db);
    const plan = await workerWith({}).explainClaim(16);
    expect(plan).toContain('webhook_deliveries_endpoint_due_idx');
    expect(plan).toContain('webhook_deliveries_endpoint_leased_idx');
    expect(plan).not.toMatch(/Seq Scan on webhook_deliveries/);
  });
});
