import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { isIPv6 } from 'node:net';
import qs from 'qs';
import { isApiPath } from '../auth/plugin.js';
import { ApiError } from '../jsonapi/errors.js';
import { jsonShapeProblem } from './json-limits.js';

const JSONAPI_MEDIA_TYPE = 'application/vnd.api+json';

/** Media type parameters JSON:API permits on its media type. */
const ALLOWED_PARAMETERS = new Set(['ext', 'profile']);

/**
 * Extensions (JSON:API 1.1 `ext` parameter, space-separated URIs) this server supports: none. A request
 * document using one would need semantics Parley does not have (415), and a client accepting only responses
 * that use one cannot be served (406). Profiles (`profile`) are ignorable by definition and are ignored.
 */
const SUPPORTED_EXTENSIONS = new Set<string>();

/** The parameters of one media range, names in lower case, quoted values unquoted. */
function parametersOf(mediaRange: string, { inAccept = false } = {}): [string, string][] {
  const parameters = splitOutsideQuotes(mediaRange, ';')
    .slice(1)
    .map((p): [string, string] => {
      const at = p.indexOf('=');
      const name = (at < 0 ? p : p.slice(0, at)).trim().toLowerCase();
      let value = at < 0 ? '' : p.slice(at + 1).trim();
      if (value.startsWith('"') && value.endsWith('"') && value.length >= 2) value = value.slice(1, -1).replace(/\\(.)/g, '$1');
      return [name, value];
    })
    .filter(([name]) => name !== '');
  const weight = inAccept ? parameters.findIndex(([name]) => name === 'q') : -1;
  return weight >= 0 ? parameters.slice(0, weight) : parameters;
}

