/**
 * The transactional outbox. The records service queues one event per create, update and delete; the events
 * are written to `events` just before the writing transaction commits, in that transaction, so an event exists
 * exactly when its change does (a rolled-back write leaves none), whoever wrote.
 *
 * Order: an event's id is a UUIDv7 that sorts in commit order within its organisation, which is what lets a
 * client resume with Last-Event-ID and a reader tail the table by id without missing a row. So events are
 * written by the transaction's last statement before COMMIT (a commit hook here; a create that is its own
 * transaction inserts its event with its record, src/jsonapi/write.ts), and take their ids there from
 * `parley_event_id` (migration 0011): the database's clock and a sequence, under a lock of the organisation
 * that writers share and a reader of the events (`parley_read_events`) takes alone for one statement, so that
 * what a reader sees is always a prefix of the organisation's events in id order. A trigger queues the
 * events' webhook deliveries in the same statement.
 *
 * Readers in every server process learn of new events from a notification on `parley_events` with the
 * organisation's id, which the writing process sends after its commit (`notifyAfterCommit`: one statement
 * at most every 10 ms, for every organisation written to meanwhile): a NOTIFY inside the writing transaction
 * would make every notifying commit of the database wait for the one before it (PostgreSQL queues
 * notifications under a database-wide lock held until the commit is flushed). Readers also look for
 * rows they were not told about every few seconds, which covers a lost announcement.
 */
import { sql } from 'kysely';
import { beforeCommit, notifyAfterCommit, type Database } from '../db/connection.js';
import type { Row } from './resource.js';

/** The NOTIFY channel: payload `<organisation id>` (readers read the organisation's new rows). */
export const EVENTS_CHANNEL = 'parley_events';

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
  // A transaction opened outside `transaction()`: write now (readers wait for its end all the same).
  await appendEvents(trx, events);
}

/** Inserts the events, in order, with their ids (`parley_event_id`, migration 0011). */
async function appendEvents(trx: Database, events: PendingEvent[]): Promise<void> {
  const values = sql.join(
    events.map(
      (event) =>
        sql`(parley_event_id(${event.organisationId}::uuid), ${event.organisationId}::uuid, ${event.type}, ${event.occurredAt}::timestamptz, ${JSON.stringify(event.data)}::jsonb)`,
    ),
  );
  await sql`INSERT INTO events (id, organisation_id, type, occurred_at, data) VALUES ${values}`.execute(trx);
  for (const organisationId of new Set(events.map((event) => event.organisationId))) eventsWritten(trx, organisationId);
}

/** Records that `trx` wrote events of `organisationId`: announced on `parley_events` once it commits. */
export function eventsWritten(trx: Database, organisationId: string): void {
  notifyAfterCommit(trx, EVENTS_CHANNEL, organisationId);
}
