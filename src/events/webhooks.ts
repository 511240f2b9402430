/**
 * The webhook delivery worker (runs inside `serve`; docs/events.md, "Delivery"). Deliveries are queued with
 * their event, in the writing transaction (src/jsonapi/outbox.ts), so none is lost. The worker claims and
 * leases due ones (several processes share the work, and none sends an attempt another is sending), POSTs
 * them signed (Standard Webhooks), and retries failures with backoff until the retry window is over; then the
 * delivery fails and its endpoint is disabled, so that a dead receiver is not retried forever. A process
 * killed mid-attempt leaves the lease to run out, and the attempt is made again: at least once.
 */
import type { FastifyBaseLogger } from 'fastify';
import { sql } from 'kysely';
import type { Config } from '../config/index.js';
import type { DatabaseHandle } from '../db/connection.js';
import type { Db } from '../db/schema.js';
import { WorkLoop } from '../db/work-loop.js';
import { systemActor } from '../jsonapi/actor.js';
import { EVENTS_CHANNEL } from '../jsonapi/outbox.js';
import type { Records } from '../jsonapi/records.js';
import { signedPost, type SignedPostOutcome } from '../resources/webhook-url.js';

/** Bytes of a receiver's answer read (the rest is ignored; only the status matters). */
const RESPONSE_BYTES = 64 * 1024;
/** Longest pause between two attempts. */
const MAX_DELAY_SECONDS = 3600;
const USER_AGENT = 'Parley-Webhooks/1';
/** Shortest pause between two looks for due deliveries. */
const WAKE_GAP_MS = 25;

interface Claimed {
  id: string;
  organisation_id: string;
  webhook_endpoint_id: string;
  event_id: string;
  attempts: number;
  created_at: Date;
  url: string;
  secret: string;
  enabled: boolean;
  body: string;
}

type Logger = Pick<FastifyBaseLogger, 'info' | 'warn'>;

export interface WorkerOptions {
  database: DatabaseHandle;
  config: Config;
  records: Records;
  logger?: Logger;
}

/** Delay before attempt `attempts + 1`: base * 2^(attempts-1), times a random factor in [1, 2) (jitter), at most an hour. */
export function retryDelaySeconds(attempts: number, baseSeconds: number, random = Math.random()): number {
  const exponential = baseSeconds * 2 ** Math.min(Math.max(attempts - 1, 0), 20);
  return Math.min(MAX_DELAY_SECONDS, exponential * (1 + random));
}

/** POSTs one signed event (the shared signed POST, under the webhook address rules). Never throws. */
export function postEvent(
  url: string,
  secret: string,
  eventId: string,
  body: string,
  options: { timeoutMs: number; allowPrivate: boolean },
): Promise<SignedPostOutcome> {
  return signedPost(url, secret, eventId, body, { ...options, maxResponseBytes: RESPONSE_BYTES, userAgent: USER_AGENT });
}

/** Claims due deliveries and works them off, `webhookConcurrency` at a time. */
export class WebhookWorker {
  private readonly db: Db;
  private readonly config: Config['events'];
  private inFlight = 0;
  private readonly attempts = new Set<Promise<void>>();
  /** A new event may bring deliveries: looked for at once, not at the next poll, at most every WAKE_GAP_MS. */
  private readonly loop: WorkLoop;

  constructor(private readonly options: WorkerOptions) {
    this.db = options.database.db;
    this.config = options.config.events;
    this.loop = new WorkLoop({
      work: () => this.tick(),
      pollMs: this.config.webhookPollMs,
      gapMs: WAKE_GAP_MS,
      listen: options.database.listen,
      channel: EVENTS_CHANNEL,
      onError: () => {},
    });
  }

  start(): Promise<void> {
    return this.loop.start();
  }

  private async tick(): Promise<void> {
    try {
      while (this.loop.started) {
        const room = this.config.webhookConcurrency - this.inFlight;
        if (room <= 0) return;
        const claimed = await this.claim(room);
        for (const delivery of claimed) this.track(this.attempt(delivery));
        if (claimed.length < room) return;
      }
    } catch (error) {
      this.options.logger?.warn({ err: error }, 'webhooks: claiming deliveries failed');
    }
  }

  private track(work: Promise<void>): void {
    this.inFlight += 1;
    this.attempts.add(work);
    void work.finally(() => {
      this.inFlight -= 1;
      this.attempts.delete(work);
      this.loop.wake();
    });
  }

