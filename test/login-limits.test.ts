import http from 'node:http';
import { sql } from 'kysely';
import type { AddressInfo } from 'node:net';
import { randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectRedis } from '../src/app.js';
import { hashPassword } from '../src/auth/passwords.js';
import { buildServer } from '../src/http/server.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { expectJsonApi } from './support/conformance.js';

let addressCounter = 0;
/** A fresh client address per call, so that only the counter under test is involved. */
const freshAddress = () => `10.${Math.floor(addressCounter / 250) % 250}.${addressCounter++ % 250}.${1 + Math.floor(Math.random() * 250)}`;

function login(
  app: FastifyInstance,
  key: string,
  email: string,
  password: string,
  options: { address?: string; headers?: Record<string, string> } = {},
) {
  return app
    .inject({
      method: 'POST',
      url: '/api/users/login',
      remoteAddress: options.address ?? freshAddress(),
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/vnd.api+json', ...options.headers },
      payload: { data: { type: 'User', attributes: { email, password } } },
    })
    .then((response) => {
      expectJsonApi(response.json());
      return response;
    });
}

const count = (statuses: number[], status: number) => statuses.filter((s) => s === status).length;

describe('login throttle', () => {
  let t: TestApp;
  let a: Tenant;
  let b: Tenant;
  beforeAll(async () => {
    t = await startTestApp();
    a = await seedTenant(t, 'ThrottleA');
    b = await seedTenant(t, 'ThrottleB');
  });
  afterAll(async () => t?.close());

  it('reserves each attempt before hashing: of 16 parallel logins 10 are checked and 6 refused, a correct password among them included', async () => {
    const burst = await Promise.all([
      ...Array.from({ length: 15 }, () => login(t.app, a.publishableKey, a.admin.email, 'wrong-password')),
      login(t.app, a.publishableKey, a.admin.email, a.admin.password),
    ]);
    const statuses = burst.map((r) => r.statusCode);
    // Which reach the hash first depends on how the database answers the credential lookups, so the correct
    // password may be among them (200) or not (429). Wrong passwords checked never exceed the limit of ten; a
    // success gives its reserved attempt back, which one more wrong attempt may then take.
    const succeeded = count(statuses, 200);
    expect(succeeded).toBeLessThanOrEqual(1);
    expect(count(statuses, 401)).toBeLessThanOrEqual(10);
    expect(count(statuses, 401)).toBeGreaterThanOrEqual(10 - succeeded);
    expect(count(statuses, 429)).toBe(16 - count(statuses, 401) - succeeded);
    const refused = burst.find((r) => r.statusCode === 429)!;
    expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
    // Ten failures lock the e-mail: once the burst is over a correct password is refused, unless fewer than ten
    // wrong ones were checked (the correct one succeeded inside the burst and nothing took its attempt back).
    const after = await login(t.app, a.publishableKey, a.admin.email, a.admin.password);
    expect(after.statusCode).toBe(count(statuses, 401) >= 10 ? 429 : 200);
    console.log(
      `login burst: 16 parallel attempts, ${count(statuses, 401)} refused as wrong (401), ${count(statuses, 429)} refused as over the limit (429), correct password among them: ${statuses[15]}`,
    );
  });

  it("counts per organisation and e-mail: another organisation's key cannot lock a user out", async () => {
    // B's admin e-mail, ten wrong logins through A's publishable key.
    for (let i = 0; i < 10; i++) expect((await login(t.app, a.publishableKey, b.admin.email, 'wrong-password')).statusCode).toBe(401);
    expect((await login(t.app, a.publishableKey, b.admin.email, 'wrong-password')).statusCode).toBe(429);
    expect((await login(t.app, b.publishableKey, b.admin.email, b.admin.password)).statusCode).toBe(200);
  });

  it('counts per client address across e-mails', async () => {
    const address = freshAddress();
    const statuses: number[] = [];
    for (let i = 0; i < 11; i++)
      statuses.push((await login(t.app, b.publishableKey, `nobody${i}@x.example`, 'wrong-password', { address })).statusCode);
    expect(statuses).toEqual([...Array(10).fill(401), 429]);
    // A correct login from that address is refused too, and from elsewhere it works.
    expect((await login(t.app, b.publishableKey, b.operator.email, b.operator.password, { address })).statusCode).toBe(429);
    expect((await login(t.app, b.publishableKey, b.operator.email, b.operator.password)).statusCode).toBe(200);
  });

  it('gives a successful attempt back: successful logins never lock a user out', async () => {
    const address = freshAddress();
    for (let i = 0; i < 12; i++)
      expect((await login(t.app, b.publishableKey, b.owner.email, b.owner.password, { address })).statusCode).toBe(200);
  });
});

