import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase } from '../src/db/connection.js';
import { startTestApp, type TestApp } from './support/app.js';

/** LISTEN/NOTIFY through the database handle: on PostgreSQL (a dedicated connection) and on PGlite (in process). */
describe('database notifications', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(async () => t?.close());

  function next(channel: string): Promise<{ payload: string; stop: () => Promise<void> }> {
    return new Promise((resolve, reject) => {
      let stop: () => Promise<void> = async () => {};
      const timer = setTimeout(() => reject(new Error(`no notification on ${channel}`)), 5000);
      t.database
        .listen(channel, (payload) => {
          clearTimeout(timer);
          resolve({ payload, stop });
        })
        .then((unsubscribe) => {
          stop = unsubscribe;
          return sql`SELECT pg_notify(${channel}, 'hello')`.execute(t.db);
        })
        .catch(reject);
    });
  }

  it('delivers a payload sent with pg_notify to the subscriber of that channel only', async () => {
    const seen: string[] = [];
    const other = await t.database.listen('parley_test_other', (payload) => seen.push(payload));
    const { payload, stop } = await next('parley_test_one');
    expect(payload).toBe('hello');
    await stop();
    await other();
    expect(seen).toEqual([]);
  });

  it('delivers a notification only when its transaction commits', async () => {
    const seen: string[] = [];
    const stop = await t.database.listen('parley_test_tx', (payload) => seen.push(payload));
    await t.db
      .transaction()
      .execute(async (trx) => {
        await sql`SELECT pg_notify('parley_test_tx', 'rolled back')`.execute(trx);
        throw new Error('roll back');
      })
      .catch(() => {});
    await sql`SELECT pg_notify('parley_test_tx', 'committed')`.execute(t.db);
    await expect.poll(() => seen, { timeout: 5000 }).toEqual(['committed']);
    await stop();
  });

  it('keeps no listening connection when the database closes while that connection is being opened', async (ctx) => {
    if (t.database.kind !== 'postgres') return ctx.skip();
    // A handle of its own, closed while its first LISTEN connection is still connecting: the connection used
    // to be kept after the close (and LISTEN sent on it), holding the process open.
    const other = await openDatabase(t.config);
    const listening = other.listen('parley_test_closing', () => {});
    await other.close();
    // Not unsubscribed: its UNLISTEN would go on the connection this test looks for.
    await listening.catch(() => {});
    await new Promise((resolve) => setTimeout(resolve, 300));
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%LISTEN parley_test_closing'`.execute(
      t.db,
    );
    expect(rows[0].n).toBe(0);
  });

  it('refuses a channel name that is not a plain identifier', async () => {
    await expect(t.database.listen('bad; DROP TABLE x', () => {})).rejects.toThrow(/channel/);
  });
});
