/**
 * GET /api/events: the organisation's events as server-sent events (WHATWG HTML, "Server-sent events"), each
 * message `id:` (the event id), `event:` (its type) and `data:` (the event JSON), for the types the caller's
 * role may read (and, where a role sees only some rows, only events about those rows).
 *
 * Fan-out: one hub per server process listens on the outbox's NOTIFY channel (LISTEN/NOTIFY on PostgreSQL,
 * in process on PGlite). On a notification it reads the organisation's new rows from the outbox once, by id
 * (ids sort in commit order, src/jsonapi/outbox.ts), and hands them to that organisation's streams. Each
 * stream first replays retained events after Last-Event-ID (or page[after]) from the outbox, then goes live.
 * Each read holds the organisation's event lock for its one statement (migration 0011: commits of the
 * organisation wait that long to take their ids); a client never holds a database connection or lock, so an
 * open stream never blocks writes; a client that reads too slowly is disconnected (it resumes with
 * Last-Event-ID), never buffered without bound.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { sql } from 'kysely';
import type { DatabaseHandle } from '../db/connection.js';
import type { Db } from '../db/schema.js';
import { ApiError, errorObject, type ErrorObject } from '../jsonapi/errors.js';
import { EVENTS_CHANNEL } from '../jsonapi/outbox.js';
import type { Principal } from '../jsonapi/principal.js';
import type { Registry } from '../jsonapi/query/parse.js';
import { columnOf, type ResourceDef } from '../jsonapi/resource.js';
import { methodNotAllowed } from '../jsonapi/routes.js';
import type { AppServices } from '../jsonapi/services.js';
import { UUID_PATTERN } from '../jsonapi/validate.js';
import { eventTypes } from '../resources/event-types.js';

/** One outbox row, with its message text made once for every stream. */
export interface EventRow {
  id: string;
  type: string;
  organisation_id: string;
  /** The event JSON (`{id, type, occurred_at, organisation_id, data}`). */
  json: string;
}

const PAGE = 500;
/** Events a stream may have waiting for a visibility check; beyond, it is too slow and is closed. */
const MAX_QUEUED = 5000;
/** Safety net besides NOTIFY: how often the hub looks for rows it was not told about. */
const SWEEP_MS = 5000;

/**
 * The outbox rows of one organisation after `after` (all when undefined), in id (commit) order: a prefix of the
 * organisation's events, read under the organisation's event lock (migration 0011), so no event with a smaller
 * id than those returned can commit later.
 */
export async function readEvents(db: Db, organisationId: string, after: string | undefined, limit = PAGE): Promise<EventRow[]> {
  const { rows } = await sql<EventRow>`
    SELECT id, type, organisation_id, event_json AS json FROM parley_read_events(${organisationId}::uuid, ${after ?? null}::uuid, ${limit}::integer)`.execute(
    db,
  );
  return rows;
}

/** The id of the organisation's last event, under the same lock as `readEvents` (undefined when none). */
async function lastEventId(db: Db, organisationId: string): Promise<string | undefined> {
  const { rows } = await sql<{ id: string | null }>`SELECT parley_last_event_id(${organisationId}::uuid) AS id`.execute(db);
  return rows[0]?.id ?? undefined;
}

interface Listener {
  /** Called with every new row of the organisation, in order. */
  offer(row: EventRow): void;
}

interface OrganisationState {
  cursor: string | undefined;
  ready: Promise<void>;
  listeners: Set<Listener>;
  running: boolean;
  again: boolean;
}

/** Reads each organisation's new outbox rows once per process and hands them to its streams. */
export class EventHub {
  private readonly organisations = new Map<string, OrganisationState>();
  private unlisten?: Promise<() => Promise<void>>;
  private sweep?: NodeJS.Timeout;
  private closed = false;

  constructor(
    private readonly database: DatabaseHandle,
    private readonly onError: (error: unknown) => void = () => {},
  ) {}

