/**
 * One descriptor per attribute kind: everything the engine knows about a kind, in one object. The body
 * validator, the query parser, the SQL builders, the select list, json-sql, the verifier and the OpenAPI
 * generator read these instead of switching on the kind, so a new kind (or bound) is a change of this file
 * and the published document cannot disagree with what the parser accepts.
 */
import { sql, type RawBuilder } from 'kysely';
import { type FilterOperator, ORDERED_OPERATORS } from './query/types.js';
import type { AttributeDef, AttributeKind, SqlType } from './resource.js';

export type Schema = Record<string, unknown>;

/**
 * The outcome of converting one value: the stored form, or why it cannot be.
 * A tagged union, so that a valid value that happens to look like a problem
 * (an object attribute `{"problem": "late delivery"}`) is never mistaken for one.
 */
export type Conversion<T = unknown> = { ok: true; value: T } | { ok: false; problem: string };
export const converted = <T>(value: T): Conversion<T> => ({ ok: true, value });
export const invalid = (problem: string): Conversion<never> => ({ ok: false, problem });

export const UUID_PATTERN = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$/;
const INT4_MAX = 2_147_483_647;
/** A 32-bit integer's text (magnitude at most 2147483647), as the query parser accepts it. */
const INT32_PATTERN =
  '^-?(\\d{1,9}|1\\d{9}|20\\d{8}|21[0-3]\\d{7}|214[0-6]\\d{6}|2147[0-3]\\d{5}|21474[0-7]\\d{4}|214748[0-2]\\d{3}|2147483[0-5]\\d{2}|21474836[0-3]\\d|214748364[0-7])$';
/** Nesting of a JSON object given as a filter value (`filter[metadata][contains]={...}`). */
export const MAX_FILTER_JSON_DEPTH = 32;

/** Declaration options that belong to one kind only (the verifier refuses them on others). */
export const KIND_OPTIONS = ['values', 'references', 'precision'] as const;

export interface KindDescriptor {
  /** PostgreSQL type of the column; drives casts in filters and cursors. */
  sqlType: SqlType;
  /** Type a single parameter is cast to, when not `sqlType` (a list column compares element by element). */
  cast?: string;
  /** A body's value (not null) in its stored form, or why not. */
  fromBody: (def: AttributeDef, value: unknown) => Conversion;
  /** A query string's operand (a well-formed string) in the attribute's type, or why not. */
  fromQuery: (def: AttributeDef, text: string) => Conversion;
  /** Filter operators that apply besides `is_nil` (and `matches`, which searchable text takes). */
  operators: readonly FilterOperator[];
  /** Why an operator that is not ordered or `contains` does not apply (lists). */
  refusal?: string;
  /** JSON Schema of a value, in bodies and responses. */
  schema: (def: AttributeDef) => Schema;
  /** JSON Schema of a filter operand as the query string carries it (default: `schema`, when that is text). */
  filterSchema?: (def: AttributeDef) => Schema;
  /** A value the server accepts, for examples (a declared `default` or `example` comes first). */
  example: (def: AttributeDef) => unknown;
  /** The value a response shows, as SQL over the column (default: the column). */
  rendered?: (column: RawBuilder<unknown>, def: AttributeDef) => RawBuilder<unknown>;
  /** The value as `jsonb` (default: `to_jsonb` of `rendered`). */
  jsonb?: (column: RawBuilder<unknown>) => RawBuilder<unknown>;
  /** The column value of a stored form (default: itself). */
  toColumn?: (value: unknown) => unknown;
  /** `filter[x][contains]=v` as SQL, for kinds that take it. */
  contains?: (column: RawBuilder<unknown>, value: unknown) => RawBuilder<unknown>;
  /** Why the kind cannot be a sort key (sorting compares the column's text form in cursors). */
  unsortable?: string;
  /** Which of `KIND_OPTIONS` it takes, and what else its declaration must satisfy. */
  options?: readonly (typeof KIND_OPTIONS)[number][];
  declarationProblems?: (def: AttributeDef) => string[];
}

export const isPlainObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

function textProblem(def: { minLength?: number; maxLength?: number; maxBytes?: number; pattern?: string }, value: string) {
  if (value.includes('\u0000')) return 'must not contain NUL characters';
  const length = [...value].length;
  if (def.minLength !== undefined && length < def.minLength) return `must have at least ${def.minLength} characters`;
  if (def.maxLength !== undefined && length > def.maxLength) return `must have at most ${def.maxLength} characters`;
  if (def.maxBytes !== undefined && Buffer.byteLength(value) > def.maxBytes) return `must be at most ${def.maxBytes} bytes of UTF-8`;
  if (def.pattern !== undefined && !new RegExp(def.pattern, 'u').test(value)) return `must match ${def.pattern}`;
  if (!value.isWellFormed()) return 'must be well-formed Unicode';
  return undefined;
}

