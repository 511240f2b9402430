/** JSON:API error objects and the exception that carries them to the error handler. */
import { randomUUID } from 'node:crypto';

export type ErrorSource = { pointer: string } | { parameter: string } | { header: string };

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

/** Thrown anywhere in a request; rendered as a JSON:API error document. */
export class ApiError extends Error {
  readonly errors: ErrorObject[];
  readonly headers: Record<string, string>;

  constructor(errors: ErrorObject[], headers: Record<string, string> = {}) {
    super(errors.map((e) => e.detail ?? e.title).join('; '));
    this.errors = errors;
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

export const badParameter = (code: string, parameter: string, detail: string) =>
  ApiError.of(400, code, detail, { parameter });

export const invalidAttribute = (pointer: string, detail: string, code = 'invalid_attribute') =>
  errorObject(422, code, detail, { pointer });

export const notFound = (detail = 'The record does not exist.') => ApiError.of(404, 'not_found', detail);

export const forbidden = (detail = 'This credential may not perform this operation.') =>
  ApiError.of(403, 'forbidden', detail);

export const unauthenticated = (detail = 'A valid bearer token is required.') =>
  ApiError.of(401, 'unauthenticated', detail, { header: 'Authorization' }, { 'WWW-Authenticate': 'Bearer' });

export function errorDocument(errors: ErrorObject[]) {
  return { errors, jsonapi: { version: '1.0' } };
}
