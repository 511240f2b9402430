import type { FastifyInstance, FastifyReply } from 'fastify';
import { sql } from 'kysely';
import { collectDefaultMetrics, Histogram, Registry } from 'prom-client';
import { errorDocument, errorObject } from '../jsonapi/errors.js';
import { methodNotAllowed } from '../jsonapi/routes.js';
import type { ServerOptions } from './server.js';

/** Liveness, readiness (the database answers) and Prometheus metrics; none needs a credential. */
export async function registerOps(app: FastifyInstance, options: ServerOptions): Promise<void> {
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

  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched';
    requests.observe({ method: request.method, route, status: String(reply.statusCode) }, reply.elapsedTime / 1000);
  });

  const open = { config: { public: true } };
  app.get('/healthz', open, async () => ({ status: 'ok' }));
  app.get('/readyz', open, async (_request, reply: FastifyReply) => {
    try {
      await sql`SELECT 1`.execute(options.database.db);
      return { status: 'ok', database: options.database.kind };
    } catch {
      reply.code(503).header('Content-Type', 'application/vnd.api+json').header('Retry-After', '1');
      return errorDocument([errorObject(503, 'unavailable', 'The database is unavailable.')]);
    }
  });
  app.get('/metrics', open, async (_request, reply) => {
    reply.header('Content-Type', registry.contentType);
    return registry.metrics();
  });
  for (const url of ['/healthz', '/readyz', '/metrics']) methodNotAllowed(app, url, ['GET'], { public: true });
}
