/**
 * A slow database answers 503 `unavailable` within a bounded time instead of
 * hanging: every statement and every connection acquisition is bounded by
 * DATABASE_TIMEOUT_MS. PostgreSQL only (the embedded database has no
 * concurrent sessions to hold a lock or a pool to exhaust).
 */
import type { InjectOptions } from 'fastify';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { client, resourceDocument } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { expectJsonApi } from './support/conformance.js';
import { seedTenant, type Tenant } from './support/seed.js';

const TIMEOUT_MS = 500;
/** A refused request must be answered within this bound (the timeout plus generous slack for a busy machine). */
const BOUND_MS = 2000;

interface Timed {
  status: number;
  ms: number;
  headers: Record<string, unknown>;
  body: any;
}

/** One request through the whole server, timed; the body is parsed and must be a JSON:API document. */
async function timed(t: TestApp, options: InjectOptions): Promise<Timed> {
  const started = performance.now();
  const response = await t.app.inject(options);
  const ms = Math.round(performance.now() - started);
  const body = response.body ? JSON.parse(response.body) : undefined;
  if (body !== undefined) expectJsonApi(body);
  return { status: response.statusCode, ms, headers: response.headers, body };
}

/** Asserts a 503 `unavailable` JSON:API error answered within the bound. */
function expectUnavailable(response: Timed, what: string): void {
  const detail = `${what}: ${response.status} after ${response.ms} ms: ${JSON.stringify(response.body)}`;
  expect(response.status, detail).toBe(503);
  expect(response.headers['content-type'], detail).toContain('application/vnd.api+json');
  expect(
    response.body?.errors?.map((e: { code: string }) => e.code),
    detail,
  ).toEqual(['unavailable']);
  expect(response.body.errors[0].status, detail).toBe('503');
  expect(response.headers['retry-after'], detail).toBe('1');
  expect(response.ms, detail).toBeLessThan(BOUND_MS);
}

/** A deferred promise: `release()` resolves it. */
function gate(): { wait: Promise<void>; release(): void } {
  let release!: () => void;
  const wait = new Promise<void>((resolve) => (release = resolve));
  return { wait, release };
}

