import rateLimit from '@fastify/rate-limit';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Redis } from 'ioredis';
import type { Config } from '../config/index.js';
import { ApiError } from '../jsonapi/errors.js';

/**
 * Per-credential request budget (per client address before authentication),
 * counted in Redis when one is given so that every node shares the budget.
 * Headers follow the IETF RateLimit draft; a 429 carries Retry-After.
 */
export async function registerRateLimit(app: FastifyInstance, config: Config, redis?: Redis): Promise<void> {
  await app.register(rateLimit, {
    global: true,
    max: config.rateLimitPerMinute,
    timeWindow: 60_000,
    hook: 'preHandler',
    redis,
    nameSpace: 'parley:rate:',
    skipOnError: true,
    enableDraftSpec: true,
    keyGenerator: (request: FastifyRequest) =>
      request.principal ? `credential:${request.principal.credentialId}` : `address:${request.ip}`,
    allowList: (request: FastifyRequest) => request.routeOptions.config.public === true,
    errorResponseBuilder: (_request, context) =>
      ApiError.of(429, 'rate_limited', `Rate limit of ${context.max} requests per minute exceeded; retry in ${context.after}.`, undefined, {
        'Retry-After': String(Math.ceil(context.ttl / 1000)),
      }),
  });
}