describe('TRUST_PROXY takes the client address from the right of X-Forwarded-For', () => {
  let t: TestApp;
  let tenant: Tenant;
  beforeAll(async () => {
    t = await startTestApp({ TRUST_PROXY: 'true', LOGIN_FAILURES_PER_WINDOW: '3' });
    tenant = await seedTenant(t, 'Proxied');
  });
  afterAll(async () => t?.close());

  it('a client choosing the leftmost X-Forwarded-For entry does not escape its address budget', async () => {
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) {
      const forwarded = `203.0.113.${i + 1}, 198.51.100.7`;
      const response = await login(t.app, tenant.publishableKey, `someone${i}@x.example`, 'wrong-password', {
        address: '127.0.0.1',
        headers: { 'x-forwarded-for': forwarded },
      });
      statuses.push(response.statusCode);
    }
    expect(statuses).toEqual([401, 401, 401, 429, 429]);
    // A real client of another network (the proxy's right-most entry; addresses count by their /24) is not affected.
    const other = await login(t.app, tenant.publishableKey, tenant.admin.email, tenant.admin.password, {
      address: '127.0.0.1',
      headers: { 'x-forwarded-for': '203.0.113.1, 192.0.2.8' },
    });
    expect(other.statusCode).toBe(200);
  });
});

describe('bounded password hashing', () => {
  let t: TestApp;
  let tenant: Tenant;
  beforeAll(async () => {
    // Twelve failures of one e-mail allowed: the burst below is exactly that many.
    t = await startTestApp({ LOGIN_HASH_CONCURRENCY: '1', LOGIN_HASH_QUEUE: '2', LOGIN_FAILURES_PER_WINDOW: '12' });
    tenant = await seedTenant(t, 'Hashing');
    // The owner's password made slow to check (its stored hash names scrypt's cost: 64 MiB, a few hundred ms),
    // so that the gate stays full while the other sign-ins arrive, however loaded the machine. With the tests'
    // cheap hash, a burst whose database look-ups were spread by load reached an empty gate one at a time.
    const previous = process.env.PASSWORD_HASH_COST_LOG2;
    process.env.PASSWORD_HASH_COST_LOG2 = '16';
    const slow = hashPassword('slow-password-1');
    process.env.PASSWORD_HASH_COST_LOG2 = previous;
    await sql`UPDATE users SET password_hash = ${await slow} WHERE lower(email) = lower(${tenant.owner.email})`.execute(t.db);
  });
  afterAll(async () => t?.close());

  it('refuses logins beyond the running and queued hashes at once with 503 and Retry-After', async () => {
    const guess = () => login(t.app, tenant.publishableKey, tenant.owner.email, 'wrong-password');
    // One sign-in takes the running slot first; the eleven behind it find it taken.
    const first = guess();
    await new Promise((r) => setTimeout(r, 50));
    const rest = Array.from({ length: 11 }, guess);
    const responses = await Promise.all([first, ...rest]);
    const statuses = responses.map((r) => r.statusCode);
    expect(count(statuses, 401)).toBeGreaterThanOrEqual(3);
    expect(count(statuses, 503)).toBeGreaterThan(0);
    expect(count(statuses, 401) + count(statuses, 503)).toBe(12);
    for (const r of responses.filter((r) => r.statusCode === 503)) expect(r.headers['retry-after']).toBe('1');
    // A refused (503) attempt is not a failed login: the throttle gave it back. Had it not, the twelve counted
    // failures would refuse this right password with 429.
    const right = await login(t.app, tenant.publishableKey, tenant.owner.email, 'slow-password-1');
    expect(right.statusCode, right.body).toBe(200);
    console.log(
      `hash gate (1 running, 2 queued): 12 parallel logins, ${count(statuses, 401)} checked, ${count(statuses, 503)} answered 503`,
    );
  });

  it('does not check the sign-ins of clients that have gone: a login right after them is checked, not refused', async () => {
    await t.app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = t.app.server.address() as AddressInfo;
    const body = JSON.stringify({ data: { type: 'User', attributes: { email: tenant.owner.email, password: 'slow-password-1' } } });
    // One check running and two waiting fill the gate (1 running, 2 queued); then their clients go.
    const abandoned = Array.from({ length: 3 }, () => {
      const request = http.request({
        port,
        host: '127.0.0.1',
        method: 'POST',
        path: '/api/users/login',
        headers: { authorization: `Bearer ${tenant.publishableKey}`, 'content-type': 'application/vnd.api+json' },
      });
      request.on('error', () => {});
      request.end(body);
      return request;
    });
    await new Promise((r) => setTimeout(r, 30));
    for (const request of abandoned) request.destroy();
    await new Promise((r) => setTimeout(r, 30));
    // The two waiting left the queue with their clients: a login now waits for the one running check and is
    // checked. (Had they stayed, the queue would be full and this login refused with 503.)
    const after = await login(t.app, tenant.publishableKey, tenant.admin.email, tenant.admin.password);
    expect(after.statusCode, after.body).toBe(200);
  });
});

