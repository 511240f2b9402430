import { sql } from 'kysely';
import { ApiError } from '../jsonapi/errors.js';
import type { ActionContext, ActionResult, AppServices } from '../jsonapi/resource.js';
import { verifyAgainstDummy, verifyPassword } from './passwords.js';
import { createLoginThrottle, type LoginThrottle } from './throttle.js';
import { issueUserToken } from './user-tokens.js';

/** One throttle per server (keyed by its services), so that separate servers in one process stay apart. */
const throttles = new WeakMap<AppServices, LoginThrottle>();
function throttleFor(services: AppServices): LoginThrottle {
  let throttle = throttles.get(services);
  if (!throttle) throttles.set(services, (throttle = createLoginThrottle(services.config, services.redis)));
  return throttle;
}

const invalidCredentials = () =>
  ApiError.of(401, 'invalid_credentials', 'The e-mail or password is wrong.', undefined, { 'WWW-Authenticate': 'Bearer' });

/**
 * POST /api/users/login: a member of the credential's organisation signs in
 * with e-mail and password and receives a user access token in meta.token.
 * Unknown e-mail and wrong password answer alike, in similar time.
 */
export async function login(ctx: ActionContext & { clientAddress: string }): Promise<ActionResult & { meta: Record<string, unknown> }> {
  const email = String(ctx.values.email);
  const password = String(ctx.values.password);
  const throttle = throttleFor(ctx.services);
  await throttle.check(email, ctx.clientAddress);
  const { rows } = await sql<{ id: string; password_hash: string }>`
    SELECT u.id, u.password_hash FROM users u
    JOIN memberships m ON m.user_id = u.id AND m.organisation_id = ${ctx.principal.organisationId}
    WHERE lower(u.email) = ${email.toLowerCase()}`.execute(ctx.db);
  const user = rows[0];
  const valid = user ? await verifyPassword(user.password_hash, password) : await verifyAgainstDummy(password);
  if (!user || !valid) {
    await throttle.fail(email, ctx.clientAddress);
    throw invalidCredentials();
  }
  const { token, expiresAt } = await issueUserToken(ctx.db, ctx.services, { organisationId: ctx.principal.organisationId, userId: user.id });
  return { id: user.id, status: 200, meta: { token, token_expires_at: expiresAt.toISOString().replace(/\.\d{3}Z$/, 'Z') } };
}