  /**
   * Due, unleased deliveries, leased for longer than an attempt can take, with their endpoint and event, fair
   * between endpoints (docs/events.md, "Delivery": at most `webhookEndpointConcurrency` leased per endpoint, a
   * bound per claim, not a lock; the free slots go round the endpoints with due work). Every probe is on a
   * partial index of pending deliveries (migration 0015_b; `test/webhook-fairness.test.ts` checks the plan).
   * SKIP LOCKED: rows another process is claiming right now are left to it.
   */
  async claim(limit: number): Promise<Claimed[]> {
    const { rows } = await this.claimQuery(limit).execute(this.db);
    return rows;
  }

  /** The claim's query plan (EXPLAIN, nothing claimed): diagnostics, and the test that it uses the indexes. */
  async explainClaim(limit = this.config.webhookConcurrency): Promise<string> {
    const query = this.claimQuery(limit);
    const { rows } = await sql<{ 'QUERY PLAN': string }>`EXPLAIN ${query}`.execute(this.db);
    return rows.map((r) => r['QUERY PLAN']).join('\n');
  }

  private claimQuery(limit: number) {
    const leaseSeconds = Math.ceil(this.config.webhookTimeoutMs / 1000) + 5;
    return sql<Claimed>`
      WITH RECURSIVE pending AS (
        -- The endpoints with pending deliveries, one index probe each (a skip scan of the pending index), so that
        -- neither the deliveries' history nor the endpoints without pending work are read.
        (SELECT webhook_endpoint_id AS id FROM webhook_deliveries WHERE status = 'pending' ORDER BY webhook_endpoint_id LIMIT 1)
        UNION ALL
        SELECT (SELECT d.webhook_endpoint_id FROM webhook_deliveries d
                WHERE d.status = 'pending' AND d.webhook_endpoint_id > p.id ORDER BY d.webhook_endpoint_id LIMIT 1)
        FROM pending p WHERE p.id IS NOT NULL
      ), endpoints AS (
        SELECT p.id, ${this.config.webhookEndpointConcurrency} - (
                 SELECT count(*) FROM webhook_deliveries l
                 WHERE l.webhook_endpoint_id = p.id AND l.status = 'pending' AND l.lease_until >= now()) AS room
        FROM pending p WHERE p.id IS NOT NULL
      ), candidates AS (
        SELECT c.id, c.next_attempt_at, row_number() OVER (PARTITION BY e.id ORDER BY c.next_attempt_at, c.id) AS turn
        FROM endpoints e
        CROSS JOIN LATERAL (
          SELECT d.id, d.next_attempt_at FROM webhook_deliveries d
          WHERE d.webhook_endpoint_id = e.id AND d.status = 'pending' AND d.next_attempt_at <= now()
            AND (d.lease_until IS NULL OR d.lease_until < now())
          ORDER BY d.next_attempt_at, d.id
          LIMIT GREATEST(e.room, 0)
        ) c
      ), due AS (
        SELECT d.id FROM webhook_deliveries d
        WHERE d.id IN (SELECT id FROM candidates ORDER BY turn, next_attempt_at, id LIMIT ${limit})
          AND d.status = 'pending' AND (d.lease_until IS NULL OR d.lease_until < now())
        FOR UPDATE SKIP LOCKED
      ), claimed AS (
        UPDATE webhook_deliveries d
        SET lease_until = now() + make_interval(secs => ${leaseSeconds}), attempts = d.attempts + 1, updated_at = now()
        FROM due WHERE d.id = due.id
        RETURNING d.id, d.organisation_id, d.webhook_endpoint_id, d.event_id, d.attempts, d.created_at
      )
      SELECT c.*, w.url, w.secret, w.enabled,
        json_build_object('id', e.id, 'type', e.type,
          'occurred_at', to_char(e.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
          'organisation_id', e.organisation_id, 'data', e.data)::text AS body
      FROM claimed c JOIN webhook_endpoints w ON w.id = c.webhook_endpoint_id JOIN events e ON e.id = c.event_id`;
  }

