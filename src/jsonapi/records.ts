/**
 * The one write path. Every writer (HTTP routes, the command line, the demo
 * seed, the agent runtime, the SIP edge, webhooks) creates, updates and
 * deletes records through this transport-free service, with an actor that is
 * a principal or the system. It runs the declared validation, defaults,
 * reference checks, uniqueness mapping and the transaction, and returns the
 * stored record rendered as a GET renders it. Nothing else writes to resource
 * tables, so whatever must happen on every change (events) happens here once.
 */
import { sql } from 'kysely';
import { inTransaction, type Database } from '../db/connection.js';
import { principalOf, systemActor, type Actor } from './actor.js';
import { queueEvent, type EventAction } from './outbox.js';
import { ApiError, errorObject, forbidden, notFound } from './errors.js';
import { ROLES } from './principal.js';
import type { Registry } from './query/parse.js';
import { fetchById, type Reader } from './read.js';
import type { ActionContext, ActionResult, AttributeDef, ResourceDef } from './resource.js';
import { mayPerform, requirePermission, rowScope } from './scope.js';
import { selectList } from './select.js';
import { renderResource, type Row } from './serialize.js';
import type { AppServices } from './services.js';
import { validateAttributes } from './validate.js';
import { applyDefaults, checkReferences, columnValues, eventBaseUrl, insertRecord, runTransaction, STORED_VISIBLE } from './write.js';

/** Renders the written record inside the transaction: once COMMIT succeeds nothing can fail any more. */
export type RenderWritten<T> = (trx: Database, result: ActionResult) => Promise<T>;

export interface WriteOptions<T> {
  /** How to render the stored record (HTTP: the request's document); default: the resource object. */
  render?: RenderWritten<T>;
  /** An update's further event, one of the type's `extraEvents` (`analysed`), queued after its `updated` event. */
  event?: string;
}

export interface Written<T = Row> {
  id: string;
  /** 201 for a new record, 200 for an existing one (idempotent repeats, upserts, updates). */
  status: 200 | 201;
  record: T;
}

export interface Deleted {
  id: string;
  /** Exact counts of the records the delete removed, by type (the record itself and any cascade). */
  removed: Record<string, number>;
}

export interface Records {
  create<T = Row>(actor: Actor, type: string, values: Record<string, unknown>, options?: WriteOptions<T>): Promise<Written<T>>;
  update<T = Row>(actor: Actor, type: string, id: string, values: Record<string, unknown>, options?: WriteOptions<T>): Promise<Written<T>>;
  delete(actor: Actor, type: string, id: string): Promise<Deleted>;
  /**
   * Runs the type's custom action `name` (on record `id` for a member action). `input` may be a function, called
   * once the record is locked and the role checked, so that a body's problems come after 404 and 403.
   */
  perform<T = Row>(
    actor: Actor,
    type: string,
    name: string,
    id: string | undefined,
    input: Record<string, unknown> | (() => Record<string, unknown>),
    options?: WriteOptions<T> & { clientAddress?: string; signal?: AbortSignal },
  ): Promise<Written<T> & { meta?: Record<string, unknown> }>;
  /** Several writes in one transaction (e.g. a call with its conversation and participants). */
  transaction<T>(work: (records: Records) => Promise<T>): Promise<T>;
}

interface RecordsOptions {
  db: Database;
  registry: Registry;
  services: AppServices;
}

/** Attributes a write accepts, and those it requires: the declared create/update flags; for the system every stored one. */
export function acceptedAttributes(attributes: Record<string, AttributeDef>, kind: 'create' | 'update', system = false) {
  const accepted: Record<string, AttributeDef> = {};
  const required: string[] = [];
  for (const [name, def] of Object.entries(attributes)) {
    const flag = kind === 'update' ? def.update : def.create;
    if ((def.expression && !def.storedByHook) || def.revealedOnCreate) continue;
    if (!flag && !system) continue;
    accepted[name] = def;
    if (kind === 'create' && flag === 'required') required.push(name);
  }
  return { accepted, required };
}

export function createRecords(options: RecordsOptions): Records {
  return bind(options, options.db);
}

