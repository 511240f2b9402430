/**
 * The transactional outbox (docs/architecture.md, "Events"). The records service queues one event per create,
 * update and delete; the events are written to `events` in the writing transaction, so an event exists exactly
 * when its change does (a rolled-back write leaves none), whoever wrote. They are written by its last statement
 * before COMMIT (a commit hook here; a create that is its own transaction inserts its event with its record,
 * write.ts), where they take their ids from `parley_event_id` (migration 0011): ids that sort in commit order
 * within the organisation, so that a client resumes with Last-Event-ID and a reader tails the table by id.
 *
 * The notification on `parley_events` is sent after the commit (`notifyAfterCommit`: one statement at most every
 * 10 ms, for every organisation written to meanwhile): a NOTIFY inside the writing transaction would make every
 * notifying commit of the database wait for the one before it (PostgreSQL queues notifications under a
 * database-wide lock held until the commit is flushed). Readers also look for rows they were not told about
 * every few seconds, which covers a lost announcement.
 */
import { sql } from 'kysely';
import { beforeCommit, notifyAfterCommit, type Database } from '../db/connection.js';
import { memo } from './memo.js';
import type { Registry, Row } from './resource.js';

/** The NOTIFY channel: payload `<organisation id>` (readers read the organisation's new rows). */
export const EVENTS_CHANNEL = 'parley_events';

export type EventAction = 'created' | 'updated' | 'deleted';
export const EVENT_ACTIONS: readonly EventAction[] = ['created', 'updated', 'deleted'];

const catalogues = new WeakMap<Registry, ReadonlySet<string>>();

/**
 * The event catalogue: `<ResourceType>.created|updated|deleted` for every type whose changes are events, and
 * the further actions a type declares (`Conversation.analysed`; docs/events.md), in the registry's order.
 */
export function eventTypes(registry: Registry): ReadonlySet<string> {
  return memo(catalogues, registry, () => {
    const evented = [...registry.values()].filter((r) => r.events !== false);
    return new Set(evented.flatMap((r) => [...EVENT_ACTIONS, ...(r.extraEvents ?? [])].map((a) => `${r.type}.${a}`)));
  });
}

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
