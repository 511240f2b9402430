/** Request document validation: every problem of a body is reported together. */
import { ApiError, errorObject, MAX_ERRORS_PER_DOCUMENT, pointerToken, type ErrorCode, type ErrorObject } from './errors.js';
import { convertValue, isPlainObject } from './kinds.js';
import { memo } from './memo.js';
import type { AttributeDef } from './resource.js';

export { UUID_PATTERN } from './kinds.js';

export type WriteKind = 'create' | 'update' | 'action';

/** What one operation accepts: the attributes by name, and those it requires. */
export interface InputSpec {
  accepted: Record<string, AttributeDef>;
  /** Names that must be present (create 'required'). */
  required: string[];
}

const specs = new WeakMap<Record<string, AttributeDef>, Map<string, InputSpec>>();

/**
 * The one statement of what a create or an update accepts (a custom action's `input` is read as a create):
 * the declared create/update flags, never a computed attribute (unless a hook stores it) or one shown only on
 * create; for the system, every stored attribute. Read by the records service, the routes' body validation
 * and the OpenAPI request schemas, so none of them can accept what another refuses.
 */
export function inputSpec(attributes: Record<string, AttributeDef>, operation: 'create' | 'update', system = false): InputSpec {
  const byOperation = memo(specs, attributes, () => new Map<string, InputSpec>());
  return memo(byOperation, `${operation}${system ? ':system' : ''}`, () => {
    const spec: InputSpec = { accepted: {}, required: [] };
    for (const [name, def] of Object.entries(attributes)) {
      const flag = operation === 'update' ? def.update : def.create;
      if ((def.expression && !def.storedByHook) || def.revealedOnCreate || (!flag && !system)) continue;
      spec.accepted[name] = def;
      if (operation === 'create' && flag === 'required') spec.required.push(name);
    }
    return spec;
  });
}

export interface BodyExpectation extends InputSpec {
  type: string;
  kind: WriteKind;
  /** For updates: the id in the path, which data.id must equal. */
  id?: string;
  /** The type's declared relationships: sending one the operation cannot set is a 403, not an unknown name. */
  relationships?: readonly string[];
}

const pointer = (name: string) => ({ pointer: `/data/attributes/${pointerToken(name)}` });

const bodyError = (detail: string, at: string) => ApiError.of('invalid_body', detail, { pointer: at });

/** Top-level members a request document may have (JSON:API 1.1 section 7.1); `links` is accepted and ignored. */
const TOP_LEVEL_MEMBERS = ['data', 'meta', 'jsonapi', 'links'];
/** Members of a resource object in a request (section 7.2); `lid`, `links` and `meta` are accepted and ignored. */
const RESOURCE_MEMBERS = ['type', 'id', 'lid', 'attributes', 'relationships', 'meta', 'links'];

/** The JSON:API object (section 7.7): `version` a string, `ext` and `profile` arrays of URIs, `meta` an object. */
function checkJsonApiObject(value: unknown): void {
  if (!isPlainObject(value)) throw bodyError('`jsonapi` must be an object.', '/jsonapi');
  if ('version' in value && typeof value.version !== 'string') throw bodyError('`jsonapi.version` must be a string.', '/jsonapi/version');
  for (const name of ['ext', 'profile'] as const) {
    const list = value[name];
    if (name in value && (!Array.isArray(list) || list.some((uri) => typeof uri !== 'string'))) {
      throw bodyError(`\`jsonapi.${name}\` must be an array of URI strings.`, `/jsonapi/${name}`);
    }
  }
  if ('meta' in value && !isPlainObject(value.meta)) throw bodyError('`jsonapi.meta` must be an object.', '/jsonapi/meta');
}