/** Nesting depth of a parsed JSON value, without recursion (a hostile value may nest thousands deep). */
function jsonDepth(value: unknown): number {
  let deepest = 0;
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [node, depth] = stack.pop()!;
    if (typeof node !== 'object' || node === null) continue;
    deepest = Math.max(deepest, depth);
    if (deepest > MAX_FILTER_JSON_DEPTH) return deepest;
    for (const child of Object.values(node)) stack.push([child, depth + 1]);
  }
  return deepest;
}

/** Timestamps outside these years (in UTC) are refused: they cannot round-trip through every driver. */
export const TIMESTAMP_YEARS = { min: 1000, max: 9999 } as const;

/** Why a timestamp's year is refused: said apart from a malformed value, since the format is right. */
export const TIMESTAMP_RANGE_PROBLEM = `must be in the years ${TIMESTAMP_YEARS.min} to ${TIMESTAMP_YEARS.max} (UTC)`;

/** Parses an RFC 3339 date-time (any offset) to a Date, or says why it cannot; optionally truncated to whole seconds. */
export function convertTimestamp(value: unknown, wholeSeconds = false): Conversion<Date> {
  const malformed = invalid('must be an RFC 3339 date-time with offset, such as 2026-01-31T12:00:00Z');
  if (typeof value !== 'string') return malformed;
  const match = RFC3339.exec(value);
  if (!match) return malformed;
  const [, year, month, day, hour, minute, second] = match.map(Number);
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 59) return malformed;
  // Year 0000 exists in RFC 3339 (ISO 8601's proleptic calendar); it is out of range, not malformed.
  if (year < 1) return invalid(TIMESTAMP_RANGE_PROBLEM);
  const date = new Date(value.toUpperCase());
  if (Number.isNaN(date.getTime())) return malformed;
  if (new Date(Date.UTC(year, month - 1, day)).getUTCDate() !== day) return malformed;
  const utcYear = date.getUTCFullYear();
  if (utcYear < TIMESTAMP_YEARS.min || utcYear > TIMESTAMP_YEARS.max) return invalid(TIMESTAMP_RANGE_PROBLEM);
  if (wholeSeconds) date.setUTCMilliseconds(0);
  return converted(date);
}

/**
 * A stored timestamp as the text a response shows (RFC 3339 in UTC: milliseconds, or whole seconds for
 * `precision: 'seconds'`), made by PostgreSQL. Read as a Date, it cost the driver a regular-expression parse
 * and the renderer a `toISOString` for each value (a sixth of a conversation list's CPU in Node.js). Both
 * truncate to the millisecond; input is limited to years 1000-9999, which the pattern covers.
 */
export function timestampText(column: RawBuilder<unknown>, def: AttributeDef): RawBuilder<unknown> {
  const pattern = def.precision === 'seconds' ? 'YYYY-MM-DD"T"HH24:MI:SS"Z"' : 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"';
  return sql`to_char(${column} AT TIME ZONE 'UTC', ${sql.lit(pattern)})`;
}

const EQUALITY: readonly FilterOperator[] = ['eq', 'not_eq', 'in'];
const COMPARABLE: readonly FilterOperator[] = [...EQUALITY, ...ORDERED_OPERATORS];
const asText = (_def: AttributeDef, text: string) => converted(text);
const textSchema = () => ({ type: 'string' });
const enumProblem = (def: AttributeDef) => `must be one of: ${def.values!.join(', ')}`;

