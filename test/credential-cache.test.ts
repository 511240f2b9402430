/**
 * The cache of verified credentials (src/auth/credential-cache.ts): a credential read once is served from
 * memory, and every change to what it depends on (key revoked or expired, member removed, role changed,
 * user tokens revoked, password changed) applies to the very next request, whoever wrote it: this process
 * through the records service or a plain query, another connection, or another server process.
 * The cache's lifetime is set to a minute here, so that only invalidation, never expiry, can explain a 401.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiKey, revokeApiKey } from '../src/auth/api-keys.js';
import { CredentialCache } from '../src/auth/credential-cache.js';
import { revokeUserTokens } from '../src/auth/user-tokens.js';
import { systemActor } from '../src/jsonapi/actor.js';
import type { Principal } from '../src/jsonapi/principal.js';
import { client, resourceDocument } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { expectJsonApi } from './support/conformance.js';
import { seedTenant } from './support/seed.js';
import { freePort } from './helpers/ports.js';

const principal = (id: string): Principal => ({
  organisationId: 'o',
  userId: 'u',
  role: 'admin',
  credential: 'secret_key',
  credentialId: id,
});

describe('CredentialCache', () => {
  let now = 1_000_000;
  const clock = () => now;

  it("serves what it kept until its lifetime or the record's expiry, whichever comes first", () => {
    const cache = new CredentialCache(5000, 100, clock);
    cache.resume();
    cache.set('a', principal('a'), Infinity, cache.mark());
    cache.set('b', principal('b'), now + 1000, cache.mark());
    expect(cache.get('a')?.credentialId).toBe('a');
    now += 1000;
    expect(cache.get('b')).toBeUndefined();
    expect(cache.get('a')?.credentialId).toBe('a');
    now += 4000;
    expect(cache.get('a')).toBeUndefined();
  });

  it('hands out copies: a caller changing its principal does not change the cache', () => {
    const cache = new CredentialCache(5000, 100, clock);
    cache.resume();
    cache.set('a', principal('a'), Infinity, cache.mark());
    cache.get('a')!.role = 'operator';
    expect(cache.get('a')!.role).toBe('admin');
  });

  it('does not keep a read that began before a change', () => {
    const cache = new CredentialCache(5000, 100, clock);
    cache.resume();
    const mark = cache.mark();
    cache.invalidate();
    cache.set('a', principal('a'), Infinity, mark);
    expect(cache.get('a')).toBeUndefined();
    cache.set('a', principal('a'), Infinity, cache.mark());
    expect(cache.get('a')).toBeDefined();
  });

  it('keeps and serves nothing while not listening, and starts empty when listening again', () => {
    const cache = new CredentialCache(5000, 100, clock);
    cache.set('a', principal('a'), Infinity, cache.mark());
    expect(cache.get('a')).toBeUndefined();
    cache.resume();
    cache.set('a', principal('a'), Infinity, cache.mark());
    cache.suspend();
    expect(cache.get('a')).toBeUndefined();
    cache.resume();
    expect(cache.get('a')).toBeUndefined();
  });

  it('is bounded: the oldest entry makes room', () => {
    const cache = new CredentialCache(5000, 3, clock);
    cache.resume();
    for (const id of ['a', 'b', 'c', 'd']) cache.set(id, principal(id), Infinity, cache.mark());
    expect(cache.size).toBe(3);
    expect(cache.get('a')).toBeUndefined();
    expect(cache.get('d')).toBeDefined();
  });
});

describe('cached credentials and immediate revocation', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ CREDENTIAL_CACHE_MS: '60000' });
  });
  afterAll(async () => t?.close());

  const status = async (token: string) => (await client(t.app, token).get('/api/conversations')).status;
  /** A change no trigger announces and no Kysely builder makes: only a cache can still accept the key after it. */
  const silently = (statement: ReturnType<typeof sql>) =>
    t.db.transaction().execute(async (trx) => {
      await sql`SET LOCAL session_replication_role = replica`.execute(trx);
      await statement.execute(trx);
    });

  it('serves a verified key from memory: a revocation nothing announces goes unseen until any credential change', async () => {
    const tenant = await seedTenant(t, 'Cached');
    const key = await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.admin.id,
      keyType: 'secret',
      name: 'cached',
    });
    expect(await status(key.token)).toBe(200);
    await silently(sql`UPDATE api_keys SET revoked_at = now() WHERE id = ${key.id}`);
    expect(await status(key.token)).toBe(200);
    // Any announced change to a credential table drops the whole cache.
    await sql`UPDATE users SET full_name = full_name WHERE id = ${tenant.owner.id}`.execute(t.db);
    expect(await status(key.token)).toBe(401);
  });

  it('a revoked key is refused on the very next request', async () => {
    const tenant = await seedTenant(t, 'Revoke key');
    const key = await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.admin.id,
      keyType: 'secret',
      name: 'doomed',
    });
    expect(await status(key.token)).toBe(200);
    expect(await status(key.token)).toBe(200);
    expect(await revokeApiKey(t.db, t.services.records!, key.id)).toBe(true);
    expect(await status(key.token)).toBe(401);
  });

  it("a removed member's token is refused on the very next request", async () => {
    const tenant = await seedTenant(t, 'Remove member');
    expect(await status(tenant.operator.token)).toBe(200);
    expect(await status(tenant.operator.token)).toBe(200);
    await t.db.transaction().execute(async (trx) => {
      // Keys reference the membership, so they go first.
      await trx.deleteFrom('api_keys').where('user_id', '=', tenant.operator.id).execute();
      await trx.deleteFrom('memberships').where('user_id', '=', tenant.operator.id).execute();
    });
    expect(await status(tenant.operator.token)).toBe(401);
  });

  it('revoked user tokens are refused on the very next request', async () => {
    const tenant = await seedTenant(t, 'Revoke tokens');
    expect(await status(tenant.owner.token)).toBe(200);
    expect(await revokeUserTokens(t.db, { userId: tenant.owner.id })).toBe(1);
    expect(await status(tenant.owner.token)).toBe(401);
  });

  it("a new password ends the user's sessions on the very next request; its keys stay valid", async () => {
    const tenant = await seedTenant(t, 'Password');
    const key = await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.operator.id,
      keyType: 'secret',
      name: 'kept',
    });
    expect(await status(tenant.operator.token)).toBe(200);
    expect(await status(key.token)).toBe(200);
    await t.services.records!.update(systemActor(tenant.organisationId, 'cli'), 'User', tenant.operator.id, {
      password: 'a-brand-new-password',
    });
    expect(await status(tenant.operator.token)).toBe(401);
    expect(await status(key.token)).toBe(200);
    const login = await client(t.app, tenant.publishableKey).post(
      '/api/users/login',
      resourceDocument('User', { email: tenant.operator.email, password: 'a-brand-new-password' }),
    );
    expect(login.status).toBe(200);
    expect(await status(login.body.meta.token)).toBe(200);
  });

  it('a role change applies to the very next request', async () => {
    const tenant = await seedTenant(t, 'Role');
    const operator = client(t.app, tenant.operator.token);
    const gateway = (n: number) => resourceDocument('Gateway', { realm: `r${n}.example.com`, username: `u${n}` });
    expect((await operator.post('/api/gateways', gateway(1))).status).toBe(403);
    await t.services.records!.update(systemActor(tenant.organisationId, 'cli'), 'User', tenant.operator.id, { role: 'admin' });
    expect((await operator.post('/api/gateways', gateway(2))).status).toBe(201);
    await t.services.records!.update(systemActor(tenant.organisationId, 'cli'), 'User', tenant.operator.id, { role: 'operator' });
    expect((await operator.post('/api/gateways', gateway(3))).status).toBe(403);
  });

  it('a change by another writer (a plain statement, announced only by the database) applies to the very next request', async () => {
    const tenant = await seedTenant(t, 'Other writer');
    const key = await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.admin.id,
      keyType: 'secret',
      name: 'raw',
    });
    expect(await status(key.token)).toBe(200);
    expect(await status(tenant.admin.token)).toBe(200);
    await sql`UPDATE api_keys SET revoked_at = now() WHERE id = ${key.id}`.execute(t.db);
    expect(await status(key.token)).toBe(401);
    await sql`UPDATE user_sessions SET revoked_at = now() WHERE user_id = ${tenant.admin.id}`.execute(t.db);
    expect(await status(tenant.admin.token)).toBe(401);
  });

  it('a key that expires while cached is refused from its expiry on', async () => {
    const tenant = await seedTenant(t, 'Expiring');
    const key = await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.admin.id,
      keyType: 'secret',
      name: 'short',
      expiresAt: new Date(Date.now() + 1500),
    });
    expect(await status(key.token)).toBe(200);
    await new Promise((resolve) => setTimeout(resolve, 1600));
    expect(await status(key.token)).toBe(401);
  });
});