function bind(options: RecordsOptions, db: Database): Records {
  const { registry, services } = options;

  const resourceOf = (type: string): ResourceDef => {
    const resource = registry.get(type);
    if (!resource) throw new Error(`records: no resource type ${type}`);
    return resource;
  };

  /** The resource object as a GET renders it, seen by the actor. */
  const plainRender =
    (actor: Actor, resource: ResourceDef) =>
    async (trx: Database, result: ActionResult): Promise<Row> => {
      const principal = principalOf(actor);
      const row = await writtenRow({ db: trx, principal, registry }, resource, result);
      const baseUrl = eventBaseUrl(services);
      const revealed = result.revealed ? new Map([[result.id, result.revealed]]) : undefined;
      return renderResource(resource, row, { baseUrl, principal, registry, fields: new Map(), revealed });
    };

  /**
   * Queues the change's event (the outbox, src/jsonapi/outbox.ts): the record as a GET by the organisation
   * renders it (its members' roles are applied when the event is read), never a write-only or shown-once value.
   */
  const emit = async (trx: Database, actor: Actor, resource: ResourceDef, action: EventAction | string, id: string, rendered?: Row) => {
    if (resource.events === false) return;
    const organisationId = principalOf(actor).organisationId;
    const data = rendered ?? (await plainRender(systemActor(organisationId, 'engine'), resource)(trx, { id, status: 200 }));
    await queueEvent(trx, { organisationId, type: `${resource.type}.${action}`, occurredAt: new Date(), data });
  };

  const records: Records = {
    async create<T>(actor: Actor, type: string, input: Record<string, unknown>, opts: WriteOptions<T> = {}) {
      const resource = resourceOf(type);
      const principal = principalOf(actor);
      const system = actor.kind === 'system';
      if (!system) requirePermission(resource, principal, 'create');
      const { accepted, required } = acceptedAttributes(resource.attributes, 'create', system);
      const values = validateAttributes(input, accepted, required);
      const render = (opts.render ?? plainRender(actor, resource)) as RenderWritten<T>;
      return runTransaction(db, resource, async (trx) => {
        const provided = new Set(Object.keys(values));
        // The event with the record, when the create is its own transaction: the insert is then its last
        // statement before COMMIT, where events take their ids (outbox.ts). In a larger transaction, the commit hook.
        const eventOnInsert =
          resource.events === false || db.isTransaction ? undefined : { type: `${resource.type}.created`, occurredAt: new Date() };
        const ctx: ActionContext = {
          db: trx,
          services,
          principal,
          actor,
          records: bind(options, trx),
          resource,
          values,
          provided,
          registry,
          eventOnInsert,
        };
        await checkReferences({ db: trx, principal, registry }, resource.attributes, values);
        applyDefaults(resource, values);
        await resource.beforeInsert?.(ctx);
        const result = resource.create ? await resource.create(ctx) : await insertRecord(ctx);
        // 201: a new record; 200: an upsert that updated one, or an idempotent repeat that changed nothing.
        const record = await render(trx, result);
        // The system's plain rendering is the organisation's view: the event reuses it (unless it shows a value once).
        const same = !opts.render && actor.kind === 'system' && !result.revealed;
        if (!result.unchanged && !result.evented)
          await emit(trx, actor, resource, result.status === 201 ? 'created' : 'updated', result.id, same ? (record as Row) : undefined);
        return { id: result.id, status: result.status, record };
      });
    },

    async update<T>(actor: Actor, type: string, id: string, input: Record<string, unknown>, opts: WriteOptions<T> = {}) {
      const resource = resourceOf(type);
      const principal = principalOf(actor);
      const system = actor.kind === 'system';
      if (!system) requirePermission(resource, principal, 'read');
      const { accepted } = acceptedAttributes(resource.attributes, 'update', system);
      const render = (opts.render ?? plainRender(actor, resource)) as RenderWritten<T>;
      return runTransaction(db, resource, async (trx) => {
        // A system write that no hook checks against the stored row needs no locking read first: the UPDATE finds
        // the row in the organisation (404 when it does not) and returns it rendered, one statement for the three.
        const existing = system && !resource.beforeUpdate ? undefined : await lockVisible(trx, resource, principal, id);
        // 404 before 403: a record the caller cannot see is not revealed by the refusal.
        if (!system) requirePermission(resource, principal, 'update');
        if (!system) await assertWritable(trx, resource, principal, id);
        const values = validateAttributes(input, accepted, []);
        const provided = new Set(Object.keys(values));
        const ctx: ActionContext = {
          db: trx,
          services,
          principal,
          actor,
          records: bind(options, trx),
          resource,
          values,
          provided,
          existing,
          registry,
        };
        await checkReferences({ db: trx, principal, registry }, resource.attributes, values);
        await resource.beforeUpdate?.(ctx);
        const columns = columnValues(resource, values);
        const row = Object.keys(columns).length > 0 ? await updateRecord(ctx, id, { ...columns, updated_at: new Date() }) : undefined;
        const record = await render(trx, { id, status: 200, row });
        const same = !opts.render && actor.kind === 'system' ? (record as Row) : undefined;
        if (Object.keys(columns).length > 0 || ctx.storedElsewhere) await emit(trx, actor, resource, 'updated', id, same);
        if (opts.event !== undefined) {
          if (!resource.extraEvents?.includes(opts.event)) throw new Error(`records: ${resource.type} has no event ${opts.event}`);
          await emit(trx, actor, resource, opts.event, id, same);
        }
        return { id, status: 200 as const, record };
      });
    },

    async delete(actor: Actor, type: string, id: string) {
      const resource = resourceOf(type);
      const principal = principalOf(actor);
      const system = actor.kind === 'system';
      if (!system) requirePermission(resource, principal, 'read');
      return runTransaction(db, resource, async (trx) => {
        const existing = await lockVisible(trx, resource, principal, id);
        if (!system && !mayPerform(resource, principal, 'delete')) throw forbidden(`Your role may not delete ${resource.type} records.`);
        if (!system) await assertWritable(trx, resource, principal, id);
        const ctx: ActionContext = {
          db: trx,
          services,
          principal,
          actor,
          records: bind(options, trx),
          resource,
          values: {},
          provided: new Set(),
          existing,
          registry,
        };
        // The deleted event carries the record as it was, rendered before anything goes.
        const before =
          resource.events === false
            ? undefined
            : await plainRender(systemActor(principal.organisationId, 'engine'), resource)(trx, { id, status: 200 });
        const removed: Record<string, number> = (await resource.beforeDelete?.(ctx)) ?? {};
        if (resource.remove) {
          // The resource removes what the record is (and takes along what it means to); its counts are exact.
          for (const [type, count] of Object.entries(await resource.remove(ctx))) removed[type] = (removed[type] ?? 0) + count;
          // Its removal is an event like any delete's (a member's removal is what a webhook audit must see).
          await emit(trx, actor, resource, 'deleted', id, before);
          return { id, removed };
        }
        await refuseWhileReferenced(trx, registry, resource, id);
        await trx.deleteFrom(resource.table).where('id', '=', id).execute();
        removed[resource.type] = (removed[resource.type] ?? 0) + 1;
        await emit(trx, actor, resource, 'deleted', id, before);
        return { id, removed };
      });
    },

    async perform<T>(
      actor: Actor,
      type: string,
      name: string,
      id: string | undefined,
      input: Record<string, unknown> | (() => Record<string, unknown>),
      opts: WriteOptions<T> & { clientAddress?: string; signal?: AbortSignal } = {},
    ) {
      const resource = resourceOf(type);
      const action = resource.actions?.[name];
      if (!action || (action.member && id === undefined))
        throw new Error(`records: no action ${name} on ${type}${id ? '' : ' without an id'}`);
      const principal = principalOf(actor);
      const system = actor.kind === 'system';
      const render = (opts.render ?? plainRender(actor, resource)) as RenderWritten<T>;
      const run = async (trx: Database) => {
        const existing = action.member && id ? await lockVisible(trx, resource, principal, id) : undefined;
        if (!system && !(action.roles ?? ROLES).includes(principal.role)) throw forbidden();
        if (existing && id && !system) await assertWritable(trx, resource, principal, id);
        const { accepted, required } = acceptedAttributes(action.input, 'create');
        const values = typeof input === 'function' ? input() : validateAttributes(input, accepted, required);
        await checkReferences({ db: trx, principal, registry }, action.input, values);
        const provided = new Set(Object.keys(values));
        const ctx = { db: trx, services, principal, actor, records: bind(options, trx), resource, values, provided, existing, registry };
        const signal = opts.signal ?? new AbortController().signal;
        const result = await action.run({ ...ctx, clientAddress: opts.clientAddress ?? '', signal });
        const record = await render(trx, result);
        if (existing && !result.unchanged)
          await emit(trx, actor, resource, 'updated', result.id, !opts.render && system ? (record as Row) : undefined);
        return { id: result.id, status: result.status, record, meta: result.meta };
      };
      return action.transaction === false ? run(db) : runTransaction(db, resource, run);
    },

    async transaction<T>(work: (records: Records) => Promise<T>): Promise<T> {
      if (db.isTransaction) return work(records);
      // The writes inside map their own errors; the outer transaction only commits them together.
      return inTransaction(db, (trx) => work(bind(options, trx)));
    },
  };
  return records;
}

