import { sql } from 'kysely';
import { type ActionContext, type ActionResult, attr, defineResource } from '../jsonapi/index.js';
import { EVERY_ROLE } from './scopes.js';
import { timestamps } from './timestamps.js';

/**
 * A new organisation is created by the system acting for it: the actor's
 * organisation id is the id the new record takes (the command line makes one).
 */
async function createOrganisation(ctx: ActionContext): Promise<ActionResult> {
  const now = new Date();
  await ctx.db
    .insertInto('organisations')
    .values({ id: ctx.principal.organisationId, name: ctx.values.name, created_at: now, updated_at: now })
    .execute();
  return { id: ctx.principal.organisationId, status: 201 };
}

/** Read only over the API (created by the command line); a caller sees the organisations its user belongs to. */
export default defineResource({
  type: 'Organisation',
  path: 'organisations',
  table: 'organisations',
  attributes: {
    name: attr.string({ create: 'required', minLength: 1, maxLength: 200, sortable: true, filterable: true }),
    ...timestamps,
  },
  relationships: {},
  operations: { list: true, get: true },
  access: { read: EVERY_ROLE },
  // A user sees the organisations it belongs to (User.organisations); the system its own.
  tenancy: (p, alias) =>
    p.userId === null
      ? sql`${sql.ref(`${alias}.id`)} = ${p.organisationId}`
      : sql`${sql.ref(`${alias}.id`)} IN (SELECT m.organisation_id FROM memberships m WHERE m.user_id = ${p.userId})`,
  create: createOrganisation,
});
