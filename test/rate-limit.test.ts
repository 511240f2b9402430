import { randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectRedis } from '../src/app.js';
import { buildServer } from '../src/http/server.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

const LIMIT = 20;

async function burst(app: FastifyInstance, token: string, count: number) {
  const statuses: number[] = [];
  let last: Awaited<ReturnType<FastifyInstance['inject']>> | undefined;
  for (let i = 0; i < count; i++) {
    last = await app.inject({ url: '/api/conversations', headers: { authorization: `Bearer ${token}` } });
    statuses.push(last.statusCode);
  }
  return { statuses, last: last! };
}

describe('rate limit on one node', () => {
  let t: TestApp;
  let tenant: Tenant;
  beforeAll(async () => {
    t = await startTestApp({ RATE_LIMIT_PER_MINUTE: String(LIMIT) });
    tenant = await seedTenant(t, 'Limited');
  });
  afterAll(async () => t?.close());

  it(`answers 429 after ${LIMIT} requests per credential per minute, with headers`, async () => {
    const first = await t.app.inject({ url: '/api/conversations', headers: { authorization: `Bearer ${tenant.admin.token}` } });
    expect(first.headers['ratelimit-limit']).toBe(String(LIMIT));
    expect(first.headers['ratelimit-remaining']).toBe(String(LIMIT - 1));
    expect(first.headers['ratelimit-reset']).toBeDefined();
    const { statuses, last } = await burst(t.app, tenant.admin.token, LIMIT + 4);
    expect(statuses.filter((s) => s === 200)).toHaveLength(LIMIT - 1);
    expect(statuses.filter((s) => s === 429)).toHaveLength(5);
    expect(last.statusCode).toBe(429);
    expect(Number(last.headers['retry-after'])).toBeGreaterThan(0);
    expect(last.json().errors[0].code).toBe('rate_limited');
    // Another credential has its own budget; health checks have none.
    expect(
      (await t.app.inject({ url: '/api/conversations', headers: { authorization: `Bearer ${tenant.operator.token}` } })).statusCode,
    ).toBe(200);
    expect((await t.app.inject({ url: '/healthz' })).statusCode).toBe(200);
    console.log(
      `rate limit, one node: limit ${LIMIT}/min, ${statuses.length + 1} requests, ${statuses.filter((s) => s === 429).length} answered 429`,
    );
  });
});

describe.runIf(process.env.REDIS_TEST_URL)('rate limit shared through Redis by two nodes', () => {
  let t: TestApp;
  let tenant: Tenant;
  let nodes: FastifyInstance[];
  let redis: Redis[];

  beforeAll(async () => {
    t = await startTestApp({ RATE_LIMIT_PER_MINUTE: String(LIMIT) });
    tenant = await seedTenant(t, `Shared${randomBytes(3).toString('hex')}`);
    redis = [new Redis(process.env.REDIS_TEST_URL!), new Redis(process.env.REDIS_TEST_URL!)];
    nodes = await Promise.all(redis.map((client) => buildServer({ ...t.services, database: t.database, redis: client })));
    await Promise.all(nodes.map((n) => n.ready()));
  });
  afterAll(async () => {
    await Promise.all((nodes ?? []).map((n) => n.close()));
    for (const r of redis ?? []) r.disconnect();
    await t?.close();
  });

  it('counts one budget across both nodes', async () => {
    const a = await burst(nodes[0], tenant.admin.token, 12);
    const b = await burst(nodes[1], tenant.admin.token, 12);
    const all = [...a.statuses, ...b.statuses];
    expect(all.filter((s) => s === 200)).toHaveLength(LIMIT);
    expect(all.filter((s) => s === 429)).toHaveLength(4);
    expect(b.last.headers['ratelimit-remaining']).toBe('0');
    console.log(
      `rate limit, two nodes sharing Redis: limit ${LIMIT}/min, 24 requests, ${all.filter((s) => s === 429).length} answered 429`,
    );
  });

  it('shares login throttling across both nodes', async () => {
    const attempt = (node: FastifyInstance) =>
      node.inject({
        method: 'POST',
        url: '/api/users/login',
        remoteAddress: `10.9.${Math.floor(Math.random() * 250)}.${Math.floor(Math.random() * 250)}`,
        headers: { authorization: `Bearer ${tenant.publishableKey}`, 'content-type': 'application/vnd.api+json' },
        payload: { data: { type: 'User', attributes: { email: tenant.operator.email, password: 'wrong-password' } } },
      });
    const statuses: number[] = [];
    for (let i = 0; i < 12; i++) statuses.push((await attempt(nodes[i % 2])).statusCode);
    expect(statuses.slice(0, 10).every((s) => s === 401)).toBe(true);
    expect(statuses.slice(10)).toEqual([429, 429]);
  });

  it('reserves login attempts atomically in Redis: of 15 parallel wrong logins on two nodes, 10 are checked', async () => {
    const responses = await Promise.all(
      Array.from({ length: 15 }, (_, i) =>
        nodes[i % 2].inject({
          method: 'POST',
          url: '/api/users/login',
          remoteAddress: `10.8.${i}.${Math.floor(Math.random() * 250)}`,
          headers: { authorization: `Bearer ${tenant.publishableKey}`, 'content-type': 'application/vnd.api+json' },
          payload: { data: { type: 'User', attributes: { email: tenant.owner.email, password: 'wrong-password' } } },
        }),
      ),
    );
    const statuses = responses.map((r) => r.statusCode);
    expect(statuses.filter((s) => s === 401)).toHaveLength(10);
    expect(statuses.filter((s) => s === 429)).toHaveLength(5);
  });
});

describe('while Redis is unreachable', () => {
  let t: TestApp;
  let tenant: Tenant;
  let node: FastifyInstance;
  let redis: Redis;

  beforeAll(async () => {
    t = await startTestApp({ RATE_LIMIT_PER_MINUTE: String(LIMIT), LOGIN_FAILURES_PER_WINDOW: '3' });
    tenant = await seedTenant(t, `NoRedis${randomBytes(3).toString('hex')}`);
    // Nothing listens on port 1: every Redis command fails at once.
    redis = connectRedis('redis://127.0.0.1:1')!;
    node = await buildServer({ ...t.services, database: t.database, redis });
    await node.ready();
  });
  afterAll(async () => {
    await node?.close();
    redis?.disconnect();
    await t?.close();
  });

  it('serves requests and keeps throttling logins on this node', async () => {
    expect((await node.inject({ url: '/api/conversations', headers: { authorization: `Bearer ${tenant.admin.token}` } })).statusCode).toBe(
      200,
    );
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) {
      const response = await node.inject({
        method: 'POST',
        url: '/api/users/login',
        headers: { authorization: `Bearer ${tenant.publishableKey}`, 'content-type': 'application/vnd.api+json' },
        payload: { data: { type: 'User', attributes: { email: tenant.operator.email, password: 'wrong-password' } } },
      });
      statuses.push(response.statusCode);
    }
    expect(statuses).toEqual([401, 401, 401, 429, 429]);
  });
});
