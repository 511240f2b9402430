/**
 * Search by content (docs/api.md, "Search"): `filter[content][matches]` on conversation items, full text
 * search by words (each a prefix), inside the caller's organisation and role scope, answered by a GIN index.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { client, errorCodes, resourceDocument, type Client } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

let t: TestApp;
let tenant: Tenant;
let operator: Client;

beforeAll(async () => {
  t = await startTestApp({ VISITOR_SESSIONS_PER_HOUR: '1000' });
  tenant = await seedTenant(t, 'Search');
  operator = client(t.app, tenant.operator.token);
});
afterAll(async () => {
  await t?.close();
});

async function conversationWith(as: Client, ...contents: string[]): Promise<string> {
  const created = await as.post('/api/conversations', resourceDocument('Conversation', {}));
  expect(created.status).toBe(201);
  for (const content of contents) {
    const item = await as.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: created.body.data.id, content, role: 'user' }),
    );
    expect(item.status).toBe(201);
  }
  return created.body.data.id;
}

const search = (as: Client, words: string) =>
  as.get(`/api/conversations?filter[content][matches]=${encodeURIComponent(words)}&page[limit]=100`);
const conversationsOf = (response: { status: number; body: { data: { id: string }[] } }) => {
  expect(response.status, JSON.stringify(response.body)).toBe(200);
  return response.body.data.map((c) => c.id).sort();
};

describe('search by content', () => {
  it('finds the items with every word (prefixes, any case, any script), only in the caller’s organisation', async () => {
    const refund = await conversationWith(operator, 'Hello', 'I would like a REFUND for invoice 4711, please');
    const invoice = await conversationWith(operator, 'Where is my invoice?');
    const cafe = await conversationWith(operator, 'Un café crème, s’il vous plaît', 'Спасибо за помощь');
    const elsewhere = await seedTenant(t, 'Other');
    await conversationWith(client(t.app, elsewhere.owner.token), 'refund invoice refund invoice');

    const both = await search(operator, 'refund invoice');
    expect(both.status).toBe(200);
    expect(conversationsOf(both)).toEqual([refund]);
    expect(conversationsOf(await search(operator, 'invoice'))).toEqual([refund, invoice].sort());
    expect(conversationsOf(await search(operator, 'inv'))).toEqual([refund, invoice].sort());
    expect(conversationsOf(await search(operator, 'Refund, 4711!'))).toEqual([refund]);
    expect(conversationsOf(await search(operator, 'café'))).toEqual([cafe]);
    expect(conversationsOf(await search(operator, 'спасибо'))).toEqual([cafe]);
    expect((await search(operator, 'nothing-like-this')).body.data).toEqual([]);
    // Combined with the rest of the query language: one conversation's matches.
    const within = await operator.get(`/api/conversations?filter[content][matches]=invoice&filter[id][not_eq]=${invoice}`);
    expect(conversationsOf(within)).toEqual([refund]);
    // A conversation's own items, searched through its related link.
    const items = await operator.get(`/api/conversations/${refund}/conversation_items?filter[content][matches]=invoice`);
    expect(items.status).toBe(200);
    expect(items.body.data.map((i: { attributes: { content: string } }) => i.attributes.content)).toEqual([
      'I would like a REFUND for invoice 4711, please',
    ]);
  });

  it("keeps a visitor to its own conversation's items", async () => {
    const session = await client(t.app, tenant.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
    const visitor = client(t.app, session.body.meta.token);
    await visitor.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: session.body.data.id, content: 'my parcel is late', role: 'user' }),
    );
    await conversationWith(operator, 'another parcel question');
    const found = await visitor.get('/api/conversations?filter[content][matches]=parcel');
    expect(found.status).toBe(200);
    expect(conversationsOf(found)).toEqual([session.body.data.id]);
  });

  it('refuses what is not a search, with a 400 on the parameter', async () => {
    for (const [query, parameter] of [
      ['filter[content][matches]=%20!!%20', 'filter[content][matches]'],
      ['filter[content][matches]=a%20b%20c%20d%20e%20f%20g%20h%20i', 'filter[content][matches]'],
      ['filter[content]=refund', 'filter[content]'],
      ['filter[content][contains]=refund', 'filter[content][contains]'],
      ['filter[status][matches]=active', 'filter[status][matches]'],
    ]) {
      const response = await operator.get(`/api/conversations?${query}`);
      expect(response.status, query).toBe(400);
      expect(errorCodes(response)).toEqual(['invalid_filter']);
      expect(response.body.errors[0].source).toEqual({ parameter });
    }
    // tsquery syntax is never passed through: its characters separate words.
    const syntax = await search(operator, "refund' | !invoice:* & (x");
    expect(syntax.status).toBe(200);
  });

  it('is answered by the GIN index of the content', async () => {
    const { rows } = await sql<{ indexdef: string }>`
      SELECT indexdef FROM pg_indexes WHERE indexname = 'conversation_items_content_search_idx'`.execute(t.db);
    expect(rows[0].indexdef).toMatch(/USING gin \(to_tsvector\('simple'::regconfig, content\)\)/);
    const plan = await t.db.transaction().execute(async (trx) => {
      await sql`SET LOCAL enable_seqscan = off`.execute(trx);
      const { rows: lines } = await sql<{ 'QUERY PLAN': string }>`
        EXPLAIN SELECT id FROM conversation_items t WHERE to_tsvector('simple', t.content) @@ to_tsquery('simple', 'refund:*')`.execute(
        trx,
      );
      return lines.map((l) => l['QUERY PLAN']).join('\n');
    });
    expect(plan).toContain('conversation_items_content_search_idx');
  });
});
