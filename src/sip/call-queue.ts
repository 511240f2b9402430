/**
 * The consumer of the durable call event queue (`sip_call_events`, migration 0013): Kamailio writes each
 * call event there without waiting for Parley; `sip serve` reads the rows in id order, validates each with
 * `parseCallEvent`, applies it through `CallEvents` (records service, system actor) and deletes it. Its order per
 * call, transactions, leases, failures and wake-up are in docs/sip.md ("Call events: a durable queue").
 */
import { sql } from 'kysely';
import type { DatabaseHandle } from '../db/connection.js';
import type { Db } from '../db/schema.js';
import { WorkLoop } from '../db/work-loop.js';
import { memo } from '../jsonapi/memo.js';
import { type CallEvent, type CallEvents, decodeCallEvent } from './call-events.js';

export const CALL_EVENT_CHANNEL = 'sip_call_events';

export interface CallQueueOptions {
  db: Db;
  events: CallEvents;
  /** Subscribes to NOTIFY; without it the queue is only polled. */
  listen?: DatabaseHandle['listen'];
  /** How often the queue is looked at without a notification (ms). */
  pollMs?: number;
  /** Rows claimed at once. */
  batchSize?: number;
  /** Calls applied at the same time when they are applied one by one (a chunk failed). */
  concurrency?: number;
  log?: (level: 'info' | 'warn' | 'error', message: string, detail?: Record<string, unknown>) => void;
}

interface Row {
  id: string;
  call_key: string;
  body: string;
  attempts: number;
}

interface Valid {
  row: Row;
  event: CallEvent;
}

/** Whether a failure is the event's fault (kept out of the queue) rather than the moment's (retried). */
function permanent(error: unknown): boolean {
  const status = (error as { status?: number }).status;
  return typeof status === 'number' && status >= 400 && status < 500 && status !== 409;
}

/** How long a claimed row is this consumer's before another may take it (ms). */
const LEASE_MS = 30_000;
/** Calls written together in one transaction. */
const CHUNK = 100;
/** The least time between the starts of two drains (ms): what arrives meanwhile is applied together. */
const GATHER_MS = 100;

const message = (error: unknown) => (error instanceof Error ? error.message : String(error));

export class CallEventQueue {
  private readonly batchSize: number;
  private readonly concurrency: number;
  private readonly log: NonNullable<CallQueueOptions['log']>;
  /**
   * Drains on each notification and poll, at most one per `GATHER_MS`: Kamailio writes a few events every 20 ms,
   * each write a notification, and a drain per notification cost its claim, reads, BEGIN, COMMIT and delete for
   * one or two calls' events; what arrives until the next is applied together.
   */
  private readonly loop: WorkLoop;

  constructor(private readonly options: CallQueueOptions) {
    this.batchSize = options.batchSize ?? 400;
    this.concurrency = options.concurrency ?? 32;
    this.log = options.log ?? (() => {});
    this.loop = new WorkLoop({
      work: () => this.drain(),
      pollMs: options.pollMs ?? 1000,
      gapMs: GATHER_MS,
      listen: options.listen,
      channel: CALL_EVENT_CHANNEL,
      onError: (error, during) => this.log('error', `call event queue: ${during === 'listen' ? 'cannot listen: ' : ''}${message(error)}`),
    });
  }

  /** Starts consuming: every queued row now, then on each notification and poll. */
  start(): Promise<void> {
    return this.loop.start();
  }

  /** Stops consuming; rows already claimed are finished first. Queued rows stay for the next consumer. */
  stop(): Promise<void> {
    return this.loop.stop();
  }

  /** Applies queued rows until none can be claimed; the number applied. */
  async drain(): Promise<number> {
    let applied = 0;
    for (;;) {
      let taken = 0;
      try {
        applied += await this.options.events.applyClaimed(async (trx) => {
          const rows = await this.claim(trx, 'delete');
          taken = rows.length;
          return this.callsOf(rows);
        });
        if (taken < this.batchSize) return applied;
        continue;
      } catch (error) {
        // Rolled back (unless only operator presence failed after the commit): the rows left are taken the
        // leased way, where the one at fault is found.
        this.log('warn', `call events of a batch not applied in one transaction, now with leases: ${message(error)}`);
      }
      const rows = await this.claim(this.options.db, 'lease');
      if (rows.length === 0) return applied;
      applied += await this.applyBatch(rows);
      if (rows.length < this.batchSize) return applied;
    }
  }

  /** Claimed rows as calls' events, in order; throws when one is not a valid event (the leased path keeps it out). */
  private callsOf(rows: Row[]): CallEvent[][] {
    const calls = new Map<string, CallEvent[]>();
    for (const row of rows) {
      const parsed = decodeCallEvent(row.body);
      if (!parsed.event) throw new Error(`call event ${row.id} is not valid: ${parsed.problems.join('; ')}`);
      memo(calls, row.call_key, () => []).push(parsed.event);
    }
    return [...calls.values()];
  }

  /** Rows waiting, not counting those kept out with an error. */
  async waiting(): Promise<number> {
    const { rows } = await sql<{ n: number }>`SELECT count(*)::int AS n FROM sip_call_events WHERE error IS NULL`.execute(this.options.db);
    return rows[0].n;
  }

