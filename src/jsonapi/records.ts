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
import { ApiError, errorObject, forbidden, notFound, type ErrorObject } from './errors.js';
import { ROLES } from './principal.js';
import { fetchById, type Reader } from './read.js';
import type { ActionContext, ActionResult, AppServices, Records, Registry, RenderWritten, ResourceDef, WriteOptions } from './resource.js';
import { requirePermission, rowScope } from './scope.js';
import { renderResource, type Row } from './serialize.js';
import type { Rendered, WriteValues } from './typed-writes.js';
import { inputSpec, validateAttributes } from './validate.js';
import { resourceJsonb } from './json-sql.js';
import {
  applyDefaults,
  checkReferences,
  columnValues,
  eventBaseUrl,
  insertRecord,
  insertRecords,
  runAtOnce,
  runTransaction,
  STORED_VISIBLE,
  updateRecord,
  updateRecords,
} from './write.js';

export type { Deleted, Records, RenderWritten, WriteOptions, Written } from './resource.js';

/** The service on `options.db`, or (inside the service) on one of its transactions. */
export function createRecords(options: { db: Database; registry: Registry; services: AppServices }, db = options.db): Records {
  const { registry, services } = options;

  const resourceOf = (type: string): ResourceDef => {
    const resource = registry.get(type);
    if (!resource) throw new Error(`records: no resource type ${type}`);
    return resource;
  };

  /** What hooks and actions receive: the write's transaction, its actor and its values as given. */
  const context = (trx: Database, actor: Actor, resource: ResourceDef, values: Record<string, unknown>, existing?: Row): ActionContext => {
    const records = createRecords(options, trx);
    const provided = new Set(Object.keys(values));
    return { db: trx, services, principal: principalOf(actor), actor, records, resource, values, provided, existing, registry };
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

  /** The records of a batch rendered as the system sees them, each change's event queued with its rendering. */
  const renderBatch = async (trx: Database, actor: Actor, resource: ResourceDef, action: EventAction, results: ActionResult[]) => {
    const render = plainRender(actor, resource);
    const written = [];
    for (const result of results) {
      const record = await render(trx, result);
      await emit(trx, actor, resource, action, result.id, record);
      written.push({ id: result.id, status: result.status, record });
    }
    return written;
  };

  const records: Records = {
    async create<T, K extends string>(actor: Actor, type: K, input: WriteValues<K>, opts: WriteOptions<T> = {}) {
      const resource = resourceOf(type);
      const principal = principalOf(actor);
      const system = actor.kind === 'system';
      if (!system) requirePermission(resource, principal, 'create');
      const { accepted, required } = inputSpec(resource.attributes, 'create', system);
      const values = opts.validated ? opts.validated() : validateAttributes(input as Record<string, unknown>, accepted, required);
      const render = (opts.render ?? plainRender(actor, resource)) as RenderWritten<T>;
      // The event with the record, when the create is its own transaction: the insert is then its last statement
      // before COMMIT, where events take their ids (outbox.ts). In a larger transaction, the commit hook.
      const prepared = async (on: Database, given: Record<string, unknown>) => {
        const eventOnInsert =
          resource.events === false || db.isTransaction ? undefined : { type: `${resource.type}.created`, occurredAt: new Date() };
        const ctx: ActionContext = { ...context(on, actor, resource, given), eventOnInsert };
        await checkReferences(resource.attributes, [ctx]);
        applyDefaults(resource, given);
        return ctx;
      };
      // The create in one statement of its own (`createAtOnce`), when its resource has one, it is its own
      // transaction, and the statement can store its event: nothing else would run in the transaction below
      // (no hook, no reference to check, the rendering from the returned row). On its own copy of the values, so
      // that the transaction, when it wrote nothing, starts from the values as given.
      if (
        resource.createAtOnce &&
        !resource.beforeInsert &&
        !db.isTransaction &&
        (resource.events === false || resourceJsonb(resource, eventBaseUrl(services)))
      ) {
        const result = await runAtOnce(resource, async () => resource.createAtOnce!(await prepared(db, { ...values })));
        if (result) {
          if (resource.events !== false && !result.evented) throw new Error(`records: ${resource.type}.createAtOnce stored no event`);
          const record = await render(db, result);
          return { id: result.id, status: result.status, record: record as Rendered<T, K> };
        }
      }
      return runTransaction(db, resource, async (trx) => {
        const ctx = await prepared(trx, values);
        await resource.beforeInsert?.(ctx);
        const result = resource.create ? await resource.create(ctx) : await insertRecord(ctx);
        // 201: a new record; 200: an upsert that updated one, or an idempotent repeat that changed nothing.
        const record = await render(trx, result);
        // The system's plain rendering is the organisation's view: the event reuses it (unless it shows a value once).
        const same = !opts.render && actor.kind === 'system' && !result.revealed;
        if (!result.unchanged && !result.evented)
          await emit(trx, actor, resource, result.status === 201 ? 'created' : 'updated', result.id, same ? (record as Row) : undefined);
        return { id: result.id, status: result.status, record: record as Rendered<T, K> };
      });
    },

    async update<T, K extends string>(actor: Actor, type: K, id: string, input: WriteValues<K>, opts: WriteOptions<T> = {}) {
      const resource = resourceOf(type);
      const principal = principalOf(actor);
      const system = actor.kind === 'system';
      if (!system) requirePermission(resource, principal, 'read');
      const { accepted } = inputSpec(resource.attributes, 'update', system);
      const render = (opts.render ?? plainRender(actor, resource)) as RenderWritten<T>;
      return runTransaction(db, resource, async (trx) => {
        // A system write that no hook checks against the stored row needs no locking read first: the UPDATE finds
        // the row in the organisation (404 when it does not) and returns it rendered, one statement for the three.
        const existing =
          system && !resource.beforeUpdate
            ? undefined
            : await lockWritable(trx, actor, resource, id, () => requirePermission(resource, principal, 'update'));
        const values = opts.validated ? opts.validated() : validateAttributes(input as Record<string, unknown>, accepted, []);
        const ctx = context(trx, actor, resource, values, existing);
        await checkReferences(resource.attributes, [ctx]);
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
        return { id, status: 200 as const, record: record as Rendered<T, K> };
      });
    },

    async createMany(actor: Actor, type: string, inputs: Record<string, unknown>[]) {
      const resource = resourceOf(type);
      if (actor.kind !== 'system' || resource.create) throw new Error(`records: createMany of ${type} is for plain system creates`);
      const { accepted, required } = inputSpec(resource.attributes, 'create', true);
      if (inputs.length === 0) return [];
      return runTransaction(db, resource, async (trx) => {
        const contexts = inputs.map((input) => context(trx, actor, resource, validateAttributes(input, accepted, required)));
        await checkReferences(resource.attributes, contexts);
        for (const ctx of contexts) {
          applyDefaults(resource, ctx.values);
          await resource.beforeInsert?.(ctx);
        }
        return renderBatch(trx, actor, resource, 'created', await insertRecords(contexts));
      });
    },

    async updateMany(actor: Actor, type: string, changes: { id: string; values: Record<string, unknown> }[]) {
      const resource = resourceOf(type);
      if (actor.kind !== 'system') throw new Error(`records: updateMany of ${type} is for system writes`);
      const { accepted } = inputSpec(resource.attributes, 'update', true);
      const principal = principalOf(actor);
      if (changes.length === 0) return [];
      return runTransaction(db, resource, async (trx) => {
        // As `update`: the stored rows locked and read first only when a hook checks against them, all in one statement.
        const { rows: stored } = resource.beforeUpdate
          ? await sql<Row>`SELECT t.* FROM ${sql.table(resource.table)} t
              WHERE t.id = ANY(${changes.map((c) => c.id)}::uuid[]) AND ${rowScope(resource, principal)} FOR UPDATE`.execute(trx)
          : { rows: [] };
        const existing = new Map(stored.map((row) => [String(row.id), row]));
        const contexts = changes.map(({ id, values }) => {
          if (resource.beforeUpdate && !existing.has(id)) throw notFound();
          return context(trx, actor, resource, validateAttributes(values, accepted, []), existing.get(id));
        });
        await checkReferences(resource.attributes, contexts);
        for (const ctx of contexts) await resource.beforeUpdate?.(ctx);
        const ids = changes.map((c) => c.id);
        return renderBatch(trx, actor, resource, 'updated', await updateRecords(contexts, ids));
      });
    },

    async delete(actor: Actor, type: string, id: string) {
      const resource = resourceOf(type);
      const principal = principalOf(actor);
      const system = actor.kind === 'system';
      if (!system) requirePermission(resource, principal, 'read');
      return runTransaction(db, resource, async (trx) => {
        const existing = await lockWritable(trx, actor, resource, id, () => requirePermission(resource, principal, 'delete'));
        const ctx = context(trx, actor, resource, {}, existing);
        // The deleted event carries the record as it was, rendered before anything goes.
        const before =
          resource.events === false
            ? undefined
            : await plainRender(systemActor(principal.organisationId, 'engine'), resource)(trx, { id, status: 200 });
        const removed: Record<string, number> = (await resource.beforeDelete?.(ctx)) ?? {};
        // The resource removes what the record is (and takes along what it means to); its counts are exact.
        // Its removal is an event like any delete's (a member's removal is what a webhook audit must see).
        if (resource.remove) {
          for (const [type, count] of Object.entries(await resource.remove(ctx))) removed[type] = (removed[type] ?? 0) + count;
        } else {
          await refuseWhileReferenced(trx, registry, resource, id);
          await trx.deleteFrom(resource.table).where('id', '=', id).execute();
          removed[resource.type] = (removed[resource.type] ?? 0) + 1;
        }
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
        const mayRun = () => {
          if (!(action.roles ?? ROLES).includes(principal.role)) throw forbidden();
        };
        const existing = action.member && id ? await lockWritable(trx, actor, resource, id, mayRun) : undefined;
        if (!existing && !system) mayRun();
        const { accepted, required } = inputSpec(action.input, 'create');
        const values = typeof input === 'function' ? input() : validateAttributes(input, accepted, required);
        const ctx = context(trx, actor, resource, values, existing);
        await checkReferences(action.input, [ctx]);
        const signal = opts.signal ?? new AbortController().signal;
        const result = await action.run({ ...ctx, clientAddress: opts.clientAddress ?? '', signal });
        const record = await render(trx, result);
        if (existing && !result.unchanged)
          await emit(trx, actor, resource, 'updated', result.id, !opts.render && system ? (record as Row) : undefined);
        return { id: result.id, status: result.status, record, meta: result.meta };
      };
      return action.transaction === false ? run(db) : runTransaction(db, resource, run);
    },

    async transaction<T>(work: (records: Records, trx: Database) => Promise<T>): Promise<T> {
      if (db.isTransaction) return work(records, db);
      // The writes inside map their own errors; the outer transaction only commits them together.
      return inTransaction(db, (trx) => work(createRecords(options, trx), trx));
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
 * The one order of a write on one record, for every writer: the visible row, locked for the rest of the
 * transaction, or 404 when the actor cannot see it; then, for a principal, 403 when its role may not
 * (`mayWrite` throws) or the row is outside `access.writable`. The values' problems (422) come after: a record
 * the caller cannot see is not revealed by a refusal.
 */
async function lockWritable(trx: Database, actor: Actor, resource: ResourceDef, id: string, mayWrite: () => void) {
  const principal = principalOf(actor);
  const { rows } = await sql<Record<string, unknown>>`
    SELECT t.* FROM ${sql.table(resource.table)} t
    WHERE t.id = ${id} AND ${rowScope(resource, principal)} FOR UPDATE`.execute(trx);
  if (!rows[0]) throw notFound();
  if (actor.kind === 'system') return rows[0];
  mayWrite();
  // A visible record outside the role's `access.writable` rows (another member's user record, for an operator) is a 403.
  const writable = resource.access.writable?.(principal, 't');
  if (!writable) return rows[0];
  const check = await sql<{ ok: boolean }>`SELECT ${writable} AS ok FROM ${sql.table(resource.table)} t WHERE t.id = ${id}`.execute(trx);
  if (check.rows[0] && !check.rows[0].ok)
    throw forbidden(
      resource.access.writableNote ? `${resource.access.writableNote}.` : `Your role may change only your own ${resource.type} record.`,
    );
  return rows[0];
}

/**
 * A record that others still name cannot go: 409 naming each referencing type
 * and how many of its records point here, so the caller knows what to remove
 * first. Resources whose delete should cascade remove their dependants in
 * `beforeDelete` (and count them) before this check runs.
 */
async function refuseWhileReferenced(trx: Database, registry: Registry, resource: ResourceDef, id: string) {
  const errors: ErrorObject[] = [];
  for (const other of registry.values()) {
    for (const [name, def] of Object.entries(other.attributes)) {
      if (def.references !== resource.type || def.expression) continue;
      const { rows } = await sql<{ count: string }>`
        SELECT count(*) AS count FROM ${sql.table(other.table)} WHERE ${sql.ref(def.column ?? name)} = ${id}`.execute(trx);
      const count = Number(rows[0].count);
      const detail = `${count} ${other.type} record(s) still name this ${resource.type} in \`${name}\`; remove or change them first.`;
      if (count > 0) errors.push(errorObject('conflict', detail, undefined, { referenced_by: other.type, count }));
    }
  }
  if (errors.length > 0) throw new ApiError(errors);
}
