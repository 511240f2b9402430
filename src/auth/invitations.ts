import { systemActor } from '../jsonapi/actor.js';
import { ApiError } from '../jsonapi/errors.js';
import type { ActionResult } from '../jsonapi/resource.js';
import { busy, invalidCredentials, type SignInContext, signIn } from './login.js';
import { verifyPassword } from './passwords.js';
import { tokenHash } from './tokens.js';

const refused = () =>
  ApiError.of('invalid_attribute', 'The invitation is unknown, accepted already, expired, or for another e-mail address.', {
    pointer: '/data/attributes/invitation_token',
  });

/**
 * POST /api/users/accept_invitation, with the inviting organisation's publishable key (as login): the person
 * invited joins with the invitation's role. An address that has an account proves it is theirs with that
 * account's password (nobody joins someone else's account to an organisation); an address without one
 * gets a new account with the password given. The membership exists from here on, and the answer is the
 * user with an access token, as login's. Failed attempts (a wrong token or password) count against login's
 * throttle, for the e-mail in this organisation and the client address.
 */
export function acceptInvitation(ctx: SignInContext): Promise<ActionResult & { meta: Record<string, unknown> }> {
  const email = String(ctx.values.email).trim();
  const password = String(ctx.values.password);
  const organisationId = ctx.principal.organisationId;
  return signIn(ctx, email, 201, async ({ gate }, failed) => {
    const invitation = await ctx.db
      .selectFrom('invitations')
      .select(['id', 'email', 'role', 'expires_at', 'accepted_at'])
      .where('token_hash', '=', tokenHash(String(ctx.values.invitation_token)))
      .where('organisation_id', '=', organisationId)
      .executeTakeFirst();
    if (
      !invitation ||
      invitation.accepted_at !== null ||
      new Date(invitation.expires_at).getTime() <= Date.now() ||
      invitation.email.toLowerCase() !== email.toLowerCase()
    )
      throw failed(refused());
    const account = await ctx.db
      .selectFrom('users')
      .select(['id', 'password_hash'])
      .where((eb) => eb(eb.fn('lower', ['email']), '=', email.toLowerCase()))
      .executeTakeFirst();
    if (account) {
      const checked = await gate.run(() => verifyPassword(account.password_hash, password), ctx.signal);
      if (!checked) throw busy();
      if (!checked.value) throw failed(invalidCredentials());
    }
    const system = systemActor(organisationId, 'engine');
    return ctx.records.transaction(async (records) => {
      const values: Record<string, unknown> = { email: invitation.email, role: invitation.role };
      // A new account: the password the person chose (checked like any user's), and their name.
      if (!account) Object.assign(values, { password, ...(ctx.values.full_name !== undefined ? { full_name: ctx.values.full_name } : {}) });
      const member = await records.create(system, 'User', values);
      // Locks the invitation: of two acceptances at once, the second finds it accepted (422) and rolls back.
      await records.update(system, 'Invitation', invitation.id, { accepted_at: new Date(), user_id: member.id });
      return member.id;
    });
  });
}
