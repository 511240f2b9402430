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

const TITLES: Record<string, string> = {
  bad_request: 'Bad request',
  invalid_body: 'Invalid request body',
  invalid_filter: 'Invalid filter',
  invalid_sort: 'Invalid sort',
  invalid_pagination: 'Invalid pagination',
  invalid_includes: 'Invalid include',
  invalid_field: 'Invalid field',
  unknown_parameter: 'Unknown query parameter',
  unauthenticated: 'Authentication required',
  invalid_credentials: 'Invalid credentials',
  forbidden: 'Forbidden',
  not_found: 'Not found',
  method_not_allowed: 'Method not allowed',
  not_acceptable: 'Not acceptable',
  conflict: 'Conflict',
  payload_too_large: 'Payload too large',
  headers_too_large: 'Request headers too large',
  request_timeout: 'Request timeout',
  unsupported_media_type: 'Unsupported media type',
  invalid_attribute: 'Invalid attribute',
  required: 'Required attribute missing',
  unknown_attribute: 'Unknown attribute',
  invalid_transition: 'Invalid transition',
  rate_limited: 'Too many requests',
  internal_error: 'Internal server error',
  unavailable: 'Service unavailable',
};

export function errorObject(
  status: number,
  code: string,
  detail?: string,
  source?: ErrorSource,
  meta?: Record<string, unknown>,
): ErrorObject {
  const error: ErrorObject = { id: randomUUID(), status: String(status), code, title: TITLES[code] ?? code };
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
    super(
      shown
        .slice(0, 10)
        .map((e) => e.detail ?? e.title)
        .join('; '),
    );
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

  static of(status: number, code: string, detail?: string, source?: ErrorSource, headers?: Record<string, string>): ApiError {
    return new ApiError([errorObject(status, code, detail, source)], headers);
  }
}

export const notFound = (detail = 'The record does not exist.') => ApiError.of(404, 'not_found', detail);

export const forbidden = (detail = 'This credential may not perform this operation.') => ApiError.of(403, 'forbidden', detail);

export const unauthenticated = (detail = 'A valid bearer token is required.') =>
  ApiError.of(401, 'unauthenticated', detail, { header: 'Authorization' }, { 'WWW-Authenticate': 'Bearer' });

/** An error document; when problems were left out, `meta.errors` says how many there were. */
export function errorDocument(errors: ErrorObject[], total = errors.length) {
  const shown = errors.slice(0, MAX_ERRORS_PER_DOCUMENT);
  if (total <= shown.length) return { errors: shown, jsonapi: { version: '1.0' } };
  return { errors: shown, meta: { errors: { total, shown: shown.length } }, jsonapi: { version: '1.0' } };
}
