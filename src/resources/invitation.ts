import { randomBytes } from 'node:crypto';
import { uuidv7 } from 'uuidv7';
import { tokenHash } from '../auth/tokens.js';
import { type ActionContext, type ActionResult, ApiError, attr, defineResource, forbidden, rel, ROLES } from '../jsonapi/index.js';
import { ADMINS } from './scopes.js';
import { timestamps } from './timestamps.js';
import { EMAIL } from './user.js';
import { at } from './pointer.js';

const DAY_MS = 24 * 3600 * 1000;
export const INVITATION_DEFAULT_DAYS = 7;
const INVITATION_MAX_DAYS = 30;

/** `inv_` and 256 random bits: the invitation's only proof, handed to the person invited. */
const newInvitationToken = () => `inv_${randomBytes(32).toString('base64url')}`;

/**
 * Invites an address. Nothing about accounts is looked at, so the answer is the same whether the address
 * has an account anywhere or not (no existence oracle, no name): only a current member of this organisation
 * is refused (409), which every member can read anyway. The membership is made when the person accepts
 * (`POST /api/users/accept_invitation`, src/auth/invitations.ts).
 */
async function invite(ctx: ActionContext): Promise<ActionResult> {
  const { db, values, principal } = ctx;
  if (ctx.actor.kind === 'principal' && values.role === 'owner' && principal.role !== 'owner') {
    throw forbidden('Only an owner may invite an owner.');
  }
  const email = String(values.email).trim();
  const member = await db
    .selectFrom('memberships')
    .innerJoin('users', 'users.id', 'memberships.user_id')
    .select('memberships.user_id')
    .where('memberships.organisation_id', '=', principal.organisationId)
    .where((eb) => eb(eb.fn('lower', ['users.email']), '=', email.toLowerCase()))
    .executeTakeFirst();
  if (member) throw ApiError.of('conflict', `${email} is a member of this organisation already`, at('email'));
  const now = new Date();
  const expiresAt = (values.expires_at as Date | undefined) ?? new Date(now.getTime() + INVITATION_DEFAULT_DAYS * DAY_MS);
  if (expiresAt.getTime() <= now.getTime() || expiresAt.getTime() > now.getTime() + INVITATION_MAX_DAYS * DAY_MS) {
    throw ApiError.of('invalid_attribute', `expires_at must be in the next ${INVITATION_MAX_DAYS} days.`, at('expires_at'));
  }
  const token = newInvitationToken();
  const id = uuidv7();
  await db
    .insertInto('invitations')
    .values({
      id,
      organisation_id: principal.organisationId,
      email,
      role: String(values.role),
      invited_by_user_id: principal.userId,
      token_hash: tokenHash(token),
      expires_at: expiresAt,
      accepted_at: null,
      user_id: null,
      created_at: now,
      updated_at: now,
    })
    .execute();
  return { id, status: 201, revealed: { token } };
}

/** Accepting is once: an accepted invitation is never accepted again (the row is locked while this runs). */
function acceptOnce(ctx: ActionContext): void {
  if (ctx.existing?.accepted_at) {
    throw ApiError.of('invalid_transition', 'The invitation was accepted already.', at('accepted_at'));
  }
}

/**
 * An invitation to join the organisation with a role: made by owners and admins (an owner only by an owner),
 * accepted by the person it was sent to, withdrawn by DELETE. The token is shown once, in the create
 * response; accepting is `POST /api/users/accept_invitation` with it (docs/api.md, "Members and roles").
 */
export default defineResource({
  type: 'Invitation',
  path: 'invitations',
  table: 'invitations',
  attributes: {
    email: attr.string({
      create: 'required',
      minLength: 3,
      maxLength: 254,
      pattern: EMAIL,
      sortable: true,
      filterable: true,
      example: 'owner@example.com',
    }),
    role: attr.enum(ROLES, { create: 'required', filterable: true, description: 'The role the person will have once they accept.' }),
    expires_at: attr.timestamp({
      create: true,
      sortable: true,
      filterable: true,
      description: `Until when it may be accepted (default ${INVITATION_DEFAULT_DAYS} days, at most ${INVITATION_MAX_DAYS}).`,
    }),
    accepted_at: attr.timestamp({ nullable: true, sortable: true, filterable: true, description: 'When it was accepted; null before.' }),
    user_id: attr.uuid({ nullable: true, filterable: true, description: 'The user who accepted it (null before).' }),
    invited_by_user_id: attr.uuid({ nullable: true, filterable: true, description: 'The member who sent it.' }),
    organisation_id: attr.uuid({ sortable: true, filterable: true }),
    token: attr.string({
      revealedOnCreate: true,
      description: 'The invitation itself, shown once in the response that creates it; null afterwards. Hand it to the person invited.',
    }),
    ...timestamps,
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  operations: { list: true, get: true, create: true, delete: true },
  access: { read: ADMINS, create: ADMINS, delete: ADMINS },
  create: invite,
  beforeUpdate: acceptOnce,
});
