/**
 * Short-lived SIP credentials for the browser softphone (CONTRACT section 15, docs/sip.md "Softphone
 * credentials"). A signed-in member trades their session for a digest username and password that Kamailio
 * accepts for REGISTER and INVITE as the SIP user, for `SIP_CREDENTIAL_TTL_SECONDS` (10 minutes by default), so
 * the page never holds the SIP user's stored `sip_password`. Kamailio reads them through the `sip_subscriber`
 * view (migration 0022), which drops a credential as soon as it expires, its session or key is revoked or
 * expires, its member leaves the organisation, or (for an operator) the SIP user stops being theirs.
 */
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { uuidv7 } from 'uuidv7';
import { ApiError, forbidden } from '../jsonapi/errors.js';
import type { ActionContext, ActionResult } from '../jsonapi/resource.js';
import { expiryIn } from './tokens.js';

/**
 * POST /api/sip_users/credential: a credential for `sip_user_id`, or for the caller's own SIP user when it is
 * left out. An operator gets one only for their own SIP user (another's is a 422 at `sip_user_id`, naming a record
 * they cannot see, as every reference in a body is; docs/api.md); owners
 * and admins for any SIP user of the organisation. Only user sessions and secret keys may ask (a publishable key
 * or a visitor never reaches here).
 */
export async function issueSipCredential(ctx: ActionContext): Promise<ActionResult & { meta: Record<string, unknown> }> {
  const { principal, services } = ctx;
  if (principal.credential !== 'user_token' && principal.credential !== 'secret_key') {
    throw forbidden('SIP credentials are issued to signed-in members and secret keys only.');
  }
  const requested = (ctx.values.sip_user_id as string | null | undefined) ?? null;
  const { rows } = await sql<{ id: string; sip_username: string; user_id: string | null; domain: string }>`
    SELECT s.id, s.sip_username, s.user_id, parley_sip_domain(o.slug) AS domain
    FROM sip_users s JOIN organisations o ON o.id = s.organisation_id
    WHERE s.organisation_id = ${principal.organisationId}
      AND ${requested === null ? sql`s.user_id = ${principal.userId}` : sql`s.id = ${requested}`}`.execute(ctx.db);
  const sipUser = rows[0];
  if (!sipUser || (principal.role === 'operator' && sipUser.user_id !== principal.userId)) {
    const detail = requested === null ? 'You have no SIP user; an admin can give you one.' : 'No such SIP user.';
    throw ApiError.of('invalid_attribute', detail, { pointer: '/data/attributes/sip_user_id' });
  }
  const wsUri = services.config.sipWsUrl;
  if (!wsUri) {
    throw ApiError.of('conflict', 'This server has no SIP WebSocket address (SIP_WS_URL), so the softphone is not set up.');
  }
  const expiry = expiryIn(services.config.sipCredentialTtlSeconds);
  // The credential as the API returns it (meta.sip_credential).
  const credential = {
    // Digest username: `<sip_username>~<random>`; no SIP user can be named so (`~` is outside their pattern).
    username: `${sipUser.sip_username}~${randomBytes(9).toString('base64url')}`,
    // 32 URL-safe characters from 192 random bits.
    password: randomBytes(24).toString('base64url'),
    expires_at: expiry.text,
    uri: `sip:${sipUser.sip_username}@${sipUser.domain}`,
    domain: sipUser.domain,
    ws_uri: wsUri,
  };
  // Credentials expired for a while are dropped here, in the organisation that issues a new one: the view
  // ignores them already, so this only keeps the table small.
  await sql`DELETE FROM sip_credentials
    WHERE organisation_id = ${principal.organisationId} AND expires_at < now() - interval '1 hour'`.execute(ctx.db);
  await sql`INSERT INTO sip_credentials (id, organisation_id, sip_user_id, user_id, session_id, api_key_id, username, password, expires_at)
    VALUES (${uuidv7()}, ${principal.organisationId}, ${sipUser.id}, ${principal.userId},
            ${principal.credential === 'user_token' ? principal.credentialId : null},
            ${principal.credential === 'secret_key' ? principal.credentialId : null},
            ${credential.username}, ${credential.password}, ${expiry.at})`.execute(ctx.db);
  return { id: sipUser.id, status: 200, unchanged: true, meta: { sip_credential: credential } };
}