/**
 * The written record as `reader` reads it: the row the write returned (`ActionResult.row`, the actor's select
 * list) when it has one, else read back; 404 when the reader's scope does not cover it.
 */
export async function writtenRow(reader: Reader, resource: ResourceDef, result: ActionResult): Promise<Row> {
  if (result.row) {
    const { [STORED_VISIBLE]: visible, ...row } = result.row;
    if (!visible) throw notFound();
    return row;
  }
  const row = await fetchById(reader, resource, result.id);
  if (!row) throw notFound();
  return row;
}

/**
 * Updates `columns` of the row `id` when the principal's row scope covers it (else 404), and returns it as
 * `insertRecord` does: the actor's select list, in the same statement.
 */
async function updateRecord(ctx: ActionContext, id: string, columns: Record<string, unknown>): Promise<Row> {
  const { resource, principal } = ctx;
  const names = Object.keys(columns).filter((name) => columns[name] !== undefined);
  const { rows } = await sql<Row>`
    WITH t AS (
      UPDATE ${sql.table(resource.table)} u SET ${sql.join(names.map((name) => sql`${sql.id(name)} = ${columns[name]}`))}
      WHERE u.id = ${id} AND ${rowScope(resource, principal, 'u')} RETURNING u.*
    )
    SELECT ${selectList(resource, principal, ctx.registry)}, ${rowScope(resource, principal)} AS ${sql.id(STORED_VISIBLE)} FROM t`.execute(
    ctx.db,
  );
  if (!rows[0]) throw notFound();
  return rows[0];
}

