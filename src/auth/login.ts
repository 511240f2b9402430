import { sql } from 'kysely';
import { ApiError } from '../jsonapi/errors.js';
import { memo } from '../jsonapi/memo.js';
import type { AppServices } from '../jsonapi/index.js';
import type { ActionContext, ActionResult } from '../jsonapi/resource.js';
import { createCounter } from './counters.js';
import { HashGate, verifyAgainstDummy, verifyPassword } from './passwords.js';
import { createLoginThrottle, type LoginThrottle } from './throttle.js';
import { issueUserToken } from './user-tokens.js';

/**
 * One throttle and one hash gate per server (exported for diagnostics and tests), keyed by its configuration, which
 * every copy of its services shares (the records service's and the routes'), so that separate servers stay apart.
 */
const guards = new WeakMap<AppServices['config'], { throttle: LoginThrottle; gate: HashGate }>();
export function guardsFor({ config, redis }: AppServices) {
  return memo(guards, config, () => ({
    throttle: createLoginThrottle(config, createCounter(redis)),
    gate: new HashGate(config.loginHashConcurrency, config.loginHashQueue),
  }));
}

export const invalidCredentials = () =>
  ApiError.of('invalid_credentials', 'The e-mail or password is wrong.', undefined, { 'WWW-Authenticate': 'Bearer' });

export const busy = () =>
  ApiError.of('unavailable', 'Too many sign-ins are being checked right now; try again shortly.', undefined, { 'Retry-After': '1' });

/** Login's largest body: an e-mail (254 characters) and a password (1,024, up to 4 KiB of UTF-8) fit many times over. */
export const LOGIN_BODY_LIMIT_BYTES = 16 * 1024;

/** A sign-in whose body was refused (400, 413, 415, 422) counts against its address as a failed one. */
export async function countRefusedLogin(services: AppServices, clientAddress: string): Promise<void> {
  await guardsFor(services)
    .throttle.refused(clientAddress)
    .catch(() => undefined);
}

export type SignInContext = ActionContext & { clientAddress: string; signal?: AbortSignal };

/**
 * A sign-in (login, accepting an invitation): the attempt is counted before `check` runs (see throttle.ts) and
 * given back unless `check` throws an error passed through `refused`; the user `check` names gets an access token
 * in meta.token.
 */
export async function signIn(
  ctx: SignInContext,
  email: string,
  status: 200 | 201,
  check: (guards: ReturnType<typeof guardsFor>, refused: (error: ApiError) => ApiError) => Promise<string>,
): Promise<ActionResult & { meta: Record<string, unknown> }> {
  const organisationId = ctx.principal.organisationId;
  const guards = guardsFor(ctx.services);
  const reservation = await guards.throttle.reserve(organisationId, email, ctx.clientAddress);
  let failed = false;
  try {
    const userId = await check(guards, (error) => {
      failed = true;
      return error;
    });
    return { id: userId, status, meta: (await issueUserToken(ctx.db, ctx.services, { organisationId, userId })).meta };
  } finally {
    if (!failed) await reservation.release();
  }
}

/**
 * POST /api/users/login: a member of the credential's organisation signs in
 * with e-mail and password and receives a user access token in meta.token.
 * Unknown e-mail and wrong password answer alike, in similar time.
 */
export function login(ctx: SignInContext): Promise<ActionResult & { meta: Record<string, unknown> }> {
  const email = String(ctx.values.email);
  const password = String(ctx.values.password);
  const organisationId = ctx.principal.organisationId;
  return signIn(ctx, email, 200, async ({ throttle, gate }, refused) => {
    const { rows } = await sql<{ id: string; password_hash: string }>`
      SELECT u.id, u.password_hash FROM users u
      JOIN memberships m ON m.user_id = u.id AND m.organisation_id = ${organisationId}
      WHERE lower(u.email) = ${email.toLowerCase()}`.execute(ctx.db);
    const user = rows[0];
    if (!user && !(await throttle.unknownAccount(organisationId))) {
      // The organisation's budget of checks for unknown e-mails is spent: the same answer, after about the time a
      // check takes, without one (a timer, not a password-check slot).
      await new Promise((resolve) => setTimeout(resolve, gate.typicalMs));
      throw refused(invalidCredentials());
    }
    const checked = await gate.run(() => (user ? verifyPassword(user.password_hash, password) : verifyAgainstDummy(password)), ctx.signal);
    if (!checked) throw busy();
    if (!user || !checked.value) throw refused(invalidCredentials());
    return user.id;
  });
}