export const KINDS: Record<AttributeKind, KindDescriptor> = {
  string: {
    sqlType: 'text',
    fromBody: (def, value) => {
      if (typeof value !== 'string') return invalid('must be a string');
      const problem = textProblem(def, value);
      return problem ? invalid(problem) : converted(value);
    },
    fromQuery: asText,
    operators: [...COMPARABLE, 'contains'],
    schema: (def) => ({
      type: 'string',
      minLength: def.minLength,
      maxLength: def.maxLength,
      pattern: def.pattern,
      description: def.maxBytes ? `At most ${def.maxBytes} bytes of UTF-8.` : undefined,
    }),
    filterSchema: textSchema,
    example: (def) => (def.pattern ? 'example-1' : 'Example'),
    contains: (column, value) => sql`strpos(${column}, ${value}::text) > 0`,
  },
  enum: {
    sqlType: 'text',
    fromBody: (def, value) => (typeof value === 'string' && def.values!.includes(value) ? converted(value) : invalid(enumProblem(def))),
    fromQuery: (def, text) => (def.values!.includes(text) ? converted(text) : invalid(`The value ${enumProblem(def)}.`)),
    operators: COMPARABLE,
    schema: (def) => ({ type: 'string', enum: def.nullable ? [...def.values!, null] : [...def.values!] }),
    filterSchema: (def) => ({ type: 'string', enum: [...def.values!] }),
    example: (def) => def.values![0],
    options: ['values'],
    declarationProblems: (def) => {
      if (!def.values?.length) return ['is an enum without values.'];
      const fixed = def.default !== undefined && typeof def.default !== 'function';
      return fixed && !def.values.includes(String(def.default))
        ? [`has default \`${String(def.default)}\`, which is not one of its values.`]
        : [];
    },
  },
  uuid: {
    sqlType: 'uuid',
    fromBody: (_def, value) =>
      typeof value === 'string' && UUID_PATTERN.test(value) ? converted(value.toLowerCase()) : invalid('must be a UUID'),
    fromQuery: (_def, text) => (UUID_PATTERN.test(text) ? converted(text.toLowerCase()) : invalid('The value must be a UUID.')),
    operators: COMPARABLE,
    schema: () => ({ type: 'string', format: 'uuid' }),
    example: () => '00000000-0000-7000-8000-000000000000',
    options: ['references'],
  },
  integer: {
    sqlType: 'integer',
    fromBody: (def, value) => {
      const min = def.minimum ?? -INT4_MAX - 1;
      const max = def.maximum ?? INT4_MAX;
      if (typeof value !== 'number' || !Number.isInteger(value)) return invalid('must be an integer');
      return value < min || value > max ? invalid(`must be between ${min} and ${max}`) : converted(value);
    },
    fromQuery: (_def, text) =>
      /^-?\d{1,10}$/.test(text) && Math.abs(Number(text)) <= INT4_MAX ? converted(Number(text)) : invalid('The value must be an integer.'),
    operators: COMPARABLE,
    schema: (def) => ({ type: 'integer', minimum: def.minimum, maximum: def.maximum }),
    filterSchema: () => ({ type: 'string', pattern: INT32_PATTERN }),
    example: (def) => def.minimum ?? 0,
  },
  boolean: {
    sqlType: 'boolean',
    fromBody: (_def, value) => (typeof value === 'boolean' ? converted(value) : invalid('must be true or false')),
    fromQuery: (_def, text) =>
      text === 'true' || text === 'false' ? converted(text === 'true') : invalid('The value must be true or false.'),
    operators: EQUALITY,
    schema: () => ({ type: 'boolean' }),
    filterSchema: () => ({ type: 'string', enum: ['true', 'false'] }),
    example: () => true,
  },
  timestamp: {
    sqlType: 'timestamptz',
    // Writers inside the process (agent runtime, SIP edge) may pass Dates; they get the same bounds as text.
    fromBody: (def, value) =>
      convertTimestamp(
        value instanceof Date ? (Number.isNaN(value.getTime()) ? '' : value.toISOString()) : value,
        def.precision === 'seconds',
      ),
    fromQuery: (_def, text) => {
      const date = convertTimestamp(text);
      if (date.ok) return date;
      return invalid(
        date.problem === TIMESTAMP_RANGE_PROBLEM
          ? `The value ${TIMESTAMP_RANGE_PROBLEM}.`
          : 'The value must be an RFC 3339 date-time, e.g. 2026-01-31T12:00:00Z.',
      );
    },
    operators: COMPARABLE,
    schema: () => ({ type: 'string', format: 'date-time' }),
    example: () => '2026-01-31T12:00:00Z',
    rendered: timestampText,
    options: ['precision'],
  },
  object: {
    sqlType: 'jsonb',
    fromBody: (def, value) => {
      if (!isPlainObject(value)) return invalid('must be a JSON object');
      const text = JSON.stringify(value);
      if (text.includes('\\u0000')) return invalid('must not contain NUL characters');
      if (!text.isWellFormed() || /\\ud[89a-f][0-9a-f]{2}/i.test(text)) return invalid('must be well-formed Unicode');
      const limit = def.maxBytes;
      if (limit !== undefined && Buffer.byteLength(text) > limit) return invalid(`must be at most ${limit} bytes of JSON`);
      return converted(value);
    },
    fromQuery: (_def, text) => {
      try {
        const parsed: unknown = JSON.parse(text);
        if (!isPlainObject(parsed)) return invalid('The value must be a JSON object.');
        // As deep as a request body may nest; deeper values would only exhaust the database's stack.
        return jsonDepth(parsed) > MAX_FILTER_JSON_DEPTH
          ? invalid(`The value nests deeper than ${MAX_FILTER_JSON_DEPTH} levels.`)
          : converted(parsed);
      } catch {
        return invalid('The value must be a JSON object.');
      }
    },
    operators: [...EQUALITY, 'contains'],
    schema: (def) => ({ type: 'object', description: def.maxBytes ? `At most ${def.maxBytes} bytes of JSON.` : undefined }),
    filterSchema: () => ({
      type: 'string',
      contentMediaType: 'application/json',
      description: `A JSON object (at most ${MAX_FILTER_JSON_DEPTH} levels deep)`,
    }),
    example: () => ({}),
    // Stored as it is: the column is jsonb already. Parameters travel as JSON text.
    jsonb: (column) => column,
    toColumn: (value) => (value === null || typeof value === 'string' ? value : JSON.stringify(value)),
    contains: (column, value) => sql`${column} @> ${JSON.stringify(value)}::jsonb`,
  },
  string_array: {
    sqlType: 'text[]',
    cast: 'text',
    fromBody: (def, value) => {
      if (!Array.isArray(value)) return invalid('must be an array of strings');
      if (def.minItems !== undefined && value.length < def.minItems) return invalid(`must have at least ${def.minItems} items`);
      if (def.maxItems !== undefined && value.length > def.maxItems) return invalid(`must have at most ${def.maxItems} items`);
      for (const [index, item] of value.entries()) {
        if (typeof item !== 'string') return invalid(`item ${index} must be a string`);
        const problem = textProblem(def.items ?? {}, item);
        if (problem) return invalid(`item ${index} ${problem}`);
      }
      return converted(value);
    },
    fromQuery: asText,
    operators: ['contains'],
    refusal: 'Lists take `contains` or `is_nil` only.',
    schema: (def) => ({
      type: 'array',
      minItems: def.minItems,
      maxItems: def.maxItems,
      items: { type: 'string', minLength: def.items?.minLength, maxLength: def.items?.maxLength, pattern: def.items?.pattern },
    }),
    filterSchema: textSchema,
    example: () => [],
    contains: (column, value) => sql`${value}::text = ANY(${column})`,
    unsortable: 'a list',
  },
};

