/** Rendering rows as JSON:API resource objects and documents. */
import qs from 'qs';
import type { Principal } from './principal.js';
import type { AttributeDef, Registry, ResourceDef, Row } from './resource.js';
import { linkageColumn } from './select.js';

export type { Row };
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

/** RFC 3986 unreserved characters only: the text qs's own encoder gives, without its per-character loop. */
const UNRESERVED = /^[A-Za-z0-9._~-]*$/;

/** qs's encoder, skipped for the usual key or value that needs no escape (keyset cursors are base64url). */
const unreservedAsIs = (text: unknown, encode: qs.defaultEncoder, charset: string): string =>
  typeof text === 'string' && UNRESERVED.test(text) ? text : encode(text, encode, charset);

/** `?a[b]=c` with brackets percent-encoded, as links must be. */
export function queryString(query: Record<string, unknown>): string {
  const text = qs.stringify(query, { encode: true, encodeValuesOnly: false, encoder: unreservedAsIs });
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
  const visitor = ctx.principal?.role === 'visitor';
  for (const [name, def] of Object.entries(resource.attributes)) {
    if (def.writeOnly || !show(name) || (visitor && def.hiddenFromVisitors === true)) continue;
    const value = renderValue(def, def.revealedOnCreate ? revealed?.[name] : row[name]);
    attributes[name] = visitor ? withoutHiddenKeys(def, value) : value;
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
      const related = relatedLink(resource, id, name, ctx.baseUrl);
      relationships[name] = related ? { links: { related }, meta: {} } : { meta: {} };
    }
  }

  const object: Record<string, unknown> = { id, type: resource.type, attributes, relationships };
  if (resource.path) object.links = { self: `${ctx.baseUrl}/api/${resource.path}/${id}` };
  object.meta = {};
  return object;
}

/**
 * A to-many relationship's related link (JSON:API section 7.2.2.2): `/api/{path}/{id}/{relationship}`, which
 * answers with the related records (routes.ts, `registerRelated`), when the record has a URL of its own.
 */
export function relatedLink(resource: ResourceDef, id: string, name: string, baseUrl: string) {
  if (!resource.path || !resource.operations.get) return undefined;
  return `${baseUrl}/api/${resource.path}/${id}/${name}`;
}

export function document(data: unknown, included: unknown[], meta: Record<string, unknown>, links?: Record<string, string | null>) {
  const doc: Record<string, unknown> = { data, included, meta };
  if (links) doc.links = links;
  doc.jsonapi = { version: '1.0' };
  return doc;
}

type ResourceJson = (row: Row, ctx: RenderContext) => string;
const compiled = new WeakMap<ResourceDef, ResourceJson>();

/**
 * One resource object as JSON text: exactly `JSON.stringify(renderResource(resource, row, ctx))` (the same
 * members, order and values) for the common case of no sparse fieldset for the type, no included to-many
 * linkage and no revealed attribute, which callers check (`plainRendering`). The member names and the
 * constant parts are worked out once per resource; a row then costs a string concatenation with one
 * `JSON.stringify` per value, a third of building the objects and serialising them (measured for a page of
 * 25 conversations).
 */
export function resourceJson(resource: ResourceDef, row: Row, ctx: RenderContext): string {
  let render = compiled.get(resource);
  if (!render) {
    render = compileResourceJson(resource);
    compiled.set(resource, render);
  }
  return render(row, ctx);
}

/** Whether `resourceJson` renders `resource` as `renderResource` would for this request. */
export const plainRendering = (resource: ResourceDef, ctx: RenderContext) =>
  !ctx.fields.has(resource.type) && !ctx.revealed && !(ctx.principal?.role === 'visitor' && hidesFromVisitors(resource));

/** Whether some attribute of `resource` is left out for visitors (`AttributeDef.hiddenFromVisitors`). */
export const hidesFromVisitors = (resource: ResourceDef) => Object.values(resource.attributes).some((def) => def.hiddenFromVisitors);