/** The visible row, locked for the rest of the transaction; 404 when the actor cannot see it. */
async function lockVisible(trx: Database, resource: ResourceDef, principal: ReturnType<typeof principalOf>, id: string) {
  const { rows } = await sql<Record<string, unknown>>`
    SELECT t.* FROM ${sql.table(resource.table)} t
    WHERE t.id = ${id} AND ${rowScope(resource, principal)} FOR UPDATE`.execute(trx);
  if (!rows[0]) throw notFound();
  return rows[0];
}

/** A visible record outside the role's `access.writable` rows (another member's user record, for an operator) is a 403. */
export async function assertWritable(
  db: Database,
  resource: ResourceDef,
  principal: ReturnType<typeof principalOf>,
  id: string,
): Promise<void> {
  const writable = resource.access.writable?.(principal, 't');
  if (!writable) return;
  const { rows } = await sql<{ ok: boolean }>`
    SELECT ${writable} AS ok FROM ${sql.table(resource.table)} t WHERE t.id = ${id}`.execute(db);
  if (rows[0] && !rows[0].ok)
    throw forbidden(
      resource.access.writableNote ? `${resource.access.writableNote}.` : `Your role may change only your own ${resource.type} record.`,
    );
}

/**
 * A record that others still name cannot go: 409 naming each referencing type
 * and how many of its records point here, so the caller knows what to remove
 * first. Resources whose delete should cascade remove their dependants in
 * `beforeDelete` (and count them) before this check runs.
 */
async function refuseWhileReferenced(trx: Database, registry: Registry, resource: ResourceDef, id: string) {
  const references: { type: string; count: number; pointer: string }[] = [];
  for (const other of registry.values()) {
    for (const [name, def] of Object.entries(other.attributes)) {
      if (def.references !== resource.type || def.expression) continue;
      const column = def.column ?? name;
      const { rows } = await sql<{ count: string }>`
        SELECT count(*) AS count FROM ${sql.table(other.table)} WHERE ${sql.ref(column)} = ${id}`.execute(trx);
      const count = Number(rows[0].count);
      if (count > 0) references.push({ type: other.type, count, pointer: name });
    }
  }
  if (references.length === 0) return;
  throw new ApiError(
    references.map((r) =>
      errorObject(
        'conflict',
        `${r.count} ${r.type} record(s) still name this ${resource.type} in \`${r.pointer}\`; remove or change them first.`,
        undefined,
        {
          referenced_by: r.type,
          count: r.count,
        },
      ),
    ),
  );
}
