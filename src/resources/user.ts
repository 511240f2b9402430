import { sql } from 'kysely';
import { uuidv7 } from 'uuidv7';
import { login } from '../auth/login.js';
import { hashPassword } from '../auth/passwords.js';
import { ApiError } from '../jsonapi/errors.js';
import { ROLES } from '../jsonapi/principal.js';
import { attr, defineResource, rel, type ActionContext, type ActionResult } from '../jsonapi/resource.js';
import { EVERY_ROLE } from './scopes.js';

/** An address with one @ and a dot in its domain: enough to catch typing mistakes, not to prove delivery. */
const EMAIL = '^[^\\s@]+@[^\\s@]+\\.[^\\s@]+$';
export const MIN_PASSWORD_LENGTH = 8;

/** A new user, member of the actor's organisation with the given role; e-mail addresses are unique (case-insensitive). */
async function createMember(ctx: ActionContext): Promise<ActionResult> {
  const { db, values, principal } = ctx;
  const organisation = await db.selectFrom('organisations').select('id').where('id', '=', principal.organisationId).executeTakeFirst();
  if (!organisation) throw ApiError.of(422, 'invalid_attribute', `no organisation ${principal.organisationId}`, { pointer: '/data' });
  const email = String(values.email).trim();
  const taken = await sql`SELECT 1 FROM users WHERE lower(email) = ${email.toLowerCase()}`.execute(db);
  if (taken.rows.length > 0) {
    throw ApiError.of(409, 'conflict', `a user with e-mail ${email} exists already`, { pointer: '/data/attributes/email' });
  }
  const id = uuidv7();
  const now = new Date();
  await db
    .insertInto('users')
    .values({
      id,
      email,
      full_name: String(values.full_name ?? '').trim(),
      password_hash: await hashPassword(String(values.password)),
      created_at: now,
      updated_at: now,
    })
    .execute();
  await db.insertInto('memberships').values({ organisation_id: principal.organisationId, user_id: id, role: values.role, created_at: now }).execute();
  return { id, status: 201 };
}

/** A member's new password (hashed) or role: the system resets the demo's passwords; members change theirs. */
async function updateMember(ctx: ActionContext): Promise<void> {
  const { db, values, existing, principal } = ctx;
  const id = String(existing!.id);
  if (values.password !== undefined) {
    await db.updateTable('users').set({ password_hash: await hashPassword(String(values.password)) }).where('id', '=', id).execute();
    // A new password ends the user's sessions (tokens from logins with the old one), in every organisation: a
    // password is changed because the old one may be known to someone else (OWASP Session Management Cheat Sheet,
    // "Renew the Session ID After Any Privilege Level Change").
    await db.updateTable('user_sessions').set({ revoked_at: new Date() }).where('user_id', '=', id).where('revoked_at', 'is', null).execute();
    delete values.password;
  }
  if (values.role !== undefined) {
    await db.updateTable('memberships').set({ role: values.role }).where('user_id', '=', id).where('organisation_id', '=', principal.organisationId).execute();
    delete values.role;
  }
}

/** Users are seen through login and includes; a caller sees the members of its organisation. */
export default defineResource({
  type: 'User',
  table: 'users',
  attributes: {
    email: attr.string({ create: 'required', minLength: 3, maxLength: 254, pattern: EMAIL }),
    full_name: attr.string({ create: true, maxLength: 200 }),
    sip_username: attr.string({
      nullable: true,
      expression: (p) =>
        sql`(SELECT s.sip_username FROM sip_users s WHERE s.user_id = t.id AND s.organisation_id = ${p.organisationId})`,
    }),
    role: attr.enum(ROLES, { create: 'required', writeOnly: true, description: 'The new member\'s role in the organisation.' }),
    password: attr.string({ create: 'required', writeOnly: true, minLength: MIN_PASSWORD_LENGTH, maxLength: 1024 }),
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
  fields: ['id', 'full_name', 'email', 'sip_username', 'organisation', 'organisations', 'sip_user'],
  operations: {},
  access: { read: EVERY_ROLE },
  tenancy: (p, alias) => sql`${sql.ref(`${alias}.id`)} IN (SELECT m.user_id FROM memberships m WHERE m.organisation_id = ${p.organisationId})`,
  create: createMember,
  beforeUpdate: updateMember,
  actions: {
    login: {
      path: 'users/login',
      summary: 'Sign in with e-mail and password; returns the user and an access token in meta.token',
      allowPublishable: true,
      input: {
        email: attr.string({ create: 'required', minLength: 3, maxLength: 254 }),
        password: attr.string({ create: 'required', minLength: 1, maxLength: 1024, writeOnly: true }),
      },
      run: login,
    },
  },
});
