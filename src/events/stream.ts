/**
 * GET /api/events (docs/events.md): the organisation's events as server-sent events, those the caller may read.
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
import type { ServerResponse } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { CompiledQuery, sql } from 'kysely';
import type { DatabaseHandle } from '../db/connection.js';
import type { Db } from '../db/schema.js';
import { ApiError, errorObject, unauthenticated, type ErrorCode, type ErrorObject } from '../jsonapi/errors.js';
import { CREDENTIALS_CHANNEL, SharedRead } from '../auth/credential-cache.js';
import { addressGroup } from '../auth/throttle.js';
import { memberCredentialStands, standingPublishableKeys, tokenExpiryMs, visitorIssuer } from '../auth/stream-credentials.js';
import { memo } from '../jsonapi/memo.js';
import { EVENTS_CHANNEL } from '../jsonapi/outbox.js';
import type { Principal } from '../jsonapi/principal.js';
import type { Registry } from '../jsonapi/query/parse.js';
import { columnOf, type ResourceDef } from '../jsonapi/resource.js';
import { forVisitors } from '../jsonapi/serialize.js';
import { methodNotAllowed } from '../jsonapi/routes.js';
import { type AppServices, eventTypes } from '../jsonapi/index.js';
import { UUID_PATTERN } from '../jsonapi/validate.js';
import { registerTyping, TYPING_EVENT } from './typing.js';

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
  return (await db.executeQuery<EventRow>(CompiledQuery.raw(READ_EVENTS, [organisationId, after ?? null, limit]))).rows;
}

const READ_EVENTS = 'SELECT id, type, organisation_id, event_json AS json FROM parley_read_events($1::uuid, $2::uuid, $3::integer)';

/** The id of the organisation's last event, under the same lock as `readEvents` (undefined when none). */
async function lastEventId(db: Db, organisationId: string): Promise<string | undefined> {
  const { rows } = await sql<{ id: string | null }>`SELECT parley_last_event_id(${organisationId}::uuid) AS id`.execute(db);
  return rows[0]?.id ?? undefined;
}

interface Listener {
  /** Called with every new row of the organisation (or of `conversationId`), in order. */
  offer(row: EventRow): void;
  /**
   * A visitor's stream: only rows of this conversation (`routeOf`) are offered, found through a map, so an
   * event costs nothing for the visitors' streams of other conversations, however many there are.
   */
  conversationId?: string;
}

