import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { uuidv7 } from 'uuidv7';
import { acceptInvitation } from '../auth/invitations.js';
import { countRefusedLogin, login, LOGIN_BODY_LIMIT_BYTES } from '../auth/login.js';
import { hashPassword, verifyPassword } from '../auth/passwords.js';
import { revokeUserTokens } from '../auth/user-tokens.js';
import type { Db } from '../db/schema.js';
import {
  type ActionContext,
  type ActionResult,
  ApiError,
  attr,
  defineResource,
  notFound,
  rel,
  type Role,
  ROLES,
  systemActor,
} from '../jsonapi/index.js';
import { ADMINS, EVERY_ROLE } from './scopes.js';
import { timestamps } from './timestamps.js';
import { at } from './pointer.js';

/** An address with one @ and a dot in its domain: enough to catch typing mistakes, not to prove delivery. */
export const EMAIL = '^[^\\s@]+@[^\\s@]+\\.[^\\s@]+$';
export const MIN_PASSWORD_LENGTH = 8;

/** 16 URL-safe characters from 96 random bits: a password no one guesses before its user replaces it. */
const newInitialPassword = () => randomBytes(12).toString('base64url');

/**
 * The member's role and whether another owner remains, with the memberships of the member and of every owner
 * locked, in one statement and in user order: two owners demoting or removing each other at once then wait
 * for each other instead of deadlocking, and the second sees the first's change (READ COMMITTED re-reads a
 * locked row, and one no longer an owner drops out), so the organisation always keeps an owner.
 */
async function lockMembership(db: Db, organisationId: string, userId: string) {
  const { rows } = await sql<{ user_id: string; role: Role }>`
    SELECT user_id, role FROM memberships
    WHERE organisation_id = ${organisationId} AND (role = 'owner' OR user_id = ${userId})
    ORDER BY user_id FOR UPDATE`.execute(db);
  return {
    role: rows.find((r) => r.user_id === userId)?.role,
    otherOwner: rows.some((r) => r.user_id !== userId && r.role === 'owner'),
  };
}

/** The user's role in the organisation; undefined for a non-member. */
export const roleIn = async (db: Db, organisationId: string, userId: string) =>
  (
    await db
      .selectFrom('memberships')
      .select('role')
      .where('organisation_id', '=', organisationId)
      .where('user_id', '=', userId)
      .executeTakeFirst()
  )?.role;

const lastOwner = (pointer?: string) =>
  ApiError.of('conflict', "This is the organisation's last owner; make another member an owner first.", pointer ? at(pointer) : undefined);

/** Only an owner makes, unmakes or removes owners (an admin could otherwise take the organisation over). */
function requireOwnerFor(ctx: ActionContext, touchesOwner: boolean, pointer?: string): void {
  if (ctx.actor.kind === 'principal' && touchesOwner && ctx.principal.role !== 'owner') {
    throw ApiError.of('forbidden', 'Only an owner may make, change or remove an owner.', pointer ? at(pointer) : undefined);
  }
}

/**
 * Adds a member to the actor's organisation with the given role. An e-mail address no user has yet makes
 * a new user, with the password given or, when none is, a generated one shown once (`initial_password`).
 * An existing user's address adds that user, who keeps their own name and password (giving a password
 * then is a 409: nobody sets another person's password). E-mail addresses are unique, case-insensitively.
 */