/** Checks one value against its attribute definition; returns the stored form or a problem. */
export function convertValue(def: AttributeDef, value: unknown): Conversion {
  if (value === null) return def.nullable ? converted(null) : invalid('must not be null');
  const result = KINDS[def.kind].fromBody(def, value);
  if (!result.ok) return result;
  const extra = def.check?.(result.value);
  return extra ? invalid(extra) : result;
}

/** The value a response shows for a stored column (select lists, json-sql). */
export const renderedValue = (column: RawBuilder<unknown>, def: AttributeDef) => KINDS[def.kind].rendered?.(column, def) ?? column;

/** A parameter cast to the attribute's column type (JSON objects travel as text). */
export function typedParameter(def: AttributeDef, value: unknown): RawBuilder<unknown> {
  const kind = KINDS[def.kind];
  return sql`${kind.toColumn ? kind.toColumn(value) : value}::${sql.raw(kind.cast ?? kind.sqlType)}`;
}

/**
 * Why `operator` does not apply to the attribute, or undefined when it does: the one statement of the filter
 * rules, read by the query parser (its 400s) and by the OpenAPI generator (the operators it lists).
 */
export function operatorProblem(def: AttributeDef, operator: FilterOperator): string | undefined {
  if (operator === 'matches') return def.searchable ? undefined : '`matches` applies to searchable text only.';
  if (def.searchable && !def.filterable) return 'This attribute takes `matches` only.';
  const kind = KINDS[def.kind];
  if (operator === 'is_nil' || kind.operators.includes(operator)) return undefined;
  if (ORDERED_OPERATORS.includes(operator)) return `\`${operator}\` does not apply to this attribute.`;
  if (operator === 'contains') return '`contains` applies to text, JSON objects and lists only.';
  return kind.refusal ?? `\`${operator}\` does not apply to this attribute.`;
}
