/** Rendering rows as JSON:API resource objects and documents. */
import qs from 'qs';
import type { Principal } from './principal.js';
import { isPlainObject } from './kinds.js';
import { memo } from './memo.js';
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
  includeLimits?: { records: number; bytes: number };
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
export function renderResource(resource: ResourceDef, row: Row, ctx: RenderContext, toMany: Map<string, Identifier[]> = new Map()) {
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
  return { data, included, meta, ...(links ? { links } : {}), jsonapi: { version: '1.0' } };
}

/**
 * Writes one resource object's JSON text into `parts` from index `at`, as `size` pieces (constant texts, each
 * value's JSON, empty strings for what a record leaves out): a document's array is then allocated once at its
 * size, where growing it piece by piece was a fifth of the memory a page's rendering allocated.
 */
interface ResourceParts {
  size: number;
  write(row: Row, ctx: RenderContext, parts: string[], at: number): void;
}
const compiled = new WeakMap<ResourceDef, ResourceParts>();

/** Whether `documentJson` renders `resource` as `renderResource` would for this request. */
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
  if (!Array.isArray(keys) || !isPlainObject(value)) return value;
  const copy = { ...value };
  for (const key of keys) delete copy[key];
  return copy;
}

/** Writes four pieces from `at`. */
function put(parts: string[], at: number, a: string, b: string, c: string, d: string) {
  parts[at] = a;
  parts[at + 1] = b;
  parts[at + 2] = c;
  parts[at + 3] = d;
}

function compileResourceParts(resource: ResourceDef): ResourceParts {
  // The texts between values: `{"id":` id `,"type":...,"attributes":{"first":` value `,"second":` value ...
  const attributes = Object.entries(resource.attributes).filter(([, def]) => !def.writeOnly);
  const opening = `,"type":${JSON.stringify(resource.type)},"attributes":{`;
  const keys = attributes.map(([name], i) => `${i === 0 ? opening : ','}${JSON.stringify(name)}:`);
  // An enumeration's values' texts, made once.
  const texts = attributes.map(([, def]) =>
    def.kind === 'enum' && def.values ? new Map(def.values.map((value) => [value, JSON.stringify(value)])) : undefined,
  );
  const closing = attributes.length === 0 ? `${opening}},"relationships":{` : '},"relationships":{';
  // Links are `${baseUrl}/api/${path}/${id}` (then `/${relationship}`): the JSON text of the prefix is made once
  // per base URL (the last one: a Host header may be anything), the id's is the "id" member's. Escaping is per
  // character, so the text of a concatenation is the texts' (the prefix ends in `/`, no surrogate half).
  let base: string | undefined;
  let prefix = '';
  // Each relationship is 4 pieces.
  type Write = (row: Row, ctx: RenderContext, parts: string[], at: number, id: string) => void;
  const relationships = Object.entries(resource.relationships).map(([name, relationship], i): Write => {
    const key = `${i === 0 ? '' : ','}${JSON.stringify(name)}:`;
    if (relationship.cardinality === 'one') {
      const column = linkageColumn(name);
      const [open, close] = [`${key}{"data":{"id":`, `,"type":${JSON.stringify(relationship.type)},"meta":{}}}`];
      // The last id's text: a page's records mostly name the same organisation, agent or user.
      let last: unknown;
      let lastJson = '';
      return (row, ctx, parts, at) => {
        const id = relationship.resolve ? relationship.resolve(ctx.principal) : row[column];
        if (id && id !== last) [last, lastJson] = [id, JSON.stringify(String(id))];
        put(parts, at, id ? open : `${key}{"data":null}`, id ? lastJson : '', id ? close : '', '');
      };
    }
    const linked = resource.path !== undefined && resource.operations.get;
    const [open, tail] = linked
      ? [`${key}{"links":{"related":`, `${JSON.stringify(`/${name}`).slice(1)}},"meta":{}}`]
      : [`${key}{"meta":{}}`, ''];
    return (_row, _ctx, parts, at, id) => put(parts, at, open, linked ? prefix : '', linked ? id : '', tail);
  });
  return {
    size: 3 + 2 * attributes.length + 4 * relationships.length + 4,
    write(row, ctx, parts, at) {
      const idJson = JSON.stringify(String(row.id));
      // The id's text inside quotes, for the links.
      const id = idJson.slice(1, -1);
      if (ctx.baseUrl !== base) [base, prefix] = [ctx.baseUrl, JSON.stringify(`${ctx.baseUrl}/api/${resource.path}/`).slice(0, -1)];
      parts[at] = '{"id":';
      parts[at + 1] = idJson;
      let n = at + 2;
      for (let i = 0; i < attributes.length; i++, n += 2) {
        const [name, def] = attributes[i];
        const value = def.revealedOnCreate ? undefined : row[name];
        parts[n] = keys[i];
        parts[n + 1] = texts[i]?.get(value as string) ?? JSON.stringify(renderValue(def, value));
      }
      parts[n++] = closing;
      for (let i = 0; i < relationships.length; n += 4) relationships[i++](row, ctx, parts, n, id);
      if (resource.path) put(parts, n, '},"links":{"self":', prefix, id, '"},"meta":{}}');
      else put(parts, n, '},"meta":{}}', '', '', '');
    },
  };
}

/**
 * `document(...)` as JSON text, exactly `JSON.stringify(document(...))` of `renderResource`'s objects for the
 * common case of no sparse fieldset for the type, no included to-many linkage and no revealed attribute, which
 * callers check (`plainRendering`); its primary data one record, or an array of them (a list). The member names
 * and constant texts are worked out once per resource; a record then costs one `JSON.stringify` per value. The
 * document is one join of its pieces: concatenated, each record's text and then the document were strings of
 * strings, copied into the document and again when the server measured the body (`Buffer.byteLength`
 * flattens them), a third of the memory a list request allocated (docs/benchmarks.md, tenth round).
 */
export function documentJson(
  resource: ResourceDef,
  data: Row | Row[],
  ctx: RenderContext,
  meta: Record<string, unknown>,
  links?: Record<string, string | null>,
): string {
  const render = memo(compiled, resource, () => compileResourceParts(resource));
  const rows = Array.isArray(data) ? data : [data];
  const parts = new Array<string>(rows.length * (render.size + 1) + 2);
  parts[0] = Array.isArray(data) ? '{"data":[' : '{"data":';
  for (let i = 0; i < rows.length; i++) {
    parts[1 + i * (render.size + 1)] = i > 0 ? ',' : '';
    render.write(rows[i], ctx, parts, 2 + i * (render.size + 1));
  }
  const end = `,"included":[],"meta":${JSON.stringify(meta)}${links ? `,"links":${JSON.stringify(links)}` : ''},"jsonapi":{"version":"1.0"}}`;
  parts[parts.length - 1] = Array.isArray(data) ? `]${end}` : end;
  return parts.join('');
}
