/** Writes: generic insert and update, reference checks, and the create/update/action flows. */
import { sql } from 'kysely';
import { uuidv7 } from 'uuidv7';
import type { Database } from '../db/connection.js';
import { ApiError, errorObject, forbidden, notFound, type ErrorObject } from './errors.js';
import type { Registry } from './query/parse.js';
import {
  columnOf,
  type ActionContext,
  type ActionResult,
  type AppServices,
  type AttributeDef,
  type Principal,
  type ResourceDef,
} from './resource.js';
import { rowScope, tenancyScope } from './scope.js';

export interface Writer {
  db: Database;
  principal: Principal;
  registry: Registry;
  services: AppServices;
}

/** Column values of the attributes present in `values` (jsonb as JSON text). */
function columnValues(resource: ResourceDef, values: Record<string, unknown>): Record<string, unknown> {
  const columns: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(values)) {
    const def = resource.attributes[name];
    if (!def || def.expression) continue;
    columns[columnOf(name, def)] = def.kind === 'object' && value !== null ? JSON.stringify(value) : value;
  }
  return columns;
}

/** Inserts `ctx.values` as a new row of the caller's organisation; returns the new id. */
export async function insertRow(ctx: ActionContext): Promise<string> {
  const id = uuidv7();
  const now = new Date();
  await ctx.db
    .insertInto(ctx.resource.table)
    .values({
      ...columnValues(ctx.resource, ctx.values),
      id,
      organisation_id: ctx.principal.organisationId,
      created_at: now,
      updated_at: now,
    })
    .execute();
  return id;
}

function applyDefaults(resource: ResourceDef, values: Record<string, unknown>): void {
  for (const [name, def] of Object.entries(resource.attributes)) {
    if (values[name] === undefined && def.default !== undefined) {
      values[name] = typeof def.default === 'function' ? (def.default as () => unknown)() : structuredClone(def.default);
    }
  }
}

/**
 * Every uuid attribute that names another record must name one the caller can
 * see: outside the organisation it is a 422 on its pointer (as if missing);
 * inside it but hidden from the caller's role, a 403.
 */
async function checkReferences(writer: Writer, attributes: Record<string, AttributeDef>, values: Record<string, unknown>) {
  const errors: ErrorObject[] = [];
  for (const [name, def] of Object.entries(attributes)) {
    const value = values[name];
    if (!def.references || def.referenceCheckedByAction || value === undefined || value === null) continue;
    const target = writer.registry.get(def.references)!;
    const { rows } = await sql<{ visible: boolean }>`
      SELECT ${rowScope(target, writer.principal)} AS visible FROM ${sql.table(target.table)} t
      WHERE t.id = ${value} AND ${tenancyScope(target, writer.principal)}`.execute(writer.db);
    if (rows.length === 0) {
      errors.push(errorObject(422, 'invalid_attribute', `\`${name}\` does not name a ${target.type} of your organisation.`, {
        pointer: `/data/attributes/${name}`,
      }));
    } else if (!rows[0].visible) {
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
  if (code === '23505') {
    return new ApiError([errorObject(409, 'conflict', attribute ? `Another record has this ${attribute}.` : 'The record conflicts with an existing one.', source)]);
  }
  if (code === '23503' || code === '23514' || code?.startsWith('22')) {
    return new ApiError([errorObject(422, 'invalid_attribute', 'The values are not acceptable together.', source)]);
  }
  return error;
}

/**
 * Runs `work` in a transaction, mapping constraint violations. When the
 * connection fails during COMMIT, the write may or may not have happened: the
 * 503 then says so (meta.outcome "unknown"), so that the client can check or
 * retry idempotently, instead of claiming a rejection.
 */
async function transaction<T>(db: Database, resource: ResourceDef, work: (trx: Database) => Promise<T>): Promise<T> {
  let committing = false;
  try {
    return await db.transaction().execute(async (trx) => {
      const result = await work(trx);
      committing = true;
      return result;
    });
  } catch (error) {
    const mapped = mapConstraintError(error, resource);
    if (committing && !(mapped instanceof ApiError)) {
      throw new ApiError(
        [errorObject(503, 'unavailable', 'The database connection failed while committing; the write may or may not have been saved.', undefined, { outcome: 'unknown' })],
        { 'Retry-After': '1' },
      );
    }
    throw mapped;
  }
}

/**
 * Renders the written record inside the transaction, so that once COMMIT
 * succeeds nothing can fail any more: a write is acknowledged exactly when it
 * is stored.
 */
export type RenderWritten<T> = (trx: Database, result: ActionResult) => Promise<T>;

/** Creates a record in one transaction; returns the status and the rendered record. */
export async function createRecord<T>(
  writer: Writer,
  resource: ResourceDef,
  values: Record<string, unknown>,
  render: RenderWritten<T>,
): Promise<{ status: ActionResult['status']; rendered: T }> {
  return transaction(writer.db, resource, async (trx) => {
    const provided = new Set(Object.keys(values));
    const ctx: ActionContext = { db: trx, services: writer.services, principal: writer.principal, resource, values, provided };
    await checkReferences({ ...writer, db: trx }, resource.attributes, values);
    applyDefaults(resource, values);
    await resource.beforeInsert?.(ctx);
    const result = resource.create ? await resource.create(ctx) : { id: await insertRow(ctx), status: 201 as const };
    return { status: result.status, rendered: await render(trx, result) };
  });
}

/** Updates a visible record (locked for the transaction); the caller checked the role. */
export async function updateRecord<T>(
  writer: Writer,
  resource: ResourceDef,
  id: string,
  values: Record<string, unknown>,
  render: RenderWritten<T>,
): Promise<T> {
  return transaction(writer.db, resource, async (trx) => {
    const { rows } = await sql<Record<string, unknown>>`
      SELECT t.* FROM ${sql.table(resource.table)} t
      WHERE t.id = ${id} AND ${rowScope(resource, writer.principal)} FOR UPDATE`.execute(trx);
    const existing = rows[0];
    if (!existing) throw notFound();
    const provided = new Set(Object.keys(values));
    const ctx: ActionContext = { db: trx, services: writer.services, principal: writer.principal, resource, values, provided, existing };
    await checkReferences({ ...writer, db: trx }, resource.attributes, values);
    await resource.beforeUpdate?.(ctx);
    const columns = columnValues(resource, values);
    if (Object.keys(columns).length > 0) {
      await trx
        .updateTable(resource.table)
        .set({ ...columns, updated_at: new Date() })
        .where('id', '=', id)
        .execute();
    }
    return render(trx, { id, status: 200 });
  });
}

/** Whether a visible record exists (for 404 before 403 on writes). */
export async function exists(writer: Writer, resource: ResourceDef, id: string): Promise<boolean> {
  const { rows } = await sql`SELECT 1 FROM ${sql.table(resource.table)} t
    WHERE t.id = ${id} AND ${rowScope(resource, writer.principal)}`.execute(writer.db);
  return rows.length > 0;
}
