import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiKey, revokeApiKey } from '../src/auth/api-keys.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, resourceDocument, type Client } from './helpers/http.js';

let t: TestApp;
let a: Tenant;
let b: Tenant;
let adminA: Client;
let adminB: Client;

beforeAll(async () => {
  t = await startTestApp();
  a = await seedTenant(t, 'SecretsA');
  b = await seedTenant(t, 'SecretsB');
  adminA = client(t.app, a.admin.token);
  adminB = client(t.app, b.admin.token);
});
afterAll(async () => t?.close());

describe('SIP passwords and cursors', () => {
  it('neither filters nor sorts by sip_password', async () => {
    await adminA.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'desk-1', sip_password: 'a-long-password-1' }));
    const filtered = await adminA.get('/api/sip_users?filter[sip_password]=a-long-password-1');
    expect(filtered.status).toBe(400);
    expect(errorCodes(filtered)).toEqual(['invalid_filter']);
    const sorted = await adminA.get('/api/sip_users?sort=-sip_password');
    expect(sorted.status).toBe(400);
    expect(errorCodes(sorted)).toEqual(['invalid_sort']);
  });

  it("binds cursors to the organisation: another organisation's admin cannot use one", async () => {
    for (let i = 0; i < 2; i++) expect((await adminA.post('/api/conversations', resourceDocument('Conversation', {}))).status).toBe(201);
    const page = await adminA.get('/api/conversations?page[limit]=1');
    const next = new URL(page.body.links.next);
    expect((await adminA.get(`${next.pathname}${next.search}`)).status).toBe(200);
    const foreign = await adminB.get(`${next.pathname}${next.search}`);
    expect(foreign.status).toBe(400);
    expect(foreign.body.errors[0].source.parameter).toBe('page[after]');
  });
});

describe('headers', () => {
  it('answers logins, SIP users and every /api response with Cache-Control: no-store', async () => {
    const login = await client(t.app, a.publishableKey).post(
      '/api/users/login',
      resourceDocument('User', { email: a.owner.email, password: a.owner.password }),
    );
    expect(login.status).toBe(200);
    expect(login.headers['cache-control']).toBe('no-store');
    const created = await adminA.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'desk-2' }));
    expect(created.body.data.attributes.sip_password).toMatch(/.{12,}/);
    expect(created.headers['cache-control']).toBe('no-store');
    expect((await adminA.get('/api/sip_users')).headers['cache-control']).toBe('no-store');
    expect((await adminA.get('/api/api_keys')).headers['cache-control']).toBe('no-store');
    expect((await client(t.app).get('/api/conversations')).headers['cache-control']).toBe('no-store');
  });

  it('sends X-Content-Type-Options: nosniff on every response', async () => {
    for (const url of ['/api/conversations', '/api/open_api', '/healthz', '/metrics', '/nowhere', '/docs/', '/api/%zz']) {
      const response = await t.app.inject({ url, headers: { authorization: `Bearer ${a.admin.token}` } });
      expect(response.headers['x-content-type-options'], url).toBe('nosniff');
    }
  });

  it('serves /docs with a Content-Security-Policy that works over plain http', async () => {
    for (const url of ['/docs/', '/docs/static/index.html']) {
      const response = await t.app.inject({ url, headers: { host: 'parley.internal:8080' } });
      const csp = String(response.headers['content-security-policy'] ?? '');
      expect(csp, url).toContain("default-src 'self'");
      expect(csp, url).not.toContain('upgrade-insecure-requests');
    }
  });
});

describe('API keys', () => {
  it('shows revoked keys with revoked_at', async () => {
    const key = await createApiKey(t.services.records!, {
      organisationId: a.organisationId,
      userId: a.admin.id,
      keyType: 'secret',
      name: 'to revoke',
    });
    expect(await revokeApiKey(t.db, t.services.records!, key.id)).toBe(true);
    const list = await adminA.get('/api/api_keys?page[limit]=100');
    const revoked = list.body.data.find((k: { id: string }) => k.id === key.id);
    expect(revoked.attributes.revoked_at).toMatch(/^\d{4}-\d\d-\d\dT/);
    expect(list.body.data.filter((k: { attributes: { revoked_at: unknown } }) => k.attributes.revoked_at === null).length).toBeGreaterThan(
      0,
    );
    const live = await adminA.get('/api/api_keys?filter[revoked_at][is_nil]=true&page[limit]=100');
    expect(live.body.data.map((k: { id: string }) => k.id)).not.toContain(key.id);
  });
});
