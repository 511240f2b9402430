/**
 * What applying a call's events costs the database: every statement the consumer runs for a call (claim,
 * reads, the records service's writes, BEGIN/COMMIT, delete), counted at the PostgreSQL client. Counted only
 * inside the work measured (AsyncLocalStorage), so the app's own background work does not add to it. The figure
 * is in docs/sip.md; the bound here fails if a change adds statements per call again. PostgreSQL only: the count
 * is taken at node-postgres' client (PGlite runs the same statements, through another driver).
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { createHash } from 'node:crypto';
import pg from 'pg';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CallEvents, type CallEventName } from '../src/sip/call-events.js';
import { CallEventQueue } from '../src/sip/call-queue.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

const postgres = process.env.DATABASE_URL?.startsWith('postgres');

describe.skipIf(!postgres)('statements per call (PostgreSQL)', () => {
  let t: TestApp;
  let tenant: Tenant;
  let n = 0;
  const measuring = new AsyncLocalStorage<{ count: number; texts: string[] }>();
  const original = pg.Client.prototype.query;

  beforeAll(async () => {
    t = await startTestApp();
    tenant = await seedTenant(t, 'Statements');
    pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
      const store = measuring.getStore();
      if (store) {
        store.count++;
        const first = args[0] as string | { text?: string };
        store.texts.push((typeof first === 'string' ? first : (first?.text ?? '')).slice(0, 80));
      }
      return (original as (...a: unknown[]) => unknown).apply(this, args);
    } as typeof pg.Client.prototype.query;
  }, 60_000);
  afterAll(async () => {
    pg.Client.prototype.query = original;
    await t?.close();
  });

  async function count(work: () => Promise<unknown>) {
    const store = { count: 0, texts: [] as string[] };
    await measuring.run(store, work);
    return store;
  }

  function rows(callId: string, start: number) {
    const at: Record<string, number> = { initiated: start, ringing: start + 100, answered: start + 300, ended: start + 3_300 };
    return (['initiated', 'ringing', 'answered', 'ended'] as CallEventName[]).map((event) => ({
      key: createHash('md5').update(callId).digest('hex'),
      body: Buffer.from(
        JSON.stringify({
          event,
          call_id: callId,
          organisation_id: tenant.organisationId,
          direction: 'outbound',
          source: 'sip',
          caller_sip_user_id: '',
          callee_sip_user_id: '',
          from: 'alice',
          to: 'bob',
          code: event === 'answered' ? 200 : event === 'ringing' ? 180 : 0,
          at: (at[event] / 1000).toFixed(6),
        }),
      ).toString('base64'),
    }));
  }

  /**
   * `calls` answered calls (initiated, ringing, answered, ended) consumed; statements per call. `queued`: all
   * queued, then one drain (a backlog); `interleaved`: every call's first event, a drain, every call's second,
   * a drain... (a consumer keeping up with many calls at once); else one event and one drain at a time.
   */
  async function perCall(calls: number, queued: boolean | 'interleaved') {
    const events = new CallEvents({ db: t.db, records: t.services.records! });
    const queue = new CallEventQueue({ db: t.db, events });
    const ids = Array.from({ length: calls }, () => `s${Date.now().toString(36)}-${n++}@test`);
    const all = ids.flatMap((id) => rows(id, Date.now() - 10_000));
    if (queued) {
      for (const row of all) await sql`INSERT INTO sip_call_events (call_key, body) VALUES (${row.key}, ${row.body})`.execute(t.db);
    }
    const measured =
      queued === 'interleaved'
        ? await count(async () => {
            for (let step = 0; step < 4; step++) {
              const round = ids.map((_, i) => all[i * 4 + step]);
              await sql`INSERT INTO sip_call_events (call_key, body) SELECT * FROM unnest(${round.map((r) => r.key)}::text[], ${round.map((r) => r.body)}::text[])`.execute(
                t.db,
              );
              await queue.drain();
            }
          })
        : queued
          ? await count(() => queue.drain())
          : await count(async () => {
              // One event at a time, as they arrive when the consumer keeps up (each its own claim).
              for (const row of all) {
                await sql`INSERT INTO sip_call_events (call_key, body) VALUES (${row.key}, ${row.body})`.execute(t.db);
                await queue.drain();
              }
            });
    const done = await t.db.selectFrom('calls').select('status').where('call_uuid', 'in', ids).execute();
    expect(done.map((c) => c.status)).toEqual(ids.map(() => 'completed'));
    // The inserts standing for Kamailio's are not the consumer's.
    if (process.env.SHOW_STATEMENTS) console.info(measured.texts.join('\n'));
    const inserts = queued === 'interleaved' ? 4 : queued ? 0 : all.length;
    return (measured.count - inserts) / calls;
  }

  it('an answered call whose four events were queued together (a backlog)', async () => {
    const perCallBacklog = await perCall(20, true);
    console.info(`statements per call, 20 calls queued together: ${perCallBacklog}`);
    // 44.2 when each event was its own read and transactions; 11.75 with a call's events applied together; 7.35
    // with the calls of a drain read at once and written in one transaction; 4.35 since a reference to a record the
    // system created in the same transaction (the Call's new Conversation, a leg's new Call) is not read again;
    // 0.45 since a drain writes each kind of record of all its calls as one statement (records.createMany).
    expect(perCallBacklog).toBeLessThanOrEqual(1);
  });

  it('many calls whose events arrive together, one event of each call per drain (a consumer keeping up at a high call rate)', async () => {
    const perCallInterleaved = await perCall(20, 'interleaved');
    console.info(`statements per call, 20 calls, one event of each per drain: ${perCallInterleaved}`);
    // Each call's event was its own read and transaction (about 53 per call); now a drain reads the calls and their
    // SIP users once and writes them in one transaction, so what is left per call is the records service's writes
    // (7.8; 4.8 since references to records created in the same transaction are not read again; 1.05 since each
    // kind of write of a drain's calls is one statement: conversations, calls and legs created, calls and legs updated).
    expect(perCallInterleaved).toBeLessThanOrEqual(1.5);
  });

  it('an answered call whose events arrive one by one (a consumer keeping up)', async () => {
    const perCallSteady = await perCall(3, false);
    console.info(`statements per call, events one by one: ${perCallSteady}`);
    // 55, then 53: each event is its own claim, read and transaction here. 43 since an update returns the row as
    // read (no read back) and a system update of a record no hook checks (Call, Conversation) takes no locking read
    // first: four such updates per call, two statements fewer each, and two legs' updates, one fewer each. 41 since
    // the legs created with their Call name it without a read; 36 with the claim in the records' transaction; 35 since a
    // call's legs are created, and updated, in one statement.
    expect(perCallSteady).toBeLessThanOrEqual(36);
  });
});
