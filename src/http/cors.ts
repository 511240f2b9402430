import cors from '@fastify/cors';
import type { FastifyInstance } from 'fastify';
import type { Config } from '../config/index.js';

/**
 * Cross-origin access for browsers (the chat widget on a customer's site) from CORS_ALLOWED_ORIGINS only;
 * with none configured, no CORS headers are sent and browsers keep other origins out. Registered before
 * authentication, so a preflight (which carries no credential, per the Fetch standard) is answered first.
 * Credentials travel in the Authorization header, never in cookies, so `credentials` stays off.
 */
export async function registerCors(app: FastifyInstance, config: Config): Promise<void> {
  if (config.corsAllowedOrigins.length === 0) return;
  await app.register(cors, {
    origin: config.corsAllowedOrigins,
    methods: ['GET', 'POST', 'PATCH', 'DELETE'],
    allowedHeaders: ['Authorization', 'Content-Type', 'Accept', 'Last-Event-ID'],
    exposedHeaders: ['Location', 'Retry-After', 'RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset'],
    maxAge: 600,
    credentials: false,
    strictPreflight: false,
  });
}
