import { createHash, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { sql } from 'kysely';
import { collectDefaultMetrics, Histogram, Registry } from 'prom-client';
import { errorDocument, errorObject, forbidden } from '../jsonapi/errors.js';
import { methodNotAllowed } from '../jsonapi/routes.js';
import type { Config } from '../config/index.js';
import type { DatabaseHandle } from '../db/connection.js';

const digest = (value: string) => createHash('sha256').update(value).digest();

/** A loopback peer of the socket itself (not a forwarded address): 127.0.0.0/8, ::1, ::ffff:127.x. */
function loopbackPeer(request: FastifyRequest): boolean {
  const address = (request.socket.remoteAddress ?? '').replace(/^::ffff:/, '');
  return address === '::1' || (isIP(address) === 4 && address.startsWith('127.'));
}

/**
 * Whether `request` may read the metrics, which count every tenant's requests per route: with
 * `METRICS_TOKEN` set, `Authorization: Bearer <token>` (compared in constant time); unset, only a client on
 * this host's loopback (a Prometheus beside the server), judged by the socket's peer, never a header.
 */
function mayReadMetrics(request: FastifyRequest, token: string | undefined): boolean {
  if (!token) return loopbackPeer(request);
  const given = /^Bearer +(\S+)$/.exec(request.headers.authorization ?? '')?.[1];
  return given !== undefined && timingSafeEqual(digest(given), digest(token));
}

/** Liveness and readiness (the database answers) need no credential; Prometheus metrics are protected. */
export async function registerOps(app: FastifyInstance, options: { database: DatabaseHandle; config: Config }): Promise<void> {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  // One histogram serves both request counts (its _count series, per status) and latencies per route.
  const requests = new Histogram({
    name: 'parley_http_request_duration_seconds',
    help: 'HTTP requests by method, route and status: count and duration',
    labelNames: ['method', 'route', 'status'],
    buckets: [0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [registry],
  });

  // A callback, not an async hook: no promise per request.
  app.addHook('onResponse', (request, reply, done) => {
    const route = request.routeOptions.url ?? 'unmatched';
    requests.observe({ method: request.method, route, status: String(reply.statusCode) }, reply.elapsedTime / 1000);
    done();
  });

  const open = { config: { public: true } };
  app.get('/healthz', open, async () => ({ status: 'ok' }));
  app.get('/readyz', open, async (_request, reply: FastifyReply) => {
    try {
      await sql`SELECT 1`.execute(options.database.db);
      return { status: 'ok', database: options.database.kind };
    } catch {
      reply.code(503).header('Content-Type', 'application/vnd.api+json').header('Retry-After', '1');
      return errorDocument([errorObject('unavailable', 'The database is unavailable.')]);
    }
  });
  app.get('/metrics', open, async (request, reply) => {
    if (!mayReadMetrics(request, options.config.metricsToken)) {
      throw forbidden('Metrics are served to this host (loopback) only, or with the METRICS_TOKEN bearer token.');
    }
    reply.header('Content-Type', registry.contentType);
    return registry.metrics();
  });
  for (const url of ['/healthz', '/readyz', '/metrics']) methodNotAllowed(app, url, ['GET'], { public: true });
}
