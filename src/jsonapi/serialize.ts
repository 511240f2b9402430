/** Rendering rows as JSON:API resource objects and documents. */
import qs from 'qs';
import type { Registry } from './query/parse.js';
import type { Principal } from './principal.js';
import type { AttributeDef, ResourceDef } from './resource.js';
import { linkageColumn } from './select.js';

export type Row = Record<string, unknown>;
export type Identifier = { id: string; type: string; meta: Record<string, never> };

export interface RenderContext {
  baseUrl: string;
  principal: Principal;
  registry: Registry;
  /** Sparse fieldsets: type -> names; absent type = every field. */
  fields: Map<string, Set<string>>;
  /** Values of `revealedOnCreate` attributes by record id: only in the response that creates the record. */
  revealed?: Map<string, Record<string, unknown>>;
  /** Bounds on what `include` may add to one response (records, and bytes of their JSON); none when absent. */
  includeLimits?: IncludeLimits;
}

export interface IncludeLimits {
  records: number;
  bytes: number;
}

export const identifier = (type: string, id: string): Identifier => ({ id, type, meta: {} });

function selfLink(resource: ResourceDef, id: string, baseUrl: string): string | undefined {
  return resource.path ? `${baseUrl}/api/${resource.path}/${id}` : undefined;
}

/** `?a[b]=c` with brackets percent-encoded, as links must be. */
export function queryString(query: Record<string, unknown>): string {
  const text = qs.stringify(query, { encode: true, encodeValuesOnly: false });
  return text ? `?${text}` : '';
}

function renderValue(def: AttributeDef, value: unknown): unknown {
  if (value === undefined || value === null) return null;
  if (value instanceof Date) {
    const iso = value.toISOString();
    return def.precision === 'seconds' ? iso.replace(/\.\d{3}Z$/, 'Z') : iso;
  }
  return value;
}

/**
 * One resource object. `toMany` holds the linkage of included to-many
 * relationships; the others render as links (or meta only when there is no URL).
 */
export function renderResource(
  resource: ResourceDef,
  row: Row,
  ctx: RenderContext,
  toMany: Map<string, Identifier[]> = new Map(),
): Record<string, unknown> {
  const id = String(row.id);
  const wanted = ctx.fields.get(resource.type);
  const show = (name: string) => wanted === undefined || wanted.has(name);

  const attributes: Record<string, unknown> = {};
  const revealed = ctx.revealed?.get(id);
  for (const [name, def] of Object.entries(resource.attributes)) {
    if (def.writeOnly || !show(name)) continue;
    attributes[name] = renderValue(def, def.revealedOnCreate ? revealed?.[name] : row[name]);
  }

  const relationships: Record<string, unknown> = {};
  for (const [name, relationship] of Object.entries(resource.relationships)) {
    if (!show(name)) continue;
    if (relationship.cardinality === 'one') {
      const related = relationship.resolve ? relationship.resolve(ctx.principal) : row[linkageColumn(name)];
      relationships[name] = { data: related ? identifier(relationship.type, String(related)) : null };
    } else if (toMany.has(name)) {
      relationships[name] = { data: toMany.get(name) };
    } else {
      const related = relatedLink(resource, relationship.inverseKey, id, name, ctx);
      relationships[name] = related ? { links: { related }, meta: {} } : { meta: {} };
    }
  }

  const object: Record<string, unknown> = { id, type: resource.type, attributes, relationships };
  const self = selfLink(resource, id, ctx.baseUrl);
  if (self) object.links = { self };
  object.meta = {};
  return object;
}

/**
 * A working URL for a to-many relationship: the parent's list filtered to the
 * parent, with the relationship included (the spec has no related endpoints).
 */
function relatedLink(resource: ResourceDef, inverseKey: string | undefined, id: string, name: string, ctx: RenderContext) {
  if (!resource.path || !resource.operations.list || !inverseKey) return undefined;
  // The same as queryString({ filter: { id }, include: name }), built directly: it is on every row of a list.
  return `${ctx.baseUrl}/api/${resource.path}?filter%5Bid%5D=${encodeURIComponent(id)}&include=${encodeURIComponent(name)}`;
}

export function document(data: unknown, included: unknown[], meta: Record<string, unknown>, links?: Record<string, string | null>) {
  const doc: Record<string, unknown> = { data, included, meta };
  if (links) doc.links = links;
  doc.jsonapi = { version: '1.0' };
  return doc;
}