describe('request budgets', () => {
  let t: TestApp;
  let tenant: Tenant;
  beforeAll(async () => {
    t = await startTestApp({ RATE_LIMIT_PER_MINUTE: '5' });
    tenant = await seedTenant(t, 'Budgets');
  });
  afterAll(async () => t?.close());

  it('limits requests answered 401 and 403, per client address', async () => {
    const address = freshAddress();
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++)
      statuses.push(
        (await t.app.inject({ url: '/api/conversations', remoteAddress: address, headers: { authorization: 'Bearer forged' } })).statusCode,
      );
    for (let i = 0; i < 3; i++) statuses.push((await t.app.inject({ url: '/api/nowhere', remoteAddress: address })).statusCode);
    expect(statuses).toEqual([401, 401, 401, 401, 401, 429, 429]);
    const limited = await t.app.inject({ url: '/api/conversations', remoteAddress: address });
    expect(limited.statusCode).toBe(429);
    expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0);
    expectJsonApi(limited.json());
  });

  it("budgets a publishable key per client address: one visitor cannot spend every visitor's sign-ins", async () => {
    const noisy = freshAddress();
    const statuses: number[] = [];
    for (let i = 0; i < 6; i++) {
      statuses.push(
        (
          await t.app.inject({
            url: '/api/conversations',
            remoteAddress: noisy,
            headers: { authorization: `Bearer ${tenant.publishableKey}` },
          })
        ).statusCode,
      );
    }
    expect(statuses).toEqual([403, 403, 403, 403, 403, 429]);
    expect((await login(t.app, tenant.publishableKey, tenant.admin.email, tenant.admin.password)).statusCode).toBe(200);
  });
});

describe('request limit with Redis configured but unreachable', () => {
  let t: TestApp;
  let tenant: Tenant;
  let node: FastifyInstance;
  let redis: ReturnType<typeof connectRedis>;
  beforeAll(async () => {
    t = await startTestApp({ RATE_LIMIT_PER_MINUTE: '5' });
    tenant = await seedTenant(t, `Down${randomBytes(3).toString('hex')}`);
    redis = connectRedis('redis://127.0.0.1:1');
    node = await buildServer({ ...t.services, database: t.database, redis });
    await node.ready();
  });
  afterAll(async () => {
    await node?.close();
    redis?.disconnect();
    await t?.close();
  });

  it('falls back to counting in memory instead of switching the limit off', async () => {
    const statuses: number[] = [];
    for (let i = 0; i < 7; i++)
      statuses.push(
        (await node.inject({ url: '/api/conversations', headers: { authorization: `Bearer ${tenant.admin.token}` } })).statusCode,
      );
    expect(statuses).toEqual([200, 200, 200, 200, 200, 429, 429]);
  });
});
