/** Request document validation: every problem of a body is reported together. */
import { ApiError, errorObject, type ErrorObject } from './errors.js';
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

/** Validates a request document and returns its attributes, converted (timestamps to Date, uuids lower-cased). */
export function validateBody(body: unknown, expected: BodyExpectation): Record<string, unknown> {
  const data = documentData(body, expected);
  const errors: ErrorObject[] = [];
  for (const name of Object.keys((data.relationships as object | undefined) ?? {})) {
    errors.push(
      errorObject(422, 'unknown_attribute', `Relationships are not writable; set the \`${name}_id\` attribute instead.`, {
        pointer: `/data/relationships/${name}`,
      }),
    );
  }
  const attributes = (data.attributes as Record<string, unknown> | undefined) ?? {};
  const values: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(attributes)) {
    const def = Object.hasOwn(expected.accepted, name) ? expected.accepted[name] : undefined;
    if (!def) {
      errors.push(errorObject(422, 'unknown_attribute', `\`${name}\` cannot be set by this operation.`, pointer(name)));
      continue;
    }
    const result = convertValue(def, value);
    if (typeof result === 'object' && result !== null && 'problem' in result) {
      errors.push(errorObject(422, 'invalid_attribute', `\`${name}\` ${result.problem}.`, pointer(name)));
    } else {
      values[name] = result;
    }
  }
  for (const name of expected.required) {
    if (!(name in attributes)) errors.push(errorObject(422, 'required', `\`${name}\` is required.`, pointer(name)));
  }
  if (errors.length > 0) throw new ApiError(errors);
  return values;
}

type Converted = unknown | { problem: string };

/** Checks one value against its attribute definition; returns the stored form or a problem. */
export function convertValue(def: AttributeDef, value: unknown): Converted {
  if (value === null) return def.nullable ? null : { problem: 'must not be null' };
  const converted = convertByKind(def, value);
  if (typeof converted === 'object' && converted !== null && 'problem' in converted) return converted;
  const extra = def.check?.(converted);
  return extra ? { problem: extra } : converted;
}

function convertByKind(def: AttributeDef, value: unknown): Converted {
  switch (def.kind) {
    case 'string':
      return checkString(def, value);
    case 'enum':
      return typeof value === 'string' && def.values!.includes(value)
        ? value
        : { problem: `must be one of: ${def.values!.join(', ')}` };
    case 'uuid':
      return typeof value === 'string' && UUID_PATTERN.test(value) ? value.toLowerCase() : { problem: 'must be a UUID' };
    case 'integer': {
      const min = def.minimum ?? -INT4_MAX - 1;
      const max = def.maximum ?? INT4_MAX;
      if (typeof value !== 'number' || !Number.isInteger(value)) return { problem: 'must be an integer' };
      return value < min || value > max ? { problem: `must be between ${min} and ${max}` } : value;
    }
    case 'boolean':
      return typeof value === 'boolean' ? value : { problem: 'must be true or false' };
    case 'timestamp':
      return parseTimestamp(value, def.precision === 'seconds') ?? { problem: 'must be an RFC 3339 date-time with offset, such as 2026-01-31T12:00:00Z' };
    case 'object':
      return checkObject(def, value);
    case 'string_array':
      return checkStringArray(def, value);
  }
}

function textProblem(def: { minLength?: number; maxLength?: number; maxBytes?: number; pattern?: string }, value: string): string | undefined {
  if (value.includes('\u0000')) return 'must not contain NUL characters';
  const length = [...value].length;
  if (def.minLength !== undefined && length < def.minLength) return `must have at least ${def.minLength} characters`;
  if (def.maxLength !== undefined && length > def.maxLength) return `must have at most ${def.maxLength} characters`;
  if (def.maxBytes !== undefined && Buffer.byteLength(value) > def.maxBytes) return `must be at most ${def.maxBytes} bytes of UTF-8`;
  if (def.pattern !== undefined && !new RegExp(def.pattern, 'u').test(value)) return `must match ${def.pattern}`;
  if (!value.isWellFormed()) return 'must be well-formed Unicode';
  return undefined;
}

function checkString(def: AttributeDef, value: unknown): Converted {
  if (typeof value !== 'string') return { problem: 'must be a string' };
  const problem = textProblem(def, value);
  return problem ? { problem } : value;
}

function checkObject(def: AttributeDef, value: unknown): Converted {
  if (!isPlainObject(value)) return { problem: 'must be a JSON object' };
  const text = JSON.stringify(value);
  if (text.includes('\\u0000')) return { problem: 'must not contain NUL characters' };
  if (!text.isWellFormed() || /\\ud[89a-f][0-9a-f]{2}/i.test(text)) return { problem: 'must be well-formed Unicode' };
  const limit = def.maxBytes;
  if (limit !== undefined && Buffer.byteLength(text) > limit) return { problem: `must be at most ${limit} bytes of JSON` };
  return value;
}

function checkStringArray(def: AttributeDef, value: unknown): Converted {
  if (!Array.isArray(value)) return { problem: 'must be an array of strings' };
  if (def.minItems !== undefined && value.length < def.minItems) return { problem: `must have at least ${def.minItems} items` };
  if (def.maxItems !== undefined && value.length > def.maxItems) return { problem: `must have at most ${def.maxItems} items` };
  for (const [index, item] of value.entries()) {
    if (typeof item !== 'string') return { problem: `item ${index} must be a string` };
    const problem = textProblem(def.items ?? {}, item);
    if (problem) return { problem: `item ${index} ${problem}` };
  }
  return value;
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
