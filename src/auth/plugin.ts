import type { FastifyInstance, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import type { DatabaseHandle } from '../db/connection.js';
import { forbidden } from '../jsonapi/errors.js';
import type { AppServices } from '../jsonapi/resource.js';
import { authenticate } from './authenticate.js';

export interface AuthOptions extends AppServices {
  database: DatabaseHandle;
}

/**
 * Every /api request needs a bearer credential (routes marked public excepted);
 * a publishable key may call only the routes that allow it (login).
 * Unmatched /api paths are authenticated too, so 401 comes before 404.
 */
export const authPlugin = fp(async (app: FastifyInstance, options: AuthOptions) => {
  app.addHook('onRequest', async (request: FastifyRequest) => {
    if (!request.url.startsWith('/api/')) return;
    const config = request.routeOptions.config;
    if (config?.public) return;
    const principal = await authenticate(options.database.db, options, request.headers.authorization);
    if (principal.credential === 'publishable_key' && !config?.allowPublishable) {
      throw forbidden('A publishable key may only sign users in.');
    }
    request.principal = principal;
  });
}, { name: 'parley-auth' });
