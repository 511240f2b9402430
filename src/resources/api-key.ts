import { uuidv7 } from 'uuidv7';
import { signToken, tokenHash } from '../auth/tokens.js';
import { sql } from 'kysely';
import { type ActionContext, type ActionResult, ApiError, attr, defineResource, forbidden, ROLES, rel } from '../jsonapi/index.js';
import { ADMINS, EVERY_ROLE, ownRowsForOperators } from './scopes.js';
import { timestamps } from './timestamps.js';
import { roleIn } from './user.js';
import { API_KEY_TYPES } from './values.js';
import { at } from './pointer.js';

/**
 * Issues a key: the token (a JWT naming this record) is returned once, in the
 * create response; the record keeps only its SHA-256. The key acts as its user,
 * who must be a member of the organisation.
 */
async function issueKey(ctx: ActionContext): Promise<ActionResult> {
  const { values, principal } = ctx;
  const userId = (values.user_id as string | undefined) ?? principal.userId;
  const role = userId ? await roleIn(ctx.db, principal.organisationId, userId) : undefined;
  if (!role) {
    throw ApiError.of(userId ? 'invalid_attribute' : 'required', 'The key must belong to a member of the organisation.', at('user_id'));
  }
  // A key acts with its user's role: an admin issuing one for an owner would gain the owner's powers.
  if (ctx.actor.kind === 'principal' && role === 'owner' && principal.role !== 'owner') {
    throw forbidden('Only an owner may issue a key that acts as an owner.');
  }
  // The key never acts above its issuer's role (migration 0014): the issuer keeps a copy of the token, and the
  // member's role may rise later. Keys the system issues (command line, demo) have no ceiling.
  const ceiling = ctx.actor.kind === 'principal' ? principal.role : ((values.role_ceiling as string | null | undefined) ?? null);
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
      user_id: userId!,
      name: values.name as string,
      key_type: values.key_type as string,
      token_hash: tokenHash(token),
      expires_at: expiresAt ?? null,
      role_ceiling: ceiling,
      created_at: now,
      updated_at: now,
    })
    .execute();
  return { id, status: 201, revealed: { token } };
}

/**
 * Revocation is final: `revoked_at` may be set (to now or a past instant; a future end is `expires_at`'s
 * job) and never cleared; setting it again keeps the first time. A revoked key authenticates nothing at once.
 */
function revoke(ctx: ActionContext): void {
  if (!ctx.provided.has('revoked_at')) return;
  const wanted = ctx.values.revoked_at as Date | null;
  const current = ctx.existing?.revoked_at as Date | null | undefined;
  if (current && wanted === null) {
    throw ApiError.of('invalid_transition', 'A revoked key stays revoked; issue a new key instead.', at('revoked_at'));
  }
  // Revoked already (the first time stays), or nothing to revoke.
  if (current || wanted === null) {
    delete ctx.values.revoked_at;
    return;
  }
  if (wanted.getTime() > Date.now() + 1000) {
    throw ApiError.of(
      'invalid_attribute',
      'revoked_at must not be in the future; set expires_at when a key should end later.',
      at('revoked_at'),
    );
  }
}

/**
 * Issued by owners and admins over the API (or the command line): the token is shown once, in the create
 * response. Revoked with PATCH `revoked_at` (the record stays, listed as revoked) or removed with DELETE.
 * Operators see, rename, revoke and delete only their own keys.
 */
export default defineResource({
  type: 'ApiKey',
  path: 'api_keys',
  table: 'api_keys',
  attributes: {
    name: attr.string({ create: 'required', update: true, minLength: 1, maxLength: 120, sortable: true, filterable: true }),
    key_type: attr.enum(API_KEY_TYPES, { create: 'required', sortable: true, filterable: true }),
    expires_at: attr.timestamp({ create: true, nullable: true, sortable: true, filterable: true }),
    revoked_at: attr.timestamp({ update: true, nullable: true, sortable: true, filterable: true }),
    organisation_id: attr.uuid({ sortable: true, filterable: true }),
    user_id: attr.uuid({ create: true, sortable: true, filterable: true, references: 'User', referenceCheckedByAction: true }),
    role_ceiling: attr.enum(ROLES, {
      nullable: true,
      description:
        "The role of whoever issued the key: the key acts with its user's role, never above this one. Null: issued by the command line (no ceiling).",
    }),
    token: attr.string({
      revealedOnCreate: true,
      description: 'The key itself, shown once in the response that creates it; null afterwards.',
    }),
    ...timestamps,
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
    user: rel.belongsTo('User', 'user_id'),
  },
  operations: { list: true, get: true, create: true, update: true, delete: true },
  access: {
    read: EVERY_ROLE,
    create: ADMINS,
    update: EVERY_ROLE,
    delete: EVERY_ROLE,
    visible: ownRowsForOperators('user_id'),
    // An admin sees an owner's keys but may not rename, revoke or delete them (the publishable key included):
    // that would cut an owner, or every visitor and the console link, off.
    writable: (p, alias) =>
      p.role === 'admin'
        ? sql`NOT EXISTS (SELECT 1 FROM memberships m WHERE m.organisation_id = ${sql.ref(`${alias}.organisation_id`)}
            AND m.user_id = ${sql.ref(`${alias}.user_id`)} AND m.role = 'owner')`
        : undefined,
    writableNote: "Admins may not change or delete an owner's key",
  },
  create: issueKey,
  beforeUpdate: revoke,
});