/** Two `serve` processes on one PostgreSQL database; the embedded database belongs to one process. */
describe.skipIf(!process.env.DATABASE_URL)('two server processes on one PostgreSQL', () => {
  let t: TestApp;
  const children: ChildProcess[] = [];
  const ports: number[] = [];

  async function serve(port: number): Promise<void> {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      DATABASE_URL: t.config.databaseUrl,
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      CREDENTIAL_CACHE_MS: '60000',
      RATE_LIMIT_PER_MINUTE: '100000',
      AGENT_RUNTIME: 'false',
    };
    delete env.REDIS_URL;
    const child = spawn(process.execPath, ['--import', 'tsx', path.resolve('src/cli/main.ts'), 'serve'], {
      env,
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    children.push(child);
    let stderr = '';
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`serve exited: ${stderr}`);
      const up = await fetch(`http://127.0.0.1:${port}/healthz`).then(
        (r) => r.ok,
        () => false,
      );
      if (up) return;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error(`serve did not start: ${stderr}`);
  }

  async function status(port: number, token: string): Promise<number> {
    const response = await fetch(`http://127.0.0.1:${port}/api/conversations`, { headers: { authorization: `Bearer ${token}` } });
    expectJsonApi(await response.json());
    return response.status;
  }

  beforeAll(async () => {
    t = await startTestApp();
    ports.push(await freePort(), await freePort());
    await Promise.all(ports.map(serve));
  }, 120_000);
  afterAll(async () => {
    for (const child of children) child.kill('SIGTERM');
    await Promise.all(
      children.map((child) => (child.exitCode === null ? new Promise((resolve) => child.once('exit', resolve)) : undefined)),
    );
    await t?.close();
  });

  it('a key revoked by another process is refused by both servers on the very next request', async () => {
    const tenant = await seedTenant(t, 'Processes');
    const key = await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.admin.id,
      keyType: 'secret',
      name: 'shared',
    });
    for (const port of ports) {
      expect(await status(port, key.token)).toBe(200);
      expect(await status(port, key.token)).toBe(200);
    }
    await revokeApiKey(t.db, t.services.records!, key.id);
    for (const port of ports) expect(await status(port, key.token)).toBe(401);
  });

  it('no request that starts after a revocation committed is served with the old key, in many trials', async () => {
    // The third review: about 2% of first requests after the revoke's answer were still served by the other
    // process, whose notification had not arrived yet. The revocation comes from a third connection here, so
    // that neither server hears of it first.
    const tenant = await seedTenant(t, 'Race');
    const other = new pg.Client({ connectionString: t.config.databaseUrl });
    await other.connect();
    let served = 0;
    const trials = 150;
    try {
      for (let trial = 0; trial < trials; trial += 1) {
        const key = await createApiKey(t.services.records!, {
          organisationId: tenant.organisationId,
          userId: tenant.admin.id,
          keyType: 'secret',
          name: `race ${trial}`,
        });
        for (const port of ports) for (let i = 0; i < 2; i += 1) expect(await status(port, key.token)).toBe(200);
        await other.query('UPDATE api_keys SET revoked_at = now() WHERE id = $1', [key.id]);
        const answers = await Promise.all(ports.map((port) => status(port, key.token)));
        served += answers.filter((answer) => answer !== 401).length;
      }
    } finally {
      await other.end();
    }
    console.log(`revocation race: ${served} of ${trials * ports.length} first requests after the commit served`);
    expect(served).toBe(0);
  }, 120_000);

  it('a member removed and tokens revoked from another connection are refused by both servers at once', async () => {
    const tenant = await seedTenant(t, 'Processes 2');
    for (const port of ports) expect(await status(port, tenant.owner.token)).toBe(200);
    for (const port of ports) expect(await status(port, tenant.operator.token)).toBe(200);
    const other = new pg.Client({ connectionString: t.config.databaseUrl });
    await other.connect();
    try {
      await other.query('UPDATE user_sessions SET revoked_at = now() WHERE user_id = $1', [tenant.owner.id]);
      for (const port of ports) expect(await status(port, tenant.owner.token)).toBe(401);
      await other.query('BEGIN');
      await other.query('DELETE FROM api_keys WHERE user_id = $1', [tenant.operator.id]);
      await other.query('DELETE FROM memberships WHERE user_id = $1', [tenant.operator.id]);
      await other.query('COMMIT');
      for (const port of ports) expect(await status(port, tenant.operator.token)).toBe(401);
    } finally {
      await other.end();
    }
  });
});
