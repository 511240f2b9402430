/** Request document validation: every problem of a body is reported together. */
import { ApiError, errorObject, MAX_ERRORS_PER_DOCUMENT, type ErrorObject } from './errors.js';
import type { AttributeDef } from './resource.js';

export const UUID_PATTERN = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$/;
const INT4_MAX = 2_147_483_647;

export type WriteKind = 'create' | 'update' | 'action';

export interface BodyExpectation {
  type: string;
  kind: WriteKind;
  /** For updates: the id in the path, which data.id must equal. */
  id?: string;
  /** Attributes the operation accepts, by name. */
  accepted: Record<string, AttributeDef>;
  /** Names that must be present (create 'required'). */
  required: string[];
}

const pointer = (name: string) => ({ pointer: `/data/attributes/${name}` });

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Checks the document envelope and returns `data`; envelope problems stop validation. */
function documentData(body: unknown, expected: BodyExpectation): Record<string, unknown> {
  if (!isPlainObject(body)) throw ApiError.of(400, 'invalid_body', 'The body must be a JSON object.', { pointer: '' });
  if (!('data' in body)) throw ApiError.of(400, 'invalid_body', 'The body must have a `data` member.', { pointer: '/data' });
  const data = body.data;
  if (!isPlainObject(data)) throw ApiError.of(400, 'invalid_body', '`data` must be a resource object.', { pointer: '/data' });
  for (const key of Object.keys(body)) {
    if (!['data', 'meta', 'jsonapi'].includes(key)) {
      throw ApiError.of(400, 'invalid_body', `Unexpected top-level member \`${key}\`.`, { pointer: `/${key}` });
    }
  }
  for (const key of Object.keys(data)) {
    if (!['type', 'id', 'lid', 'attributes', 'relationships', 'meta', 'links'].includes(key)) {
      throw ApiError.of(400, 'invalid_body', `Unexpected member \`${key}\` in data.`, { pointer: `/data/${key}` });
    }
  }
  if (typeof data.type !== 'string') throw ApiError.of(400, 'invalid_body', '`data.type` is required.', { pointer: '/data/type' });
  if (data.type !== expected.type) {
    throw ApiError.of(409, 'conflict', `This endpoint takes \`${expected.type}\`, not \`${data.type}\`.`, { pointer: '/data/type' });
  }
  if (expected.kind === 'update') {
    if (typeof data.id !== 'string') throw ApiError.of(400, 'invalid_body', '`data.id` is required.', { pointer: '/data/id' });
    if (data.id.toLowerCase() !== expected.id?.toLowerCase()) {
      throw ApiError.of(409, 'conflict', '`data.id` does not match the id in the path.', { pointer: '/data/id' });
    }
  } else if ('id' in data) {
    throw ApiError.of(403, 'forbidden', 'Ids are assigned by the server.', { pointer: '/data/id' });
  }
  if ('attributes' in data && !isPlainObject(data.attributes)) {
    throw ApiError.of(400, 'invalid_body', '`data.attributes` must be an object.', { pointer: '/data/attributes' });
  }
  if ('relationships' in data && !isPlainObject(data.relationships)) {
    throw ApiError.of(400, 'invalid_body', '`data.relationships` must be an object.', { pointer: '/data/relationships' });
  }
  return data;
}

/**
 * The to-one relationships a body may set through linkage, by name: each accepted reference attribute
 * `x_id` (a uuid naming an `X`) stands for the relationship `x` of type `X`, as the resources declare them.
 */
function writableLinkage(accepted: Record<string, AttributeDef>): Map<string, { attribute: string; type: string }> {
  const linkage = new Map<string, { attribute: string; type: string }>();
  for (const [name, def] of Object.entries(accepted)) {
    if (def.kind === 'uuid' && def.references && name.endsWith('_id'))
      linkage.set(name.slice(0, -3), { attribute: name, type: def.references });
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
    const at = `/data/relationships/${name}`;
    const target = writable.get(name);
    if (!target) {
      const settable = [...writable.keys()].map((n) => `\`${n}\``).join(', ') || 'none';
      errors.push(
        errorObject(422, 'unknown_attribute', `\`${name}\` cannot be set by this operation (relationships it sets: ${settable}).`, {
          pointer: at,
        }),
      );
      continue;
    }
    if (!isPlainObject(member) || !('data' in member)) {
      errors.push(
        errorObject(422, 'invalid_attribute', `\`${name}\` must be {"data": {"type": "${target.type}", "id": ...}} or {"data": null}.`, {
          pointer: at,
        }),
      );
      continue;
    }
    const linkage = member.data;
    if (linkage === null) {
      values[target.attribute] = null;
      continue;
    }
    if (!isPlainObject(linkage) || typeof linkage.type !== 'string' || typeof linkage.id !== 'string') {
      errors.push(
        errorObject(422, 'invalid_attribute', `\`${name}\` linkage must have a string \`type\` and \`id\`.`, { pointer: `${at}/data` }),
      );
      continue;
    }
    if (linkage.type !== target.type) {
      errors.push(
        errorObject(422, 'invalid_attribute', `\`${name}\` must name a ${target.type}, not a ${linkage.type}.`, {
          pointer: `${at}/data/type`,
        }),
      );
      continue;
    }
    values[target.attribute] = linkage.id;
  }
  return values;
}

