import rateLimit from '@fastify/rate-limit';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Redis } from 'ioredis';
import { createCounter } from '../auth/counters.js';
import { isApiPath } from '../auth/plugin.js';
import type { Config } from '../config/index.js';
import { ApiError } from '../jsonapi/errors.js';
import { memo } from '../jsonapi/memo.js';

/**
 * The budget a request counts against: its credential; a publishable key's per client address (the key is
 * public, so one visitor must not be able to spend every visitor's budget); the client address when the
 * request has no valid credential (so 401s and 403s are limited too).
 */
export function rateLimitKey(request: FastifyRequest): string {
  const principal = request.principal;
  if (!principal) return `address:${request.ip}`;
  if (principal.credential === 'publishable_key') return `publishable:${principal.credentialId}:${request.ip}`;
  return `credential:${principal.credentialId}`;
}

/**
 * Per-credential request budget, counted in Redis when one is given so that every node shares the budget,
 * and in this node's memory while Redis is unreachable (never switched off). Headers follow the IETF
 * RateLimit draft; a 429 carries Retry-After. It runs before the body is parsed and before an authentication
 * failure is answered, so that every request under /api, whatever its answer, is counted.
 */
export async function registerRateLimit(app: FastifyInstance, config: Config, redis?: Redis): Promise<void> {
  const counter = createCounter(redis);
  class Store {
    incr(key: string, done: (error: Error | null, result?: { current: number; ttl: number }) => void, timeWindow = 60_000) {
      counter.add(`rate:${key}`, timeWindow, 1).then(
        (result) => done(null, { current: result.count, ttl: result.ttlMs }),
        (error: Error) => done(error),
      );
    }
    /** One budget per key across every route. */
    child() {
      return this;
    }
  }
  await app.register(rateLimit, {
    global: false,
    max: config.rateLimitPerMinute,
    timeWindow: 60_000,
    store: Store,
    enableDraftSpec: true,
    keyGenerator: rateLimitKey,
    allowList: (request: FastifyRequest) => !isApiPath(request) || request.routeOptions.config?.public === true,
    errorResponseBuilder: (_request, context) =>
      ApiError.of('rate_limited', `Rate limit of ${context.max} requests exceeded; retry in ${context.after}.`, undefined, {
        'Retry-After': String(Math.ceil(context.ttl / 1000)),
      }),
  });
  // An instance hook (not a per-route one) so that it also runs for unmatched paths, in order with the hooks after it.
  app.addHook('preParsing', app.rateLimit());

  // Tighter budgets besides that one (the plugin runs one limiter per request, so these are checked here):
  // a visitor credential (anyone on a website with the chat widget) has its own smaller budget, all visitors
  // from one client address share one, and routes may set a budget per address (opening visitor sessions).
  const limiters = new Map<string, ReturnType<FastifyInstance['createRateLimit']>>();
  const limiter = (name: string, max: number, timeWindow: number, key: (request: FastifyRequest) => string) =>
    memo(limiters, name, () => app.createRateLimit({ max, timeWindow, keyGenerator: key }));
  const spend = async (check: ReturnType<FastifyInstance['createRateLimit']>, request: FastifyRequest, what: string) => {
    const limit = await check(request);
    if (limit.isAllowed || !limit.isExceeded) return;
    const seconds = Math.max(1, limit.ttlInSeconds);
    throw ApiError.of('rate_limited', `${what}: at most ${limit.max} requests; retry in ${seconds} s.`, undefined, {
      'Retry-After': String(seconds),
    });
  };
  const tighter = async (request: FastifyRequest, budget: { max: number; timeWindowMs: number } | undefined) => {
    if (budget) {
      const url = request.routeOptions.url ?? '';
      await spend(
        limiter(`route:${url}`, budget.max, budget.timeWindowMs, (r) => `route:${url}:${r.ip}`),
        request,
        'Requests to this path from your address',
      );
    }
    if (request.principal?.credential !== 'visitor') return;
    await spend(
      limiter('visitor', config.visitorRateLimitPerMinute, 60_000, (r) => `visitor:${r.principal?.credentialId}`),
      request,
      'This visitor',
    );
    await spend(
      limiter('visitor-address', config.visitorAddressRateLimitPerMinute, 60_000, (r) => `visitor-address:${r.ip}`),
      request,
      'Visitors from your address',
    );
  };
  // A callback: a request with no tighter budget (almost every one) costs no promise.
  app.addHook('preHandler', (request, _reply, done) => {
    const budget = request.routeOptions.config?.addressBudget;
    if (!budget && request.principal?.credential !== 'visitor') return done();
    tighter(request, budget).then(() => done(), done);
  });
}