async function createMember(ctx: ActionContext): Promise<ActionResult> {
  const { db, values, principal } = ctx;
  const organisation = await db.selectFrom('organisations').select('id').where('id', '=', principal.organisationId).executeTakeFirst();
  if (!organisation) throw ApiError.of('invalid_attribute', `no organisation ${principal.organisationId}`, { pointer: '/data' });
  requireOwnerFor(ctx, values.role === 'owner', 'role');
  const email = String(values.email).trim();
  const now = new Date();
  const { rows } = await sql<{ id: string }>`SELECT id FROM users WHERE lower(email) = ${email.toLowerCase()}`.execute(db);
  let id = rows[0]?.id;
  let revealed: Record<string, unknown> | undefined;
  if (id) {
    if (values.password !== undefined) {
      throw ApiError.of(
        'conflict',
        `a user with e-mail ${email} exists already; to add them, leave out password (they keep their own)`,
        at('email'),
      );
    }
    if (await roleIn(db, principal.organisationId, id))
      throw ApiError.of('conflict', `${email} is a member of this organisation already`, at('email'));
  } else {
    const password = values.password === undefined ? newInitialPassword() : String(values.password);
    if (values.password === undefined) revealed = { initial_password: password };
    id = uuidv7();
    await db
      .insertInto('users')
      .values({
        id,
        email,
        full_name: String(values.full_name ?? '').trim(),
        password_hash: await hashPassword(password),
        created_at: now,
        updated_at: now,
      })
      .execute();
  }
  await db
    .insertInto('memberships')
    .values({ organisation_id: principal.organisationId, user_id: id, role: values.role as string, created_at: now, updated_at: now })
    .execute();
  return { id, status: 201, revealed };
}

/**
 * A change to a member. Their own name and password are the user's alone: a new password needs the
 * current one and ends every other session of the user (the token making the change stays valid).
 * The role is the membership's, changed by owners and admins (owners only for owners), never leaving
 * the organisation without an owner. The system (command line, demo) sets passwords and roles directly.
 */
async function updateMember(ctx: ActionContext): Promise<void> {
  const { db, values, existing, principal, actor } = ctx;
  const id = String(existing!.id);
  const system = actor.kind === 'system';
  const self = principal.userId === id;
  const now = new Date();
  const ownSession = principal.credential === 'user_token' ? principal.credentialId : undefined;
  if (!system) {
    if (values.full_name !== undefined && !self)
      throw ApiError.of('forbidden', 'Only the user may change their own name.', at('full_name'));
    if (values.password !== undefined && !self)
      throw ApiError.of('forbidden', 'Only the user may change their own password.', at('password'));
    if (values.current_password !== undefined && values.password === undefined) {
      throw ApiError.of('invalid_attribute', 'current_password is taken only with a new password.', at('current_password'));
    }
  }
  if (values.password !== undefined) {
    if (!system) {
      if (values.current_password === undefined)
        throw ApiError.of('required', 'The current password is required to set a new one.', at('current_password'));
      const user = await db.selectFrom('users').select('password_hash').where('id', '=', id).executeTakeFirstOrThrow();
      if (!(await verifyPassword(user.password_hash, String(values.current_password)))) {
        throw ApiError.of('invalid_attribute', 'current_password is not the current password.', at('current_password'));
      }
    }
    await db
      .updateTable('users')
      .set({ password_hash: await hashPassword(String(values.password)), updated_at: now })
      .where('id', '=', id)
      .execute();
    // Every other session, in every organisation (the password is the user's), stops working at once.
    await revokeUserTokens(db, { userId: id, except: system ? undefined : ownSession });
  }
  if (values.revoke_tokens === true) {
    if (!system && !self) {
      if (!ADMINS.includes(principal.role as Role))
        throw ApiError.of('forbidden', 'Only owners and admins sign other members out.', at('revoke_tokens'));
      requireOwnerFor(ctx, (await roleIn(db, principal.organisationId, id)) === 'owner', 'revoke_tokens');
    }
    // Sessions in this organisation; a user signing themselves out elsewhere keeps the token making the request.
    await revokeUserTokens(db, { userId: id, organisationId: principal.organisationId, except: system || !self ? undefined : ownSession });
  }
  if (values.role !== undefined) {
    if (!system && !ADMINS.includes(principal.role as Role))
      throw ApiError.of('forbidden', 'Only owners and admins change roles.', at('role'));
    const { role: current, otherOwner } = await lockMembership(db, principal.organisationId, id);
    if (current !== values.role) {
      requireOwnerFor(ctx, current === 'owner' || values.role === 'owner', 'role');
      if (current === 'owner' && !otherOwner) throw lastOwner('role');
      await db
        .updateTable('memberships')
        .set({ role: values.role as Role, updated_at: now })
        .where('user_id', '=', id)
        .where('organisation_id', '=', principal.organisationId)
        .execute();
      await db.updateTable('users').set({ updated_at: now }).where('id', '=', id).execute();
      // The role lives in `memberships`, not in a column of `users`: the change is a `User.updated` event all the same.
      ctx.storedElsewhere = true;
    }
  }
  // Stored above (or not columns of `users`): nothing left for the engine to write.
  for (const name of ['password', 'current_password', 'role', 'revoke_tokens']) delete values[name];
}