/**
 * Validates a request document and returns its attributes, converted (timestamps to Date, uuids lower-cased).
 * To-one references may come as attributes (`conversation_id`, as the spec shows) or as relationship linkage
 * (as JSON:API clients send them), or both when they agree.
 */
export function validateBody(body: unknown, expected: BodyExpectation): Record<string, unknown> {
  const data = documentData(body, expected);
  const errors: ErrorObject[] = [];
  const linked = linkageValues(data, expected, errors);
  const attributes = (data.attributes as Record<string, unknown> | undefined) ?? {};
  const values: Record<string, unknown> = {};
  for (const [name, raw] of Object.entries(linked)) {
    const relationship = `/data/relationships/${name.slice(0, -3)}`;
    const result = convertValue(expected.accepted[name], raw);
    if (!result.ok) {
      errors.push(
        errorObject(422, 'invalid_attribute', `\`${name.slice(0, -3)}\` linkage: the id ${result.problem}.`, {
          pointer: `${relationship}/data${raw === null ? '' : '/id'}`,
        }),
      );
      continue;
    }
    const attribute = Object.hasOwn(attributes, name) ? convertValue(expected.accepted[name], attributes[name]) : undefined;
    if (attribute?.ok && attribute.value !== result.value) {
      errors.push(
        errorObject(422, 'invalid_attribute', `\`${name}\` and the \`${name.slice(0, -3)}\` relationship name different records.`, {
          pointer: relationship,
        }),
      );
    } else {
      values[name] = result.value;
    }
  }
  // Unknown attributes past the error document's bound are only counted (a 1 MiB body can name 100,000).
  let uncounted = 0;
  for (const [name, value] of Object.entries(attributes)) {
    const def = Object.hasOwn(expected.accepted, name) ? expected.accepted[name] : undefined;
    if (!def) {
      if (errors.length >= MAX_ERRORS_PER_DOCUMENT) uncounted += 1;
      else errors.push(errorObject(422, 'unknown_attribute', `\`${name}\` cannot be set by this operation.`, pointer(name)));
      continue;
    }
    const result = convertValue(def, value);
    if (result.ok) values[name] = result.value;
    else errors.push(errorObject(422, 'invalid_attribute', `\`${name}\` ${result.problem}.`, pointer(name)));
  }
  for (const name of expected.required) {
    const viaRelationship = name.endsWith('_id') && Object.hasOwn((data.relationships as object | undefined) ?? {}, name.slice(0, -3));
    if (!(name in attributes) && !viaRelationship) errors.push(errorObject(422, 'required', `\`${name}\` is required.`, pointer(name)));
  }
  if (errors.length > 0) throw new ApiError(errors, {}, errors.length + uncounted);
  return values;
}

/**
 * Validates attribute values given by name (the records service's input, from
 * any writer): unknown names, invalid values and missing required ones are
 * reported together, each on its `/data/attributes/<name>` pointer.
 */
export function validateAttributes(
  input: Record<string, unknown>,
  accepted: Record<string, AttributeDef>,
  required: readonly string[],
): Record<string, unknown> {
  const errors: ErrorObject[] = [];
  const values: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(input)) {
    if (value === undefined) continue;
    const def = Object.hasOwn(accepted, name) ? accepted[name] : undefined;
    if (!def) {
      errors.push(errorObject(422, 'unknown_attribute', `\`${name}\` cannot be set by this operation.`, pointer(name)));
      continue;
    }
    const result = convertValue(def, value);
    if (result.ok) values[name] = result.value;
    else errors.push(errorObject(422, 'invalid_attribute', `\`${name}\` ${result.problem}.`, pointer(name)));
  }
  for (const name of required) {
    if (input[name] === undefined) errors.push(errorObject(422, 'required', `\`${name}\` is required.`, pointer(name)));
  }
  if (errors.length > 0) throw new ApiError(errors);
  return values;
}

/**
 * The outcome of converting one value: the stored form, or why it cannot be.
 * A tagged union, so that a valid value that happens to look like a problem
 * (an object attribute `{"problem": "late delivery"}`) is never mistaken for one.
 */
export type Conversion<T = unknown> = { ok: true; value: T } | { ok: false; problem: string };
export const converted = <T>(value: T): Conversion<T> => ({ ok: true, value });
export const invalid = (problem: string): Conversion<never> => ({ ok: false, problem });

/** Checks one value against its attribute definition; returns the stored form or a problem. */
export function convertValue(def: AttributeDef, value: unknown): Conversion {
  if (value === null) return def.nullable ? converted(null) : invalid('must not be null');
  const result = convertByKind(def, value);
  if (!result.ok) return result;
  const extra = def.check?.(result.value);
  return extra ? invalid(extra) : result;
}

