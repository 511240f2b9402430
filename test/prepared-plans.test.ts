/**
 * Reads whose plan does not depend on their values (by primary key; an organisation's page in an indexed
 * order, unfiltered) run as named statements with a generic plan, planned once per connection; a page in id
 * order filtered by equality is named in PostgreSQL's default plan mode; other filtered lists stay unnamed
 * and are planned for their values; a transaction always runs in PostgreSQL's default
 * plan mode (src/db/prepared.ts). PostgreSQL only: the embedded database has no prepared-statement cache
 * of this kind to inspect. One pool connection, so that every request's statements are on the session the
 * test inspects.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { genericPlan } from '../src/db/prepared.js';
import { client, resourceDocument } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

interface Prepared {
  statement: string;
  generic_plans: string;
  custom_plans: string;
}

describe.runIf(process.env.DATABASE_URL !== undefined)('plans of prepared reads', () => {
  let t: TestApp;
  let tenant: Tenant;
  let conversationId: string;

  beforeAll(async () => {
    t = await startTestApp({ DATABASE_POOL_SIZE: '1', DATABASE_TIMEOUT_MS: '60000' });
    tenant = await seedTenant(t, 'Plans');
    for (const channel of ['chat', 'sms', 'chat']) {
      const created = await client(t.app, tenant.owner.token).post('/api/conversations', resourceDocument('Conversation', { channel }));
      expect(created.status).toBe(201);
      conversationId = created.body.data.id;
    }
  });

  afterAll(async () => {
    await t?.close();
  });

  const planMode = async () => (await sql<{ plan_cache_mode: string }>`SHOW plan_cache_mode`.execute(t.db)).rows[0].plan_cache_mode;

  it('an unfiltered page and a read by id are planned once and reused; a filtered page is prepared or planned for its values', async () => {
    const api = client(t.app, tenant.owner.token);
    for (let i = 0; i < 8; i++) {
      const page = await api.get('/api/conversations?page[limit]=2');
      expect(page.status).toBe(200);
      expect(page.body.data).toHaveLength(2);
      const one = await api.get(`/api/conversations/${conversationId}`);
      expect(one.status).toBe(200);
      expect(one.body.data.id).toBe(conversationId);
      const filtered = await api.get('/api/conversations?filter[channel]=sms');
      expect(filtered.status).toBe(200);
      expect(filtered.body.data.map((c: { attributes: { channel: string } }) => c.attributes.channel)).toEqual(['sms']);
      const ranged = await api.get('/api/conversations?filter[channel][in]=sms&sort=-created_at');
      expect(ranged.status).toBe(200);
      expect(ranged.body.data).toHaveLength(1);
    }
    const { rows } = await sql<Prepared>`
      SELECT statement, generic_plans::text, custom_plans::text FROM pg_prepared_statements
      WHERE statement LIKE '%FROM "conversations" t%'`.execute(t.db);
    const marked = rows.filter((row) => row.statement.startsWith('/* generic plan */'));
    const byId = marked.filter((row) => row.statement.includes('t.id = ANY('));
    const page = marked.filter((row) => row.statement.includes('LIMIT 3'));
    expect(byId, JSON.stringify(rows)).toHaveLength(1);
    expect(page, JSON.stringify(rows)).toHaveLength(1);
    // Every request's read ran the one generic plan. (The read by id also ran in the creates' transactions,
    // which keep PostgreSQL's default mode and may plan it for its values there.)
    expect(Number(page[0].custom_plans), page[0].statement).toBe(0);
    for (const row of [...byId, ...page]) expect(Number(row.generic_plans), row.statement).toBeGreaterThanOrEqual(8);
    // The page filtered by equality was named, without the generic mark (PostgreSQL's default plan mode) and
    // run once per request; the one filtered by `in` and sorted otherwise was never named.
    const equal = rows.filter((row) => row.statement.includes('"channel" = $'));
    expect(equal, JSON.stringify(rows)).toHaveLength(1);
    expect(equal[0].statement.startsWith('/* prepared */')).toBe(true);
    expect(Number(equal[0].generic_plans) + Number(equal[0].custom_plans)).toBe(8);
    expect(
      rows.filter((row) => row.statement.includes('"channel" IN (')),
      JSON.stringify(rows),
    ).toEqual([]);
  });

  it('the first statement of a checkout sets the connection plan mode, and a transaction runs in the default', async () => {
    const marked = (id: string) => genericPlan(sql`SELECT id FROM conversations t WHERE t.id = ${id}`);
    const within = await t.db.connection().execute(async (connection) => {
      const found = await marked(conversationId).execute(connection);
      expect(found.rows).toHaveLength(1);
      return (await sql<{ plan_cache_mode: string }>`SHOW plan_cache_mode`.execute(connection)).rows[0].plan_cache_mode;
    });
    expect(within).toBe('force_generic_plan');
    // The connection kept that mode; a transaction opening on it is returned to the default first.
    const inTransaction = await t.db.transaction().execute(async (trx) => {
      await marked(conversationId).execute(trx);
      return (await sql<{ plan_cache_mode: string }>`SHOW plan_cache_mode`.execute(trx)).rows[0].plan_cache_mode;
    });
    expect(inTransaction).toBe('auto');
    // And back: a marked read leaves the connection generic, a checkout opening with anything else resets it.
    await marked(conversationId).execute(t.db);
    expect(await planMode()).toBe('auto');
  });

  it('a page of an organisation holding most of the table is read through the index, not by sorting all its rows', async () => {
    // One organisation with most rows: a generic plan that did not know the page's size assumed a tenth of
    // them and sorted all of them after a sequential scan (docs/benchmarks.md, the sixth round).
    await sql`INSERT INTO conversations (id, organisation_id, channel, mode, status, public_id)
      SELECT gen_random_uuid(), ${tenant.organisationId}, 'chat', 'text', 'active', 'bulk-' || g FROM generate_series(1, 150000) g`.execute(
      t.db,
    );
    await sql`ANALYZE conversations`.execute(t.db);
    const api = client(t.app, tenant.owner.token);
    const page = await api.get('/api/conversations?page[limit]=7');
    expect(page.status).toBe(200);
    expect(page.body.data).toHaveLength(7);
    const { rows } = await sql<{ name: string; statement: string; parameter_types: string[] }>`
      SELECT name, statement, parameter_types::text[] AS parameter_types FROM pg_prepared_statements
      WHERE statement LIKE '/* generic plan */%FROM "conversations" t%LIMIT 8%'`.execute(t.db);
    expect(rows, 'the page ran as a marked, named statement').toHaveLength(1);
    const values = rows[0].parameter_types.map((type) => (type === 'uuid' ? `'${tenant.organisationId}'` : type === 'text' ? "''" : '0'));
    const explained = await t.db.connection().execute(async (connection) => {
      await sql`SET plan_cache_mode = force_generic_plan`.execute(connection);
      try {
        return await sql
          .raw<{ 'QUERY PLAN': { Plan: Record<string, unknown> }[] }>(
            `EXPLAIN (FORMAT JSON) EXECUTE ${rows[0].name} (${values.join(', ')})`,
          )
          .execute(connection);
      } finally {
        await sql`RESET plan_cache_mode`.execute(connection);
      }
    });
    const nodes: string[] = [];
    const visit = (node: Record<string, unknown>) => {
      if (node['Relation Name'] === 'conversations') nodes.push(String(node['Node Type']));
      if (node['Node Type'] === 'Sort') nodes.push('Sort');
      for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) visit(child);
    };
    visit(explained.rows[0]['QUERY PLAN'][0].Plan);
    expect(nodes).toEqual(['Index Scan']);
  }, 90_000);
});