interface OrganisationState {
  cursor: string | undefined;
  ready: Promise<void>;
  /** Listeners offered every row. */
  listeners: Set<Listener>;
  /** Listeners offered only the rows of one conversation. */
  byConversation: Map<string, Set<Listener>>;
  size: number;
  running: boolean;
  again: boolean;
  /**
   * The organisation's last event id, read after the caller's listener was added (so every later event is
   * offered to it). A burst of new streams costs a few reads, not one each, and each read holds the
   * organisation's event lock (and so its writers) for one statement.
   */
  lastId: SharedRead<string | undefined>;
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
    /** The conversation a row belongs to, for listeners that want only one conversation's rows. */
    private readonly routeOf: (row: EventRow) => string | undefined = () => undefined,
  ) {}

  /** Adds a listener; resolves with the organisation's last event id when it was added (live starts after it). */
  async subscribe(organisationId: string, listener: Listener): Promise<{ cursor: string | undefined; unsubscribe: () => void }> {
    this.unlisten ??= this.database.listen(
      EVENTS_CHANNEL,
      (payload) => this.notified(payload),
      () => this.catchUpAll(),
    );
    await this.unlisten.catch((error) => {
      // The next stream tries again.
      this.unlisten = undefined;
      throw error;
    });
    this.sweep ??= setInterval(() => this.catchUpAll(), SWEEP_MS).unref();
    let state = this.organisations.get(organisationId);
    const fresh = !state;
    if (!state) {
      const created: OrganisationState = {
        cursor: undefined,
        ready: Promise.resolve(),
        listeners: new Set(),
        byConversation: new Map(),
        size: 0,
        running: false,
        again: false,
        lastId: new SharedRead(() => lastEventId(this.database.db, organisationId)),
      };
      // Listening already, so any event after this snapshot is announced; the cursor starts at the snapshot.
      created.ready = lastEventId(this.database.db, organisationId).then((id) => {
        created.cursor = id;
      });
      // A snapshot that failed is not kept: the next stream takes it again.
      created.ready.catch(() => this.organisations.get(organisationId) === created && this.organisations.delete(organisationId));
      this.organisations.set(organisationId, created);
      state = created;
    }
    await state.ready;
    // The last stream of the organisation may have left while this one waited (its unsubscribe found the
    // state empty and dropped it): a listener added to the dropped state would never be offered a row.
    if (this.organisations.get(organisationId) !== state) return this.subscribe(organisationId, listener);
    const current = state;
    const { conversationId } = listener;
    const set = conversationId === undefined ? current.listeners : memo(current.byConversation, conversationId, () => new Set());
    set.add(listener);
    current.size++;
    const remove = () => {
      if (!set.delete(listener)) return;
      current.size--;
      if (set.size === 0 && conversationId !== undefined) current.byConversation.delete(conversationId);
    };
    // The hub learns of commits shortly after they happen (outbox.ts): a stream starts after the last event
    // committed before it opened, even if the hub has not read it yet (the stream skips what it has passed).
    let cursor = current.cursor;
    if (!fresh) {
      const last = await current.lastId.read().catch((error) => {
        remove();
        throw error;
      });
      if (last && (!cursor || last > cursor)) cursor = last;
    }
    return {
      cursor,
      unsubscribe: () => {
        remove();
        if (current.size === 0 && this.organisations.get(organisationId) === current) this.organisations.delete(organisationId);
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
        // On a connection of its own where there is one: through the pool, the read of what a write committed
        // queued behind the writes that followed it (readAside).
        rows = this.database.readAside
          ? await this.database.readAside<EventRow>(READ_EVENTS, [organisationId, state.cursor ?? null, PAGE])
          : await readEvents(this.database.db, organisationId, state.cursor);
        for (const row of rows) {
          state.cursor = row.id;
          for (const listener of state.listeners) listener.offer(row);
          if (state.byConversation.size === 0) continue;
          const conversationId = this.routeOf(row);
          const routed = conversationId === undefined ? undefined : state.byConversation.get(conversationId);
          if (routed) for (const listener of routed) listener.offer(row);
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

const message = (row: EventRow, json: string) => `id: ${row.id}\nevent: ${row.type}\ndata: ${json}\n\n`;
const messages = new WeakMap<EventRow, Buffer>();
/** A row's message as every member stream shows it, encoded once for all of them (rows are shared). */
const messageBytes = (row: EventRow) => memo(messages, row, () => Buffer.from(message(row, row.json)));

/** The resource type of an event type (`ConversationItem.created` -> `ConversationItem`). */
const resourceTypeOf = (type: string) => type.slice(0, type.lastIndexOf('.'));

/**
 * An event's record put back into the columns its attributes come from, made once per row for every stream
 * of the process (rows are shared): the record as the event shows it, even when it has since changed or
 * been deleted.
 */
const columnsByRow = new WeakMap<EventRow, Record<string, unknown>>();
function columnsOf(row: EventRow, resource: ResourceDef): Record<string, unknown> {
  return memo(columnsByRow, row, () => {
    const event = JSON.parse(row.json) as { data: { id: string; attributes?: Record<string, unknown> } };
    const columns: Record<string, unknown> = { id: event.data.id, organisation_id: row.organisation_id };
    for (const [name, def] of Object.entries(resource.attributes)) {
      if (def.expression || def.writeOnly || def.revealedOnCreate) continue;
      const value = event.data.attributes?.[name];
      if (value !== undefined) columns[columnOf(name, def)] = value;
    }
    return columns;
  });
}

/** The conversation a row belongs to for visitors (`Scope.visitorConversationColumn`), if its type has one. */
export function conversationOfRow(registry: Registry, row: EventRow): string | undefined {
  const resource = registry.get(resourceTypeOf(row.type));
  const column = resource?.access.visible?.visitorConversationColumn;
  if (!resource || !column) return undefined;
  const value = columnsOf(row, resource)[column];
  return typeof value === 'string' ? value : undefined;
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
    return memo(this.perType, resourceType, () => {
      const resource = this.registry.get(resourceType);
      return resource?.access.read.includes(this.principal.role)
        ? { resource, rowCheck: resource.access.visible?.(this.principal, 't') !== undefined }
        : null;
    });
  }

  /** Undefined: decided without the record; else the record must be checked (`visibleRow`). */
  byType(type: string): boolean | undefined {
    const rule = this.rule(resourceTypeOf(type));
    if (!rule) return false;
    // An event that exists to announce what visitors do not read (`Conversation.analysed`) is not theirs.
    if (this.principal.role === 'visitor' && rule.resource.eventsHiddenFromVisitors?.includes(type.slice(type.lastIndexOf('.') + 1)))
      return false;
    return rule.rowCheck ? undefined : true;
  }

  /** Whether the event may be sent: by its type, else by its record (`visibleRow`). */
  visible(row: EventRow): boolean | Promise<boolean> {
    const byType = this.byType(row.type);
    return byType === undefined ? this.visibleRow(row) : byType;
  }

  /**
   * The role's row condition evaluated on the event's record (`columnsOf`). Where the rule is a plain
   * comparison (`Scope.onColumns`: a visitor's conversation, an operator's own rows) it is judged here,
   * without a query, so a stream costs no statement per event (docs/hardening.md, "Third review: event
   * streams"); otherwise the same SQL the reads use runs on the record (jsonb_populate_record).
   */
  visibleRow(row: EventRow): boolean | Promise<boolean> {
    const { resource } = this.rule(resourceTypeOf(row.type))!;
    const columns = columnsOf(row, resource);
    const scope = resource.access.visible!;
    if (scope.onColumns) return scope.onColumns(this.principal, columns) !== false;
    const condition = scope(this.principal, 't')!;
    return sql<{ visible: boolean }>`
      SELECT (${condition}) AS visible FROM jsonb_populate_record(NULL::${sql.table(resource.table)}, ${JSON.stringify(columns)}::jsonb) AS t`
      .execute(this.db)
      .then(({ rows }) => rows[0]?.visible === true);
  }
}

interface StreamOptions extends AppServices {
  database: DatabaseHandle;
  registry: Registry;
}

/** The query of GET /api/events: filter[type] and page[after] (Last-Event-ID wins: it is where a reconnecting client is). */
function parseStreamQuery(request: FastifyRequest, registry: Registry): { types?: Set<string>; after?: string } {
  const query = (request.query ?? {}) as Record<string, unknown>;
  const errors: ErrorObject[] = [];
  const bad = (parameter: string, detail: string, code: ErrorCode = 'invalid_parameter') =>
    errors.push(errorObject(code, detail, { parameter }));
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
        const unknown = names.filter((t) => !eventTypes(registry).has(t) && t !== TYPING_EVENT);
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
      errors.push(errorObject('invalid_header', 'Last-Event-ID must be an event id.', { header: 'Last-Event-ID' }));
    } else {
      after = header.trim().toLowerCase();
    }
  }
  if (errors.length > 0) throw new ApiError(errors);
  return { types, after };
}

/** What ends a stream besides the client: the credential's revocation or expiry, or the server closing. */
type EndReason = 'credential' | 'expired' | 'slow' | 'server' | 'failed' | 'client';

interface OpenStream {
  principal: Principal;
  /** The bearer token the stream was opened with. */
  token: string;
  /** For a visitor: `organisation:publishable key id` of the key that issued its credential. */
  issuer?: string;
  end(reason: EndReason): void;
  heartbeat(): void;
}

const CLOSING: Record<EndReason, string> = {
  credential: 'credential no longer valid',
  expired: 'credential expired',
  server: 'server closing',
  failed: 'stream failed; resume with Last-Event-ID',
  slow: '',
  client: '',
};

/** The longest delay a Node.js timer takes (about 24.8 days); a later expiry is reached in steps. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Registers GET /api/events. A stream ends when the server closes, when its client is too slow, and when its
 * credential ends (docs/events.md, "Ends"): at the token's `exp`, or once a credential change the database
 * announces leaves it no longer standing as it was when the stream opened.
 */
export function registerEventStream(app: FastifyInstance, options: StreamOptions): void {
  const { config } = options;
  const limits = config.events;
  const hub = new EventHub(
    options.database,
    (error) => app.log.warn({ err: error }, 'event stream: reading the outbox failed'),
    (row) => conversationOfRow(options.registry, row),
  );
  const open = new Set<OpenStream>();
  // Typing signals (typing.ts): ephemeral, never in the outbox; handed to the live streams below.
  const typing = registerTyping(app, options);
  /** Open streams per cap: `credential:`, `user:`, `organisation:` or `address:` and whose. */
  const held = new Map<string, number>();
  let heartbeats: NodeJS.Timeout | undefined;
  /** Set when the server starts closing: a request still on its way to its stream is answered 503 instead. */
  let closing = false;
  let watching: Promise<() => Promise<void>> | undefined;
  let checking = false;
  let checkAgain = false;

  /**
   * Checks every open stream's credential again (after a credential change, or when the listening connection
   * is back and changes may have been missed): each distinct member credential once, with the full check a
   * request gets, and the publishable keys behind all visitor streams in one statement. A stream whose
   * credential no longer stands, or stands with another role (its visibility was decided by the old one), ends.
   * Changes announced meanwhile make it check again, so the last change is always judged after its commit.
   */
  const recheck = async () => {
    if (checking) {
      checkAgain = true;
      return;
    }
    checking = true;
    try {
      do {
        checkAgain = false;
        const members = new Map<string, OpenStream[]>();
        const visitors = new Map<string, OpenStream[]>();
        for (const stream of open) {
          const group = stream.issuer === undefined ? members : visitors;
          memo(group, stream.issuer ?? stream.token, () => []).push(stream);
        }
        if (visitors.size > 0) {
          const standing = await standingPublishableKeys(options.database.db, visitors.keys());
          for (const [issuer, streams] of visitors) if (!standing.has(issuer)) for (const s of streams) s.end('credential');
        }
        const pending = [...members.values()];
        const worker = async () => {
          for (let streams = pending.pop(); streams; streams = pending.pop()) {
            const { token, principal } = streams[0];
            if (!(await memberCredentialStands(options.database.db, options, token, principal)))
              for (const s of streams) s.end('credential');
          }
        };
        await Promise.all(Array.from({ length: Math.min(4, pending.length) }, worker));
      } while (checkAgain);
    } catch (error) {
      // The credentials could not be judged: end the streams rather than serve them unchecked; their clients
      // reconnect with Last-Event-ID and are authenticated afresh.
      app.log.warn({ err: error }, 'event stream: checking credentials failed; streams closed');
      for (const stream of [...open]) stream.end('failed');
    } finally {
      checking = false;
    }
  };
  /** When the last credential change was announced (or changes may have been missed). */
  let lastCredentialChange = 0;
  const changed = () => {
    lastCredentialChange = Date.now();
    void recheck();
  };
  const watchCredentials = () => {
    watching ??= options.database.listen(CREDENTIALS_CHANNEL, changed, changed);
    return watching.catch((error) => {
      watching = undefined;
      throw error;
    });
  };

  // Listening from the start, so that a change committed while a stream's request is being authenticated is
  // heard (see `lastCredentialChange` in the handler).
  app.addHook('onReady', async () => {
    await watchCredentials().catch((error) => app.log.warn({ err: error }, 'event stream: not listening for credential changes yet'));
  });
  app.addHook('preClose', async () => {
    closing = true;
    for (const stream of [...open]) stream.end('server');
    clearInterval(heartbeats);
    const unwatch = watching;
    watching = undefined;
    if (unwatch) await (await unwatch.catch(() => async () => {}))();
    await hub.close();
  });

  app.get('/api/events', { config: { allowVisitor: true } }, async (request: FastifyRequest, reply: FastifyReply) => {
    const principal = request.principal;
    if (!principal) throw ApiError.of('unauthenticated', 'A valid bearer token is required.');
    const { types, after } = parseStreamQuery(request, options.registry);
    const token = /^Bearer +(\S+)$/.exec(request.headers.authorization ?? '')![1];
    const expiresAt = tokenExpiryMs(token);
    // The caps: per credential, per user across all of their credentials, per organisation and per client
    // address (docs/events.md, "Caps"); counted in this process, where the sockets and memory are.
    const caps: [string, number, string][] = [
      [`credential:${principal.credential}:${principal.credentialId}`, limits.streamsPerCredential, 'This credential'],
      [`user:${principal.organisationId}:${principal.userId}`, limits.streamsPerUser, 'This user'],
      [`organisation:${principal.organisationId}`, limits.streamsPerOrganisation, 'This organisation'],
      [`address:${addressGroup(request.ip, 32)}`, limits.streamsPerAddress, 'This client address'],
    ];
    for (const [key, max, who] of caps) {
      const count = held.get(key) ?? 0;
      if (count >= max) {
        throw ApiError.of('too_many_streams', `${who} holds ${count} event streams, the most allowed; close one first.`, undefined, {
          'Retry-After': '5',
        });
      }
    }
    await watchCredentials();
    for (const [key] of caps) held.set(key, (held.get(key) ?? 0) + 1);
    const visibility = new Visibility(options.database.db, options.registry, principal);
    const raw = reply.raw;
    let ended: EndReason | undefined;
    let hijacked = false;
    let live = false;
    let dirty = false;
    let lastSent = after;
    const queue: EventRow[] = [];
    let draining = false;
    let expiry: NodeJS.Timeout | undefined;
    let unsubscribe = () => {};
    let unsubscribeTyping = () => {};

    const end = (reason: EndReason) => {
      if (ended) return;
      ended = reason;
      clearTimeout(expiry);
      unsubscribe();
      unsubscribeTyping();
      open.delete(stream);
      for (const [key] of caps) {
        const left = held.get(key)! - 1;
        if (left > 0) held.set(key, left);
        else held.delete(key);
      }
      // Before the stream began, the handler answers (below): a credential that ended meanwhile is a 401.
      if (!hijacked) return;
      if (reason === 'slow' || reason === 'client') {
        raw.destroy();
        return;
      }
      // A comment says why before the end, for whoever reads the stream by hand; clients reconnect, and a
      // revoked or expired credential is then refused with 401.
      if (reason === 'credential' || reason === 'expired') request.log.info({ reason }, 'event stream: credential ended');
      if (raw.headersSent && !raw.destroyed) raw.write(`: closed: ${CLOSING[reason]}\n\n`);
      raw.end();
    };
    /** Writes one chunk; a client whose unread bytes pass the bound is disconnected (it resumes with Last-Event-ID). */
    const write = (chunk: string | Buffer) => {
      if (ended) return;
      raw.write(chunk);
      if (raw.writableLength > limits.streamBufferBytes) {
        request.log.info({ buffered: raw.writableLength }, 'event stream: client too slow, disconnected');
        end('slow');
      }
    };
    const send = (row: EventRow) => {
      // A visitor's copy leaves out the attributes hidden from visitors (a conversation's `analysis`).
      const resource = principal.role === 'visitor' ? options.registry.get(resourceTypeOf(row.type)) : undefined;
      write(resource ? message(row, forVisitors(resource, row.json)) : messageBytes(row));
    };
    const wanted = (row: EventRow) => !types || types.has(row.type);
    const stream: OpenStream = {
      principal,
      token,
      issuer: principal.credential === 'visitor' ? visitorIssuer(token, principal.organisationId) : undefined,
      end,
      heartbeat: () => {
        if (raw.headersSent) write(': keep-alive\n\n');
      },
    };

    /** Live rows, in order; those needing a row check wait their turn, so order is kept. */
    const drain = async () => {
      if (draining) return;
      draining = true;
      try {
        while (queue.length > 0 && !ended) {
          const row = queue.shift()!;
          const visible = visibility.visible(row);
          if (visible === true || (visible !== false && (await visible))) send(row);
        }
      } catch (error) {
        request.log.warn({ err: error }, 'event stream: visibility check failed; the client will resume');
        end('failed');
      } finally {
        draining = false;
      }
    };
    const listener: Listener = {
      conversationId: principal.credential === 'visitor' ? principal.conversationId : undefined,
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
          end('slow');
          return;
        }
        void drain();
      },
    };

    open.add(stream);
    // A credential change announced since this request began may have come after its credential was read
    // and before the stream was in `open`, where the check looks: check again.
    if (lastCredentialChange >= Date.now() - reply.elapsedTime - 1) void recheck();
    raw.on('close', () => end('client'));
    // The stream lives no longer than its token (a visitor's, a session's, a key's expiry).
    const armExpiry = () => {
      const left = expiresAt - Date.now();
      if (left <= 0) end('expired');
      else if (Number.isFinite(left))
        expiry = setTimeout(left > MAX_TIMER_MS ? armExpiry : () => end('expired'), Math.min(left, MAX_TIMER_MS));
    };
    armExpiry();
    try {
      await typing.ready();
      // A request that began before the server started closing, and reached here after its streams were ended.
      if (closing) end('server');
      if (!ended) {
        const subscription = await hub.subscribe(principal.organisationId, listener);
        unsubscribe = subscription.unsubscribe;
        lastSent ??= subscription.cursor;
      }
    } catch (error) {
      end('failed');
      throw error;
    }
    if (closing) end('server');
    // Ended while subscribing: its listener was added after `end` ran, so it goes now. The request is answered
    // rather than left open (an async handler that returns an unsent reply keeps its connection waiting, and a
    // server closing meanwhile would wait for it until the client gave up).
    if (ended) unsubscribe();
    if (ended === 'credential' || ended === 'expired') throw unauthenticated('The bearer token is invalid or expired.');
    if (ended) throw ApiError.of('unavailable', 'The server is closing; reconnect shortly.', undefined, { 'Retry-After': '1' });

    // Typing, live only and without an id (never replayed): a visitor hears the others in its conversation, a
    // member every conversation their role reads; nobody hears their own signal.
    if (wanted({ type: TYPING_EVENT } as EventRow) && visibility.byType('Conversation.updated') !== false) {
      // A visitor's stream is subscribed to its conversation's signals only (TypingHub), so the organisation's
      // other signals never reach it; the conversation check stays as a guard.
      const visitor = principal.credential === 'visitor';
      unsubscribeTyping = typing.subscribe(
        principal.organisationId,
        (signal, json) => {
          if (!live || ended) return;
          if (visitor) {
            if (signal.conversation_id !== principal.conversationId || signal.role === 'visitor') return;
          } else if (signal.user_id === principal.userId) return;
          write(`event: ${TYPING_EVENT}\ndata: ${json}\n\n`);
        },
        visitor ? principal.conversationId : undefined,
      );
    }

    reply.hijack();
    hijacked = true;
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
    // One timer for every stream of the process, rather than one each; it writes to 500 streams at a time and
    // lets the event loop run in between, so 10,000 streams' heartbeats do not hold up events for a whole pass.
    heartbeats ??= setInterval(() => {
      const streams = [...open];
      let next = 0;
      const step = () => {
        for (const stop = Math.min(next + 500, streams.length); next < stop; next++) streams[next].heartbeat();
        if (next < streams.length) setImmediate(step);
      };
      step();
    }, limits.heartbeatSeconds * 1000).unref();

    // Without a Last-Event-ID, and with no row offered since the subscription's snapshot, every later event
    // comes live: no replay read (a burst of new streams would otherwise cost a statement each).
    if (after === undefined && !dirty) {
      live = true;
      return reply;
    }
    // Replay retained events after the client's last id, then go live; rows announced during a page make it
    // read again. A client that takes nothing for a heartbeat interval while the replay waits for it to drain
    // is cut, as is one whose unread bytes pass EVENTS_STREAM_BUFFER_BYTES (`write`): otherwise a client that
    // never reads would hold its page of rows and its socket for as long as it stays connected.
    try {
      for (;;) {
        dirty = false;
        const rows = await readEvents(options.database.db, principal.organisationId, lastSent);
        for (const row of rows) {
          if (ended) return reply;
          lastSent = row.id;
          if (!wanted(row)) continue;
          const visible = visibility.visible(row);
          if (visible === true || (visible !== false && (await visible))) send(row);
          if (!ended && raw.writableNeedDrain && !(await drained(raw, limits.heartbeatSeconds * 1000))) {
            request.log.info({ buffered: raw.writableLength }, 'event stream: client took nothing during replay, disconnected');
            end('slow');
          }
        }
        if (ended) return reply;
        if (rows.length < PAGE && !dirty) break;
      }
      live = true;
    } catch (error) {
      request.log.warn({ err: error }, 'event stream: replay failed; the client will resume');
      end('failed');
    }
    return reply;
  });
  methodNotAllowed(app, '/api/events', ['GET']);
}

/** Resolves true once the socket has drained (or closed), false when `ms` pass first. */
function drained(raw: ServerResponse, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    const done = (value: boolean) => {
      clearTimeout(timer);
      raw.off('drain', onDrain).off('close', onDrain);
      resolve(value);
    };
    const onDrain = () => done(true);
    const timer = setTimeout(() => done(false), ms);
    raw.once('drain', onDrain).once('close', onDrain);
  });
}