/**
 * Removing a member ends their membership of this organisation, not their account (they may belong to
 * others): their API keys here are deleted, their sessions here end with the membership, and their
 * SIP user here stays as an account without a user. The last owner cannot be removed (409).
 */
async function removeMember(ctx: ActionContext): Promise<Record<string, number>> {
  const { db, principal } = ctx;
  const id = String(ctx.existing!.id);
  const { role, otherOwner } = await lockMembership(db, principal.organisationId, id);
  if (!role) throw notFound();
  requireOwnerFor(ctx, role === 'owner');
  if (role === 'owner' && !otherOwner) throw lastOwner();
  const system = systemActor(principal.organisationId, 'engine');
  // The member's rows of `table` in this organisation.
  const theirs = (table: 'api_keys' | 'sip_users' | 'operator_statuses') =>
    db.selectFrom(table).select('id').where('organisation_id', '=', principal.organisationId).where('user_id', '=', id);
  const keys = await theirs('api_keys').execute();
  for (const key of keys) await ctx.records.delete(system, 'ApiKey', key.id);
  const sipUsers = await theirs('sip_users').execute();
  for (const sipUser of sipUsers) await ctx.records.update(system, 'SipUser', sipUser.id, { user_id: null });
  // Their availability here: a SIP user's status stays the SIP user's (without a user); a status of theirs
  // without a SIP user goes, with its history (as a SIP user's does when the SIP user is deleted).
  const own = await theirs('operator_statuses').where('sip_user_id', 'is', null).execute();
  const removed: Record<string, number> = {};
  if (own.length > 0) {
    const ownIds = own.map((o) => o.id);
    const events = await db.deleteFrom('operator_status_events').where('operator_status_id', 'in', ownIds).executeTakeFirst();
    await db.deleteFrom('operator_statuses').where('id', 'in', ownIds).execute();
    removed.OperatorStatus = own.length;
    if (Number(events.numDeletedRows) > 0) removed.OperatorStatusEvent = Number(events.numDeletedRows);
  }
  await db
    .updateTable('operator_statuses')
    .set({ user_id: null })
    .where('organisation_id', '=', principal.organisationId)
    .where('user_id', '=', id)
    .execute();
  // user_sessions rows go with the membership (ON DELETE CASCADE): its tokens are refused from now on.
  await db.deleteFrom('memberships').where('organisation_id', '=', principal.organisationId).where('user_id', '=', id).execute();
  return keys.length > 0 ? { User: 1, ApiKey: keys.length, ...removed } : { User: 1, ...removed };
}

