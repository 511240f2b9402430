import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError, errorDocument } from '../jsonapi/errors.js';

interface DatabaseError {
  code?: string;
  constraint?: string;
  message?: string;
}

/** PostgreSQL and driver failures that mean "the database is not reachable right now". */
function isUnavailable(error: DatabaseError): boolean {
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
  const fastify = error as FastifyError & DatabaseError;
  switch (fastify.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return ApiError.of(413, 'payload_too_large', 'The request body is larger than allowed.');
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return ApiError.of(415, 'unsupported_media_type', 'Send application/vnd.api+json.', { header: 'Content-Type' });
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return ApiError.of(400, 'invalid_body', 'The body is not valid JSON.', { pointer: '' });
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return ApiError.of(400, 'bad_request', 'Content-Length does not match the body.', { header: 'Content-Length' });
  }
  if (error instanceof SyntaxError) return ApiError.of(400, 'invalid_body', 'The body is not valid JSON.', { pointer: '' });
  if (fastify.statusCode === 400 && typeof fastify.code === 'string' && fastify.code.startsWith('FST_')) {
    return ApiError.of(400, 'bad_request', 'The request is malformed.');
  }
  if (isUnavailable(fastify)) {
    return ApiError.of(503, 'unavailable', 'The database is unavailable; try again shortly.', undefined, { 'Retry-After': '1' });
  }
  return ApiError.of(500, 'internal_error', 'An unexpected error occurred.');
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
  if (error.code === 'FST_ERR_MAX_PARAM_LENGTH') return send(reply, ApiError.of(404, 'not_found', 'The record does not exist.'));
  if (error.code === 'FST_ERR_BAD_URL') return send(reply, ApiError.of(400, 'bad_request', 'The URL is malformed.'));
  return send(reply, toApiError(error));
}

export function registerErrorHandling(app: FastifyInstance): void {
  app.setErrorHandler((error, request: FastifyRequest, reply) => {
    const apiError = toApiError(error);
    if (apiError.status >= 500) request.log.error({ err: error }, 'request failed');
    return send(reply, apiError);
  });
  app.setNotFoundHandler((request, reply) =>
    send(reply, ApiError.of(404, 'not_found', `No route for ${request.method} ${request.url.split('?')[0]}.`)),
  );
}

/** Node's parser errors that reach no route, by their code, as status and error code. */
const CONNECTION_ERRORS: Record<string, [number, string, string]> = {
  HPE_HEADER_OVERFLOW: [431, 'headers_too_large', 'The request headers are larger than allowed.'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'request_timeout', 'The request took too long to arrive.'],
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
  const [status, code, detail] = CONNECTION_ERRORS[error.code ?? ''] ?? [400, 'bad_request', 'The request is not valid HTTP.'];
  const body = JSON.stringify(errorDocument(ApiError.of(status, code, detail).errors));
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\n` +
      `Content-Type: application/vnd.api+json\r\nX-Content-Type-Options: nosniff\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}
