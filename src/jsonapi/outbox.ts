/**
 * The transactional outbox. The records service queues one event per create, update and delete; the events
 * are written to `events` just before the writing transaction commits, in that transaction, so an event exists
 * exactly when its change does (a rolled-back write leaves none), whoever wrote.
 *
 * Order: an event's id is a UUIDv7 that sorts in commit order within its organisation, which is what lets a
 * client resume with Last-Event-ID and a reader tail the table by id without missing a row. Two transactions
 * of one organisation could otherwise draw ids in one order and commit in the other. So the append takes a
 * transaction-level advisory lock for the organisation (held until COMMIT or ROLLBACK) and draws its ids
 * above the organisation's last committed id: transactions of one organisation pass this point, and commit,
 * one at a time. The append runs as the transaction's last step (a commit hook), so the lock is held only for
 * the append and the COMMIT itself, and it is the last lock the transaction takes (no deadlock cycle can
 * run through it). Different organisations never wait for each other (but for a rare hash collision).
 *
 * With the events, the same statement queues a webhook delivery for each enabled endpoint of the
 * organisation that wants the type, and a NOTIFY (sent by PostgreSQL only on commit) tells every server
 * process that the organisation has new events; the payload is small, readers fetch the rows.
 */
import { sql } from 'kysely';
import { uuidv7 } from 'uuidv7';
import { beforeCommit, type Database } from '../db/connection.js';
import type { Row } from './serialize.js';

/** The NOTIFY channel: payload `<organisation id>:<last event id>`. */
export const EVENTS_CHANNEL = 'parley_events';

/** Advisory lock namespace (first key of pg_advisory_xact_lock(int, int)) of the per-organisation event order. */
const EVENT_ORDER_LOCK = 0x70617231; // "par1"

export type EventAction = 'created' | 'updated' | 'deleted';
export const EVENT_ACTIONS: readonly EventAction[] = ['created', 'updated', 'deleted'];

export interface PendingEvent {
  organisationId: string;
  /** `<ResourceType>.<action>` */
  type: string;
  occurredAt: Date;
  /** The resource object as a GET renders it (no write-only value, no value shown once). */
  data: Row;
}

/** The event document: what the stream's `data:` line and a webhook's body carry. */
export interface EventDocument {
  id: string;
  type: string;
  occurred_at: string;
  organisation_id: string;
  data: Row;
}

const pending = new WeakMap<Database, PendingEvent[]>();

/** Queues `event` to be written when `trx` commits (at once when `trx` has no commit hooks). */
export async function queueEvent(trx: Database, event: PendingEvent): Promise<void> {
  const queued = pending.get(trx);
  if (queued) {
    queued.push(event);
    return;
  }
  const events = [event];
  if (beforeCommit(trx, () => appendEvents(trx, events))) {
    pending.set(trx, events);
    return;
  }
  // A transaction opened outside `transaction()`: write now (the lock is then held from here to its commit).
  await appendEvents(trx, events);
}

/** Writes events, grouped by organisation in a fixed order (so that two transactions never wait on each other's locks). */
async function appendEvents(trx: Database, events: PendingEvent[]): Promise<void> {
  const byOrganisation = new Map<string, PendingEvent[]>();
  for (const event of events) {
    const list = byOrganisation.get(event.organisationId) ?? [];
    list.push(event);
    byOrganisation.set(event.organisationId, list);
  }
  for (const organisationId of [...byOrganisation.keys()].sort()) {
    await appendForOrganisation(trx, organisationId, byOrganisation.get(organisationId)!);
  }
}

async function appendForOrganisation(trx: Database, organisationId: string, events: PendingEvent[]): Promise<void> {
  await sql`SELECT pg_advisory_xact_lock(${EVENT_ORDER_LOCK}, hashtext(${organisationId}))`.execute(trx);
  // Usually this process's clock gives ids above the organisation's last one: one statement, which checks
  // that (a new statement: its snapshot sees every commit made before the lock was granted).
  const fresh = idsAfter(undefined, events.length);
  if (await insertEvents(trx, organisationId, events, fresh, true)) return;
  // Another process's clock is ahead: continue from the last id.
  const { rows } = await sql<{ id: string }>`
    SELECT id FROM events WHERE organisation_id = ${organisationId} ORDER BY id DESC LIMIT 1`.execute(trx);
  await insertEvents(trx, organisationId, events, idsAfter(rows[0]?.id, events.length), false);
}

function idsAfter(last: string | undefined, count: number): string[] {
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    last = nextEventId(last);
    ids.push(last);
  }
  return ids;
}

/**
 * Inserts the events with `ids` (ascending), the webhook deliveries they cause, and the NOTIFY. With `guard`,
 * nothing is written when the organisation already has an id at or above the first (returns false).
 */
async function insertEvents(trx: Database, organisationId: string, events: PendingEvent[], ids: string[], guard: boolean): Promise<boolean> {
  const values = sql.join(
    events.map((event, i) => sql`(${ids[i]}::uuid, ${organisationId}::uuid, ${event.type}, ${event.occurredAt}::timestamptz, ${JSON.stringify(event.data)}::jsonb)`),
  );
  const last = ids[ids.length - 1];
  const { rows } = await sql<{ appended: number }>`
    WITH appended AS (
      INSERT INTO events (id, organisation_id, type, occurred_at, data)
      SELECT * FROM (VALUES ${values}) AS v (id, organisation_id, type, occurred_at, data)
      ${guard ? sql`WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.organisation_id = ${organisationId} AND e.id >= ${ids[0]}::uuid)` : sql``}
      RETURNING id, organisation_id, type
    ), deliveries AS (
      -- Delivery ids: a UUIDv7 of the event's millisecond (the event id's first 48 bits), random after.
      INSERT INTO webhook_deliveries (id, organisation_id, webhook_endpoint_id, event_id, event_type, status, next_attempt_at, created_at, updated_at)
      SELECT (substr(a.id::text, 1, 14) || '7' || substr(gen_random_uuid()::text, 16))::uuid, a.organisation_id, w.id, a.id, a.type, 'pending', now(), now(), now()
      FROM appended a JOIN webhook_endpoints w
        ON w.organisation_id = a.organisation_id AND w.enabled AND (cardinality(w.event_types) = 0 OR a.type = ANY (w.event_types))
    ), notified AS (
      SELECT pg_notify(${EVENTS_CHANNEL}, ${`${organisationId}:${last}`}) FROM appended WHERE id = ${last}::uuid
    )
    SELECT (SELECT count(*)::int FROM appended) AS appended, (SELECT count(*)::int FROM notified) AS notified`.execute(trx);
  return rows[0].appended === events.length;
}

const LOW_62 = (1n << 62n) - 1n;

/**
 * A UUIDv7 (RFC 9562 section 5.7) greater than `last`: a fresh one from this process's clock, or, when that
 * does not sort after `last` (another process's clock ahead, or the same millisecond), `last` plus one in its
 * random bits, which keeps the version and variant bits and the order.
 */
export function nextEventId(last: string | undefined): string {
  const fresh = uuidv7();
  if (last === undefined || fresh > last) return fresh;
  let n = BigInt(`0x${last.replace(/-/g, '')}`);
  if ((n & LOW_62) === LOW_62) {
    // rand_b is exhausted: the next millisecond, rand_b from zero.
    n = ((n >> 80n) + 1n) << 80n | (n & (0xfffn << 64n)) | (0x7n << 76n) | (0x2n << 62n);
  } else {
    n += 1n;
  }
  const hex = n.toString(16).padStart(32, '0');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