  private async attempt(delivery: Claimed): Promise<void> {
    try {
      if (!delivery.enabled) {
        await this.finish(delivery, { ok: false, error: 'The endpoint is disabled.' }, true);
        return;
      }
      const outcome = await postEvent(delivery.url, delivery.secret, delivery.event_id, delivery.body, {
        timeoutMs: this.config.webhookTimeoutMs,
        allowPrivate: this.config.webhookAllowPrivateUrls,
      });
      await this.finish(delivery, outcome, false);
    } catch (error) {
      // The lease runs out and the attempt is made again.
      this.options.logger?.warn({ err: error, delivery: delivery.id }, 'webhooks: recording an attempt failed');
    }
  }

  /** Records an attempt's outcome; the last failure of the retry window fails the delivery and disables the endpoint. */
  private async finish(delivery: Claimed, outcome: SignedPostOutcome, final: boolean): Promise<void> {
    const delay = retryDelaySeconds(delivery.attempts, this.config.webhookRetryBaseSeconds);
    const deadline = new Date(delivery.created_at).getTime() + this.config.webhookRetryHours * 3600_000;
    const exhausted = !outcome.ok && (final || Date.now() + delay * 1000 > deadline);
    // Through the records service, as the system (the type declares itself eventless); no rendering wanted.
    await this.options.records.perform(
      systemActor(delivery.organisation_id, 'webhook'),
      'WebhookDelivery',
      'record_attempt',
      delivery.id,
      {
        status: outcome.ok ? 'succeeded' : exhausted ? 'failed' : 'pending',
        last_status_code: outcome.status ?? null,
        last_error: outcome.ok ? null : (outcome.error ?? null),
        retry_in_ms: outcome.ok || exhausted ? null : Math.round(delay * 1000),
        endpoint: outcome.ok ? 'reset' : final ? 'same' : 'failed',
      },
      { render: async () => null },
    );
    if (exhausted && !final) await this.disable(delivery, outcome);
  }

  private async disable(delivery: Claimed, outcome: SignedPostOutcome): Promise<void> {
    const reason = `Deliveries failed for ${this.config.webhookRetryHours} h; last: ${outcome.error ?? 'no answer'}`.slice(0, 500);
    // Through the records service: disabling is a change members see (a WebhookEndpoint.updated event).
    await this.options.records.update(systemActor(delivery.organisation_id, 'webhook'), 'WebhookEndpoint', delivery.webhook_endpoint_id, {
      enabled: false,
      disabled_reason: reason,
    });
    const { rows } = await sql<{ id: string }>`
      UPDATE webhook_deliveries SET status = 'failed', last_error = 'The endpoint was disabled.', next_attempt_at = NULL, updated_at = now()
      WHERE webhook_endpoint_id = ${delivery.webhook_endpoint_id} AND status = 'pending' AND (lease_until IS NULL OR lease_until < now())
      RETURNING id`.execute(this.db);
    this.options.logger?.warn(
      { webhook_endpoint_id: delivery.webhook_endpoint_id, organisation_id: delivery.organisation_id, failed_pending: rows.length, reason },
      'webhooks: endpoint disabled after its deliveries kept failing',
    );
  }

  /** Stops claiming; waits for the attempts in flight (each ends within the timeout). */
  async stop(): Promise<void> {
    await this.loop.stop();
    await Promise.allSettled([...this.attempts]);
  }
}

/** Deletes events past the retention (their deliveries go with them), in batches, every few minutes. */
export class EventPruner {
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly db: Db,
    private readonly retentionDays: number,
    private readonly logger?: Logger,
  ) {}

  start(): void {
    void this.prune();
    this.timer = setInterval(() => void this.prune(), 10 * 60_000).unref();
  }

  async prune(): Promise<number> {
    let total = 0;
    try {
      for (;;) {
        // By id: an event's id begins with the millisecond of the database's clock when it was written, never
        // earlier (migration 0011), so ids below the bound are older than the retention (the primary key finds them).
        const { rows } = await sql<{ id: string }>`
          DELETE FROM events WHERE id IN (
            SELECT id FROM events
            WHERE id < (lpad(to_hex((extract(epoch FROM now() - make_interval(days => ${this.retentionDays})) * 1000)::bigint), 12, '0') || '70008000000000000000')::uuid
            LIMIT 5000)
          RETURNING id`.execute(this.db);
        total += rows.length;
        if (rows.length < 5000) break;
      }
    } catch (error) {
      this.logger?.warn({ err: error }, 'events: pruning failed');
    }
    return total;
  }

  stop(): void {
    clearInterval(this.timer);
  }
}
