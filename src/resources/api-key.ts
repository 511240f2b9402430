import { uuidv7 } from 'uuidv7';
import { signToken, tokenHash } from '../auth/tokens.js';
import { ApiError } from '../jsonapi/errors.js';
import { attr, defineResource, rel, type ActionContext, type ActionResult } from '../jsonapi/resource.js';
import { EVERY_ROLE, ownRowsForOperators } from './scopes.js';
import { API_KEY_TYPES } from './values.js';

/**
 * Issues a key: the token (a JWT naming this record) is returned once, in the
 * create response; the record keeps only its SHA-256. The key acts as its user,
 * who must be a member of the organisation.
 */
async function issueKey(ctx: ActionContext): Promise<ActionResult> {
  const { values, principal } = ctx;
  const userId = (values.user_id as string | undefined) ?? principal.userId;
  const member = userId
    ? await ctx.db
        .selectFrom('memberships')
        .select('role')
        .where('organisation_id', '=', principal.organisationId)
        .where('user_id', '=', userId)
        .executeTakeFirst()
    : undefined;
  if (!member) {
    throw ApiError.of(422, userId ? 'invalid_attribute' : 'required', 'The key must belong to a member of the organisation.', {
      pointer: '/data/attributes/user_id',
    });
  }
  const id = uuidv7();
  const expiresAt = values.expires_at as Date | null | undefined;
  const token = await signToken(
    { typ: 'api_key', sub: userId!, org: principal.organisationId, jti: id, kty: values.key_type as 'publishable' | 'secret' },
    ctx.services.signingKey,
    expiresAt ?? undefined,
  );
  const now = new Date();
  await ctx.db
    .insertInto('api_keys')
    .values({
      id,
      organisation_id: principal.organisationId,
      user_id: userId,
      name: values.name,
      key_type: values.key_type,
      token_hash: tokenHash(token),
      expires_at: expiresAt ?? null,
      created_at: now,
      updated_at: now,
    })
    .execute();
  return { id, status: 201, revealed: { token } };
}

/** Read over the API; issued by the command line (and the records service), which shows the token once. */
export default defineResource({
  type: 'ApiKey',
  path: 'api_keys',
  table: 'api_keys',
  attributes: {
    name: attr.string({ create: 'required', minLength: 1, maxLength: 120, sortable: true, filterable: true }),
    key_type: attr.enum(API_KEY_TYPES, { create: 'required', sortable: true, filterable: true }),
    expires_at: attr.timestamp({ create: true, nullable: true, sortable: true, filterable: true }),
    revoked_at: attr.timestamp({ nullable: true, sortable: true, filterable: true }),
    organisation_id: attr.uuid({ sortable: true, filterable: true }),
    user_id: attr.uuid({ create: true, sortable: true, filterable: true, references: 'User', referenceCheckedByAction: true }),
    token: attr.string({ revealedOnCreate: true, description: 'The key itself, shown once in the response that creates it; null afterwards.' }),
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
    user: rel.belongsTo('User', 'user_id'),
  },
  operations: { list: true, get: true },
  access: { read: EVERY_ROLE, visible: ownRowsForOperators('user_id') },
  create: issueKey,
});
