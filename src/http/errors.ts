import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError, errorDocument, type ErrorCode } from '../jsonapi/errors.js';

/** PostgreSQL and driver failures that mean "the database is not reachable right now". */
function isUnavailable(error: { code?: string; message?: string }): boolean {
  const code = error.code ?? '';
  return (
    ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', '57P01', '57P02', '57P03', '53300', '57014'].includes(code) ||
    code.startsWith('08') ||
    /timeout|terminat|Connection terminated|connect/i.test(error.message ?? '')
  );
}

/** Maps any thrown error to a JSON:API error; unknown ones become a 500 that leaks nothing. */
function toApiError(error: unknown): ApiError {
  if (error instanceof ApiError) return error;
  const fastify = error as FastifyError;
  switch (fastify.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return ApiError.of('payload_too_large', 'The request body is larger than allowed.');
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return ApiError.of('unsupported_media_type', 'Send application/vnd.api+json.', { header: 'Content-Type' });
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return ApiError.of('invalid_body', 'The body is not valid JSON.', { pointer: '' });
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return ApiError.of('bad_request', 'Content-Length does not match the body.', { header: 'Content-Length' });
  }
  if (error instanceof SyntaxError) return ApiError.of('invalid_body', 'The body is not valid JSON.', { pointer: '' });
  if (fastify.statusCode === 400 && typeof fastify.code === 'string' && fastify.code.startsWith('FST_')) {
    return ApiError.of('bad_request', 'The request is malformed.');
  }
  if (isUnavailable(fastify)) {
    return ApiError.of('unavailable', 'The database is unavailable; try again shortly.', undefined, { 'Retry-After': '1' });
  }
  return ApiError.of('internal_error', 'An unexpected error occurred.');
}

function send(reply: FastifyReply, error: ApiError) {
  for (const [name, value] of Object.entries(error.headers)) reply.header(name, value);
  reply.header('Content-Type', 'application/vnd.api+json');
  // Errors of the router (frameworkError) skip the onSend hooks that set it elsewhere.
  reply.header('X-Content-Type-Options', 'nosniff');
  return reply.code(error.status).send(errorDocument(error.errors, error.total));
}

/**
 * Errors raised by the router before any route runs (malformed URL, overlong
 * path parameter): a too-long id names no record, a malformed URL is a 400.
 */
export function frameworkError(error: FastifyError, _request: FastifyRequest, reply: FastifyReply) {
  if (error.code === 'FST_ERR_MAX_PARAM_LENGTH') return send(reply, ApiError.of('not_found', 'The record does not exist.'));
  if (error.code === 'FST_ERR_BAD_URL') return send(reply, ApiError.of('bad_request', 'The URL is malformed.'));
  return send(reply, toApiError(error));
}

export function registerErrorHandling(app: FastifyInstance): void {
  app.setErrorHandler((error, request: FastifyRequest, reply) => {
    const apiError = toApiError(error);
    if (apiError.status >= 500) request.log.error({ err: error }, 'request failed');
    return send(reply, apiError);
  });
  app.setNotFoundHandler((request, reply) =>
    send(reply, ApiError.of('not_found', `No route for ${request.method} ${request.url.split('?')[0]}.`)),
  );
}

/** Node's parser errors that reach no route, by their code, as error code (its status is the catalogue's). */
const CONNECTION_ERRORS: Record<string, [ErrorCode, string]> = {
  HPE_HEADER_OVERFLOW: ['headers_too_large', 'The request headers are larger than allowed.'],
  ERR_HTTP_REQUEST_TIMEOUT: ['request_timeout', 'The request took too long to arrive.'],
};

/**
 * Errors of the HTTP layer below Fastify (header overflow, malformed HTTP,
 * timeouts): a JSON:API error document, then the connection is closed.
 */
export function connectionError(error: Error & { code?: string }, socket: Socket): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const [code, detail] = CONNECTION_ERRORS[error.code ?? ''] ?? ['bad_request', 'The request is not valid HTTP.'];
  const { errors, status } = ApiError.of(code, detail);
  const body = JSON.stringify(errorDocument(errors));
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\n` +
      `Content-Type: application/vnd.api+json\r\nX-Content-Type-Options: nosniff\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}
