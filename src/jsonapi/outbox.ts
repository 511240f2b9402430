/**
 * The transactional outbox. The records service queues one event per create, update and delete; the events
 * are written to `events` just before the writing transaction commits, in that transaction, so an event exists
 * exactly when its change does (a rolled-back write leaves none), whoever wrote.
 *
 * Order: an event's id is a UUIDv7 that sorts in commit order within its organisation, which is what lets a
 * client resume with Last-Event-ID and a reader tail the table by id without missing a row. Two transactions
 * of one organisation could otherwise draw ids in one order and commit in the other. So the id drawn here is
 * settled at COMMIT by a deferred trigger (migration 0010) under the organisation's `event_order` row lock,
 * after the organisation's last committed id. The append runs as the transaction's last step (a commit hook),
 * so that a transaction's events follow its other writes.
 *
 * The same trigger queues a webhook delivery for each enabled endpoint of the organisation that wants the
 * type, and a NOTIFY (sent by PostgreSQL only on commit) tells every server process that the organisation has
 * new events; the payload is small, readers fetch the rows.
 */
import { sql } from 'kysely';
import { uuidv7 } from 'uuidv7';
import { beforeCommit, type Database } from '../db/connection.js';
import type { Row } from './serialize.js';

/** The NOTIFY channel: payload `<organisation id>:<last event id>`. */
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
  // A transaction opened outside `transaction()`: write now (its id is settled at its COMMIT all the same).
  await appendEvents(trx, events);
}

/**
 * Inserts the events with ids from this process's clock (ascending). The deferred trigger of migration 0010
 * settles each id at COMMIT (after the organisation's last one), queues its webhook deliveries and notifies.
 */
async function appendEvents(trx: Database, events: PendingEvent[]): Promise<void> {
  const values = sql.join(
    events.map((event) => sql`(${uuidv7()}::uuid, ${event.organisationId}::uuid, ${event.type}, ${event.occurredAt}::timestamptz, ${JSON.stringify(event.data)}::jsonb)`),
  );
  await sql`INSERT INTO events (id, organisation_id, type, occurred_at, data) VALUES ${values}`.execute(trx);
}