/** Checks the document envelope and returns `data`; envelope problems stop validation. */
function documentData(body: unknown, expected: BodyExpectation): Record<string, unknown> {
  if (body === undefined) throw bodyError('The request has no body: send a JSON:API document with `data`.', '');
  if (!isPlainObject(body)) throw bodyError('The body must be a JSON object.', '');
  if (!('data' in body)) throw bodyError('The body must have a `data` member.', '/data');
  const data = body.data;
  if (!isPlainObject(data)) throw bodyError('`data` must be a resource object.', '/data');
  for (const key of Object.keys(body)) {
    if (!TOP_LEVEL_MEMBERS.includes(key)) throw bodyError(`Unexpected top-level member \`${key}\`.`, `/${pointerToken(key)}`);
  }
  if ('jsonapi' in body) checkJsonApiObject(body.jsonapi);
  for (const name of ['meta', 'links']) {
    if (name in body && !isPlainObject(body[name])) throw bodyError(`\`${name}\` must be an object.`, `/${name}`);
  }
  for (const key of Object.keys(data)) {
    if (!RESOURCE_MEMBERS.includes(key)) throw bodyError(`Unexpected member \`${key}\` in data.`, `/data/${pointerToken(key)}`);
  }
  if (typeof data.type !== 'string') throw bodyError('`data.type` is required.', '/data/type');
  if ('lid' in data && typeof data.lid !== 'string') throw bodyError('`data.lid` must be a string.', '/data/lid');
  for (const name of ['meta', 'links']) {
    if (name in data && !isPlainObject(data[name])) throw bodyError(`\`data.${name}\` must be an object.`, `/data/${name}`);
  }
  if (data.type !== expected.type) {
    throw ApiError.of('conflict', `This endpoint takes \`${expected.type}\`, not \`${data.type}\`.`, { pointer: '/data/type' });
  }
  if (expected.kind === 'update') {
    if (typeof data.id !== 'string') throw bodyError('`data.id` is required.', '/data/id');
    if (data.id.toLowerCase() !== expected.id?.toLowerCase()) {
      throw ApiError.of('conflict', '`data.id` does not match the id in the path.', { pointer: '/data/id' });
    }
  } else if ('id' in data) {
    throw ApiError.of('forbidden', 'Ids are assigned by the server.', { pointer: '/data/id' });
  }
  if ('attributes' in data && !isPlainObject(data.attributes)) throw bodyError('`data.attributes` must be an object.', '/data/attributes');
  if ('relationships' in data && !isPlainObject(data.relationships)) {
    throw bodyError('`data.relationships` must be an object.', '/data/relationships');
  }
  return data;
}

/**
 * The to-one relationships a body may set through linkage, by name: each accepted reference attribute
 * `x_id` (a uuid naming an `X`) stands for the relationship `x` of type `X`, as the resources declare them.
 */
export function writableLinkage(accepted: Record<string, AttributeDef>): Map<string, { attribute: string; type: string }> {
  const linkage = new Map<string, { attribute: string; type: string }>();
  for (const [name, def] of Object.entries(accepted)) {
    // Only a uuid may reference (verify.ts).
    if (def.references && name.endsWith('_id')) linkage.set(name.slice(0, -3), { attribute: name, type: def.references });
  }
  return linkage;
}

/**
 * `data.relationships` as JSON:API clients send it: `{x: {data: {type: 'X', id}}}` (or `{data: null}`) for
 * every to-one reference the operation accepts, read as the attribute `x_id`. Problems are collected into
 * `errors` with their pointers; returns the raw id (or null) by attribute name.
 */
function linkageValues(data: Record<string, unknown>, expected: BodyExpectation, errors: ErrorObject[]): Record<string, unknown> {
  const writable = writableLinkage(expected.accepted);
  const values: Record<string, unknown> = {};
  for (const [name, member] of Object.entries((data.relationships as Record<string, unknown> | undefined) ?? {})) {
    const at = `/data/relationships/${pointerToken(name)}`;
    const refuse = (code: ErrorCode, detail: string, pointer = at) => errors.push(errorObject(code, detail, { pointer }));
    const target = writable.get(name);
    const linkage = isPlainObject(member) ? member.data : undefined;
    if (!target && expected.relationships?.includes(name)) {
      // JSON:API 1.1 section 9.2/9.3: an unsupported request to set a relationship is 403 Forbidden.
      refuse('forbidden', `The \`${name}\` relationship cannot be set by this operation.`);
    } else if (!target) {
      const settable = [...writable.keys()].map((n) => `\`${n}\``).join(', ') || 'none';
      refuse('unknown_attribute', `\`${name}\` cannot be set by this operation (relationships it sets: ${settable}).`);
    } else if (!isPlainObject(member) || !('data' in member)) {
      refuse('invalid_attribute', `\`${name}\` must be {"data": {"type": "${target.type}", "id": ...}} or {"data": null}.`);
    } else if (linkage === null) {
      values[target.attribute] = null;
    } else if (!isPlainObject(linkage) || typeof linkage.type !== 'string' || typeof linkage.id !== 'string') {
      refuse('invalid_attribute', `\`${name}\` linkage must have a string \`type\` and \`id\`.`, `${at}/data`);
    } else if (linkage.type !== target.type) {
      refuse('invalid_attribute', `\`${name}\` must name a ${target.type}, not a ${linkage.type}.`, `${at}/data/type`);
    } else {
      values[target.attribute] = linkage.id;
    }
  }
  return values;
}

/**
 * Validates a request document and returns its attributes, converted (timestamps to Date, uuids lower-cased).
 * To-one references may come as attributes (`conversation_id`, as the spec shows) or as relationship linkage
 * (as JSON:API clients send them), or both when they agree.
 */