  /** Adds a listener; resolves with the organisation's last event id when it was added (live starts after it). */
  async subscribe(organisationId: string, listener: Listener): Promise<{ cursor: string | undefined; unsubscribe: () => void }> {
    this.unlisten ??= this.database.listen(
      EVENTS_CHANNEL,
      (payload) => this.notified(payload),
      () => this.catchUpAll(),
    );
    try {
      await this.unlisten;
    } catch (error) {
      // The next stream tries again.
      this.unlisten = undefined;
      throw error;
    }
    if (!this.sweep) {
      this.sweep = setInterval(() => this.catchUpAll(), SWEEP_MS);
      this.sweep.unref();
    }
    let state = this.organisations.get(organisationId);
    let fresh = false;
    if (!state) {
      const created: OrganisationState = {
        cursor: undefined,
        ready: Promise.resolve(),
        listeners: new Set(),
        running: false,
        again: false,
      };
      // Listening already, so any event after this snapshot is announced; the cursor starts at the snapshot.
      created.ready = lastEventId(this.database.db, organisationId).then((id) => {
        created.cursor = id;
      });
      fresh = true;
      this.organisations.set(organisationId, created);
      state = created;
      try {
        await created.ready;
      } catch (error) {
        this.organisations.delete(organisationId);
        throw error;
      }
    } else {
      await state.ready;
    }
    const current = state;
    current.listeners.add(listener);
    // The hub learns of commits shortly after they happen (outbox.ts): a stream starts after the last event
    // committed before it opened, even if the hub has not read it yet (the stream skips what it has passed).
    let cursor = current.cursor;
    if (!fresh) {
      const last = await lastEventId(this.database.db, organisationId).catch((error) => {
        current.listeners.delete(listener);
        throw error;
      });
      if (last && (!cursor || last > cursor)) cursor = last;
    }
    return {
      cursor,
      unsubscribe: () => {
        current.listeners.delete(listener);
        if (current.listeners.size === 0 && this.organisations.get(organisationId) === current) this.organisations.delete(organisationId);
      },
    };
  }

  /** A notification names an organisation with new events (outbox.ts). */
  private notified(organisationId: string): void {
    const state = this.organisations.get(organisationId);
    if (state) void this.fetch(organisationId, state);
  }

  private catchUpAll(): void {
    for (const [organisationId, state] of this.organisations) void this.fetch(organisationId, state);
  }

  /** Reads and dispatches new rows; notifications arriving meanwhile make it read again (one reader per organisation). */
  private async fetch(organisationId: string, state: OrganisationState): Promise<void> {
    if (state.running) {
      state.again = true;
      return;
    }
    state.running = true;
    try {
      await state.ready;
      let rows: EventRow[];
      do {
        state.again = false;
        rows = await readEvents(this.database.db, organisationId, state.cursor);
        for (const row of rows) {
          state.cursor = row.id;
          for (const listener of state.listeners) listener.offer(row);
        }
      } while ((state.again || rows.length === PAGE) && !this.closed);
    } catch (error) {
      this.onError(error);
    } finally {
      state.running = false;
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.sweep);
    const unlisten = this.unlisten;
    this.unlisten = undefined;
    this.organisations.clear();
    if (unlisten) await (await unlisten.catch(() => async () => {}))();
  }
}

/** Whether a role's principal may see an event, given the type and (where the role sees only some rows) the record. */
class Visibility {
  private readonly perType = new Map<string, { resource: ResourceDef; rowCheck: boolean } | null>();

  constructor(
    private readonly db: Db,
    private readonly registry: Registry,
    private readonly principal: Principal,
  ) {}

  private rule(resourceType: string) {
    let rule = this.perType.get(resourceType);
    if (rule === undefined) {
      const resource = this.registry.get(resourceType);
      rule = resource?.access.read.includes(this.principal.role)
        ? { resource, rowCheck: resource.access.visible?.(this.principal, 't') !== undefined }
        : null;
      this.perType.set(resourceType, rule);
    }
    return rule;
  }

  /** Undefined: decided without the record; else the record must be checked (`visibleRow`). */
  byType(type: string): boolean | undefined {
    const rule = this.rule(type.slice(0, type.lastIndexOf('.')));
    if (!rule) return false;
    return rule.rowCheck ? undefined : true;
  }

