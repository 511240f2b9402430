import { sql } from 'kysely';
import type { Database } from '../db/connection.js';
import { unauthenticated } from '../jsonapi/errors.js';
import type { AppServices, Principal, Role } from '../jsonapi/resource.js';
import { tokenHash, verifyToken } from './tokens.js';

/**
 * Resolves `Authorization: Bearer <jwt>` to a principal. The signature,
 * algorithm, issuer, audience and expiry are checked, then the backing record
 * (key or session: present, not revoked, not expired) and the membership,
 * whose role applies, in one query. Any failure is the same 401.
 */
export async function authenticate(db: Database, services: AppServices, header: string | undefined): Promise<Principal> {
  const match = /^Bearer +([A-Za-z0-9_\-.]{1,4096})$/.exec(header ?? '');
  if (!match) throw unauthenticated();
  const token = match[1];
  const claims = await verifyToken(token, services.signingKey);
  if (!claims) throw unauthenticated('The bearer token is invalid or expired.');

  const record =
    claims.typ === 'api_key'
      ? sql`SELECT m.role, k.key_type AS kind FROM api_keys k
            JOIN memberships m ON m.organisation_id = k.organisation_id AND m.user_id = k.user_id
            WHERE k.id = ${claims.jti} AND k.organisation_id = ${claims.org} AND k.user_id = ${claims.sub}
              AND k.token_hash = ${tokenHash(token)} AND k.revoked_at IS NULL
              AND (k.expires_at IS NULL OR k.expires_at > now())`
      : sql`SELECT m.role, 'user' AS kind FROM user_sessions s
            JOIN memberships m ON m.organisation_id = s.organisation_id AND m.user_id = s.user_id
            WHERE s.id = ${claims.jti} AND s.organisation_id = ${claims.org} AND s.user_id = ${claims.sub}
              AND s.revoked_at IS NULL AND s.expires_at > now()`;
  const { rows } = await (record as ReturnType<typeof sql<{ role: Role; kind: string }>>).execute(db);
  const row = rows[0];
  if (!row || (claims.typ === 'api_key' && row.kind !== claims.kty)) throw unauthenticated('The bearer token is invalid or expired.');
  return {
    organisationId: claims.org,
    userId: claims.sub,
    role: row.role,
    credential: claims.typ === 'user' ? 'user_token' : row.kind === 'publishable' ? 'publishable_key' : 'secret_key',
    credentialId: claims.jti,
  };
}
