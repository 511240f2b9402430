/**
 * The call event queue (`sip_call_events`) as Kamailio fills it, consumed by `CallEventQueue`: order per call,
 * exactly once in effect, bad rows kept out with their reason, and reconciliation that leaves calls with a
 * dialog (or with events still queued) alone. Runs on PGlite and PostgreSQL, without Kamailio: rows are
 * inserted as Kamailio's route[EVENTQUEUE] writes them (MD5 of the Call-ID, the JSON body in base64).
 */
import { createHash, randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CallEvents, parseCallEvent, type CallEventName } from '../src/sip/call-events.js';
import { CallEventQueue } from '../src/sip/call-queue.js';
import { reconcileCalls } from '../src/sip/reconcile.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

describe('the SIP call event queue', () => {
  let t: TestApp;
  let tenant: Tenant;
  let events: CallEvents;
  let n = 0;

  beforeAll(async () => {
    t = await startTestApp();
    tenant = await seedTenant(t, 'Queue');
    events = new CallEvents({ db: t.db, records: t.services.records! });
  }, 60_000);
  afterAll(async () => {
    await t?.close();
  });

  const callKey = (callId: string) => createHash('md5').update(callId).digest('hex');

  function body(callId: string, event: CallEventName, at: number, code = 0) {
    return {
      event,
      call_id: callId,
      organisation_id: tenant.organisationId,
      direction: 'outbound',
      source: 'sip',
      caller_sip_user_id: '',
      callee_sip_user_id: '',
      from: 'alice',
      to: 'bob',
      code,
      at: (at / 1000).toFixed(6),
    };
  }

  /** Queues rows as Kamailio does: one INSERT per batch, in the order given. */
  async function enqueue(rows: { callId: string; body: unknown }[]) {
    for (const row of rows) {
      const encoded = Buffer.from(typeof row.body === 'string' ? row.body : JSON.stringify(row.body)).toString('base64');
      await sql`INSERT INTO sip_call_events (call_key, body) VALUES (${callKey(row.callId)}, ${encoded})`.execute(t.db);
    }
  }

  /** The four events of an answered call, `talkMs` of talk, in the order Kamailio raised them (or `order`). */
  function answeredCall(
    callId: string,
    start: number,
    talkMs: number,
    order: CallEventName[] = ['initiated', 'ringing', 'answered', 'ended'],
  ) {
    const at: Record<string, number> = { initiated: start, ringing: start + 100, answered: start + 300, ended: start + 300 + talkMs };
    return order.map((event) => ({
      callId,
      body: body(callId, event, at[event], event === 'answered' ? 200 : event === 'ringing' ? 180 : 0),
    }));
  }

  async function call(callId: string) {
    return t.db
      .selectFrom('calls')
      .selectAll()
      .where('organisation_id', '=', tenant.organisationId)
      .where('call_uuid', '=', callId)
      .executeTakeFirst();
  }

  const newId = () => `q${Date.now().toString(36)}-${n++}@test`;

  it('applies the events of a call in the order queued and deletes them', async () => {
    const id = newId();
    await enqueue(answeredCall(id, Date.now() - 10_000, 5_430));
    const queue = new CallEventQueue({ db: t.db, events });
    expect(await queue.drain()).toBe(4);
    const record = await call(id);
    expect(record?.status).toBe('completed');
    expect(record?.duration_seconds).toBeGreaterThanOrEqual(5);
    expect(await queue.waiting()).toBe(0);
    const left = await sql<{ n: number }>`SELECT count(*)::int AS n FROM sip_call_events`.execute(t.db);
    expect(left.rows[0].n).toBe(0);
  });

  it('a 180 raised after the 200 (relayed late) leaves the call to end completed, not stuck in progress', async () => {
    const id = newId();
    await enqueue(answeredCall(id, Date.now() - 10_000, 2_000, ['initiated', 'answered', 'ringing', 'ended']));
    await new CallEventQueue({ db: t.db, events }).drain();
    expect((await call(id))?.status).toBe('completed');
  });

  it('keeps one call in order across consumers claiming one row at a time, many calls at once', async () => {
    const ids = Array.from({ length: 12 }, newId);
    const start = Date.now() - 20_000;
    // Each call's events one after the other: free consumers would take a call's next event while another
    // still applies the one before.
    const rows = ids.flatMap((id) => answeredCall(id, start, 3_000));
    await enqueue(rows);
    // Each with its own CallEvents, as separate processes would have.
    const consumers = [1, 2, 3].map(
      () =>
        new CallEventQueue({ db: t.db, events: new CallEvents({ db: t.db, records: t.services.records! }), batchSize: 1, concurrency: 1 }),
    );
    // A drain ends when it finds nothing it may claim (another consumer holds each call's next event).
    let applied = 0;
    for (let round = 0; round < 50 && (await consumers[0].waiting()) > 0; round++) {
      applied += (await Promise.all(consumers.map((c) => c.drain()))).reduce((a, b) => a + b, 0);
    }
    expect(applied).toBe(rows.length);
    // Applied out of order, an `ended` before its call's `answered` ends it `failed` with no talk time.
    for (const id of ids) {
      const record = await call(id);
      expect(record?.status, id).toBe('completed');
      expect(record?.duration_seconds, id).toBeGreaterThanOrEqual(3);
    }
  });

  it('applies a row twice (a consumer died before deleting it) without a second effect', async () => {
    const id = newId();
    const rows = answeredCall(id, Date.now() - 10_000, 1_000);
    await enqueue(rows);
    await new CallEventQueue({ db: t.db, events }).drain();
    const first = await call(id);
    await enqueue(rows);
    await new CallEventQueue({ db: t.db, events }).drain();
    const again = await call(id);
    expect(again?.status).toBe('completed');
    expect(again?.updated_at).toEqual(first?.updated_at);
    const legs = await t.db.selectFrom('call_participants').select('id').where('call_id', '=', first!.id).execute();
    expect(legs).toHaveLength(2);
  });

  it('keeps a row that is not an event out of the queue with its reason, and applies the rest', async () => {
    const id = newId();
    const broken = newId();
    await enqueue([
      { callId: broken, body: 'not json {' },
      { callId: broken, body: { ...body(broken, 'initiated', Date.now()), organisation_id: 'nope' } },
      ...answeredCall(id, Date.now() - 5_000, 1_000),
    ]);
    const queue = new CallEventQueue({ db: t.db, events });
    expect(await queue.drain()).toBe(4);
    expect((await call(id))?.status).toBe('completed');
    expect(await queue.waiting()).toBe(0);
    const kept = await sql<{ error: string }>`SELECT error FROM sip_call_events WHERE error IS NOT NULL ORDER BY id`.execute(t.db);
    expect(kept.rows.map((r) => r.error)).toEqual(['the body is not base64-encoded JSON', 'organisation_id must be a UUID']);
    await sql`DELETE FROM sip_call_events`.execute(t.db);
  });

  it('holds a call whose event cannot be applied for now, and applies it in order later', async () => {
    const id = newId();
    await enqueue(answeredCall(id, Date.now() - 5_000, 1_000));
    let failing = true;
    const lost = () => Promise.reject(Object.assign(new Error('connection lost'), { status: 503 }));
    const flaky = {
      apply: (event: Parameters<CallEvents['apply']>[0]) => (failing && event.event === 'answered' ? lost() : events.apply(event)),
      // The call's events together fail as one transaction would; then one by one, up to the failing one.
      applyAll: (list: Parameters<CallEvents['applyAll']>[0]) =>
        failing && list.some((e) => e.event === 'answered') ? lost() : events.applyAll(list),
      applyMany: (groups: Parameters<CallEvents['applyMany']>[0]) =>
        failing && groups.flat().some((e) => e.event === 'answered') ? lost() : events.applyMany(groups),
      // The usual path fails inside its transaction, after the claim deleted the rows: the rollback must bring them back.
      applyClaimed: (claim: Parameters<CallEvents['applyClaimed']>[0]) =>
        events.applyClaimed(async (trx) => {
          const groups = await claim(trx);
          if (failing && groups.flat().some((e) => e.event === 'answered')) await lost();
          return groups;
        }),
    } as CallEvents;
    const queue = new CallEventQueue({ db: t.db, events: flaky });
    expect(await queue.drain()).toBe(2);
    expect((await call(id))?.status).toBe('ringing');
    // The failed row waits out its delay (about a second), and the call's later rows wait for it.
    expect(await queue.drain()).toBe(0);
    failing = false;
    await sql`UPDATE sip_call_events SET lease_until = now() - interval '1 second'`.execute(t.db);
    expect(await queue.drain()).toBe(2);
    expect((await call(id))?.status).toBe('completed');
  });

  it('wakes on NOTIFY when given a listener', async () => {
    const id = newId();
    const queue = new CallEventQueue({
      db: t.db,
      events,
      pollMs: 600_000,
      listen: (channel, onNotify, onResumed) => t.database.listen(channel, onNotify, onResumed),
    });
    await queue.start();
    try {
      await enqueue(answeredCall(id, Date.now() - 5_000, 1_000));
      const deadline = Date.now() + 10_000;
      while ((await call(id))?.status !== 'completed' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect((await call(id))?.status).toBe('completed');
    } finally {
      await queue.stop();
    }
  });

  describe('transfers (REFER)', () => {
    /** A call alice -> bob that bob transferred (his dialog ended after the REFER), then the transferee's leg to carol. */
    function transferred(id: string, start: number, leg: CallEventName[], code = 0) {
      const first = answeredCall(id, start, 2_000).map((row) =>
        row.body.event === 'ended' ? { ...row, body: { ...row.body, transferor: 'callee' } } : row,
      );
      const at: Record<string, number> = { initiated: start + 2_400, answered: start + 3_000, failed: start + 3_000, ended: start + 6_000 };
      const second = leg.map((event) => ({
        callId: id,
        body: { ...body(id, event, at[event], event === 'failed' ? code : event === 'answered' ? 200 : 0), to: 'carol', leg: `leg-${id}` },
      }));
      return [...first, ...second];
    }

    async function legs(id: string) {
      const record = await call(id);
      return t.db
        .selectFrom('call_participants')
        .select(['member_uuid', 'role', 'joined_at', 'left_at'])
        .where('call_id', '=', record!.id)
        .orderBy('joined_at')
        .orderBy('id')
        .execute();
    }

    it("an attended transfer: the consultation call, replaced by the transferee's call to the target, ends as transferred", async () => {
      const id = newId();
      const rows = answeredCall(id, Date.now() - 10_000, 2_000).map((row) =>
        row.body.event === 'ended' ? { ...row, body: { ...row.body, replaced_by: `x-${id}` } } : row,
      );
      await enqueue(rows);
      expect(await new CallEventQueue({ db: t.db, events }).drain()).toBe(4);
      expect(await call(id)).toMatchObject({ status: 'completed', end_reason: 'transferred', duration_seconds: 2 });
      // Only an end may say it was replaced.
      expect(parseCallEvent({ ...body(id, 'answered', Date.now(), 200), replaced_by: 'x' }).problems).toEqual([
        'replaced_by is for ended events only',
      ]);
    });

    it('one Call: the transferor leaves, the target joins, the call ends with the leg to the target', async () => {
      const id = newId();
      // Applied both as a backlog (together) and one by one: the same records.
      for (const together of [true, false]) {
        const callId = `${id}-${together}`;
        const rows = transferred(callId, Date.now() - 20_000, ['initiated', 'answered', 'ended']);
        if (together) {
          await enqueue(rows);
          await new CallEventQueue({ db: t.db, events }).drain();
        } else {
          for (const row of rows) {
            await enqueue([row]);
            await new CallEventQueue({ db: t.db, events }).drain();
          }
        }
        const record = await call(callId);
        expect(record?.status).toBe('completed');
        // From bob's answer to the end of the leg with carol.
        expect(record?.duration_seconds).toBe(6);
        const all = await legs(callId);
        expect(all.map((l) => [l.member_uuid, l.role])).toEqual([
          ['sip:alice', 'caller'],
          ['sip:bob', 'callee'],
          ['sip:carol', 'callee'],
        ]);
        // Kept to the second: the transferor left no later than the target joined.
        expect(all[1].left_at!.getTime()).toBeLessThanOrEqual(all[2].joined_at.getTime());
        expect(all.every((l) => l.left_at !== null)).toBe(true);
        expect(await t.db.selectFrom('calls').select('id').where('call_uuid', '=', `leg-${callId}`).execute()).toEqual([]);
      }
    });

    it('a transfer that fails once the transferor has left ends the call, saying why', async () => {
      const id = newId();
      await enqueue(transferred(id, Date.now() - 20_000, ['initiated', 'failed'], 486));
      await new CallEventQueue({ db: t.db, events }).drain();
      const record = await call(id);
      expect(record).toMatchObject({ status: 'completed', end_reason: 'transfer to carol failed (486)' });
      expect((await legs(id)).every((l) => l.left_at !== null)).toBe(true);
    });

    it('keeps out an event naming a transferor that is neither party', async () => {
      const id = newId();
      await enqueue([{ callId: id, body: { ...body(id, 'ended', Date.now()), transferor: 'someone' } }]);
      await new CallEventQueue({ db: t.db, events }).drain();
      const kept = await sql<{ error: string }>`SELECT error FROM sip_call_events WHERE error IS NOT NULL`.execute(t.db);
      expect(kept.rows.map((r) => r.error)).toEqual(['transferor must be caller or callee']);
      await sql`DELETE FROM sip_call_events`.execute(t.db);
    });
  });

  describe('reconciliation', () => {
    async function open(id: string, answered: boolean) {
      const rows = answeredCall(id, Date.now() - 60_000, 1_000).slice(0, answered ? 3 : 2);
      await enqueue(rows);
      await new CallEventQueue({ db: t.db, events }).drain();
    }
    const options = () => ({ answeredBefore: new Date(Date.now() + 1000), unansweredBefore: new Date(Date.now() + 1000) });

    it('ends calls without a dialog, leaves those with one and those with events still queued', async () => {
      const gone = newId();
      const talking = newId();
      const queued = newId();
      const ringing = newId();
      for (const id of [gone, talking, queued]) await open(id, true);
      await open(ringing, false);
      await sql`INSERT INTO sip_dialogs (hash_entry, hash_id, callid, from_uri, from_tag, to_uri, to_tag, caller_cseq, callee_cseq,
        caller_contact, callee_contact, caller_sock, callee_sock, state, start_time, req_uri)
        VALUES (1, 1, ${talking}, 'sip:a@x', 'f', 'sip:b@x', 't', '1', '1', 'sip:a@h', 'sip:b@h', 'udp:127.0.0.1:5060', 'udp:127.0.0.1:5060', 4, 0, 'sip:b@x')`.execute(
        t.db,
      );
      await enqueue([{ callId: queued, body: body(queued, 'ended', Date.now() - 1000) }]);
      expect(await reconcileCalls(t.db, events, options())).toBe(2);
      expect((await call(gone))?.status).toBe('completed');
      expect((await call(ringing))?.status).toBe('failed');
      expect((await call(talking))?.status).toBe('in_progress');
      expect((await call(queued))?.status).toBe('in_progress');
      await new CallEventQueue({ db: t.db, events }).drain();
      expect((await call(queued))?.status).toBe('completed');
      await sql`DELETE FROM sip_dialogs`.execute(t.db);
    });

    it('pages through many open calls', async () => {
      const ids = Array.from({ length: 7 }, newId);
      for (const id of ids) await open(id, true);
      expect(await reconcileCalls(t.db, events, { ...options(), pageSize: 2 })).toBeGreaterThanOrEqual(7);
      for (const id of ids) expect((await call(id))?.status).toBe('completed');
    });
  });

  it('stores what Kamailio writes: an organisation that does not exist is a kept-out row, not a crash', async () => {
    const id = newId();
    await enqueue([{ callId: id, body: { ...body(id, 'initiated', Date.now()), organisation_id: randomUUID() } }]);
    const queue = new CallEventQueue({ db: t.db, events });
    await queue.drain();
    const rows = await sql<{ error: string | null }>`SELECT error FROM sip_call_events`.execute(t.db);
    expect(rows.rows).toHaveLength(1);
    expect(rows.rows[0].error).not.toBeNull();
    await sql`DELETE FROM sip_call_events`.execute(t.db);
  });
});
