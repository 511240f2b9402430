import type { FastifyInstance, FastifyRequest } from 'fastify';
import qs from 'qs';
import { ApiError } from '../jsonapi/errors.js';

export const JSONAPI_MEDIA_TYPE = 'application/vnd.api+json';

/** Media type parameters JSON:API permits on its media type. */
const ALLOWED_PARAMETERS = new Set(['ext', 'profile']);

/** Parameter names of one media range, e.g. `application/vnd.api+json; ext="x"` -> ['ext']. */
function parameterNames(mediaRange: string): string[] {
  return mediaRange
    .split(';')
    .slice(1)
    .map((p) => p.split('=')[0].trim().toLowerCase())
    .filter(Boolean);
}

const isJsonApi = (mediaRange: string) => mediaRange.split(';')[0].trim().toLowerCase() === JSONAPI_MEDIA_TYPE;

/** 406 only when every JSON:API media range in Accept carries forbidden parameters. */
function checkAccept(request: FastifyRequest): void {
  const accept = request.headers.accept;
  if (!accept) return;
  const ranges = accept.split(',').filter(isJsonApi);
  if (ranges.length > 0 && ranges.every((r) => parameterNames(r).some((p) => !ALLOWED_PARAMETERS.has(p)))) {
    throw ApiError.of(406, 'not_acceptable', `Accept ${JSONAPI_MEDIA_TYPE} without media type parameters.`, { header: 'Accept' });
  }
}

/** Deepest nesting a request body may have; deeper documents are refused before any work. */
export const MAX_JSON_DEPTH = 32;

function depthExceeds(value: unknown, limit: number): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [node, depth] = stack.pop()!;
    if (typeof node !== 'object' || node === null) continue;
    if (depth > limit) return true;
    for (const child of Object.values(node)) stack.push([child, depth + 1]);
  }
  return false;
}

/** Query strings in bracket notation (`filter[a][in][0]=x`), bounded in depth and size. */
export function parseQueryString(text: string): Record<string, unknown> {
  return qs.parse(text, { depth: 6, arrayLimit: 100, parameterLimit: 200, allowPrototypes: false, strictDepth: false });
}

/**
 * Request bodies: JSON:API's media type (415 with parameters other than ext/profile),
 * plain application/json as a convenience; anything else is a 415.
 */
export function registerMedia(app: FastifyInstance): void {
  const defaultParser = app.getDefaultJsonParser('error', 'error');
  const parseJson: typeof defaultParser = (request, body, done) =>
    defaultParser(request, body, (error, value) => {
      if (!error && depthExceeds(value, MAX_JSON_DEPTH)) {
        done(ApiError.of(400, 'invalid_body', `The body nests deeper than ${MAX_JSON_DEPTH} levels.`, { pointer: '' }), undefined);
      } else done(error, value);
    });
  app.removeAllContentTypeParsers();
  app.addContentTypeParser(JSONAPI_MEDIA_TYPE, { parseAs: 'string' }, (request, body, done) => {
    const names = parameterNames(request.headers['content-type'] ?? '');
    if (names.some((p) => !ALLOWED_PARAMETERS.has(p))) {
      done(ApiError.of(415, 'unsupported_media_type', `${JSONAPI_MEDIA_TYPE} takes no parameters but ext and profile.`, { header: 'Content-Type' }), undefined);
      return;
    }
    parseJson(request, body as string, done);
  });
  app.addContentTypeParser('application/json', { parseAs: 'string' }, parseJson);

  app.addHook('onRequest', async (request) => {
    if (request.url.startsWith('/api/')) checkAccept(request);
  });
  app.addHook('onSend', async (request, reply, payload) => {
    if (request.url.startsWith('/api/') && request.url !== '/api/open_api' && !request.url.startsWith('/api/open_api?')) {
      reply.header('Content-Type', JSONAPI_MEDIA_TYPE);
      reply.header('Vary', 'Accept');
    }
    return payload;
  });
}
