import { sql } from 'kysely';
import { login } from '../auth/login.js';
import { attr, defineResource, rel } from '../jsonapi/resource.js';
import { EVERY_ROLE } from './scopes.js';

/** Users are seen through login and includes; a caller sees the members of its organisation. */
export default defineResource({
  type: 'User',
  table: 'users',
  attributes: {
    email: attr.string(),
    full_name: attr.string(),
    sip_username: attr.string({
      nullable: true,
      expression: (p) =>
        sql`(SELECT s.sip_username FROM sip_users s WHERE s.user_id = t.id AND s.organisation_id = ${p.organisationId})`,
    }),
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
