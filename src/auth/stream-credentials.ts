/**
 * Credentials of long-lived connections (GET /api/events) checked again after they were accepted: a stream
 * authenticates once, so whatever ends a credential (a revoked key or session, a removed member, a changed
 * role, the token's expiry) must also end the streams opened with it (docs/events.md, "Ends").
 */
import { sql } from 'kysely';
import { decodeJwt } from 'jose';
import type { Db } from '../db/schema.js';
import type { Principal } from '../jsonapi/principal.js';
import type { AppServices } from '../jsonapi/index.js';
import { authenticate } from './authenticate.js';

/** When a verified bearer token expires (ms since the epoch); Infinity for a token without `exp` (an API key without expiry). */
export function tokenExpiryMs(token: string): number {
  const { exp } = decodeJwt(token);
  return typeof exp === 'number' ? exp * 1000 : Infinity;
}

/** The publishable key that issued a visitor credential, as `organisation:key id` (its `jti`). */
export function visitorIssuer(token: string, organisationId: string): string {
  return `${organisationId}:${decodeJwt(token).jti}`;
}

/**
 * Whether a member's credential still stands with the same role: the full check of a request (no cache), so
 * that a stream is judged exactly as its next request would be. False for a refused credential or another role.
 */
export async function memberCredentialStands(db: Db, services: AppServices, token: string, principal: Principal): Promise<boolean> {
  try {
    const now = await authenticate(db, services, `Bearer ${token}`);
    return now.role === principal.role && now.userId === principal.userId && now.organisationId === principal.organisationId;
  } catch (error) {
    if ((error as { status?: number }).status === 401) return false;
    throw error;
  }
}

/**
 * Of the publishable keys that issued visitor credentials (`organisation:key id`), those that still stand:
 * present, not revoked, not expired, their user still a member (the conditions of a visitor's request,
 * src/auth/authenticate.ts, less its conversation, which no credential change touches). One statement for
 * every visitor stream of the process, however many.
 */
export async function standingPublishableKeys(db: Db, keys: Iterable<string>): Promise<Set<string>> {
  const wanted = [...keys].map((key) => key.split(':'));
  if (wanted.length === 0) return new Set();
  const { rows } = await sql<{ key: string }>`
    SELECT k.organisation_id || ':' || k.id AS key
    FROM unnest(${wanted.map((w) => w[0])}::uuid[], ${wanted.map((w) => w[1])}::uuid[]) AS wanted(organisation_id, id)
    JOIN api_keys k ON k.organisation_id = wanted.organisation_id AND k.id = wanted.id
    JOIN memberships m ON m.organisation_id = k.organisation_id AND m.user_id = k.user_id
    WHERE k.key_type = 'publishable' AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())`.execute(db);
  return new Set(rows.map((r) => r.key));
}
