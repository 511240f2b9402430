import { METHODS } from 'node:http';
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { DatabaseHandle } from '../db/connection.js';
import { authPlugin, refuseUnauthenticated, requestPath } from '../auth/plugin.js';
import { registerWebAssets } from '../web/assets.js';
import { registerCors } from './cors.js';
import { registerDocs } from './docs.js';
import { connectionError, frameworkError, registerErrorHandling } from './errors.js';
import { mediaHeaders, parseQueryString, registerMedia } from './media.js';
import { registerOps } from './ops.js';
import { registerResources } from '../jsonapi/routes.js';
import { registerEventStream } from '../events/stream.js';
import { verifyResources } from '../jsonapi/verify.js';
import { verifySchema } from '../jsonapi/verify-schema.js';
import { schemaSql } from '../db/migrate.js';
import type { AppServices } from '../jsonapi/index.js';
import { resources } from '../resources/index.js';
import { createLogger } from './logger.js';
import { registerRateLimit } from './rate-limit.js';

export interface ServerOptions extends AppServices {
  database: DatabaseHandle;
  /** Where logs go; by default JSON lines on stdout. */
  logger?: FastifyBaseLogger;
}

/** Assembles the HTTP server: media types, auth, resources, docs and operations endpoints. */
export async function buildServer(options: ServerOptions): Promise<FastifyInstance> {
  const { config } = options;
  const app = Fastify({
    loggerInstance: options.logger ?? (createLogger(config) as FastifyBaseLogger),
    bodyLimit: config.bodyLimitBytes,
    routerOptions: { querystringParser: parseQueryString, maxParamLength: 200, ignoreTrailingSlash: true },
    frameworkErrors: frameworkError,
    trustProxy: trustedHops(config.trustProxy),
    requestIdHeader: false,
    // While closing, requests already on open connections are still served (with Connection: close below).
    return503OnClosing: false,
    forceCloseConnections: false,
    // A whole request must arrive within this time (slow-client protection); headers are bounded by Node (16 KiB).
    requestTimeout: 30_000,
    clientErrorHandler: connectionError,
    // Node would answer an HTTP/1.1 request without Host with an empty 400; the media hook answers it instead.
    http: { requireHostHeader: false },
  });
  registerErrorHandling(app);
  routeEveryMethod(app);
  responseHeaders(app);
  registerMedia(app, config.publicUrl);
  await registerCors(app, config);
  await registerOps(app, options);
  await app.register(authPlugin, options);
  await registerRateLimit(app, config, options.redis);
  verifyResources(resources, { schemaSql: schemaSql() });
  verifySchema(resources);
  refuseUnauthenticated(app);
  const registry = registerResources(app, resources, options);
  registerEventStream(app, { ...options, registry });
  await registerDocs(app, resources, config.publicUrl);
  await registerWebAssets(app, config.sipWsUrl);
  return app;
}

/**
 * A hop count becomes "trust the nearest n addresses" (what Fastify does with a number, which its types do not
 * admit): the client address is then the n-th entry from the right of X-Forwarded-For, never one the client
 * chose itself at the left.
 */
function trustedHops(trust: boolean | number | string): boolean | string | ((address: string, hop: number) => boolean) {
  return typeof trust === 'number' ? (_address, hop) => hop < trust : trust;
}

/**
 * Fastify routes a fixed set of methods and answers any other (TRACE, PROPFIND, ...) as an unknown route, a
 * 404. Registering every method Node parses lets a path that exists answer 405 with `Allow` to each method it
 * does not offer (RFC 9110 section 15.5.6). They take no body here (none of them is offered anywhere).
 * CONNECT is left out: Node hands it to the server's 'connect' event, never to a route.
 */
function routeEveryMethod(app: FastifyInstance): void {
  const known = new Set(app.supportedMethods);
  for (const method of METHODS) if (!known.has(method) && method !== 'CONNECT') app.addHttpMethod(method);
}

/**
 * Every response: `X-Content-Type-Options: nosniff`, so a browser never reads a JSON document as HTML or script.
 * Everything under /api/ but the OpenAPI document answers for a credential and may carry secrets (a login's
 * token, SIP passwords): `Cache-Control: no-store` keeps it out of every cache (RFC 9111 section 5.2.2.5).
 * Once shutdown starts, every response closes its connection, so that keep-alive clients do not hold the server
 * open after their in-flight requests are answered. Then the media type's headers (`mediaHeaders`). One hook
 * with a callback, not three async ones: each hook's promise and each reading of the request's path (Fastify
 * builds `routeOptions` anew at every read) was work of every request.
 */
function responseHeaders(app: FastifyInstance): void {
  let closing = false;
  app.addHook('preClose', async () => {
    closing = true;
  });
  app.addHook('onSend', (request, reply, payload, done) => {
    reply.header('X-Content-Type-Options', 'nosniff');
    const path = requestPath(request);
    if (path.startsWith('/api/') && path !== '/api/open_api') reply.header('Cache-Control', 'no-store');
    if (closing) reply.header('Connection', 'close');
    mediaHeaders(reply, path);
    done(null, payload);
  });
}