describe.runIf(process.env.DATABASE_URL !== undefined)('a slow database answers 503 within a bounded time', () => {
  let t: TestApp;
  let tenant: Tenant;
  let conversationId: string;
  let publicId: string;
  const lockers: pg.Client[] = [];

  const patch = (status: string) =>
    timed(t, {
      method: 'PATCH',
      url: `/api/conversations/${conversationId}`,
      headers: { authorization: `Bearer ${tenant.owner.token}`, 'content-type': 'application/vnd.api+json' },
      payload: JSON.stringify(resourceDocument('Conversation', { status }, conversationId)),
    });
  /** The conversation as the API lists it (there is no single-record GET for conversations). */
  const show = async () => {
    const response = await timed(t, {
      method: 'GET',
      url: `/api/conversations?filter[public_id]=${publicId}`,
      headers: { authorization: `Bearer ${tenant.owner.token}` },
    });
    if (response.status === 200) {
      expect(response.body.data).toHaveLength(1);
      expect(response.body.data[0].id).toBe(conversationId);
      response.body.data = response.body.data[0];
    }
    return response;
  };
  /** The stored status, read directly from the database. */
  const storedStatus = async () => {
    const reader = new pg.Client({ connectionString: t.config.databaseUrl });
    await reader.connect();
    try {
      return (await reader.query('SELECT status FROM conversations WHERE id = $1', [conversationId])).rows[0]?.status;
    } finally {
      await reader.end();
    }
  };

  /** A separate session on the same database that holds a row lock on the conversation until rolled back. */
  async function lockConversation(): Promise<pg.Client> {
    const locker = new pg.Client({ connectionString: t.config.databaseUrl });
    lockers.push(locker);
    await locker.connect();
    await locker.query('BEGIN');
    const { rows } = await locker.query('SELECT id, status FROM conversations WHERE id = $1 FOR UPDATE', [conversationId]);
    expect(rows).toHaveLength(1);
    return locker;
  }

  beforeAll(async () => {
    t = await startTestApp({ DATABASE_TIMEOUT_MS: String(TIMEOUT_MS), DATABASE_POOL_SIZE: '2' });
    tenant = await seedTenant(t, 'Slow');
    const created = await client(t.app, tenant.owner.token).post(
      '/api/conversations',
      resourceDocument('Conversation', { channel: 'chat', metadata: { case: 'slow' } }),
    );
    expect(created.status).toBe(201);
    expect(created.body.data.attributes.status).toBe('active');
    conversationId = created.body.data.id;
    publicId = created.body.data.attributes.public_id;
  });

  afterAll(async () => {
    for (const locker of lockers) await locker.end().catch(() => {});
    await t?.close();
  });

  it('a statement blocked on a row lock answers 503 unavailable, changes nothing, and succeeds once the lock is gone', async () => {
    const locker = await lockConversation();
    try {
      const refused = await patch('closed');
      console.log(
        `slow database: PATCH on a locked row answered ${refused.status} in ${refused.ms} ms (DATABASE_TIMEOUT_MS=${TIMEOUT_MS})`,
      );
      expectUnavailable(refused, 'PATCH on a locked row');
      // It was the statement timeout that ended the wait, not a quick failure.
      expect(refused.ms).toBeGreaterThanOrEqual(TIMEOUT_MS - 50);
      // Reads do not wait for the row lock.
      const during = await show();
      expect(during.status).toBe(200);
      expect(during.body.data.attributes.status).toBe('active');
    } finally {
      await locker.query('ROLLBACK');
    }
    const unchanged = await show();
    expect(unchanged.status).toBe(200);
    expect(unchanged.body.data.attributes.status).toBe('active');
    expect(await storedStatus()).toBe('active');

    const accepted = await patch('closed');
    expect(accepted.status, JSON.stringify(accepted.body)).toBe(200);
    expect(accepted.body.data.attributes.status).toBe('closed');
    expect(accepted.ms).toBeLessThan(BOUND_MS);
    const after = await show();
    expect(after.body.data.attributes.status).toBe('closed');
  });

  it('with every pool connection taken, further requests answer 503 unavailable instead of waiting for one', async () => {
    // Take both connections of the server's own pool (DATABASE_POOL_SIZE=2) and keep them.
    const held = gate();
    let taken = 0;
    const allTaken = gate();
    const holders = [0, 1].map(() =>
      t.db.connection().execute(async () => {
        if (++taken === 2) allTaken.release();
        await held.wait;
      }),
    );
    await allTaken.wait;
    try {
      const [read, write, list] = await Promise.all([
        show(),
        patch('pending'),
        timed(t, { method: 'GET', url: '/api/conversations', headers: { authorization: `Bearer ${tenant.secretKey}` } }),
      ]);
      console.log(
        `slow database: with the pool exhausted, GET answered ${read.status} in ${read.ms} ms, PATCH ${write.status} in ${write.ms} ms, list ${list.status} in ${list.ms} ms`,
      );
      expectUnavailable(read, 'GET with the pool exhausted');
      expectUnavailable(write, 'PATCH with the pool exhausted');
      expectUnavailable(list, 'list with the pool exhausted');
      // The wait for a connection was bounded by the timeout, not refused at once.
      for (const response of [read, write, list]) expect(response.ms).toBeGreaterThanOrEqual(TIMEOUT_MS - 50);
    } finally {
      held.release();
      await Promise.all(holders);
    }
    // Nothing changed, and the server recovers as soon as connections are free.
    const recovered = await show();
    expect(recovered.status).toBe(200);
    expect(recovered.body.data.attributes.status).toBe('closed');
    expect(await storedStatus()).toBe('closed');
  });

  it('requests queued behind requests blocked on a lock all answer within the bound, then the server recovers', async () => {
    const locker = await lockConversation();
    let responses: Timed[];
    try {
      // Six writes on the locked row against a pool of two: some wait for the lock, the others for a connection.
      responses = await Promise.all(Array.from({ length: 6 }, () => patch('pending')));
    } finally {
      await locker.query('ROLLBACK');
    }
    console.log(
      `slow database: 6 concurrent PATCHes on a locked row (pool 2) answered ${responses.map((r) => `${r.status}/${r.ms}ms`).join(', ')}`,
    );
    for (const [i, response] of responses.entries()) expectUnavailable(response, `concurrent PATCH #${i}`);
    const unchanged = await show();
    expect(unchanged.status).toBe(200);
    expect(unchanged.body.data.attributes.status).toBe('closed');
    expect(await storedStatus()).toBe('closed');
    const accepted = await patch('pending');
    expect(accepted.status, JSON.stringify(accepted.body)).toBe(200);
    expect(accepted.body.data.attributes.status).toBe('pending');
  });
});
