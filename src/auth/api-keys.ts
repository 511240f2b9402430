/** Issuing and revoking API keys, through the records service with the system as actor. */
import type { Db } from '../db/schema.js';
import { systemActor } from '../jsonapi/actor.js';
import type { Records } from '../jsonapi/records.js';

/** Issues an API key: the token is returned once; the record keeps only its hash. */
export async function createApiKey(
  records: Records,
  input: { organisationId: string; userId: string; keyType: 'publishable' | 'secret'; name: string; expiresAt?: Date },
) {
  const { id, record } = await records.create(systemActor(input.organisationId, 'cli'), 'ApiKey', {
    user_id: input.userId,
    key_type: input.keyType,
    name: input.name,
    expires_at: input.expiresAt,
  });
  const { attributes } = record;
  return {
    id,
    token: String(attributes.token),
    key_type: input.keyType,
    name: attributes.name,
    organisation_id: input.organisationId,
    user_id: input.userId,
    expires_at: attributes.expires_at,
  };
}

/** Revokes a key at once; returns whether an active key was revoked. */
export async function revokeApiKey(db: Db, records: Records, id: string): Promise<boolean> {
  const key = await db.selectFrom('api_keys').select(['organisation_id', 'revoked_at']).where('id', '=', id).executeTakeFirst();
  if (!key || key.revoked_at !== null) return false;
  await records.update(systemActor(key.organisation_id, 'cli'), 'ApiKey', id, { revoked_at: new Date() });
  return true;
}
