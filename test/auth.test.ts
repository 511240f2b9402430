import { Writable } from 'node:stream';
import type { FastifyBaseLogger } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { revokeUserTokens } from '../src/auth/user-tokens.js';
import { hashPassword, verifyPassword } from '../src/auth/passwords.js';
import { createLogger } from '../src/http/logger.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, resourceDocument } from './helpers/http.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let logs = '';

beforeAll(async () => {
  const sink = new Writable({
    write(chunk, _encoding, done) {
      logs += chunk.toString();
      done();
    },
  });
  const logger = createLogger({ logLevel: 'debug' } as never, sink) as FastifyBaseLogger;
  t = await startTestApp({ LOGIN_FAILURES_PER_WINDOW: '3' }, logger);
  tenant = await seedTenant(t, 'Auth');
  other = await seedTenant(t, 'Other');
});
afterAll(async () => t?.close());

const login = (email: string, password: string) => resourceDocument('User', { email, password });

describe('passwords', () => {
  it('are hashed with scrypt and verified', async () => {
    const hash = await hashPassword('correct horse');
    expect(hash).toMatch(/^scrypt\$\d+\$8\$1\$/);
    expect(await verifyPassword(hash, 'correct horse')).toBe(true);
    expect(await verifyPassword(hash, 'wrong horse')).toBe(false);
  });
});