  /**
   * `lease`: the rows get a lease (their own statement); `delete`: the rows are deleted, inside the caller's
   * transaction, which holds them (locked, and still there for other consumers' order check) until it ends.
   */
  private async claim(db: Db, how: 'lease' | 'delete'): Promise<Row[]> {
    // SKIP LOCKED: two consumers never claim the same row; the lease (or the open delete) keeps it theirs.
    // Of the rows locked here, only those with no earlier row of their call outside this batch are claimed:
    // an earlier row elsewhere is being applied by another consumer (or its claim is in flight, locked and not
    // yet leased), or waits out a retry delay, and the call's later rows wait for it. The others are released
    // (when leasing; a delete's transaction holds them until it ends, as another consumer could not take them).
    const take =
      how === 'lease'
        ? sql`UPDATE sip_call_events q SET lease_until = now() + make_interval(secs => ${LEASE_MS / 1000}), attempts = q.attempts + 1`
        : sql`DELETE FROM sip_call_events q`;
    const { rows } = await sql<Row>`
      WITH candidates AS (
        SELECT e.id, e.call_key FROM sip_call_events e
        WHERE e.error IS NULL AND (e.lease_until IS NULL OR e.lease_until < now())
        ORDER BY e.id LIMIT ${this.batchSize}
        FOR UPDATE SKIP LOCKED
      ), heads AS (
        SELECT c.id FROM candidates c
        WHERE NOT EXISTS (
          SELECT 1 FROM sip_call_events p
          WHERE p.call_key = c.call_key AND p.id < c.id AND p.error IS NULL AND p.id NOT IN (SELECT id FROM candidates))
      )
      ${take}
      WHERE q.id IN (SELECT id FROM heads)
      RETURNING q.id::text AS id, q.call_key, q.body, q.attempts`.execute(db);
    return rows.sort((a, b) => (BigInt(a.id) < BigInt(b.id) ? -1 : 1));
  }

  private async applyBatch(rows: Row[]): Promise<number> {
    // The rows as calls' events, in order; a row that is not a valid event is kept out here.
    const calls = new Map<string, Valid[]>();
    for (const row of rows) {
      const parsed = decodeCallEvent(row.body);
      if (parsed.event) memo(calls, row.call_key, () => []).push({ row, event: parsed.event });
      else await this.keepOut(row, parsed.problems.join('; '));
    }
    const groups = [...calls.values()];
    const done: string[] = [];
    // Many calls together (docs/sip.md, "what a call costs"): one read of the calls, one of their SIP users and
    // one transaction per chunk. A chunk that fails (a row the records service refuses, the database gone) is
    // applied again call by call below, where the row at fault is kept out or retried alone.
    const alone: Valid[][] = [];
    for (let i = 0; i < groups.length; i += CHUNK) {
      const chunk = groups.slice(i, i + CHUNK);
      if (chunk.length === 1) {
        alone.push(chunk[0]);
        continue;
      }
      try {
        await this.options.events.applyMany(chunk.map((g) => g.map((v) => v.event)));
        for (const group of chunk) for (const v of group) done.push(v.row.id);
      } catch (error) {
        this.log('warn', `call events of ${chunk.length} calls not applied together, now one call at a time: ${message(error)}`);
        alone.push(...chunk);
      }
    }
    let next = 0;
    const worker = async () => {
      while (next < alone.length) await this.applyCall(alone[next++], done);
    };
    await Promise.all(Array.from({ length: Math.min(this.concurrency, alone.length) }, worker));
    if (done.length) await sql`DELETE FROM sip_call_events WHERE id = ANY(${done}::bigint[])`.execute(this.options.db);
    return done.length;
  }

  /**
   * One call's rows, in order. Their events are applied together (one read of the call, one transaction);
   * when that fails, one by one, so that a row the records service refuses is kept out alone and the first that
   * fails for the moment holds the rest back.
   */
  private async applyCall(valid: Valid[], done: string[]): Promise<void> {
    if (valid.length > 1) {
      try {
        await this.options.events.applyAll(valid.map((v) => v.event));
        for (const v of valid) done.push(v.row.id);
        return;
      } catch {
        // Nothing of the batch was written (one transaction): one by one below finds the row at fault.
      }
    }
    for (let i = 0; i < valid.length; i++) {
      const { row, event } = valid[i];
      try {
        await this.options.events.apply(event);
        done.push(row.id);
      } catch (error) {
        if (permanent(error)) {
          await this.keepOut(row, message(error));
          continue;
        }
        this.log('warn', `call event ${event.event} for ${event.call_id} not applied (retried): ${message(error)}`);
        // Retried after a delay that grows with the attempts (at most a minute); the call's later rows wait
        // for it (released now, not claimed while this one is leased).
        const delay = Math.min(60, 2 ** Math.min(row.attempts, 6) / 2);
        const later = valid.slice(i + 1).map((v) => v.row.id);
        await sql`UPDATE sip_call_events SET lease_until = now() + make_interval(secs => ${delay}) WHERE id = ${row.id}::bigint`
          .execute(this.options.db)
          .catch(() => {});
        if (later.length)
          await sql`UPDATE sip_call_events SET lease_until = NULL, attempts = attempts - 1 WHERE id = ANY(${later}::bigint[])`
            .execute(this.options.db)
            .catch(() => {});
        return;
      }
    }
  }

  private async keepOut(row: Row, reason: string): Promise<void> {
    this.log('error', `call event ${row.id} kept out of the queue: ${reason}`, { id: row.id });
    await sql`UPDATE sip_call_events SET error = ${reason.slice(0, 1000)}, lease_until = NULL WHERE id = ${row.id}::bigint`.execute(
      this.options.db,
    );
  }
}
