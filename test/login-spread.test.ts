/**
 * Sign-in from many addresses (third review): 40 addresses x 10 parallel logins for made-up e-mails kept every
 * password check busy, and every sign-in answered 503 for about 18 s. Addresses now count by their /24 or
 * /64, and an organisation's checks for unknown e-mails have a budget per window, past which the same 401
 * comes without a check. Counted in password checks, not time.
 */
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { guardsFor } from '../src/auth/login.js';
import { addressGroup } from '../src/auth/throttle.js';
import { buildServer } from '../src/http/server.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

function login(app: FastifyInstance, key: string, email: string, password: string, address: string) {
  return app.inject({
    method: 'POST',
    url: '/api/users/login',
    remoteAddress: address,
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/vnd.api+json' },
    payload: { data: { type: 'User', attributes: { email, password } } },
  });
}

describe('address groups', () => {
  it('IPv4 by /24, IPv6 by /64, IPv4-mapped IPv6 as IPv4', () => {
    expect(addressGroup('203.0.113.7')).toBe('203.0.113.0/24');
    expect(addressGroup('203.0.113.250')).toBe('203.0.113.0/24');
    expect(addressGroup('::ffff:203.0.113.9')).toBe('203.0.113.0/24');
    expect(addressGroup('2001:db8:1:2:aaaa::1')).toBe('2001:db8:1:2::/64');
    expect(addressGroup('2001:db8:1:2:bbbb::9')).toBe('2001:db8:1:2::/64');
    expect(addressGroup('2001:db8:1:3::1')).not.toBe(addressGroup('2001:db8:1:2::1'));
  });
});

describe('sign-in from many addresses', () => {
  let t: TestApp;
  let tenant: Tenant;
  let other: Tenant;
  /** A server built here, so that its options (the key of its login guards) are known. */
  let options: Parameters<typeof buildServer>[0];
  let app: FastifyInstance;
  beforeAll(async () => {
    t = await startTestApp({ LOGIN_FAILURES_PER_WINDOW: '10', LOGIN_UNKNOWN_PER_ORGANISATION: '5' });
    tenant = await seedTenant(t, 'Spread');
    other = await seedTenant(t, 'Bystander');
    options = { ...t.services, database: t.database };
    app = await buildServer(options);
    await app.ready();
  });
  afterAll(async () => {
    await app?.close();
    await t?.close();
  });

  it('the addresses of one /24 or /64 share one failure budget', async () => {
    const v4 = [];
    for (let i = 1; i <= 12; i++)
      v4.push((await login(app, tenant.publishableKey, `x${i}@nowhere.example`, 'guess', `198.51.100.${i}`)).statusCode);
    expect(v4.slice(0, 10).every((s) => s === 401)).toBe(true);
    expect(v4.slice(10)).toEqual([429, 429]);
    const v6 = [];
    for (let i = 1; i <= 11; i++)
      v6.push((await login(app, other.publishableKey, other.owner.email, 'guess', `2001:db8:77:1::${i.toString(16)}`)).statusCode);
    expect(v6.at(-1)).toBe(429);
  });

  it("40 addresses x 10 parallel guesses of unknown e-mails: the organisation's budget of checks holds, all answered 401, and members sign in", async () => {
    const gate = guardsFor(options).gate;
    const before = gate.checks;
    const guesses = [];
    for (let a = 0; a < 40; a++) {
      for (let i = 0; i < 10; i++) {
        // Every address in a network of its own: no address budget is reached (10 each).
        guesses.push(login(app, tenant.publishableKey, `guess${a}.${i}@nowhere.example`, 'guess', `10.${a}.${i}.1`));
      }
    }
    const statuses = (await Promise.all(guesses)).map((r) => r.statusCode);
    // The first test's 10 unknown e-mails already spent this organisation's budget of 5: none of these is checked.
    expect(statuses.every((s) => s === 401)).toBe(true);
    expect(gate.checks - before).toBe(0);
    // A member of the organisation is checked as always, as is another organisation's unknown e-mail.
    expect((await login(app, tenant.publishableKey, tenant.operator.email, tenant.operator.password, '192.0.2.10')).statusCode).toBe(200);
    expect((await login(app, other.publishableKey, 'nobody@nowhere.example', 'guess', '192.0.2.11')).statusCode).toBe(401);
    expect(gate.checks - before).toBe(2);
    console.log(`400 guesses of unknown e-mails from 40 addresses: ${gate.checks - before - 2} password checks (budget spent)`);
  });
});
