/**
 * The records service's batch writes (`createMany`, `updateMany`: one statement per type and set of columns, the
 * SIP edge's calls of a queue drain) store and announce what the same writes one at a time do: the same rows, the
 * same rendered records, the same events in the same order per record. Runs on PGlite and PostgreSQL.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { systemActor } from '../src/jsonapi/actor.js';
import type { Row } from '../src/jsonapi/serialize.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

describe('records service batch writes', () => {
  let t: TestApp;
  let tenant: Tenant;

  beforeAll(async () => {
    t = await startTestApp();
    tenant = await seedTenant(t, 'Batch');
  }, 60_000);
  afterAll(async () => {
    await t?.close();
  });

  const conversation = (i: number) => ({ channel: 'voice', mode: 'voice', status: 'active', metadata: { sip: { call_id: `c${i}` } } });
  const call = (i: number, conversationId: string, tag: string) => ({
    direction: 'outbound',
    from_number: 'alice',
    to_number: i % 2 ? 'bob' : null,
    status: i % 2 ? 'ringing' : 'initiated',
    call_uuid: `${tag}-${i}@test`,
    call_source: 'sip',
    started_at: new Date(1_800_000_000_000 + i),
    conversation_id: conversationId,
  });
  const leg = (callId: string, i: number) => ({
    call_id: callId,
    member_uuid: `sip:m${i}`,
    role: 'caller',
    joined_at: new Date(1_800_000_000_000 + i),
  });
  const updates = (i: number) =>
    i % 2
      ? { status: 'in_progress', answered_at: new Date(1_800_000_001_000 + i) }
      : { status: 'completed', ended_at: new Date(1_800_000_002_000), duration_seconds: 2 };

  /** What a record or event holds apart from what differs between two writes of it (ids, times written, links). */
  const comparable = (value: unknown, ids: Map<string, string>): unknown =>
    JSON.parse(
      JSON.stringify(value)
        .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, (id) => {
          if (!ids.has(id)) ids.set(id, `id${ids.size}`);
          return ids.get(id)!;
        })
        .replace(/"(created_at|updated_at)":"[^"]*"/g, '"$1":"t"')
        .replace(/"(call_uuid|public_id)":"[^"]*"/g, '"$1":"x"'),
    );

  /** One write after the other, as a transaction's writes go. */
  async function inTurn<T>(list: number[], write: (i: number) => Promise<T>): Promise<T[]> {
    const out: T[] = [];
    for (const i of list) out.push(await write(i));
    return out;
  }

  /** Three calls with a conversation and a leg each, then updated: one write at a time, or each kind as one batch. */
  async function write(batch: boolean, tag: string) {
    const actor = systemActor(tenant.organisationId, 'sip');
    const records = t.services.records!;
    const from = (await sql<{ id: string }>`SELECT coalesce(max(id::text), '') AS id FROM events`.execute(t.db)).rows[0].id;
    const written = await records.transaction(async (trx) => {
      const list = [0, 1, 2];
      const conversations = batch
        ? await trx.createMany(actor, 'Conversation', list.map(conversation))
        : await inTurn(list, (i) => trx.create(actor, 'Conversation', conversation(i)));
      const calls = batch
        ? await trx.createMany(
            actor,
            'Call',
            list.map((i) => call(i, conversations[i].id, tag)),
          )
        : await inTurn(list, (i) => trx.create(actor, 'Call', call(i, conversations[i].id, tag)));
      const legs = batch
        ? await trx.createMany(
            actor,
            'CallParticipant',
            list.map((i) => leg(calls[i].id, i)),
          )
        : await inTurn(list, (i) => trx.create(actor, 'CallParticipant', leg(calls[i].id, i)));
      const left = { left_at: new Date(1_800_000_003_000) };
      const changes = batch
        ? [
            ...(await trx.updateMany(
              actor,
              'Call',
              list.map((i) => ({ id: calls[i].id, values: updates(i) })),
            )),
            ...(await trx.updateMany(
              actor,
              'CallParticipant',
              list.map((i) => ({ id: legs[i].id, values: left })),
            )),
            ...(await trx.updateMany(
              actor,
              'Conversation',
              list.map((i) => ({ id: conversations[i].id, values: { status: 'closed' } })),
            )),
          ]
        : [
            ...(await inTurn(list, (i) => trx.update(actor, 'Call', calls[i].id, updates(i)))),
            ...(await inTurn(list, (i) => trx.update(actor, 'CallParticipant', legs[i].id, left))),
            ...(await inTurn(list, (i) => trx.update(actor, 'Conversation', conversations[i].id, { status: 'closed' }))),
          ];
      return [...conversations, ...calls, ...legs, ...changes].map((w) => ({ status: w.status, record: w.record as Row }));
    });
    const ids = new Map<string, string>();
    const stored = await sql<Row>`
      SELECT to_jsonb(c) - 'id' - 'conversation_id' - 'created_at' - 'updated_at' - 'call_uuid' AS row FROM calls c
      WHERE c.call_uuid LIKE ${`${tag}-%`} ORDER BY c.call_uuid`.execute(t.db);
    const events = await sql<{ type: string; data: Row }>`
      SELECT type, data FROM events WHERE organisation_id = ${tenant.organisationId} AND id::text > ${from} ORDER BY id`.execute(t.db);
    // Per record, its events in order (the batch groups records by type, so the order across records differs).
    const perRecord = new Map<string, string[]>();
    for (const e of events.rows) perRecord.set(String(e.data.id), [...(perRecord.get(String(e.data.id)) ?? []), e.type]);
    return {
      written: comparable(written, ids),
      stored: stored.rows,
      events: comparable(
        events.rows.map((e) => ({ type: e.type, data: e.data })).sort((a, b) => a.type.localeCompare(b.type)),
        new Map(),
      ),
      perRecord: [...perRecord.values()].map((types) => types.join()).sort(),
    };
  }

  it('creates and updates as one statement per type what single writes store, render and announce', async () => {
    const one = await write(false, `one${Date.now()}`);
    const many = await write(true, `many${Date.now()}`);
    expect(many.written).toEqual(one.written);
    expect(many.stored).toEqual(one.stored);
    expect(many.perRecord).toEqual(one.perRecord);
    expect(many.perRecord).toContain('Call.created,Call.updated');
    expect(many.events).toHaveLength(18);
  });

  it('refuses, as single writes do, a value that is not valid and a reference outside the organisation', async () => {
    const actor = systemActor(tenant.organisationId, 'sip');
    const records = t.services.records!;
    await expect(records.createMany(actor, 'Call', [{ direction: 'sideways' }])).rejects.toMatchObject({ status: 422 });
    const stranger = '018f0000-0000-7000-8000-000000000000';
    await expect(records.createMany(actor, 'CallParticipant', [leg(stranger, 0)])).rejects.toMatchObject({ status: 422 });
    await expect(records.updateMany(actor, 'Call', [{ id: stranger, values: { status: 'completed' } }])).rejects.toMatchObject({
      status: 404,
    });
  });
});
