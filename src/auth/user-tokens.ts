import { uuidv7 } from 'uuidv7';
import type { Db } from '../db/schema.js';
import type { AppServices } from '../jsonapi/index.js';
import { expiryIn, signToken } from './tokens.js';

/** A user access token for one organisation, backed by a user_sessions row (for revocation). */
export async function issueUserToken(db: Db, services: AppServices, input: { organisationId: string; userId: string }) {
  const sessionId = uuidv7();
  const { at: expiresAt, text } = expiryIn(services.config.userTokenTtlSeconds);
  await db
    .insertInto('user_sessions')
    .values({ id: sessionId, organisation_id: input.organisationId, user_id: input.userId, expires_at: expiresAt, created_at: new Date() })
    .execute();
  const token = await signToken(
    { typ: 'user', sub: input.userId, org: input.organisationId, jti: sessionId },
    services.signingKey,
    expiresAt,
  );
  return { token, expiresAt, sessionId, meta: { token, token_expires_at: text } };
}

/** Revokes every live token of a user (in one organisation, or all; but the session `except`); returns how many. */
export async function revokeUserTokens(db: Db, input: { userId: string; organisationId?: string; except?: string }): Promise<number> {
  let query = db
    .updateTable('user_sessions')
    .set({ revoked_at: new Date() })
    .where('user_id', '=', input.userId)
    .where('revoked_at', 'is', null);
  if (input.organisationId) query = query.where('organisation_id', '=', input.organisationId);
  if (input.except) query = query.where('id', '<>', input.except);
  const result = await query.executeTakeFirst();
  return Number(result.numUpdatedRows);
}
