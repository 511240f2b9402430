import { uuidv7 } from 'uuidv7';
import type { Database } from '../db/connection.js';
import type { AppServices } from '../jsonapi/resource.js';
import { signToken, tokenHash } from './tokens.js';

export type KeyType = 'publishable' | 'secret';

/** Issues an API key: the token is returned once; the record keeps only its hash. */
export async function createApiKey(
  db: Database,
  services: AppServices,
  input: { organisationId: string; userId: string; keyType: KeyType; name: string; expiresAt?: Date },
) {
  if (input.keyType !== 'publishable' && input.keyType !== 'secret') throw new Error('key type must be publishable or secret');
  const name = input.name?.trim();
  if (!name || name.length > 120) throw new Error('key name must be 1 to 120 characters');
  if (input.expiresAt && Number.isNaN(input.expiresAt.getTime())) throw new Error('expires-at must be an RFC 3339 date-time');
  const member = await db
    .selectFrom('memberships')
    .select('role')
    .where('organisation_id', '=', input.organisationId)
    .where('user_id', '=', input.userId)
    .executeTakeFirst();
  if (!member) throw new Error(`user ${input.userId} is not a member of organisation ${input.organisationId}`);
  const id = uuidv7();
  const token = await signToken(
    { typ: 'api_key', sub: input.userId, org: input.organisationId, jti: id, kty: input.keyType },
    services.signingKey,
    input.expiresAt,
  );
  const now = new Date();
  await db
    .insertInto('api_keys')
    .values({
      id,
      organisation_id: input.organisationId,
      user_id: input.userId,
      name,
      key_type: input.keyType,
      token_hash: tokenHash(token),
      expires_at: input.expiresAt ?? null,
      created_at: now,
      updated_at: now,
    })
    .execute();
  return {
    id,
    token,
    key_type: input.keyType,
    name,
    organisation_id: input.organisationId,
    user_id: input.userId,
    expires_at: input.expiresAt?.toISOString() ?? null,
  };
}

/** Revokes a key at once; returns whether one was revoked. */
export async function revokeApiKey(db: Database, id: string): Promise<boolean> {
  const result = await db
    .updateTable('api_keys')
    .set({ revoked_at: new Date(), updated_at: new Date() })
    .where('id', '=', id)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
  return Number(result.numUpdatedRows) > 0;
}
