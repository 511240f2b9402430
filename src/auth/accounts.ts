/** Organisations, users and memberships: used by the command line, the demo and tests. */
import { uuidv7 } from 'uuidv7';
import { inTransaction, type Database } from '../db/connection.js';
import { ROLES, type Role } from '../jsonapi/resource.js';
import { hashPassword } from './passwords.js';

const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;
export const MIN_PASSWORD_LENGTH = 8;

export async function createOrganisation(db: Database, input: { name: string }) {
  const name = input.name?.trim();
  if (!name || name.length > 200) throw new Error('organisation name must be 1 to 200 characters');
  const organisation = { id: uuidv7(), name, created_at: new Date(), updated_at: new Date() };
  await db.insertInto('organisations').values(organisation).execute();
  return { id: organisation.id, name, created_at: organisation.created_at.toISOString() };
}

export async function createUser(db: Database, input: { email: string; password: string; fullName: string }) {
  const email = input.email?.trim();
  if (!email || !EMAIL.test(email) || email.length > 254) throw new Error(`"${input.email}" is not an e-mail address`);
  if (!input.password || input.password.length < MIN_PASSWORD_LENGTH) {
    throw new Error(`password must have at least ${MIN_PASSWORD_LENGTH} characters`);
  }
  const taken = await db.selectFrom('users').select('id').where((eb) => eb(eb.fn('lower', ['email']), '=', email.toLowerCase())).executeTakeFirst();
  if (taken) throw new Error(`a user with e-mail ${email} exists already`);
  const user = { id: uuidv7(), email, full_name: input.fullName?.trim() ?? '', password_hash: await hashPassword(input.password) };
  await db.insertInto('users').values({ ...user, created_at: new Date(), updated_at: new Date() }).execute();
  return { id: user.id, email, full_name: user.full_name };
}

export async function addMembership(db: Database, input: { organisationId: string; userId: string; role: Role }) {
  if (!ROLES.includes(input.role)) throw new Error(`role must be one of ${ROLES.join(', ')}`);
  const organisation = await db.selectFrom('organisations').select('id').where('id', '=', input.organisationId).executeTakeFirst();
  if (!organisation) throw new Error(`no organisation ${input.organisationId}`);
  await db
    .insertInto('memberships')
    .values({ organisation_id: input.organisationId, user_id: input.userId, role: input.role, created_at: new Date() })
    .onConflict((oc) => oc.columns(['organisation_id', 'user_id']).doUpdateSet({ role: input.role }))
    .execute();
  return { organisation_id: input.organisationId, user_id: input.userId, role: input.role };
}

/** A new user who is a member of one organisation with the given role. */
export async function createUserInOrganisation(
  db: Database,
  input: { organisationId: string; email: string; password: string; fullName: string; role: Role },
) {
  return inTransaction(db, async (trx) => {
    if (!ROLES.includes(input.role)) throw new Error(`role must be one of ${ROLES.join(', ')}`);
    const organisation = await trx.selectFrom('organisations').select('id').where('id', '=', input.organisationId).executeTakeFirst();
    if (!organisation) throw new Error(`no organisation ${input.organisationId}`);
    const user = await createUser(trx, input);
    await addMembership(trx, { organisationId: input.organisationId, userId: user.id, role: input.role });
    return { ...user, organisation_id: input.organisationId, role: input.role };
  });
}
