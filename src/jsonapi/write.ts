/** The pieces of a write that the records service (records.ts) composes: insert, update, defaults, references, transaction. */
import { sql, type RawBuilder } from 'kysely';
import { uuidv7 } from 'uuidv7';
import { transaction, type Database } from '../db/connection.js';
import { ApiError, errorObject, forbidden, notFound, type ErrorObject } from './errors.js';
import type { Principal } from './principal.js';
import {
  columnOf,
  type ActionContext,
  type ActionResult,
  type AttributeDef,
  type ResourceDef,
  type AppServices,
  type Row,
} from './resource.js';
import { resourceJsonb } from './json-sql.js';
import { KINDS } from './kinds.js';
import { eventsWritten } from './outbox.js';
import { memo } from './memo.js';
import { selectList } from './select.js';
import { rowScope, tenancyScope } from './scope.js';

/** Column values of the attributes present in `values` (jsonb as JSON text). */
export function columnValues(resource: ResourceDef, values: Record<string, unknown>): Record<string, unknown> {
  const columns: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(values)) {
    const def = resource.attributes[name];
    if (!def || def.expression) continue;
    columns[columnOf(name, def)] = KINDS[def.kind].toColumn?.(value) ?? value;
  }
  return columns;
}

/** The member of a row returned by `insertRecord` that says whether the actor's row scope covers it. */
export const STORED_VISIBLE = '_visible';

/** The base of links in records rendered outside a request (events): PUBLIC_URL, else the local listener. */
export const eventBaseUrl = (services: AppServices) => services.config.publicUrl ?? `http://127.0.0.1:${services.config.port}`;

/**
 * Inserts `ctx.values` as a new row of the caller's organisation and returns it as the actor's select list
 * reads it (`INSERT ... RETURNING`, with whether the actor's row scope covers it), so that the write renders
 * its response without a second statement. The returned row is what a read of it in the same transaction
 * gives: the select list's subqueries see everything the transaction did before (PostgreSQL, "Data-Modifying
 * Statements in WITH"). When the records service asks for the create's event (`ctx.eventOnInsert`) and
 * PostgreSQL can render the record (json-sql.ts), the same statement inserts the event with its id (the
 * records service asks only when the create is its own transaction, so that this is its last statement
 * before COMMIT, outbox.ts); it is announced after COMMIT.
 */
export async function insertRecord(ctx: ActionContext): Promise<ActionResult & { row: Row }> {
  return (await insertRecordFrom(ctx))!;
}

/**
 * A statement that `insertRecordFrom` runs first, in the same statement: a CTE named `src` (a data-modifying one
 * may lock and change another row), and the inserted row's columns that take their values from its row. The
 * record is inserted only when `src` returns a row (nothing is written otherwise, and the answer is undefined).
 */
export interface InsertSource {
  with: RawBuilder<unknown>;
  columns: Record<string, RawBuilder<unknown>>;
}

/**
 * `insertRecord`, with some of the row's values taken from `source` in the same statement: a row lock that
 * `source` takes is then held for the statement and the COMMIT only, not for another round trip (a conversation's
 * next `content_index`, taken and used together; docs/benchmarks.md, "Eleventh round").
 */
