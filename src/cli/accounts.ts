/** `parley migrate`, `org`, `user` and `key`: the database, organisations, their members and API keys. */
import { createOrganisation, createUserInOrganisation } from '../auth/accounts.js';
import { createApiKey, revokeApiKey } from '../auth/api-keys.js';
import { revokeUserTokens } from '../auth/user-tokens.js';
import { consoleLink } from '../app.js';
import { loadConfig, publicBaseUrl } from '../config/index.js';
import { openDatabase } from '../db/connection.js';
import { migrate as applyMigrations } from '../db/migrate.js';
import type { Role } from '../jsonapi/principal.js';
import { UUID_PATTERN } from '../jsonapi/validate.js';
import { iso, requireOrganisation, table, withDatabase } from './database.js';

export async function migrate(o: { json?: boolean }): Promise<void> {
  const database = await openDatabase(loadConfig());
  try {
    const applied = await applyMigrations(database.db);
    console.log(o.json ? JSON.stringify({ applied }) : applied.length ? `applied ${applied.join(', ')}` : 'up to date');
  } finally {
    await database.close();
  }
}

export const orgCreate = (o: { name: string; json?: boolean }) =>
  withDatabase(!!o.json, async (_db, records) => {
    const created = await createOrganisation(records, { name: o.name });
    return { result: created, text: `organisation ${created.id} (${created.name})` };
  });

export const orgList = (o: { json?: boolean }) =>
  withDatabase(!!o.json, async (db) => {
    const organisations = (
      await db.selectFrom('organisations').select(['id', 'name', 'created_at']).orderBy('created_at').orderBy('id').execute()
    ).map((r) => ({ ...r, created_at: iso(r.created_at) }));
    return { result: { organisations }, text: table(organisations, ['id', 'name', 'created_at']) };
  });

export const userList = (o: { org: string; json?: boolean }) =>
  withDatabase(!!o.json, async (db) => {
    await requireOrganisation(db, o.org);
    const rows = await db
      .selectFrom('memberships as m')
      .innerJoin('users as u', 'u.id', 'm.user_id')
      .select(['u.id', 'u.email', 'u.full_name', 'm.role', 'm.created_at as member_since'])
      .where('m.organisation_id', '=', o.org)
      .orderBy('m.created_at')
      .orderBy('u.id')
      .execute();
    const users = rows.map((r) => ({ ...r, member_since: iso(r.member_since) }));
    return { result: { organisation_id: o.org, users }, text: table(users, ['id', 'email', 'role', 'full_name']) };
  });

export const userCreate = (o: { org: string; email: string; password: string; fullName: string; role: Role; json?: boolean }) =>
  withDatabase(!!o.json, async (_db, records) => {
    const created = await createUserInOrganisation(records, { ...o, organisationId: o.org });
    return { result: created, text: `user ${created.id} (${created.email}, ${created.role})` };
  });

export const userRevokeTokens = (o: { user: string; org?: string; json?: boolean }) =>
  withDatabase(!!o.json, async (db) => {
    const revoked = await revokeUserTokens(db, { userId: o.user, organisationId: o.org });
    return { result: { id: o.user, revoked }, text: `revoked ${revoked} token(s)` };
  });

export const keyCreate = (o: {
  org: string;
  user: string;
  type: 'publishable' | 'secret';
  name: string;
  expiresAt?: string;
  json?: boolean;
}) =>
  withDatabase(!!o.json, async (_db, records, config) => {
    const expiresAt = o.expiresAt ? new Date(o.expiresAt) : undefined;
    const created = await createApiKey(records, { organisationId: o.org, userId: o.user, keyType: o.type, name: o.name, expiresAt });
    const text = `key ${created.id} (${created.key_type}); token, shown once:\n${created.token}`;
    if (created.key_type !== 'publishable') return { result: created, text };
    // A publishable key signs the organisation's users in to the console: print its link.
    const link = consoleLink(publicBaseUrl(config), created.token);
    return { result: { ...created, console_url: link }, text: `${text}\noperator console:\n${link}` };
  });

export const keyList = (o: { org: string; user?: string; json?: boolean }) =>
  withDatabase(!!o.json, async (db) => {
    await requireOrganisation(db, o.org);
    let query = db
      .selectFrom('api_keys')
      .select(['id', 'name', 'key_type', 'user_id', 'expires_at', 'revoked_at', 'created_at'])
      .where('organisation_id', '=', o.org);
    if (o.user) query = query.where('user_id', '=', o.user);
    const rows = await query.orderBy('created_at').orderBy('id').execute();
    const keys = rows.map((r) => ({ ...r, expires_at: iso(r.expires_at), revoked_at: iso(r.revoked_at), created_at: iso(r.created_at) }));
    return { result: { organisation_id: o.org, keys }, text: table(keys, ['id', 'name', 'key_type', 'user_id', 'revoked_at']) };
  });

export const keyRevoke = (o: { id: string; json?: boolean }) =>
  withDatabase(!!o.json, async (db, records) => {
    if (!UUID_PATTERN.test(o.id) || !(await revokeApiKey(db, records, o.id))) throw new Error(`no active key ${o.id}`);
    return { result: { id: o.id, revoked: true }, text: `key ${o.id} revoked` };
  });
