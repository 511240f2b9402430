/** Organisations and their members, created through the records service by the system (command line, demo, tests). */
import { uuidv7 } from 'uuidv7';
import { systemActor } from '../jsonapi/actor.js';
import type { Role } from '../jsonapi/principal.js';
import type { Records } from '../jsonapi/records.js';

export async function createOrganisation(records: Records, input: { name: string }) {
  const { id, record } = await records.create(systemActor(uuidv7(), 'cli'), 'Organisation', { name: input.name?.trim() });
  return { id, name: record.attributes.name };
}

/** A new user who is a member of one organisation with the given role. */
export async function createUserInOrganisation(
  records: Records,
  input: { organisationId: string; email: string; password: string; fullName: string; role: Role },
) {
  const { id, record } = await records.create(systemActor(input.organisationId, 'cli'), 'User', {
    email: input.email?.trim(),
    password: input.password,
    full_name: input.fullName?.trim() ?? '',
    role: input.role,
  });
  const { email, full_name } = record.attributes;
  return { id, email, full_name, organisation_id: input.organisationId, role: input.role };
}