export async function insertRecordFrom(ctx: ActionContext, source?: InsertSource): Promise<(ActionResult & { row: Row }) | undefined> {
  const id = uuidv7();
  const columns = newRow(ctx, id, new Date());
  const names = Object.keys(columns).filter((name) => columns[name] !== undefined && !source?.columns[name]);
  const { eventOnInsert } = ctx;
  const data = eventOnInsert && resourceJsonb(ctx.resource, eventBaseUrl(ctx.services));
  const event = data
    ? sql`, event AS (
      INSERT INTO events (id, organisation_id, type, occurred_at, data)
      SELECT parley_event_id(t.organisation_id), t.organisation_id, ${eventOnInsert.type}, ${eventOnInsert.occurredAt}::timestamptz, ${data} FROM t
    )`
    : sql``;
  const from = Object.keys(source?.columns ?? {});
  const insert = source
    ? sql`INSERT INTO ${sql.table(ctx.resource.table)} (${sql.join([...names, ...from].map((name) => sql.id(name)))})
      SELECT ${sql.join([...names.map((name) => sql`${columns[name]}`), ...from.map((name) => source.columns[name])])} FROM src`
    : sql`INSERT INTO ${sql.table(ctx.resource.table)} (${sql.join(names.map((name) => sql.id(name)))})
      VALUES (${sql.join(names.map((name) => sql`${columns[name]}`))})`;
  const { rows } = await sql<Row>`
    WITH ${source ? sql`src AS (${source.with}), ` : sql``}t AS (
      ${insert}
      RETURNING *
    )${event}
    ${selectStored(ctx)}`.execute(ctx.db);
  if (!rows[0]) return undefined;
  if (data) eventsWritten(ctx.db, ctx.principal.organisationId);
  noteCreated(ctx.db, ctx.principal, ctx.resource.type, id);
  return { id, status: 201, row: rows[0], evented: data !== undefined };
}

/**
 * `insertRecord` for several records of one type (`list`, their contexts): one multi-row INSERT per set of columns
 * given, each returning its rows as the actor's select list reads them. Their events are the caller's to queue.
 */
export async function insertRecords(list: ActionContext[]): Promise<(ActionResult & { row: Row })[]> {
  const now = new Date();
  const rows = list.map((ctx) => newRow(ctx, uuidv7(), now));
  const results: (ActionResult & { row: Row })[] = [];
  for (const [names, indexes] of byColumns(rows)) {
    const ctx = list[indexes[0]];
    const { rows: stored } = await sql<Row>`
      WITH t AS (
        INSERT INTO ${sql.table(ctx.resource.table)} (${sql.join(names.map((name) => sql.id(name)))})
        VALUES ${sql.join(indexes.map((i) => sql`(${sql.join(names.map((name) => sql`${rows[i][name]}`))})`))}
        RETURNING *
      )
      ${selectStored(ctx)}`.execute(ctx.db);
    const byId = new Map(stored.map((row) => [String(row.id), row]));
    for (const i of indexes) {
      const id = rows[i].id as string;
      noteCreated(ctx.db, ctx.principal, ctx.resource.type, id);
      results[i] = { id, status: 201, row: byId.get(id)! };
    }
  }
  return results;
}

/**
 * Updates `columns` of the row `id` when the principal's row scope covers it (else 404), and returns it as
 * `insertRecord` does: the actor's select list, in the same statement.
 */
export async function updateRecord(ctx: ActionContext, id: string, columns: Record<string, unknown>): Promise<Row> {
  const { resource, principal } = ctx;
  const names = Object.keys(columns).filter((name) => columns[name] !== undefined);
  const { rows } = await sql<Row>`
    WITH t AS (
      UPDATE ${sql.table(resource.table)} u SET ${sql.join(names.map((name) => sql`${sql.id(name)} = ${columns[name]}`))}
      WHERE u.id = ${id} AND ${rowScope(resource, principal, 'u')} RETURNING u.*
    )
    ${selectStored(ctx)}`.execute(ctx.db);
  if (!rows[0]) throw notFound();
  return rows[0];
}

/**
 * `updateRecord` of several records of one type (`contexts[i]` the values for `ids[i]`): one `UPDATE ... FROM
 * (VALUES ...)` per set of columns written, returning the rows in the order of `ids`; 404 when one is not found.
 */