/** An event's resource object as a visitor may read it: without the attributes hidden from visitors. */
export function forVisitors(resource: ResourceDef, eventJson: string): string {
  if (!hidesFromVisitors(resource)) return eventJson;
  const event = JSON.parse(eventJson) as { data?: { attributes?: Record<string, unknown> } };
  const attributes = event.data?.attributes;
  if (!attributes) return eventJson;
  for (const [name, def] of Object.entries(resource.attributes)) {
    if (def.hiddenFromVisitors === true) delete attributes[name];
    else if (name in attributes) attributes[name] = withoutHiddenKeys(def, attributes[name]);
  }
  return JSON.stringify(event);
}

/** An object attribute's value without the keys its declaration hides from visitors (`hiddenFromVisitors: [...]`). */
function withoutHiddenKeys(def: AttributeDef, value: unknown): unknown {
  const keys = def.hiddenFromVisitors;
  if (!Array.isArray(keys) || value === null || typeof value !== 'object' || Array.isArray(value)) return value;
  const copy = { ...(value as Record<string, unknown>) };
  for (const key of keys) delete copy[key];
  return copy;
}

function compileResourceJson(resource: ResourceDef): ResourceJson {
  const typeJson = JSON.stringify(resource.type);
  const attributes = Object.entries(resource.attributes)
    .filter(([, def]) => !def.writeOnly)
    .map(([name, def], i) => ({ name, def, key: `${i === 0 ? '' : ','}${JSON.stringify(name)}:` }));
  // Links are `${baseUrl}/api/${path}/${id}` (then `/${relationship}`): the JSON text of the prefix is made once
  // per base URL (the last one: a Host header may be anything), the id's is the "id" member's. Escaping is per
  // character, so the text of a concatenation is the texts' (the prefix ends in `/`, no surrogate half).
  let base: string | undefined;
  let prefix = '';
  const relationships = Object.entries(resource.relationships).map(([name, relationship], i) => {
    const key = `${i === 0 ? '' : ','}${JSON.stringify(name)}:`;
    if (relationship.cardinality === 'one') {
      const column = linkageColumn(name);
      const relatedType = JSON.stringify(relationship.type);
      return (row: Row, ctx: RenderContext) => {
        const id = relationship.resolve ? relationship.resolve(ctx.principal) : row[column];
        return `${key}{"data":${id ? `{"id":${JSON.stringify(String(id))},"type":${relatedType},"meta":{}}` : 'null'}}`;
      };
    }
    const tail = `${JSON.stringify(`/${name}`).slice(1)}},"meta":{}}`;
    return resource.path && resource.operations.get
      ? (_row: Row, _ctx: RenderContext, links: string, idJson: string) => `${key}{"links":{"related":${links}${idJson.slice(1, -1)}${tail}`
      : () => `${key}{"meta":{}}`;
  });
  return (row, ctx) => {
    const idJson = JSON.stringify(String(row.id));
    if (ctx.baseUrl !== base) [base, prefix] = [ctx.baseUrl, JSON.stringify(`${ctx.baseUrl}/api/${resource.path}/`).slice(0, -1)];
    let json = `{"id":${idJson},"type":${typeJson},"attributes":{`;
    for (const { name, def, key } of attributes)
      json += key + JSON.stringify(renderValue(def, def.revealedOnCreate ? undefined : row[name]));
    json += '},"relationships":{';
    for (const relationship of relationships) json += relationship(row, ctx, prefix, idJson);
    json += '}';
    if (resource.path) json += `,"links":{"self":${prefix}${idJson.slice(1)}}`;
    return `${json},"meta":{}}`;
  };
}

/** `document(...)` as JSON text, with primary data already rendered as JSON text (an object, or an array's items). */
export function documentJson(data: string | string[], meta: Record<string, unknown>, links?: Record<string, string | null>): string {
  const primary = Array.isArray(data) ? `[${data.join(',')}]` : data;
  return `{"data":${primary},"included":[],"meta":${JSON.stringify(meta)}${links ? `,"links":${JSON.stringify(links)}` : ''},"jsonapi":{"version":"1.0"}}`;
}
