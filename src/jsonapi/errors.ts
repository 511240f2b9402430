/** JSON:API error objects and the exception that carries them to the error handler. */
import { randomUUID } from 'node:crypto';

export type ErrorSource = { pointer: string } | { parameter: string } | { header: string };

/**
 * One reference token of a JSON Pointer (RFC 6901 section 3): `~` is written `~0` and `/` is `~1`, so that a
 * member named `c/d` is one step (`/data/attributes/c~1d`), not two.
 */
export const pointerToken = (name: string): string => name.replaceAll('~', '~0').replaceAll('/', '~1');

export interface ErrorObject {
  id: string;
  status: string;
  code: string;
  title: string;
  detail?: string;
  source?: ErrorSource;
  meta?: Record<string, unknown>;
}

/**
 * The error catalogue: every code the API answers with, its one HTTP status and its title. Call sites name the
 * code alone; docs/api.md's error table (the meaning of each, under ERRORS_DOC) is checked against this by
 * test/error-catalogue.test.ts.
 */
export const ERRORS = {
  bad_request: [400, 'Bad request'],
  invalid_body: [400, 'Invalid request body'],
  invalid_filter: [400, 'Invalid filter'],
  invalid_sort: [400, 'Invalid sort'],
  invalid_pagination: [400, 'Invalid pagination'],
  invalid_page: [400, 'Invalid page parameter'],
  invalid_parameter: [400, 'Invalid query parameter'],
  invalid_header: [400, 'Invalid header'],
  invalid_includes: [400, 'Invalid include'],
  invalid_field: [400, 'Invalid field'],
  unknown_parameter: [400, 'Unknown query parameter'],
  unauthenticated: [401, 'Authentication required'],
  invalid_credentials: [401, 'Invalid credentials'],
  forbidden: [403, 'Forbidden'],
  not_found: [404, 'Not found'],
  method_not_allowed: [405, 'Method not allowed'],
  not_acceptable: [406, 'Not acceptable'],
  request_timeout: [408, 'Request timeout'],
  conflict: [409, 'Conflict'],
  conversation_closed: [409, 'Conversation closed'],
  payload_too_large: [413, 'Payload too large'],
  body_too_complex: [413, 'Body too complex'],
  unsupported_media_type: [415, 'Unsupported media type'],
  invalid_attribute: [422, 'Invalid attribute'],
  required: [422, 'Required attribute missing'],
  unknown_attribute: [422, 'Unknown attribute'],
  invalid_transition: [422, 'Invalid transition'],
  rate_limited: [429, 'Too many requests'],
  too_many_streams: [429, 'Too many event streams'],
  headers_too_large: [431, 'Request headers too large'],
  internal_error: [500, 'Internal server error'],
  unavailable: [503, 'Service unavailable'],
} as const satisfies Record<string, readonly [number, string]>;

export type ErrorCode = keyof typeof ERRORS;
/** Where each code's meaning is documented. */
export const ERRORS_DOC = 'docs/api.md#errors';

export function errorObject(code: ErrorCode, detail?: string, source?: ErrorSource, meta?: Record<string, unknown>): ErrorObject {
  const [status, title] = ERRORS[code];
  const error: ErrorObject = { id: randomUUID(), status: String(status), code, title };
  if (detail !== undefined) error.detail = detail;
  if (source !== undefined) error.source = source;
  if (meta !== undefined) error.meta = meta;
  return error;
}

/**
 * Most error objects one document carries: a hostile body (100,000 unknown attributes in 1 MiB) would
 * otherwise make a response twenty times its size. The document's `meta.errors` then gives the total.
 */
export const MAX_ERRORS_PER_DOCUMENT = 100;

/** Thrown anywhere in a request; rendered as a JSON:API error document. */
export class ApiError extends Error {
  /** The first MAX_ERRORS_PER_DOCUMENT problems. */
  readonly errors: ErrorObject[];
  /** How many problems were found in all. */
  readonly total: number;
  readonly headers: Record<string, string>;

  /** `total`: how many problems there were, when the caller stopped collecting them at the bound. */
  constructor(errors: ErrorObject[], headers: Record<string, string> = {}, total = errors.length) {
    const shown = errors.slice(0, MAX_ERRORS_PER_DOCUMENT);
    super(Array.from(shown.slice(0, 10), (e) => e.detail ?? e.title).join('; '));
    this.errors = shown;
    this.total = Math.max(total, errors.length);
    this.headers = headers;
  }

  /** The HTTP status: the errors' common status, else the most general class (400 or 500). */
  get status(): number {
    const statuses = [...new Set(this.errors.map((e) => Number(e.status)))];
    if (statuses.length === 1) return statuses[0];
    return statuses.some((s) => s >= 500) ? 500 : 400;
  }

  static of(code: ErrorCode, detail?: string, source?: ErrorSource, headers?: Record<string, string>): ApiError {
    return new ApiError([errorObject(code, detail, source)], headers);
  }
}

export const notFound = (detail = 'The record does not exist.') => ApiError.of('not_found', detail);

export const forbidden = (detail = 'This credential may not perform this operation.') => ApiError.of('forbidden', detail);

export const unauthenticated = (detail = 'A valid bearer token is required.') =>
  ApiError.of('unauthenticated', detail, { header: 'Authorization' }, { 'WWW-Authenticate': 'Bearer' });

/** An error document; when problems were left out, `meta.errors` says how many there were. */
export function errorDocument(errors: ErrorObject[], total = errors.length) {
  const shown = errors.slice(0, MAX_ERRORS_PER_DOCUMENT);
  if (total <= shown.length) return { errors: shown, jsonapi: { version: '1.0' } };
  return { errors: shown, meta: { errors: { total, shown: shown.length } }, jsonapi: { version: '1.0' } };
}