export async function updateRecords(contexts: ActionContext[], ids: string[]): Promise<(ActionResult & { row: Row })[]> {
  const now = new Date();
  const columns = contexts.map((ctx) => columnValues(ctx.resource, ctx.values));
  for (const [i, set] of columns.entries()) {
    if (Object.values(set).every((value) => value === undefined))
      throw new Error(`records: nothing to update in ${contexts[i].resource.type} ${ids[i]}`);
  }
  const results: (ActionResult & { row: Row })[] = [];
  for (const [names, indexes] of byColumns(columns)) {
    const ctx = contexts[indexes[0]];
    const { resource, principal } = ctx;
    const types = new Map(Object.entries(resource.attributes).map(([name, def]) => [columnOf(name, def), KINDS[def.kind].sqlType]));
    const values = indexes.map(
      (i) => sql`(${sql.join([sql`${ids[i]}::uuid`, ...names.map((name) => sql`${columns[i][name]}::${sql.raw(types.get(name)!)}`)])})`,
    );
    const { rows: stored } = await sql<Row>`
      WITH t AS (
        UPDATE ${sql.table(resource.table)} u SET ${sql.join(names.map((name) => sql`${sql.id(name)} = v.${sql.id(name)}`))}, updated_at = ${now}
        FROM (VALUES ${sql.join(values)}) AS v(id, ${sql.join(names.map((name) => sql.id(name)))})
        WHERE u.id = v.id AND ${rowScope(resource, principal, 'u')} RETURNING u.*
      )
      ${selectStored(ctx)}`.execute(ctx.db);
    const byId = new Map(stored.map((row) => [String(row.id), row]));
    for (const i of indexes) {
      const row = byId.get(ids[i]);
      if (!row) throw notFound();
      results[i] = { id: ids[i], status: 200, row };
    }
  }
  return results;
}

/** The columns of a new row of the caller's organisation holding `ctx.values`. */
const newRow = (ctx: ActionContext, id: string, now: Date): Record<string, unknown> => ({
  ...columnValues(ctx.resource, ctx.values),
  id,
  organisation_id: ctx.principal.organisationId,
  created_at: now,
  updated_at: now,
});

/** The rows of `t` as the actor's select list reads them, each with whether its row scope covers it (`STORED_VISIBLE`). */
const selectStored = ({ resource, principal, registry }: ActionContext) =>
  sql`SELECT ${selectList(resource, principal, registry)}, ${rowScope(resource, principal)} AS ${sql.id(STORED_VISIBLE)} FROM t`;

/** The indexes of `rows` grouped by the columns each gives a value (sorted names): a batch writes one statement per group. */
function byColumns(rows: Record<string, unknown>[]): [string[], number[]][] {
  const groups = new Map<string, number[]>();
  for (const [i, row] of rows.entries()) {
    const names = Object.keys(row).filter((name) => row[name] !== undefined);
    memo(groups, names.sort().join(), () => []).push(i);
  }
  return [...groups].map(([key, indexes]) => [key.split(','), indexes]);
}

export function applyDefaults(resource: ResourceDef, values: Record<string, unknown>): void {
  for (const [name, def] of Object.entries(resource.attributes)) {
    if (values[name] === undefined && def.default !== undefined) {
      values[name] = typeof def.default === 'function' ? (def.default as () => unknown)() : structuredClone(def.default);
    }
  }
}

/**
 * Records the system created in a transaction (`<organisation>/<type>/<id>`): a later write of the same transaction
 * naming one (a Call its new Conversation, a leg its new Call) names a row of its organisation, not read again.
 */
const createdIn = new WeakMap<Database, Set<string>>();

function noteCreated(trx: Database, principal: Principal, type: string, id: string): void {
  if (principal.credential !== 'system' || !trx.isTransaction) return;
  memo(createdIn, trx, () => new Set<string>()).add(`${principal.organisationId}/${type}/${id}`);
}

/**
 * Every uuid attribute that names another record must name one the caller can see: outside the organisation it
 * is a 422 on its pointer (as if missing); inside it but hidden from the caller's role, a 403. The records named
 * by several writes (`contexts`, one or more: a batch of one type) are read in one statement per type they name.
 */
