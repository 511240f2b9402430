import { sql } from 'kysely';
import { attr, defineResource } from '../jsonapi/resource.js';
import { EVERY_ROLE } from './scopes.js';

/** Reachable only through `include`; a caller sees the organisations its user belongs to. */
export default defineResource({
  type: 'Organisation',
  table: 'organisations',
  attributes: {
    name: attr.string({ maxLength: 200 }),
  },
  relationships: {},
  operations: {},
  access: { read: EVERY_ROLE },
  tenancy: (p, alias) => sql`${sql.ref(`${alias}.id`)} IN (SELECT m.organisation_id FROM memberships m WHERE m.user_id = ${p.userId})`,
});
