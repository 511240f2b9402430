/** The chat widget's visitor credential, CORS for other origins, and the console's static assets. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiKey, revokeApiKey } from '../src/auth/api-keys.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, resourceDocument } from './helpers/http.js';
import { insertAgent } from './helpers/telephony.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let agentId: string;

beforeAll(async () => {
  t = await startTestApp({
    CORS_ALLOWED_ORIGINS: 'https://shop.example',
    VISITOR_SESSIONS_PER_HOUR: '50',
    VISITOR_RATE_LIMIT_PER_MINUTE: '1000',
  });
  tenant = await seedTenant(t, 'Visitors');
  other = await seedTenant(t, 'Elsewhere');
  agentId = await insertAgent(t.db, tenant.organisationId);
});
afterAll(async () => t?.close());

async function openSession(key = tenant.publishableKey, attributes: Record<string, unknown> = { ai_agent_id: agentId }) {
  const response = await client(t.app, key).post('/api/visitor_sessions', resourceDocument('Conversation', attributes));
  return response;
}

describe('visitor sessions', () => {
  it('a publishable key opens a chat conversation and returns a visitor token for it', async () => {
    const response = await openSession();
    expect(response.status).toBe(201);
    expect(response.headers.location).toMatch(/\/api\/conversations\//);
    const conversation = response.body.data;
    expect(conversation.type).toBe('Conversation');
    expect(conversation.attributes).toMatchObject({ status: 'active', channel: 'chat', mode: 'text', ai_agent_id: agentId });
    expect(conversation.attributes.public_id).toMatch(/^[A-Za-z0-9_-]{22,}$/);
    expect(response.body.meta.token).toMatch(/^ey/);
    const lifetime = Date.parse(response.body.meta.token_expires_at) - Date.now();
    expect(lifetime).toBeGreaterThan(3600_000);
    expect(lifetime).toBeLessThanOrEqual(2 * 3600_000);
    // The organisation sees the new conversation.
    const listed = await client(t.app, tenant.operator.token).get(`/api/conversations?filter[id]=${conversation.id}`);
    expect(listed.body.data).toHaveLength(1);
  });

  it('an agent of another organisation is refused with a pointer', async () => {
    const foreign = await insertAgent(t.db, other.organisationId);
    const response = await openSession(tenant.publishableKey, { ai_agent_id: foreign });
    expect(response.status).toBe(422);
    expect(response.body.errors[0].source.pointer).toBe('/data/attributes/ai_agent_id');
  });

  it('the visitor posts user items to its conversation and reads them by public_id, and nothing else', async () => {
    const opened = await openSession();
    const { id, attributes } = opened.body.data;
    const visitor = client(t.app, opened.body.meta.token);
    const posted = await visitor.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content: 'Hello?' }),
    );
    expect(posted.status).toBe(201);
    const operator = client(t.app, tenant.operator.token);
    await operator.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: id, role: 'operator', content: 'Hi, how can I help?' }),
    );

    const read = await visitor.get(`/api/conversations?filter[public_id]=${attributes.public_id}&include=conversation_items`);
    expect(read.status).toBe(200);
    expect(read.body.data.map((c: { id: string }) => c.id)).toEqual([id]);
    expect(read.body.included.map((i: { attributes: { content: string } }) => i.attributes.content)).toEqual([
      'Hello?',
      'Hi, how can I help?',
    ]);
    expect((await visitor.get(`/api/conversation_items/${posted.body.data.id}`)).status).toBe(200);

    // Only its own conversation, whatever the filter.
    const all = await visitor.get('/api/conversations');
    expect(all.body.data.map((c: { id: string }) => c.id)).toEqual([id]);
    const someoneElse = (await openSession()).body.data;
    expect((await visitor.get(`/api/conversations?filter[public_id]=${someoneElse.attributes.public_id}`)).body.data).toEqual([]);
    const theirItem = await client(t.app, tenant.admin.token).post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: someoneElse.id, role: 'user', content: 'private' }),
    );
    expect((await visitor.get(`/api/conversation_items/${theirItem.body.data.id}`)).status).toBe(404);
    const intrude = await visitor.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: someoneElse.id, role: 'user', content: 'x' }),
    );
    expect(intrude.status).toBe(422);

    // As user only: not as the agent, an operator or the system.
    for (const role of ['operator', 'assistant', 'system']) {
      const forged = await visitor.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: id, role, content: 'x' }),
      );
      expect(forged.status).toBe(403);
      expect(forged.body.errors[0].source.pointer).toBe('/data/attributes/role');
    }
    // No other route: changing the conversation, new conversations, more sessions, sign-in, other types.
    const refused = [
      await visitor.patch(`/api/conversations/${id}`, resourceDocument('Conversation', { status: 'closed' }, id)),
      await visitor.post('/api/conversations', resourceDocument('Conversation', {})),
      await visitor.post('/api/visitor_sessions', resourceDocument('Conversation', {})),
      await visitor.post(
        '/api/users/login',
        resourceDocument('User', { email: tenant.operator.email, password: tenant.operator.password }),
      ),
      await visitor.get('/api/sip_users'),
      await visitor.get('/api/api_keys'),
      await visitor.get('/api/operator_status_events'),
    ];
    expect(refused.map((r) => r.status)).toEqual([403, 403, 403, 403, 403, 403, 403]);
    expect(errorCodes(refused[0])).toEqual(['forbidden']);
  });

  it('a visitor token stops working when its publishable key is revoked', async () => {
    const key = await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.owner.id,
      keyType: 'publishable',
      name: 'site',
    });
    const opened = await openSession(key.token, {});
    const visitor = client(t.app, opened.body.meta.token);
    expect((await visitor.get('/api/conversations')).status).toBe(200);
    await revokeApiKey(t.db, t.services.records!, key.id);
    expect((await visitor.get('/api/conversations')).status).toBe(401);
  });

  it('only a publishable key opens visitor sessions', async () => {
    expect((await client(t.app, tenant.admin.token).post('/api/visitor_sessions', resourceDocument('Conversation', {}))).status).toBe(403);
    expect((await client(t.app, tenant.secretKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}))).status).toBe(403);
    expect((await client(t.app).post('/api/visitor_sessions', resourceDocument('Conversation', {}))).status).toBe(401);
  });
});

describe('visitor rate limits', () => {
  it('limits sessions per address and requests per visitor', async () => {
    const limited = await startTestApp({
      VISITOR_SESSIONS_PER_HOUR: '2',
      VISITOR_RATE_LIMIT_PER_MINUTE: '3',
      VISITOR_ADDRESS_RATE_LIMIT_PER_MINUTE: '5',
    });
    try {
      const site = await seedTenant(limited, 'Limited');
      const open = () => client(limited.app, site.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
      const first = await open();
      const second = await open();
      expect(second.status).toBe(201);
      const third = await open();
      expect(third.status).toBe(429);
      expect(Number(third.headers['retry-after'])).toBeGreaterThan(0);
      const visitor = client(limited.app, first.body.meta.token);
      const statuses = [];
      for (let i = 0; i < 4; i++) statuses.push((await visitor.get('/api/conversations')).status);
      expect(statuses).toEqual([200, 200, 200, 429]);
      // Every visitor from one address shares a budget too: 3 counted so far (the refused request stopped at the
      // visitor's own budget), so the next visitor gets 2 of the 5.
      const neighbour = client(limited.app, second.body.meta.token);
      const next = [];
      for (let i = 0; i < 3; i++) next.push((await neighbour.get('/api/conversations')).status);
      expect(next).toEqual([200, 200, 429]);
      // A member's budget is its own.
      expect((await client(limited.app, site.operator.token).get('/api/conversations')).status).toBe(200);
    } finally {
      await limited.close();
    }
  });
});

describe('CORS', () => {
  it('answers a preflight from an allowed origin before authentication', async () => {
    const response = await t.app.inject({
      method: 'OPTIONS',
      url: '/api/conversation_items',
      headers: {
        origin: 'https://shop.example',
        'access-control-request-method': 'POST',
        'access-control-request-headers': 'authorization,content-type',
      },
    });
    expect(response.statusCode).toBe(204);
    expect(response.headers['access-control-allow-origin']).toBe('https://shop.example');
    expect(String(response.headers['access-control-allow-headers']).toLowerCase()).toContain('authorization');
    expect(String(response.headers['access-control-allow-methods'])).toContain('POST');
    const actual = await client(t.app, tenant.operator.token).get('/api/conversations', { origin: 'https://shop.example' });
    expect(actual.headers['access-control-allow-origin']).toBe('https://shop.example');
  });

  it('gives no CORS headers to other origins, nor to any origin by default', async () => {
    const foreign = await client(t.app, tenant.operator.token).get('/api/conversations', { origin: 'https://evil.example' });
    expect(foreign.headers['access-control-allow-origin']).toBeUndefined();
    const plain = await startTestApp();
    try {
      const response = await plain.app.inject({
        method: 'OPTIONS',
        url: '/api/conversations',
        headers: { origin: 'https://shop.example', 'access-control-request-method': 'GET' },
      });
      expect(response.headers['access-control-allow-origin']).toBeUndefined();
    } finally {
      await plain.close();
    }
  });

  it('refuses an origin that is not an origin', () => {
    expect(() => startTestApp({ CORS_ALLOWED_ORIGINS: 'https://shop.example/path' })).rejects.toThrow(/CORS_ALLOWED_ORIGINS/);
  });
});

describe('browser assets', () => {
  it('serves the console page with a strict content security policy, its hashed assets, and /widget.js', async () => {
    const page = await t.app.inject({ method: 'GET', url: '/console' });
    expect(page.statusCode).toBe(200);
    expect(page.headers['content-type']).toContain('text/html');
    expect(page.headers['content-security-policy']).toContain("default-src 'self'");
    expect(page.headers['content-security-policy']).toContain("frame-ancestors 'none'");
    const script = /src="(\/console\/assets\/[^"]+\.js)"/.exec(page.body)?.[1];
    expect(script).toBeDefined();
    const asset = await t.app.inject({ method: 'GET', url: script! });
    expect(asset.statusCode).toBe(200);
    expect(asset.headers['cache-control']).toContain('immutable');
    expect((await t.app.inject({ method: 'GET', url: '/console/' })).body).toBe(page.body);
    expect((await t.app.inject({ method: 'GET', url: '/console/assets/nothing.js' })).statusCode).toBe(404);
    const widget = await t.app.inject({ method: 'GET', url: '/widget.js' });
    expect(widget.statusCode).toBe(200);
    expect(widget.headers['content-type']).toContain('javascript');
    expect(widget.body).toContain('visitor_sessions');
  });
});
