/**
 * Database fault: a private PostgreSQL cluster is stopped during a write load
 * and started again. Parley must answer 503 quickly while it is gone, recover
 * by itself, keep every acknowledged write and none of the rejected ones.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import { createUserInOrganisation, createOrganisation } from '../src/auth/accounts.js';
import { createApiKey } from '../src/auth/api-keys.js';
import { createServices } from '../src/app.js';
import { loadConfig } from '../src/config/index.js';
import { openDatabase, type DatabaseHandle } from '../src/db/connection.js';
import { migrate } from '../src/db/migrate.js';
import { buildServer } from '../src/http/server.js';
import { PrivatePostgres, privatePostgresAvailable } from './support/private-postgres.js';

const TIMEOUT_MS = 1000;
const enabled = privatePostgresAvailable() && process.env.DATABASE_URL !== undefined;

interface Attempt {
  seq: number;
  status: number;
  /** A 503 raised while committing: the write may or may not be stored. */
  unknown?: boolean;
  startedAt: number;
  ms: number;
}

describe.runIf(enabled)('PostgreSQL goes away and comes back', () => {
  let cluster: PrivatePostgres;
  let database: DatabaseHandle;
  let app: FastifyInstance;
  let token: string;

  beforeAll(async () => {
    cluster = new PrivatePostgres(55000 + Math.floor(Math.random() * 5000)).init();
    cluster.start();
    const config = loadConfig({
      DATABASE_URL: cluster.url,
      DATABASE_TIMEOUT_MS: String(TIMEOUT_MS),
      LOG_LEVEL: 'silent',
      RATE_LIMIT_PER_MINUTE: '1000000',
    } as NodeJS.ProcessEnv);
    database = await openDatabase(config);
    await migrate(database.db);
    const services = await createServices(database, config);
    const organisation = await createOrganisation(services.records!, { name: 'Fault' });
    const user = await createUserInOrganisation(services.records!, {
      organisationId: organisation.id,
      email: 'fault@example.com',
      password: 'fault-password',
      fullName: 'Fault Owner',
      role: 'owner',
    });
    token = (await createApiKey(services.records!, { organisationId: organisation.id, userId: user.id, keyType: 'secret', name: 'load' }))
      .token;
    app = await buildServer({ ...services, database });
    await app.ready();
  }, 120_000);

  afterAll(async () => {
    await app?.close();
    await database?.close();
    cluster?.destroy();
  });

  it('answers 503 within the timeout, recovers, and loses no acknowledged write', async () => {
    const attempts: Attempt[] = [];
    let seq = 0;
    let running = true;
    const t0 = Date.now();

    async function worker() {
      while (running) {
        const n = seq++;
        const startedAt = Date.now();
        const response = await app.inject({
          method: 'POST',
          url: '/api/conversations',
          headers: { authorization: `Bearer ${token}`, 'content-type': 'application/vnd.api+json' },
          payload: { data: { type: 'Conversation', attributes: { metadata: { seq: n } } } },
        });
        const error = response.statusCode === 503 ? JSON.parse(response.body).errors[0] : undefined;
        attempts.push({
          seq: n,
          status: response.statusCode,
          startedAt: startedAt - t0,
          ms: Date.now() - startedAt,
          unknown: error?.meta?.outcome === 'unknown',
        });
        if (error) {
          expect(error.code).toBe('unavailable');
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    }

    const workers = Array.from({ length: 4 }, worker);
    await new Promise((r) => setTimeout(r, 1500));
    const stoppedAt = Date.now() - t0;
    cluster.stop('fast');
    await new Promise((r) => setTimeout(r, 2000));
    const restartedAt = Date.now() - t0;
    cluster.start();
    await new Promise((r) => setTimeout(r, 2500));
    running = false;
    await Promise.all(workers);

    const acknowledged = attempts.filter((a) => a.status === 201);
    const unavailable = attempts.filter((a) => a.status === 503);
    const other = attempts.filter((a) => a.status !== 201 && a.status !== 503);
    expect(other).toEqual([]);
    expect(unavailable.length).toBeGreaterThan(0);
    const slowest503 = Math.max(...unavailable.map((a) => a.ms));
    expect(slowest503).toBeLessThan(TIMEOUT_MS * 3);
    const firstSuccessAfter = acknowledged.filter((a) => a.startedAt >= restartedAt).map((a) => a.startedAt + a.ms);
    expect(firstSuccessAfter.length).toBeGreaterThan(0);
    const recoveredMs = Math.min(...firstSuccessAfter) - restartedAt;

    const { rows } = await sql<{ seq: string }>`SELECT metadata->>'seq' AS seq FROM conversations`.execute(database.db);
    const stored = new Set(rows.map((r) => Number(r.seq)));
    const lost = acknowledged.filter((a) => !stored.has(a.seq));
    const rejected = unavailable.filter((a) => !a.unknown);
    const phantom = rejected.filter((a) => stored.has(a.seq));
    const unknown = unavailable.filter((a) => a.unknown);
    console.log(
      `fault: stopped at ${stoppedAt} ms, restarted at ${restartedAt} ms; ${attempts.length} writes, ` +
        `${acknowledged.length} acknowledged, ${unavailable.length} answered 503 (slowest ${slowest503} ms), ` +
        `lost ${lost.length}, rejected but stored ${phantom.length}, ${unknown.length} with unknown outcome ` +
        `(${unknown.filter((a) => stored.has(a.seq)).length} stored), recovered ${recoveredMs} ms after restart`,
    );
    expect(lost).toEqual([]);
    expect(phantom).toEqual([]);
  }, 60_000);
});