  /**
   * The role's row condition (the same SQL the reads use) evaluated on the event's record: its attributes
   * put back into the columns they come from (jsonb_populate_record), so it judges the record as the event
   * shows it, even when it has since changed or been deleted.
   */
  async visibleRow(row: EventRow): Promise<boolean> {
    const { resource } = this.rule(row.type.slice(0, row.type.lastIndexOf('.')))!;
    const event = JSON.parse(row.json) as { data: { id: string; attributes?: Record<string, unknown> } };
    const columns: Record<string, unknown> = { id: event.data.id, organisation_id: row.organisation_id };
    for (const [name, def] of Object.entries(resource.attributes)) {
      if (def.expression || def.writeOnly || def.revealedOnCreate) continue;
      const value = event.data.attributes?.[name];
      if (value !== undefined) columns[columnOf(name, def)] = value;
    }
    const condition = resource.access.visible!(this.principal, 't')!;
    const { rows } = await sql<{ visible: boolean }>`
      SELECT (${condition}) AS visible FROM jsonb_populate_record(NULL::${sql.table(resource.table)}, ${JSON.stringify(columns)}::jsonb) AS t`.execute(
      this.db,
    );
    return rows[0]?.visible === true;
  }
}

interface StreamOptions extends AppServices {
  database: DatabaseHandle;
  registry: Registry;
}

/** The query of GET /api/events: filter[type] and page[after] (Last-Event-ID wins: it is where a reconnecting client is). */
function parseStreamQuery(request: FastifyRequest): { types?: Set<string>; after?: string } {
  const query = (request.query ?? {}) as Record<string, unknown>;
  const errors: ErrorObject[] = [];
  const bad = (parameter: string, detail: string, code = 'invalid_parameter') => errors.push(errorObject(400, code, detail, { parameter }));
  let types: Set<string> | undefined;
  let after: string | undefined;
  for (const [name, value] of Object.entries(query)) {
    if (name === 'filter' && value && typeof value === 'object' && !Array.isArray(value)) {
      for (const [key, raw] of Object.entries(value)) {
        if (key !== 'type') {
          bad(`filter[${key}]`, 'The event stream filters only by `filter[type]`.', 'invalid_filter');
          continue;
        }
        if (typeof raw !== 'string' || raw.trim() === '') {
          bad('filter[type]', 'Give a comma-separated list of event types, such as ConversationItem.created.', 'invalid_filter');
          continue;
        }
        const names = raw.split(',').map((t) => t.trim());
        const unknown = names.filter((t) => !eventTypes().has(t));
        if (unknown.length > 0) bad('filter[type]', `Unknown event types: ${unknown.join(', ')}.`, 'invalid_filter');
        types = new Set(names);
      }
    } else if (name === 'page' && value && typeof value === 'object' && !Array.isArray(value)) {
      for (const [key, raw] of Object.entries(value)) {
        if (key !== 'after') bad(`page[${key}]`, 'The event stream pages only by `page[after]` (an event id).', 'invalid_page');
        else if (typeof raw !== 'string' || !UUID_PATTERN.test(raw))
          bad('page[after]', '`page[after]` must be an event id.', 'invalid_page');
        else after = raw.toLowerCase();
      }
    } else {
      bad(name, `This endpoint does not take \`${name}\`; it takes filter[type] and page[after].`, 'unknown_parameter');
    }
  }
  const header = request.headers['last-event-id'];
  if (typeof header === 'string' && header.trim() !== '') {
    if (!UUID_PATTERN.test(header.trim())) {
      errors.push(errorObject(400, 'invalid_header', 'Last-Event-ID must be an event id.', { header: 'Last-Event-ID' }));
    } else {
      after = header.trim().toLowerCase();
    }
  }
  if (errors.length > 0) throw new ApiError(errors);
  return { types, after };
}