export async function checkReferences(attributes: Record<string, AttributeDef>, contexts: ActionContext[]) {
  const [writer] = contexts;
  const created = writer.principal.credential === 'system' ? createdIn.get(writer.db) : undefined;
  const wanted: { name: string; target: ResourceDef; id: string }[] = [];
  for (const { values } of contexts) {
    for (const [name, def] of Object.entries(attributes)) {
      const value = values[name];
      if (!def.references || def.referenceCheckedByAction || value === undefined || value === null) continue;
      if (created?.has(`${writer.principal.organisationId}/${def.references}/${value}`)) continue;
      wanted.push({ name, target: writer.registry.get(def.references)!, id: String(value).toLowerCase() });
    }
  }
  const found = new Map<ResourceDef, Map<string, boolean>>();
  for (const target of new Set(wanted.map((w) => w.target))) {
    const ids = [...new Set(wanted.filter((w) => w.target === target).map((w) => w.id))];
    const { rows } = await sql<{ id: string; visible: boolean }>`
      SELECT t.id::text AS id, ${rowScope(target, writer.principal)} AS visible FROM ${sql.table(target.table)} t
      WHERE t.id = ANY(${ids}::uuid[]) AND ${tenancyScope(target, writer.principal)}`.execute(writer.db);
    found.set(target, new Map(rows.map((r) => [r.id, r.visible])));
  }
  const errors: ErrorObject[] = [];
  for (const { name, target, id } of wanted) {
    const visible = found.get(target)!.get(id);
    if (visible === undefined) {
      errors.push(
        errorObject('invalid_attribute', `\`${name}\` does not name a ${target.type} of your organisation.`, {
          pointer: `/data/attributes/${name}`,
        }),
      );
    } else if (!visible) {
      throw forbidden(`Your role may not use this ${target.type}.`);
    }
  }
  if (errors.length > 0) throw new ApiError(errors);
}

/**
 * Constraint violations that validation cannot foresee (races, uniqueness):
 * 409 for uniqueness on the attribute the constraint protects, 422 otherwise.
 */
function mapConstraintError(error: unknown, resource: ResourceDef): unknown {
  const { code, constraint } = error as { code?: string; constraint?: string };
  const attribute = constraint ? resource.uniqueConstraints?.[constraint] : undefined;
  const source = { pointer: attribute ? `/data/attributes/${attribute}` : '/data' };
  const conflict = attribute ? `Another record has this ${attribute}.` : 'The record conflicts with an existing one.';
  if (code === '23505') return ApiError.of('conflict', conflict, source);
  if (code === '23503' || code === '23514' || code?.startsWith('22'))
    return ApiError.of('invalid_attribute', 'The values are not acceptable together.', source);
  return error;
}

/**
 * Runs `work`, a write of one statement outside a transaction (`ResourceDef.createAtOnce`), mapping constraint
 * violations as `runTransaction` does. A failure that PostgreSQL did not answer with an error (a connection lost
 * while the statement ran) leaves the write unknown, as a failed COMMIT does: the same 503.
 */
export async function runAtOnce<T>(resource: ResourceDef, work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (error) {
    const mapped = mapConstraintError(error, resource);
    if (mapped instanceof ApiError || /^[0-9A-Z]{5}$/.test(String((error as { code?: unknown }).code))) throw mapped;
    throw unknownOutcome();
  }
}

const unknownOutcome = () =>
  new ApiError(
    [
      errorObject('unavailable', 'The database connection failed while committing; the write may or may not have been saved.', undefined, {
        outcome: 'unknown',
      }),
    ],
    { 'Retry-After': '1' },
  );

/**
 * Runs `work` in a transaction, mapping constraint violations. When the
 * connection fails during COMMIT, the write may or may not have happened: the
 * 503 then says so (meta.outcome "unknown"), so that the client can check or
 * retry idempotently, instead of claiming a rejection.
 */
export async function runTransaction<T>(db: Database, resource: ResourceDef, work: (trx: Database) => Promise<T>): Promise<T> {
  // Inside a caller's transaction (records.transaction), the write joins it; its commit is the caller's.
  if (db.isTransaction) {
    try {
      return await work(db);
    } catch (error) {
      throw mapConstraintError(error, resource);
    }
  }
  let committing = false;
  try {
    return await transaction(db, work, () => {
      committing = true;
    });
  } catch (error) {
    const mapped = mapConstraintError(error, resource);
    if (committing && !(mapped instanceof ApiError)) throw unknownOutcome();
    throw mapped;
  }
}