/** Why a JSON:API media range cannot be honoured: a parameter other than ext/profile, or an unsupported extension. */
function unusable(mediaRange: string, options: { inAccept?: boolean } = {}): string | undefined {
  for (const [name, value] of parametersOf(mediaRange, options)) {
    if (!ALLOWED_PARAMETERS.has(name)) return `the parameter \`${name}\``;
    if (name === 'ext') {
      const unsupported = value.split(/\s+/).filter((uri) => uri !== '' && !SUPPORTED_EXTENSIONS.has(uri));
      if (unsupported.length > 0)
        return `the extension ${unsupported.map((u) => `\`${u}\``).join(', ')}, which this server does not support`;
    }
  }
  return undefined;
}

/** Splits a header value on `separator`, except inside quoted strings (`ext="a,b"`). */
function splitOutsideQuotes(value: string, separator: string): string[] {
  const parts: string[] = [];
  let current = '';
  let quoted = false;
  for (let i = 0; i < value.length; i++) {
    const c = value[i];
    if (quoted && c === '\\' && i + 1 < value.length) {
      current += c + value[++i];
      continue;
    }
    if (c === '"') quoted = !quoted;
    if (c === separator && !quoted) {
      parts.push(current);
      current = '';
    } else current += c;
  }
  parts.push(current);
  return parts;
}

/** Whether a media range or Content-Type value names JSON:API's media type (its parameters aside, in any case). */
const isJsonApi = (value: string) => value.split(';')[0].trim().toLowerCase() === JSONAPI_MEDIA_TYPE;

/**
 * 406 only when every JSON:API media range in Accept is unusable: it carries parameters other than ext and
 * profile, or names an extension this server does not support (a `q` weight is no media type parameter).
 */
function checkAccept(request: FastifyRequest): void {
  const accept = request.headers.accept;
  if (!accept) return;
  const ranges = splitOutsideQuotes(accept, ',').filter(isJsonApi);
  const problems = ranges.map((r) => unusable(r, { inAccept: true }));
  if (ranges.length > 0 && problems.every((p) => p !== undefined)) {
    throw ApiError.of('not_acceptable', `Accept ${JSONAPI_MEDIA_TYPE} without ${problems[0]}.`, { header: 'Accept' });
  }
}

/** `hostname[:port]` (DNS labels; underscores tolerated, as in container names) or `[ipv6][:port]`. */
const HOST_NAME =
  /^([A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?)(?::(\d{1,5}))?$/;
const IPV6_HOST = /^\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?$/;

function validHost(host: string): boolean {
  const match = HOST_NAME.exec(host) ?? IPV6_HOST.exec(host);
  if (!match) return false;
  const [, name, port] = match;
  if (host.startsWith('[') ? !isIPv6(name) : name.length > 253) return false;
  return port === undefined || Number(port) <= 65535;
}

/**
 * The authority that absolute links are built from (Host, or X-Forwarded-Host behind a trusted proxy) must be
 * a well-formed `host[:port]`: anything else would end up verbatim in every link. An HTTP/1.1 request without
 * Host is a 400 anywhere (RFC 9112 section 3.2); an empty Host is refused on /api unless PUBLIC_URL supplies
 * the authority.
 */
function checkHost(request: FastifyRequest, publicUrl: string | undefined, api: boolean): void {
  const { headers } = request;
  if (headers.host === undefined && request.raw.httpVersion === '1.1') {
    throw ApiError.of('bad_request', 'An HTTP/1.1 request needs a Host header.', { header: 'Host' });
  }
  if (!api) return;
  const forwarded = headers['x-forwarded-host'] !== undefined && request.host !== (headers.host ?? '');
  const header = forwarded ? 'X-Forwarded-Host' : 'Host';
  const host = request.host;
  if (host === '' ? publicUrl === undefined : !validHost(host)) {
    throw ApiError.of('bad_request', `${header} must be a host name or address with an optional port.`, { header });
  }
  const protocol = request.protocol;
  if (protocol !== 'http' && protocol !== 'https') {
    throw ApiError.of('bad_request', 'X-Forwarded-Proto must be http or https.', { header: 'X-Forwarded-Proto' });
  }
}

/** Query strings in bracket notation (`filter[a][in][0]=x`), bounded in depth and size. */
export function parseQueryString(text: string): Record<string, unknown> {
  return qs.parse(text, { depth: 6, arrayLimit: 100, parameterLimit: 200, allowPrototypes: false, strictDepth: false });
}

/**
 * Request bodies: JSON:API's media type (415 with parameters other than ext/profile),
 * plain application/json as a convenience; anything else is a 415.
 */
export function registerMedia(app: FastifyInstance, publicUrl: string | undefined): void {
  // `__proto__` and `constructor` are ordinary member names: JSON.parse defines them as own properties, which
  // never reach a prototype; the validators look names up with Object.hasOwn and copy values into fresh
  // objects only under declared names (test/conformance-review.test.ts).
  const defaultParser = app.getDefaultJsonParser('ignore', 'ignore');
  const parseJson: typeof defaultParser = (request, body, done) => {
    // A request without a body is fine whatever its Content-Type (a DELETE from a client library that always
    // sends it): no document, and the route that needs one says so.
    if (body === '') return done(null, undefined);
    // Bounded work first: too many members or levels (deeper than 32) are refused before any object is built
    // (json-limits.ts), so the parsed document needs no walk of its own.
    const tooComplex = typeof body === 'string' ? jsonShapeProblem(body) : undefined;
    if (tooComplex) return done(tooComplex, undefined);
    return defaultParser(request, body, done);
  };
  app.removeAllContentTypeParsers();
  app.addContentTypeParser(JSONAPI_MEDIA_TYPE, { parseAs: 'string' }, (request, body, done) => {
    const problem = unusable(request.headers['content-type'] ?? '');
    if (!problem) return parseJson(request, body as string, done);
    const detail = `${JSONAPI_MEDIA_TYPE} with ${problem}: only ext (of supported extensions) and profile are accepted.`;
    done(ApiError.of('unsupported_media_type', detail, { header: 'Content-Type' }), undefined);
  });
  app.addContentTypeParser('application/json', { parseAs: 'string' }, parseJson);

  // Registered before authentication, so a malformed Host or Accept is refused before anything else runs.
  app.addHook('onRequest', (request, _reply, done) => {
    try {
      const api = isApiPath(request);
      checkHost(request, publicUrl, api);
      if (api) checkAccept(request);
    } catch (error) {
      return done(error as Error);
    }
    done();
  });
}

/**
 * Every JSON:API document, wherever its URL, is exactly application/vnd.api+json (Fastify would append a
 * charset) with Vary: Accept; so is everything under /api but the OpenAPI document (`path`: `requestPath`).
 */
export function mediaHeaders(reply: FastifyReply, path: string): void {
  const contentType = reply.getHeader('content-type');
  const jsonApi = typeof contentType === 'string' && isJsonApi(contentType);
  if (jsonApi || (path.startsWith('/api/') && path !== '/api/open_api')) {
    reply.header('Content-Type', JSONAPI_MEDIA_TYPE);
    const vary = reply.getHeader('vary');
    const values = (Array.isArray(vary) ? vary.join(',') : String(vary ?? ''))
      .split(',')
      .map((v) => v.trim())
      .filter(Boolean);
    if (!values.some((v) => v.toLowerCase() === 'accept' || v === '*')) reply.header('Vary', [...values, 'Accept'].join(', '));
  }
}