describe('POST /api/users/login', () => {
  it('signs a member in with the publishable key and returns a working token', async () => {
    const widget = client(t.app, tenant.publishableKey);
    const response = await widget.post(
      '/api/users/login?include=organisation',
      login(tenant.operator.email.toUpperCase(), tenant.operator.password),
    );
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({
      id: tenant.operator.id,
      type: 'User',
      attributes: { email: tenant.operator.email, full_name: tenant.operator.fullName },
    });
    expect(response.body.data.relationships.organisation.data.id).toBe(tenant.organisationId);
    expect(response.body.included[0]).toMatchObject({ type: 'Organisation', id: tenant.organisationId, attributes: { name: 'Auth' } });
    expect(response.body.meta.token_expires_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    const expiresIn = Date.parse(response.body.meta.token_expires_at) - Date.now();
    expect(expiresIn).toBeGreaterThan(11.9 * 3600_000);
    expect(expiresIn).toBeLessThan(12.1 * 3600_000);
    const token = response.body.meta.token;
    expect((await client(t.app, token).get('/api/conversations')).status).toBe(200);
  });

  it('answers wrong password and unknown e-mail alike', async () => {
    const widget = client(t.app, tenant.publishableKey);
    const wrong = await widget.post('/api/users/login', login(tenant.admin.email, 'not-the-password'));
    const unknown = await widget.post('/api/users/login', login('nobody@nowhere.example', 'whatever-password'));
    const foreign = await widget.post('/api/users/login', login(other.admin.email, other.admin.password));
    for (const response of [wrong, unknown, foreign]) {
      expect(response.status).toBe(401);
      expect(errorCodes(response)).toEqual(['invalid_credentials']);
      expect(response.headers['www-authenticate']).toBe('Bearer');
      expect(response.body.errors[0].detail).toBe(wrong.body.errors[0].detail);
    }
  });

  it('validates the body', async () => {
    const widget = client(t.app, tenant.publishableKey);
    const response = await widget.post('/api/users/login', resourceDocument('User', { email: 'x@y.z', extra: 1 }));
    expect(response.status).toBe(422);
    expect(errorCodes(response).sort()).toEqual(['required', 'unknown_attribute']);
    expect((await client(t.app).post('/api/users/login', login(tenant.admin.email, tenant.admin.password))).status).toBe(401);
  });

  it('throttles repeated failures per e-mail and per client address with 429 and Retry-After', async () => {
    const attempt = (email: string, password: string, remoteAddress: string) =>
      t.app.inject({
        method: 'POST',
        url: '/api/users/login',
        remoteAddress,
        headers: { authorization: `Bearer ${tenant.publishableKey}`, 'content-type': 'application/vnd.api+json' },
        payload: login(email, password),
      });
    const byEmail: number[] = [];
    for (let i = 0; i < 5; i++) byEmail.push((await attempt(tenant.owner.email, 'nope-nope', `10.0.0.${i + 1}`)).statusCode);
    expect(byEmail).toEqual([401, 401, 401, 429, 429]);
    const blocked = await attempt(tenant.owner.email, tenant.owner.password, '10.0.1.1');
    expect(blocked.statusCode).toBe(429);
    expect(Number(blocked.headers['retry-after'])).toBeGreaterThan(0);

    const byAddress: number[] = [];
    for (let i = 0; i < 4; i++) byAddress.push((await attempt(`someone${i}@example.com`, 'nope-nope', '10.0.2.1')).statusCode);
    expect(byAddress).toEqual([401, 401, 401, 429]);
    expect((await attempt(tenant.operator.email, tenant.operator.password, '10.0.3.1')).statusCode).toBe(200);
  });
});

describe('credentials', () => {
  it('a publishable key may only sign in', async () => {
    const widget = client(t.app, tenant.publishableKey);
    expect((await widget.get('/api/conversations')).status).toBe(403);
    expect((await widget.post('/api/conversations', resourceDocument('Conversation', {}))).status).toBe(403);
  });

  it('a secret key acts as its user with that role', async () => {
    const server = client(t.app, tenant.secretKey);
    expect((await server.post('/api/gateways', resourceDocument('Gateway', { realm: 'k.example.com', username: 'k' }))).status).toBe(201);
  });

  it('revoked user tokens and removed memberships stop at once', async () => {
    const fresh = await seedTenant(t, 'Revocation');
    const api = client(t.app, fresh.operator.token);
    expect((await api.get('/api/conversations')).status).toBe(200);
    await revokeUserTokens(t.db, { userId: fresh.operator.id });
    const revoked = await api.get('/api/conversations');
    expect(revoked.status).toBe(401);
    expect(revoked.headers['www-authenticate']).toBe('Bearer');
    const admin = client(t.app, fresh.admin.token);
    expect((await admin.get('/api/conversations')).status).toBe(200);
    await t.db.deleteFrom('api_keys').where('user_id', '=', fresh.admin.id).execute();
    await t.db.deleteFrom('memberships').where('user_id', '=', fresh.admin.id).execute();
    expect((await admin.get('/api/conversations')).status).toBe(401);
  });

  it('an expired session is refused even while its JWT is unexpired', async () => {
    const fresh = await seedTenant(t, 'Expiry');
    await t.db
      .updateTable('user_sessions')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('user_id', '=', fresh.owner.id)
      .execute();
    expect((await client(t.app, fresh.owner.token).get('/api/conversations')).status).toBe(401);
  });

  it('refuses tampered tokens and other schemes', async () => {
    const [header, payload, signature] = tenant.admin.token.split('.');
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString());
    const forged = Buffer.from(JSON.stringify({ ...claims, org: other.organisationId })).toString('base64url');
    for (const value of [
      `Bearer ${header}.${forged}.${signature}`,
      `Basic ${tenant.admin.token}`,
      'Bearer',
      `Bearer ${tenant.admin.token}x`,
    ]) {
      const response = await t.app.inject({ url: '/api/conversations', headers: { authorization: value } });
      expect(response.statusCode, value).toBe(401);
    }
  });

  it('keeps tokens and passwords out of the logs', async () => {
    await client(t.app, tenant.publishableKey).post('/api/users/login', login(tenant.admin.email, tenant.admin.password));
    await client(t.app, tenant.secretKey).get('/api/conversations?filter[status]=active');
    expect(logs.length).toBeGreaterThan(0);
    for (const secret of [tenant.publishableKey, tenant.secretKey, tenant.admin.token, tenant.admin.password]) {
      expect(logs).not.toContain(secret);
    }
  });
});