function convertByKind(def: AttributeDef, value: unknown): Conversion {
  switch (def.kind) {
    case 'string':
      return checkString(def, value);
    case 'enum':
      return typeof value === 'string' && def.values!.includes(value)
        ? converted(value)
        : invalid(`must be one of: ${def.values!.join(', ')}`);
    case 'uuid':
      return typeof value === 'string' && UUID_PATTERN.test(value) ? converted(value.toLowerCase()) : invalid('must be a UUID');
    case 'integer': {
      const min = def.minimum ?? -INT4_MAX - 1;
      const max = def.maximum ?? INT4_MAX;
      if (typeof value !== 'number' || !Number.isInteger(value)) return invalid('must be an integer');
      return value < min || value > max ? invalid(`must be between ${min} and ${max}`) : converted(value);
    }
    case 'boolean':
      return typeof value === 'boolean' ? converted(value) : invalid('must be true or false');
    case 'timestamp': {
      // Writers inside the process (agent runtime, SIP edge) may pass Dates; they get the same bounds as text.
      const date =
        value instanceof Date
          ? parseTimestamp(Number.isNaN(value.getTime()) ? '' : value.toISOString(), def.precision === 'seconds')
          : parseTimestamp(value, def.precision === 'seconds');
      return date ? converted(date) : invalid('must be an RFC 3339 date-time with offset, such as 2026-01-31T12:00:00Z');
    }
    case 'object':
      return checkObject(def, value);
    case 'string_array':
      return checkStringArray(def, value);
  }
}

function textProblem(
  def: { minLength?: number; maxLength?: number; maxBytes?: number; pattern?: string },
  value: string,
): string | undefined {
  if (value.includes('\u0000')) return 'must not contain NUL characters';
  const length = [...value].length;
  if (def.minLength !== undefined && length < def.minLength) return `must have at least ${def.minLength} characters`;
  if (def.maxLength !== undefined && length > def.maxLength) return `must have at most ${def.maxLength} characters`;
  if (def.maxBytes !== undefined && Buffer.byteLength(value) > def.maxBytes) return `must be at most ${def.maxBytes} bytes of UTF-8`;
  if (def.pattern !== undefined && !new RegExp(def.pattern, 'u').test(value)) return `must match ${def.pattern}`;
  if (!value.isWellFormed()) return 'must be well-formed Unicode';
  return undefined;
}

function checkString(def: AttributeDef, value: unknown): Conversion {
  if (typeof value !== 'string') return invalid('must be a string');
  const problem = textProblem(def, value);
  return problem ? invalid(problem) : converted(value);
}

function checkObject(def: AttributeDef, value: unknown): Conversion {
  if (!isPlainObject(value)) return invalid('must be a JSON object');
  const text = JSON.stringify(value);
  if (text.includes('\\u0000')) return invalid('must not contain NUL characters');
  if (!text.isWellFormed() || /\\ud[89a-f][0-9a-f]{2}/i.test(text)) return invalid('must be well-formed Unicode');
  const limit = def.maxBytes;
  if (limit !== undefined && Buffer.byteLength(text) > limit) return invalid(`must be at most ${limit} bytes of JSON`);
  return converted(value);
}

function checkStringArray(def: AttributeDef, value: unknown): Conversion {
  if (!Array.isArray(value)) return invalid('must be an array of strings');
  if (def.minItems !== undefined && value.length < def.minItems) return invalid(`must have at least ${def.minItems} items`);
  if (def.maxItems !== undefined && value.length > def.maxItems) return invalid(`must have at most ${def.maxItems} items`);
  for (const [index, item] of value.entries()) {
    if (typeof item !== 'string') return invalid(`item ${index} must be a string`);
    const problem = textProblem(def.items ?? {}, item);
    if (problem) return invalid(`item ${index} ${problem}`);
  }
  return converted(value);
}

/** Timestamps outside these years (in UTC) are refused: they cannot round-trip through every driver. */
export const TIMESTAMP_YEARS = { min: 1000, max: 9999 } as const;

/** Parses an RFC 3339 date-time (any offset) to a Date; optionally truncated to whole seconds. */
export function parseTimestamp(value: unknown, wholeSeconds = false): Date | undefined {
  if (typeof value !== 'string') return undefined;
  const match = RFC3339.exec(value);
  if (!match) return undefined;
  const [, year, month, day, hour, minute, second] = match.map(Number);
  if (year < 1 || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 59) return undefined;
  const date = new Date(value.toUpperCase());
  if (Number.isNaN(date.getTime())) return undefined;
  if (new Date(Date.UTC(year, month - 1, day)).getUTCDate() !== day) return undefined;
  const utcYear = date.getUTCFullYear();
  if (utcYear < TIMESTAMP_YEARS.min || utcYear > TIMESTAMP_YEARS.max) return undefined;
  if (wholeSeconds) date.setUTCMilliseconds(0);
  return date;
}
