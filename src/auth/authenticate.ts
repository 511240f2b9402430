import { sql } from 'kysely';
import type { Db } from '../db/schema.js';
import { unauthenticated } from '../jsonapi/errors.js';
import type { Principal, Role } from '../jsonapi/principal.js';
import type { AppServices } from '../jsonapi/index.js';
import type { CredentialCache } from './credential-cache.js';
import { tokenHash, verifyToken, type TokenClaims } from './tokens.js';

/**
 * Resolves `Authorization: Bearer <jwt>` to a principal. The signature,
 * algorithm, issuer, audience and expiry are checked, then the backing record
 * (key or session: present, not revoked, not expired) and the membership,
 * whose role applies (for a key, capped at its issuer's role), in one query, unless `cache` holds them from a recent
 * request (see CredentialCache for why that stays exact). Any failure is the same 401.
 */
export async function authenticate(db: Db, services: AppServices, header: string | undefined, cache?: CredentialCache): Promise<Principal> {
  const match = /^Bearer +([A-Za-z0-9_\-.]{1,4096})$/.exec(header ?? '');
  if (!match) throw unauthenticated();
  const token = match[1];
  const claims = await verifyToken(token, services.signingKey);
  if (!claims) throw unauthenticated('The bearer token is invalid or expired.');
  if (claims.typ === 'visitor') return authenticateVisitor(db, claims);
  const cached = cache?.get(token);
  if (cached && (await cache!.current(token))) return cached;
  const mark = cache?.mark() ?? 0;

  type Row = { role: Role; kind: string; expires_at: Date | string | null; epoch: string };
  const record =
    claims.typ === 'api_key'
      ? // The membership's role, but never above the key's ceiling (its issuer's role, migration 0014).
        sql<Row>`SELECT CASE WHEN m.role = 'operator' OR k.role_ceiling = 'operator' THEN 'operator'
                        WHEN m.role = 'admin' OR k.role_ceiling = 'admin' THEN 'admin' ELSE m.role END AS role,
              k.key_type AS kind, k.expires_at, (SELECT n::text FROM credential_epoch) AS epoch FROM api_keys k
            JOIN memberships m ON m.organisation_id = k.organisation_id AND m.user_id = k.user_id
            WHERE k.id = ${claims.jti} AND k.organisation_id = ${claims.org} AND k.user_id = ${claims.sub}
              AND k.token_hash = ${tokenHash(token)} AND k.revoked_at IS NULL
              AND (k.expires_at IS NULL OR k.expires_at > now())`
      : sql<Row>`SELECT m.role, 'user' AS kind, s.expires_at, (SELECT n::text FROM credential_epoch) AS epoch FROM user_sessions s
            JOIN memberships m ON m.organisation_id = s.organisation_id AND m.user_id = s.user_id
            WHERE s.id = ${claims.jti} AND s.organisation_id = ${claims.org} AND s.user_id = ${claims.sub}
              AND s.revoked_at IS NULL AND s.expires_at > now()`;
  const row = (await record.execute(db)).rows[0];
  if (!row || (claims.typ === 'api_key' && row.kind !== claims.kty)) throw unauthenticated('The bearer token is invalid or expired.');
  const principal: Principal = {
    organisationId: claims.org,
    userId: claims.sub,
    role: row.role,
    credential: claims.typ === 'user' ? 'user_token' : row.kind === 'publishable' ? 'publishable_key' : 'secret_key',
    credentialId: claims.jti,
  };
  // The epoch of the snapshot the records were read in (the same statement).
  cache?.set(token, principal, row.expires_at === null ? Infinity : new Date(row.expires_at).getTime(), mark, row.epoch);
  return principal;
}

/**
 * A visitor credential (issued to the chat widget with a publishable key) lives as long as its JWT, the
 * publishable key that issued it (not revoked, not expired, its user still a member) and its conversation.
 */
async function authenticateVisitor(db: Db, claims: TokenClaims): Promise<Principal> {
  const { rows } = await sql<{ ok: number }>`
    SELECT 1 AS ok FROM api_keys k
    JOIN memberships m ON m.organisation_id = k.organisation_id AND m.user_id = k.user_id
    JOIN conversations c ON c.organisation_id = k.organisation_id AND c.id = ${claims.cnv}
    WHERE k.id = ${claims.jti} AND k.organisation_id = ${claims.org} AND k.key_type = 'publishable'
      AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())`.execute(db);
  if (rows.length === 0) throw unauthenticated('The bearer token is invalid or expired.');
  return {
    organisationId: claims.org,
    userId: claims.sub,
    role: 'visitor',
    credential: 'visitor',
    credentialId: claims.sub,
    conversationId: claims.cnv,
  };
}
