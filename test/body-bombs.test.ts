/**
 * Attribute bombs (third review, "cost and amplification"): a login body of 0.87 MB with 80,000 unknown
 * attributes cost 166 ms of CPU and was not counted as a failed login. The work per body is now bounded
 * before it is parsed into objects (src/http/json-limits.ts), login reads at most 16 KiB, and a refused
 * login body counts against its address. Counts, not times: the parser is shown to stop, and never to build
 * the bomb's objects.
 */
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { JSON_SHAPE_LIMITS, jsonShapeProblem } from '../src/http/json-limits.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, resourceDocument } from './helpers/http.js';

/** `{"data":{"type":"User","attributes":{email, password, a0..aN}}}` as text. */
function loginBomb(email: string, password: string, unknown: number): string {
  const attributes: Record<string, unknown> = { email, password };
  for (let i = 0; i < unknown; i++) attributes[`a${i}`] = 1;
  return JSON.stringify({ data: { type: 'User', attributes } });
}

describe('the bounded scan before parsing', () => {
  it('stops at the first limit passed, having read a small part of a bomb', () => {
    const bomb = loginBomb('a@b.example', 'x', 80_000);
    expect(bomb.length).toBeGreaterThan(800_000);
    const scanned = { chars: 0 };
    const problem = jsonShapeProblem(bomb, JSON_SHAPE_LIMITS, scanned);
    expect(problem?.status).toBe(413);
    expect(problem?.errors[0].code).toBe('body_too_complex');
    // It stopped at the 4,097th member: about 5% of the text.
    expect(scanned.chars).toBeLessThan(bomb.length / 15);

    const deep = `${'['.repeat(40)}${']'.repeat(40)}`;
    expect(jsonShapeProblem(deep)?.status).toBe(400);
    expect(jsonShapeProblem(`${'['.repeat(32)}${']'.repeat(32)}`)).toBeUndefined();
    // Many values in all, each container small.
    const wide = JSON.stringify(Array.from({ length: 20 }, () => Array.from({ length: 1000 }, () => 0)));
    expect(jsonShapeProblem(wide)?.errors[0].detail).toMatch(/more than 16384 values/);
    // Commas, brackets and escaped quotes inside strings are not counted.
    const text = JSON.stringify({ a: '[{,,,}]\\"'.repeat(5000), b: [1, 2, 3] });
    expect(jsonShapeProblem(text)).toBeUndefined();
    // A conversation's metadata at its 16 KiB limit, one-character keys: about 2,700 members, accepted.
    const metadata = Object.fromEntries(Array.from({ length: 2600 }, (_, i) => [i.toString(36), 1]));
    expect(jsonShapeProblem(JSON.stringify({ data: { type: 'Conversation', attributes: { metadata } } }))).toBeUndefined();
  });
});

describe('attribute bombs over HTTP', () => {
  let t: TestApp;
  let tenant: Tenant;
  beforeAll(async () => {
    t = await startTestApp({ LOGIN_FAILURES_PER_WINDOW: '5' });
    tenant = await seedTenant(t, 'Bombs');
  });
  afterAll(async () => t?.close());

  const post = (app: FastifyInstance, url: string, key: string, payload: string, address: string) =>
    app.inject({
      method: 'POST',
      url,
      remoteAddress: address,
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/vnd.api+json' },
      payload,
    });

  it('bomb logins are refused without being parsed, counted as failed sign-ins of their address; other addresses sign in', async () => {
    const address = '10.77.0.1';
    const parse = vi.spyOn(JSON, 'parse');
    try {
      const ok = await post(
        t.app,
        '/api/users/login',
        tenant.publishableKey,
        loginBomb(tenant.operator.email, tenant.operator.password, 0),
        address,
      );
      expect(ok.statusCode).toBe(200);

      // The review's bomb: 0.87 MB, 80,000 attributes. 413 on its length alone.
      const big = await post(t.app, '/api/users/login', tenant.publishableKey, loginBomb(tenant.operator.email, 'x', 80_000), address);
      expect(big.statusCode).toBe(413);
      // The same within 16 KiB: 1,500 unknown attributes, a 422 with a pointer.
      const small = loginBomb(tenant.operator.email, 'x', 1500);
      expect(small.length).toBeLessThan(16 * 1024);
      const invalid = await post(t.app, '/api/users/login', tenant.publishableKey, small, address);
      expect(invalid.statusCode).toBe(422);
      expect(invalid.json().errors[0].source.pointer).toMatch(/^\/data\/attributes\/a\d+$/);
      // Malformed JSON, and more members than one object may have.
      expect((await post(t.app, '/api/users/login', tenant.publishableKey, '{"data":', address)).statusCode).toBe(400);
      const members = `{"data":{"type":"User","attributes":{"email":"${tenant.operator.email}","password":"x"}},"meta":[${'0,'.repeat(5000)}0]}`;
      const complex = await post(t.app, '/api/users/login', tenant.publishableKey, members, address);
      expect(complex.statusCode).toBe(413);
      expect(complex.json().errors[0].code).toBe('body_too_complex');

      // The bombs' texts were never handed to JSON.parse (no object built from them).
      const parsedBombs = parse.mock.calls.filter(([text]) => typeof text === 'string' && /"a79999"|(0,){100}/.test(text));
      expect(parsedBombs).toHaveLength(0);
    } finally {
      parse.mockRestore();
    }
    // 4 refused bodies + 1 wrong password = the limit of 5: the address's next sign-in, correct, is refused.
    const wrong = await post(t.app, '/api/users/login', tenant.publishableKey, loginBomb(tenant.operator.email, 'wrong', 0), address);
    expect(wrong.statusCode).toBe(401);
    const refused = await post(
      t.app,
      '/api/users/login',
      tenant.publishableKey,
      loginBomb(tenant.operator.email, tenant.operator.password, 0),
      address,
    );
    expect(refused.statusCode).toBe(429);
    // Another network signs in as before (addresses count by their /24).
    const other = await post(
      t.app,
      '/api/users/login',
      tenant.publishableKey,
      loginBomb(tenant.operator.email, tenant.operator.password, 0),
      '10.78.0.2',
    );
    expect(other.statusCode).toBe(200);
  });

  it('every JSON body has the limits; ordinary bodies, a large metadata among them, still work', async () => {
    const owner = client(t.app, tenant.owner.token);
    const metadata = Object.fromEntries(Array.from({ length: 1800 }, (_, i) => [i.toString(36), 1]));
    const created = await owner.post('/api/conversations', resourceDocument('Conversation', { channel: 'chat', metadata }));
    expect(created.status).toBe(201);
    expect(Object.keys(created.body.data.attributes.metadata)).toHaveLength(1800);
    const tooMany = Object.fromEntries(Array.from({ length: 5000 }, (_, i) => [`${i}`, 1]));
    const refused = await owner.post('/api/conversations', resourceDocument('Conversation', { channel: 'chat', metadata: tooMany }));
    expect(refused.status).toBe(413);
    expect(refused.body.errors[0].code).toBe('body_too_complex');
    const deep = await owner.post('/api/conversations', `{"data":${'['.repeat(100)}${']'.repeat(100)}}`);
    expect(deep.status).toBe(400);
  });
});