/** The organisation's members: read by every member, managed by owners and admins; each changes their own name and password. */
export default defineResource({
  type: 'User',
  path: 'users',
  table: 'users',
  attributes: {
    email: attr.string({ create: 'required', minLength: 3, maxLength: 254, pattern: EMAIL, sortable: true, filterable: true }),
    full_name: attr.string({ create: true, update: true, maxLength: 200, sortable: true, filterable: true }),
    sip_username: attr.string({
      nullable: true,
      expression: (p) => sql`(SELECT s.sip_username FROM sip_users s WHERE s.user_id = t.id AND s.organisation_id = ${p.organisationId})`,
    }),
    role: attr.enum(ROLES, {
      create: 'required',
      update: true,
      filterable: true,
      storedByHook: true,
      expression: (p) => sql`(SELECT m.role FROM memberships m WHERE m.user_id = t.id AND m.organisation_id = ${p.organisationId})`,
      description: "The member's role in the caller's organisation.",
    }),
    password: attr.string({
      create: true,
      update: true,
      writeOnly: true,
      virtual: true,
      minLength: MIN_PASSWORD_LENGTH,
      maxLength: 1024,
      description: "A new user's password (generated when omitted), or your own new password (with current_password).",
    }),
    current_password: attr.string({
      update: true,
      writeOnly: true,
      virtual: true,
      minLength: 1,
      maxLength: 1024,
      description: 'Your current password, required to set a new one.',
    }),
    revoke_tokens: attr.boolean({
      update: true,
      writeOnly: true,
      virtual: true,
      description:
        "true: ends the member's sessions (user tokens) in this organisation at once; your own token making the request stays valid. " +
        'Owners and admins for any member (owners only for owners), every user for themselves. API keys are revoked one by one.',
    }),
    initial_password: attr.string({
      revealedOnCreate: true,
      description:
        'The generated password of a new user created without one, shown once in the create response; null afterwards. Hand it to the user, who should change it.',
    }),
    ...timestamps,
  },
  relationships: {
    organisation: { type: 'Organisation', cardinality: 'one', resolve: (p) => p.organisationId },
    organisations: {
      type: 'Organisation',
      cardinality: 'many',
      through: { table: 'memberships', from: 'user_id', to: 'organisation_id' },
      includable: true,
    },
    sip_user: rel.hasOne('SipUser', 'user_id'),
  },
  uniqueConstraints: { users_email_key: 'email' },
  // No POST /api/users: members join by invitation (Invitation, then `accept_invitation`), so that adding an
  // address answers alike whether it has an account or not. The command line and the demo create users.
  operations: { list: true, get: true, create: false, update: true, delete: true },
  access: {
    read: EVERY_ROLE,
    update: EVERY_ROLE,
    delete: ADMINS,
    // Operators change only their own record (name, password); owners and admins every member's role.
    writable: (p, alias) => (p.role === 'operator' ? sql`${sql.ref(`${alias}.id`)} = ${p.userId}` : undefined),
  },
  aliases: { me: { summary: 'Read your own user record', resolve: (p) => p.userId } },
  tenancy: (p, alias) =>
    sql`${sql.ref(`${alias}.id`)} IN (SELECT m.user_id FROM memberships m WHERE m.organisation_id = ${p.organisationId})`,
  create: createMember,
  beforeUpdate: updateMember,
  remove: removeMember,
  actions: {
    login: {
      path: 'users/login',
      summary: 'Sign in with e-mail and password; returns the user and an access token in meta.token',
      allowPublishable: true,
      input: {
        email: attr.string({ create: 'required', minLength: 3, maxLength: 254, example: 'owner@example.com' }),
        password: attr.string({ create: 'required', minLength: 1, maxLength: 1024, writeOnly: true, example: 'correct-horse-battery' }),
      },
      // A small body, and a refused one counts as a failed sign-in of its address (docs/hardening.md).
      bodyLimit: LOGIN_BODY_LIMIT_BYTES,
      onRefusedBody: countRefusedLogin,
      // Outside a transaction: a refused password must still count against the throttle.
      transaction: false,
      run: login,
    },
    accept_invitation: {
      path: 'users/accept_invitation',
      summary:
        "Accept an invitation (with the inviting organisation's publishable key): join with your account's password, or, for an address without an account, a new one with the password given; returns the user and an access token in meta.token",
      allowPublishable: true,
      status: 201,
      input: {
        invitation_token: attr.string({ create: 'required', minLength: 1, maxLength: 200, writeOnly: true }),
        email: attr.string({ create: 'required', minLength: 3, maxLength: 254, example: 'owner@example.com' }),
        password: attr.string({ create: 'required', minLength: 1, maxLength: 1024, writeOnly: true, example: 'correct-horse-battery' }),
        full_name: attr.string({ create: true, maxLength: 200, description: 'Your name, for a new account.' }),
      },
      // Outside a transaction: a refused password must still count against the throttle.
      transaction: false,
      run: acceptInvitation,
    },
  },
});
