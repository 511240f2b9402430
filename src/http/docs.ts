import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import type { FastifyInstance } from 'fastify';
import { buildOpenApi } from '../jsonapi/openapi.js';
import type { ResourceDef } from '../jsonapi/resource.js';
import { methodNotAllowed } from '../jsonapi/routes.js';

/** GET /api/open_api (OpenAPI 3.1 from the resource definitions) and GET /docs (its interactive reference). */
export async function registerDocs(app: FastifyInstance, resources: ResourceDef[], serverUrl: string | undefined): Promise<void> {
  const document = buildOpenApi(resources, { serverUrl });
  app.get('/api/open_api', { config: { public: true } }, async (_request, reply) => {
    reply.header('Content-Type', 'application/vnd.oai.openapi+json');
    return document;
  });
  methodNotAllowed(app, '/api/open_api', ['GET'], { public: true });
  await app.register(async (scope) => {
    scope.addHook('onRoute', (route) => {
      route.config = { ...(route.config as object), public: true };
    });
    await scope.register(swagger, { mode: 'static', specification: { document: document as never } });
    await scope.register(swaggerUi, {
      routePrefix: '/docs',
      staticCSP: true,
      // The default policy ends in upgrade-insecure-requests, which makes a browser fetch the assets over https
      // and leaves /docs blank on any plain-http host but localhost; everything is served from 'self' anyway.
      transformStaticCSP: (header) => header.replace(/\s*upgrade-insecure-requests;?/g, ''),
    });
  });
}
