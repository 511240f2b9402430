import type { FastifyInstance, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { sql } from 'kysely';
import { forbidden } from '../jsonapi/errors.js';
import type { EngineOptions } from '../jsonapi/routes.js';
import { authenticate } from './authenticate.js';
import { CREDENTIALS_CHANNEL, CredentialCache } from './credential-cache.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** Why the credential was refused; answered by `refuseUnauthenticated`, after the rate limiter counted it. */
    authFailure?: unknown;
  }
}

/**
 * The path a request is routed by: its route's pattern when it matched one (the router decodes the URL, so
 * `/%61pi/conversations` is `/api/conversations`), else the URL's path, taken out of an absolute-form target
 * (`GET http://host/api/...`, RFC 9112 section 3.2.2) and percent-decoded. Every decision by path (does it
 * need a credential, is it a JSON:API document) uses this, so no spelling of a path escapes authentication.
 */
export function requestPath(request: FastifyRequest): string {
  const route = request.routeOptions.url;
  if (route && route !== '*' && route !== '/*') return route;
  let path = request.url.split('?')[0];
  const origin = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/]*/.exec(path);
  if (origin) path = path.slice(origin[0].length) || '/';
  try {
    path = decodeURIComponent(path);
  } catch {
    // A malformed escape: the router answers it; the path is judged as written.
  }
  return path;
}

export const isApiPath = (request: FastifyRequest) => requestPath(request).startsWith('/api/');

/**
 * Every /api request needs a bearer credential (routes marked public excepted);
 * a publishable key may call only the routes that allow it (login, visitor sessions), and a visitor
 * credential only the routes of the resources whose access rules name visitors (its conversation, its items).
 * Unmatched /api paths are authenticated too, so 401 comes before 404.
 * A refusal is kept on the request and answered by `refuseUnauthenticated`, so
 * that the request limiter (which runs in between) counts it against the client address.
 */
export const authPlugin = fp(
  async (app: FastifyInstance, options: EngineOptions) => {
    const cache = await credentialCache(app, options);
    app.addHook('onRequest', async (request: FastifyRequest) => {
      if (!isApiPath(request)) return;
      const config = request.routeOptions.config;
      if (config?.public) return;
      try {
        const principal = await authenticate(options.database.db, options, request.headers.authorization, cache);
        if (principal.credential === 'publishable_key' && !config?.allowPublishable)
          throw forbidden('A publishable key may only sign users in and open visitor sessions.');
        if (principal.credential === 'visitor' && !config?.allowVisitor)
          throw forbidden('A visitor credential may only read its conversation and post its items.');
        request.principal = principal;
      } catch (error) {
        request.authFailure = error;
      }
    });
  },
  { name: 'parley-auth' },
);

/**
 * The server's cache of verified credentials, dropped by every change to the records behind them, which the
 * database announces (migration 0009). Without a notification channel (a command sharing a server's
 * embedded database) there is no cache.
 */
async function credentialCache(app: FastifyInstance, options: EngineOptions): Promise<CredentialCache | undefined> {
  const ttlMs = options.config.credentialCacheMs;
  if (ttlMs <= 0) return undefined;
  const cache = new CredentialCache(ttlMs);
  let unlisten: () => Promise<void>;
  try {
    unlisten = await options.database.listen(
      CREDENTIALS_CHANNEL,
      () => cache.invalidate(),
      () => cache.resume(),
      {
        onLost: () => cache.suspend(),
        ownStatementsFirst: true,
      },
    );
  } catch (error) {
    app.log.warn({ err: error }, 'credentials are read on every request: no notification channel');
    return undefined;
  }
  // Another process's change reaches this one's listener a moment after its commit: on PostgreSQL, entries
  // are served only after a fresh read of the credential epoch (one statement shared by concurrent requests),
  // on a connection of its own: through the pool, every request waited for a connection twice, once behind the
  // other requests' statements for this read (docs/benchmarks.md, eighth round).
  const { database } = options;
  if (database.kind === 'postgres') {
    const read = database.readAside
      ? (text: string) => database.readAside!<{ n: string }>(text)
      : async (text: string) => (await sql.raw<{ n: string }>(text).execute(database.db)).rows;
    cache.checkEpoch(async () => (await read('SELECT n::text AS n FROM credential_epoch'))[0]?.n ?? '');
  }
  cache.resume();
  app.addHook('onClose', async () => {
    cache.suspend();
    await unlisten().catch(() => {});
  });
  return cache;
}

/** Answers the refusal `authPlugin` recorded; registered after the rate limiter, before the body is parsed. */
export function refuseUnauthenticated(app: FastifyInstance): void {
  app.addHook('preParsing', async (request) => {
    if (request.authFailure !== undefined) throw request.authFailure;
  });
}
