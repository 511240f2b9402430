import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { DatabaseHandle } from '../db/connection.js';
import { authPlugin } from '../auth/plugin.js';
import { registerDocs } from './docs.js';
import { connectionError, frameworkError, registerErrorHandling } from './errors.js';
import { parseQueryString, registerMedia } from './media.js';
import { registerOps } from './ops.js';
import { registerResources } from '../jsonapi/routes.js';
import type { AppServices } from '../jsonapi/resource.js';
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
    trustProxy: config.trustProxy,
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
  closeConnectionsWhenDone(app);
  registerMedia(app, { publicUrl: config.publicUrl });
  await registerOps(app, options);
  await app.register(authPlugin, options);
  await registerRateLimit(app, config, options.redis);
  registerResources(app, resources, options);
  await registerDocs(app, resources, options);
  return app;
}

/**
 * Once shutdown starts, every response closes its connection, so that keep-alive
 * clients do not hold the server open after their in-flight requests are answered.
 */
function closeConnectionsWhenDone(app: FastifyInstance): void {
  let closing = false;
  app.addHook('preClose', async () => {
    closing = true;
  });
  app.addHook('onSend', async (_request, reply, payload) => {
    if (closing) reply.header('Connection', 'close');
    return payload;
  });
}