/** Registers GET /api/events; streams end when the server closes. */
export function registerEventStream(app: FastifyInstance, options: StreamOptions): EventHub {
  const { config } = options;
  const hub = new EventHub(options.database, (error) => app.log.warn({ err: error }, 'event stream: reading the outbox failed'));
  const open = new Set<() => void>();
  const perCredential = new Map<string, number>();

  app.addHook('preClose', async () => {
    for (const end of [...open]) end();
    await hub.close();
  });

  app.get('/api/events', { config: { allowVisitor: true } }, async (request: FastifyRequest, reply: FastifyReply) => {
    const principal = request.principal;
    if (!principal) throw ApiError.of(401, 'unauthenticated', 'A valid bearer token is required.');
    const { types, after } = parseStreamQuery(request);
    const credential = `${principal.credential}:${principal.credentialId}`;
    const held = perCredential.get(credential) ?? 0;
    if (held >= config.events.streamsPerCredential) {
      throw ApiError.of(
        429,
        'too_many_streams',
        `This credential holds ${held} event streams, the most allowed; close one first.`,
        undefined,
        { 'Retry-After': '5' },
      );
    }
    perCredential.set(credential, held + 1);
    const visibility = new Visibility(options.database.db, options.registry, principal);
    const raw = reply.raw;
    let ended = false;
    let live = false;
    let dirty = false;
    let lastSent = after;
    const queue: EventRow[] = [];
    let draining = false;
    let heartbeat: NodeJS.Timeout | undefined;
    let unsubscribe = () => {};

    const end = () => {
      if (ended) return;
      ended = true;
      clearInterval(heartbeat);
      unsubscribe();
      open.delete(end);
      const count = (perCredential.get(credential) ?? 1) - 1;
      if (count <= 0) perCredential.delete(credential);
      else perCredential.set(credential, count);
      raw.end();
    };
    /** Writes one chunk; a client whose unread bytes pass the bound is disconnected (it resumes with Last-Event-ID). */
    const write = (chunk: string) => {
      if (ended) return;
      raw.write(chunk);
      if (raw.writableLength > config.events.streamBufferBytes) {
        request.log.info({ buffered: raw.writableLength }, 'event stream: client too slow, disconnected');
        end();
        raw.destroy();
      }
    };
    const send = (row: EventRow) => {
      write(`id: ${row.id}\nevent: ${row.type}\ndata: ${row.json}\n\n`);
    };
    const wanted = (row: EventRow) => !types || types.has(row.type);

    /** Live rows, in order; those needing a row check wait their turn, so order is kept. */
    const drain = async () => {
      if (draining) return;
      draining = true;
      try {
        while (queue.length > 0 && !ended) {
          const row = queue.shift()!;
          const byType = visibility.byType(row.type);
          if (byType === true || (byType === undefined && (await visibility.visibleRow(row)))) send(row);
        }
      } catch (error) {
        request.log.warn({ err: error }, 'event stream: visibility check failed; the client will resume');
        end();
      } finally {
        draining = false;
      }
    };
    const listener: Listener = {
      offer(row) {
        if (ended) return;
        if (!live) {
          dirty = true;
          return;
        }
        if (lastSent !== undefined && row.id <= lastSent) return;
        lastSent = row.id;
        if (!wanted(row)) return;
        if (visibility.byType(row.type) === false) return;
        queue.push(row);
        if (queue.length > MAX_QUEUED) {
          request.log.info('event stream: client too slow, disconnected');
          end();
          raw.destroy();
          return;
        }
        void drain();
      },
    };

    open.add(end);
    raw.on('close', end);
    try {
      const subscription = await hub.subscribe(principal.organisationId, listener);
      unsubscribe = subscription.unsubscribe;
      lastSent ??= subscription.cursor;
    } catch (error) {
      end();
      throw error;
    }
    if (ended) return reply;

    reply.hijack();
    raw.writeHead(200, {
      ...(reply.getHeaders() as Record<string, string>),
      'Content-Type': 'text/event-stream; charset=utf-8',
      'Cache-Control': 'no-store',
      'X-Content-Type-Options': 'nosniff',
      // Proxies (nginx) must pass each message on at once.
      'X-Accel-Buffering': 'no',
      Connection: 'keep-alive',
    });
    // The comment opens the body at once, so the client sees the stream is live before the first event.
    raw.write(': connected\n\n');
    heartbeat = setInterval(() => write(': keep-alive\n\n'), config.events.heartbeatSeconds * 1000);
    heartbeat.unref();

    // Replay retained events after the client's last id, then go live; rows announced during a page make it read again.
    try {
      for (;;) {
        dirty = false;
        const rows = await readEvents(options.database.db, principal.organisationId, lastSent);
        for (const row of rows) {
          if (ended) return reply;
          lastSent = row.id;
          if (!wanted(row)) continue;
          const byType = visibility.byType(row.type);
          if (byType === true || (byType === undefined && (await visibility.visibleRow(row)))) send(row);
          if (raw.writableLength > 0 && raw.writableNeedDrain)
            await new Promise((resolve) => raw.once('drain', resolve).once('close', resolve));
        }
        if (ended) return reply;
        if (rows.length < PAGE && !dirty) break;
      }
      live = true;
    } catch (error) {
      request.log.warn({ err: error }, 'event stream: replay failed; the client will resume');
      end();
    }
    return reply;
  });
  methodNotAllowed(app, '/api/events', ['GET']);
  return hub;
}