export function validateBody(body: unknown, expected: BodyExpectation): Record<string, unknown> {
  return validateDocument(body, expected).values;
}

/**
 * `validateBody`, with where each reference sent as linkage came from: the records service reports a
 * reference it refuses (another organisation's record) on its attribute's pointer, and `relocate` moves such
 * errors to the relationship the client actually sent (`/data/relationships/organisation`).
 */
export function validateDocument(body: unknown, expected: BodyExpectation) {
  const data = documentData(body, expected);
  const errors: ErrorObject[] = [];
  const linked = linkageValues(data, expected, errors);
  const attributes = (data.attributes as Record<string, unknown> | undefined) ?? {};
  const values: Record<string, unknown> = {};
  for (const [name, raw] of Object.entries(linked)) {
    const relationship = `/data/relationships/${name.slice(0, -3)}`;
    const refuse = (detail: string, pointer: string) => errors.push(errorObject('invalid_attribute', detail, { pointer }));
    const result = convertValue(expected.accepted[name], raw);
    const attribute = Object.hasOwn(attributes, name) ? convertValue(expected.accepted[name], attributes[name]) : undefined;
    if (!result.ok) {
      refuse(`\`${name.slice(0, -3)}\` linkage: the id ${result.problem}.`, `${relationship}/data${raw === null ? '' : '/id'}`);
    } else if (attribute?.ok && attribute.value !== result.value) {
      refuse(`\`${name}\` and the \`${name.slice(0, -3)}\` relationship name different records.`, relationship);
    } else {
      values[name] = result.value;
    }
  }
  const uncounted = convertAttributes(attributes, expected.accepted, values, errors);
  for (const name of expected.required) {
    const viaRelationship = name.endsWith('_id') && Object.hasOwn((data.relationships as object | undefined) ?? {}, name.slice(0, -3));
    if (!(name in attributes) && !viaRelationship) errors.push(errorObject('required', `\`${name}\` is required.`, pointer(name)));
  }
  if (errors.length > 0) throw new ApiError(errors, {}, errors.length + uncounted);
  const moved = new Map<string, string>();
  for (const name of Object.keys(linked)) {
    if (!Object.hasOwn(attributes, name)) moved.set(pointer(name).pointer, `/data/relationships/${name.slice(0, -3)}`);
  }
  return { values, relocate: (error: unknown) => relocatePointers(error, moved) };
}

/** The same error with each pointer in `moved` (or below it) replaced by its new place. */
function relocatePointers(error: unknown, moved: Map<string, string>): unknown {
  if (!(error instanceof ApiError) || moved.size === 0) return error;
  let changed = false;
  const errors = error.errors.map((e) => {
    const at = e.source && 'pointer' in e.source ? e.source.pointer : undefined;
    const to = at === undefined ? undefined : moved.get(at);
    if (to === undefined) return e;
    changed = true;
    return { ...e, source: { pointer: to } };
  });
  return changed ? new ApiError(errors, error.headers, error.total) : error;
}

/**
 * Converts the attributes given by name into `values`, each problem into `errors`; returns how many unknown
 * names past the error document's bound were only counted (a 1 MiB body can name 100,000).
 */
function convertAttributes(
  input: Record<string, unknown>,
  accepted: Record<string, AttributeDef>,
  values: Record<string, unknown>,
  errors: ErrorObject[],
): number {
  let uncounted = 0;
  for (const [name, value] of Object.entries(input)) {
    if (value === undefined) continue;
    const def = Object.hasOwn(accepted, name) ? accepted[name] : undefined;
    if (!def) {
      if (errors.length >= MAX_ERRORS_PER_DOCUMENT) uncounted += 1;
      else errors.push(errorObject('unknown_attribute', `\`${name}\` cannot be set by this operation.`, pointer(name)));
      continue;
    }
    const result = convertValue(def, value);
    if (result.ok) values[name] = result.value;
    else errors.push(errorObject('invalid_attribute', `\`${name}\` ${result.problem}.`, pointer(name)));
  }
  return uncounted;
}

/**
 * Validates attribute values given by name (the records service's input, from
 * any writer): unknown names, invalid values and missing required ones are
 * reported together, each on its `/data/attributes/<name>` pointer.
 */
export function validateAttributes(input: Record<string, unknown>, accepted: Record<string, AttributeDef>, required: readonly string[]) {
  const errors: ErrorObject[] = [];
  const values: Record<string, unknown> = {};
  const uncounted = convertAttributes(input, accepted, values, errors);
  for (const name of required) {
    if (input[name] === undefined) errors.push(errorObject('required', `\`${name}\` is required.`, pointer(name)));
  }
  if (errors.length > 0) throw new ApiError(errors, {}, errors.length + uncounted);
  return values;
}
