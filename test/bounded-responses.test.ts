/** Responses stay bounded, and odd spellings of requests are answered, never a 500. */
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { expectJsonApi } from './support/conformance.js';
import { client, errorCodes, resourceDocument, type Client } from './helpers/http.js';

let t: TestApp;
let tenant: Tenant;
let admin: Client;

beforeAll(async () => {
  t = await startTestApp({ INCLUDE_MAX_RECORDS: '5', INCLUDE_MAX_BYTES: '40000' });
  tenant = await seedTenant(t, 'Bounded');
  admin = client(t.app, tenant.admin.token);
});
afterAll(async () => t?.close());

async function conversationWithItems(count: number, content = 'x') {
  const id = (await admin.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
  for (let i = 0; i < count; i++) {
    expect(
      (await admin.post('/api/conversation_items', resourceDocument('ConversationItem', { role: 'user', content, conversation_id: id })))
        .status,
    ).toBe(201);
  }
  return id;
}

describe('included records', () => {
  it('refuses an include that would add more records than allowed with 400 invalid_includes', async () => {
    const small = await conversationWithItems(5);
    const fits = await admin.get(`/api/conversations?filter[id]=${small}&include=conversation_items`);
    expect(fits.status).toBe(200);
    expect(fits.body.included).toHaveLength(5);
    const large = await conversationWithItems(6);
    const refused = await admin.get(`/api/conversations?filter[id]=${large}&include=conversation_items`);
    expect(refused.status).toBe(400);
    expect(refused.body.errors[0]).toMatchObject({
      code: 'invalid_includes',
      source: { parameter: 'include' },
      meta: { limit: 5, unit: 'records' },
    });
    // Both conversations in one list: 11 items together.
    const both = await admin.get(`/api/conversations?filter[id][in]=${small},${large}&include=conversation_items`);
    expect(both.status).toBe(400);
  });

  it('refuses an include whose records would exceed the byte bound', async () => {
    const id = await conversationWithItems(3, 'y'.repeat(16 * 1024));
    const refused = await admin.get(`/api/conversations?filter[id]=${id}&include=conversation_items`);
    expect(refused.status).toBe(400);
    expect(refused.body.errors[0]).toMatchObject({ code: 'invalid_includes', meta: { limit: 40000, unit: 'bytes' } });
    expect(refused.body.errors[0]).toBeDefined();
  });
});

describe('error documents', () => {
  it('carry at most 100 errors, with the total in meta', async () => {
    // 4,000 members: under the body's bounded shape (4,096 members an object; src/http/json-limits.ts).
    const attributes = Object.fromEntries(Array.from({ length: 4_000 }, (_, i) => [`unknown_${i}`, i]));
    const started = performance.now();
    const response = await admin.post('/api/conversations', resourceDocument('Conversation', attributes));
    const elapsed = performance.now() - started;
    expect(response.status).toBe(422);
    expect(response.body.errors).toHaveLength(100);
    expect(response.body.meta.errors).toEqual({ total: 4_000, shown: 100 });
    expect(JSON.stringify(response.body).length).toBeLessThan(40_000);
    // Login reads at most 16 KiB: the review's 20,000-attribute body is refused on its size.
    const login = Object.fromEntries(Array.from({ length: 20_000 }, (_, i) => [`unknown_${i}`, i]));
    expect((await client(t.app, tenant.publishableKey).post('/api/users/login', resourceDocument('User', login))).status).toBe(413);
    console.log(`4,000 unknown attributes: ${JSON.stringify(response.body).length} bytes of errors in ${elapsed.toFixed(0)} ms`);
  });
});

describe('hostile query values and paths', () => {
  it('answers a deeply nested JSON filter value with 400', async () => {
    const deep = `${'{"a":'.repeat(5000)}1${'}'.repeat(5000)}`;
    for (const url of [
      `/api/conversations?filter[metadata][contains]=${encodeURIComponent(deep)}`,
      `/api/conversations?filter[metadata]=${encodeURIComponent(deep)}`,
    ]) {
      const response = await admin.get(url);
      expect(response.status).toBe(400);
      expect(errorCodes(response)).toEqual(['invalid_filter']);
    }
    const shallow = encodeURIComponent(JSON.stringify({ a: { b: 1 } }));
    expect((await admin.get(`/api/conversations?filter[metadata][contains]=${shallow}`)).status).toBe(200);
  });

  it('authenticates percent-encoded spellings of /api paths', async () => {
    for (const url of [
      '/%61pi/conversations',
      '/%61%70%69/conversations',
      '/api/%63onversations',
      '/%61pi/nowhere',
      '/%61pi/open_api/../conversations',
    ]) {
      const response = await t.app.inject({ url });
      expect(response.statusCode, url).toBeLessThan(500);
      expect([401, 404], url).toContain(response.statusCode);
      expectJsonApi(response.json());
    }
    expect((await t.app.inject({ url: '/%61pi/conversations' })).statusCode).toBe(401);
    const authenticated = await t.app.inject({ url: '/%61pi/conversations', headers: { authorization: `Bearer ${tenant.admin.token}` } });
    expect(authenticated.statusCode).toBe(200);
    expectJsonApi(authenticated.json());
  });

  it('authenticates absolute-form request targets over a real connection', async () => {
    const server = await startTestApp();
    try {
      await server.app.listen({ port: 0, host: '127.0.0.1' });
      const { port } = server.app.server.address() as AddressInfo;
      const raw = (target: string, extra = '') =>
        new Promise<string>((resolve, reject) => {
          const socket = net.connect(port, '127.0.0.1', () =>
            socket.end(`GET ${target} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n${extra}Connection: close\r\n\r\n`),
          );
          let text = '';
          socket.on('data', (chunk) => (text += chunk.toString()));
          socket.on('end', () => resolve(text));
          socket.on('error', reject);
        });
      for (const target of [
        `http://127.0.0.1:${port}/api/conversations`,
        `http://example.com/%61pi/conversations`,
        'http://x/api/nowhere',
      ]) {
        const answer = await raw(target);
        const status = Number(answer.split(' ')[1]);
        expect([401, 404], `${target}: ${answer.slice(0, 200)}`).toContain(status);
        expectJsonApi(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)));
      }
    } finally {
      await server.close();
    }
  });

  it('answers TRACE, PROPFIND and other methods a path does not offer with 405 and Allow; unknown paths 404', async () => {
    for (const method of ['TRACE', 'PROPFIND', 'MKCOL', 'LOCK', 'PURGE']) {
      const response = await t.app.inject({
        method: method as 'GET',
        url: '/api/conversations',
        headers: { authorization: `Bearer ${tenant.admin.token}` },
      });
      expect(response.statusCode, method).toBe(405);
      expect(response.headers.allow).toBe('GET, POST, HEAD');
      expectJsonApi(response.json());
      const health = await t.app.inject({ method: method as 'GET', url: '/healthz' });
      expect(health.statusCode, method).toBe(405);
      expect(health.headers.allow).toContain('GET');
      const nowhere = await t.app.inject({ method: method as 'GET', url: '/nowhere' });
      expect(nowhere.statusCode, method).toBe(404);
    }
    // Without a credential the 405 is a 401, like every /api path.
    expect((await t.app.inject({ method: 'TRACE' as 'GET', url: '/api/conversations' })).statusCode).toBe(401);
  });
});
