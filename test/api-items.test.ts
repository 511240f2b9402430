import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, pointers, resourceDocument, type Client } from './helpers/http.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let api: Client;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Items');
  other = await seedTenant(t, 'Elsewhere');
  api = client(t.app, tenant.operator.token);
});
afterAll(async () => t?.close());

async function newConversation(as: Client = api): Promise<string> {
  return (await as.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
}

const item = (conversationId: string, attributes: Record<string, unknown> = {}) =>
  resourceDocument('ConversationItem', { content: 'Hello', role: 'user', conversation_id: conversationId, ...attributes });

describe('POST /api/conversation_items', () => {
  it('creates with defaults and assigns content_index from 0', async () => {
    const conversationId = await newConversation();
    const first = await api.post('/api/conversation_items?include=conversation', item(conversationId));
    expect(first.status).toBe(201);
    expect(first.headers.location).toBe(first.body.data.links.self);
    expect(first.body.data.attributes).toMatchObject({
      content: 'Hello',
      role: 'user',
      modality: 'text',
      content_index: 0,
      metadata: {},
      conversation_id: conversationId,
    });
    expect(first.body.data.attributes.item_id).toMatch(/^item_/);
    expect(first.body.data.attributes.occurred_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
    expect(first.body.included[0].id).toBe(conversationId);
    const second = await api.post('/api/conversation_items', item(conversationId, { organisation_id: tenant.organisationId }));
    expect(second.body.data.attributes.content_index).toBe(1);
    const got = await api.get(`/api/conversation_items/${second.body.data.id}`);
    expect(got.status).toBe(200);
    expect(got.body.data).toEqual(second.body.data);
  });

  it('stores occurred_at given with an offset as UTC', async () => {
    const conversationId = await newConversation();
    const response = await api.post('/api/conversation_items', item(conversationId, { occurred_at: '2026-03-01T12:00:00+02:00' }));
    expect(response.body.data.attributes.occurred_at).toBe('2026-03-01T10:00:00.000Z');
  });

  it('bounds timestamps to years 1000..9999 in UTC, with a pointer', async () => {
    const conversationId = await newConversation();
    for (const occurred_at of ['0001-01-01T00:00:00Z', '0099-06-15T12:00:00Z', '0001-01-01T00:30:00+01:00', '9999-12-31T23:30:00-01:00']) {
      const refused = await api.post('/api/conversation_items', item(conversationId, { occurred_at }));
      expect(refused.status, occurred_at).toBe(422);
      expect(pointers(refused)).toEqual(['/data/attributes/occurred_at']);
    }
    for (const occurred_at of ['1000-01-01T00:00:00.000Z', '9999-12-31T23:59:59.000Z']) {
      const stored = await api.post('/api/conversation_items', item(conversationId, { occurred_at }));
      expect(stored.body.data.attributes.occurred_at).toBe(occurred_at);
      expect((await api.get(`/api/conversation_items/${stored.body.data.id}`)).body.data.attributes.occurred_at).toBe(occurred_at);
    }
  });

  it('bounds content in bytes, not characters', async () => {
    const conversationId = await newConversation();
    const tooBig = await api.post('/api/conversation_items', item(conversationId, { content: '\u{1F600}'.repeat(8193) }));
    expect(tooBig.status).toBe(422);
    expect(pointers(tooBig)).toEqual(['/data/attributes/content']);
    expect((await api.post('/api/conversation_items', item(conversationId, { content: '\u{1F600}'.repeat(8192) }))).status).toBe(201);
  });

  it("lets no client request use up a conversation's numbering: a given content_index is at most the next plus 1000", async () => {
    const conversationId = await newConversation();
    const exhausting = await api.post('/api/conversation_items', item(conversationId, { content_index: 2_147_483_646 }));
    expect(exhausting.status).toBe(422);
    expect(pointers(exhausting)).toEqual(['/data/attributes/content_index']);
    expect((await api.post('/api/conversation_items', item(conversationId, { content_index: 1001 }))).status).toBe(422);
    expect((await api.post('/api/conversation_items', item(conversationId, { content_index: 1000 }))).status).toBe(201);
    // The server's numbering goes on after the highest index, and earlier free indexes stay usable.
    expect((await api.post('/api/conversation_items', item(conversationId))).body.data.attributes.content_index).toBe(1001);
    expect((await api.post('/api/conversation_items', item(conversationId, { content_index: 3 }))).status).toBe(201);
  });

  it('refuses an item once the conversation has no index left, with a pointer', async () => {
    const conversationId = await newConversation();
    // A conversation numbered to the end (two billion items, or indexes given ahead over time).
    await t.db.updateTable('conversations').set({ next_content_index: 2_147_483_646 }).where('id', '=', conversationId).execute();
    expect((await api.post('/api/conversation_items', item(conversationId))).status).toBe(201);
    const full = await api.post('/api/conversation_items', item(conversationId));
    expect(full.status).toBe(422);
    expect(pointers(full)).toEqual(['/data/attributes/content_index']);
  });

  it('treats an idempotent repeat that omits optional fields as the same item', async () => {
    const conversationId = await newConversation();
    const first = await api.post('/api/conversation_items', item(conversationId, { item_id: 'audio-1', modality: 'audio' }));
    expect(first.status).toBe(201);
    const repeat = await api.post('/api/conversation_items', item(conversationId, { item_id: 'audio-1' }));
    expect(repeat.status).toBe(200);
    expect(repeat.body.data.id).toBe(first.body.data.id);
    const changed = await api.post('/api/conversation_items', item(conversationId, { item_id: 'audio-1', modality: 'text' }));
    expect(changed.status).toBe(409);
  });

  it('is idempotent on item_id: same content 200, other content 409', async () => {
    const conversationId = await newConversation();
    const first = await api.post('/api/conversation_items', item(conversationId, { item_id: 'msg-1' }));
    expect(first.status).toBe(201);
    const repeat = await api.post('/api/conversation_items', item(conversationId, { item_id: 'msg-1' }));
    expect(repeat.status).toBe(200);
    expect(repeat.body.data.id).toBe(first.body.data.id);
    const different = await api.post('/api/conversation_items', item(conversationId, { item_id: 'msg-1', content: 'Other' }));
    expect(different.status).toBe(409);
    expect(pointers(different)).toEqual(['/data/attributes/item_id']);
  });

  it('refuses an explicit content_index that is taken', async () => {
    const conversationId = await newConversation();
    await api.post('/api/conversation_items', item(conversationId, { content_index: 5 }));
    const taken = await api.post('/api/conversation_items', item(conversationId, { content_index: 5 }));
    expect(taken.status).toBe(409);
    const next = await api.post('/api/conversation_items', item(conversationId));
    expect(next.body.data.attributes.content_index).toBe(6);
  });

  it('refuses items on a closed conversation until it is reopened', async () => {
    const conversationId = await newConversation();
    await api.patch(`/api/conversations/${conversationId}`, resourceDocument('Conversation', { status: 'closed' }, conversationId));
    const refused = await api.post('/api/conversation_items', item(conversationId));
    expect(refused.status).toBe(422);
    expect(errorCodes(refused)).toEqual(['invalid_transition']);
    await api.patch(`/api/conversations/${conversationId}`, resourceDocument('Conversation', { status: 'active' }, conversationId));
    expect((await api.post('/api/conversation_items', item(conversationId))).status).toBe(201);
  });

  it('reports missing and invalid attributes together', async () => {
    const response = await api.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { role: 'robot', modality: 'video', content_index: -1, metadata: 'x' }),
    );
    expect(response.status).toBe(422);
    expect(pointers(response).sort()).toEqual(
      ['content', 'content_index', 'conversation_id', 'metadata', 'modality', 'role'].map((n) => `/data/attributes/${n}`).sort(),
    );
    expect(errorCodes(response)).toContain('required');
  });

  it('keeps references inside the organisation', async () => {
    const foreign = await newConversation(client(t.app, other.owner.token));
    const response = await api.post('/api/conversation_items', item(foreign));
    expect(response.status).toBe(422);
    expect(pointers(response)).toEqual(['/data/attributes/conversation_id']);
    const wrongOrg = await api.post('/api/conversation_items', item(await newConversation(), { organisation_id: other.organisationId }));
    expect(wrongOrg.status).toBe(422);
    expect(pointers(wrongOrg)).toEqual(['/data/attributes/organisation_id']);
  });

  it('assigns unique, gap-free indexes under concurrent posts', async () => {
    const conversationId = await newConversation();
    const responses = await Promise.all(
      Array.from({ length: 20 }, (_, i) => api.post('/api/conversation_items', item(conversationId, { content: `m${i}` }))),
    );
    expect(responses.every((r) => r.status === 201)).toBe(true);
    const indexes = responses.map((r) => r.body.data.attributes.content_index).sort((a: number, b: number) => a - b);
    expect(indexes).toEqual(Array.from({ length: 20 }, (_, i) => i));
    // One event per item, as stored, in the items' order: each post's lock, index and event id are taken by
    // one statement, so the next post's statement takes its event id after this one has committed.
    const { rows } = await sql<{ data: { id: string; attributes: { content_index: number } } }>`
      SELECT data FROM events WHERE type = 'ConversationItem.created' AND data->'attributes'->>'conversation_id' = ${conversationId}
      ORDER BY id`.execute(t.db);
    expect(rows.map((r) => r.data.attributes.content_index)).toEqual(indexes);
    expect(new Set(rows.map((r) => r.data.id))).toEqual(new Set(responses.map((r) => r.body.data.id)));
  });

  it('includes items in content order on the conversation', async () => {
    const conversationId = await newConversation();
    for (const content of ['a', 'b', 'c']) await api.post('/api/conversation_items', item(conversationId, { content }));
    const response = await api.get(
      `/api/conversations?filter[id]=${conversationId}&include=conversation_items&fields[ConversationItem]=content`,
    );
    expect(response.body.included.map((r: { attributes: { content: string } }) => r.attributes.content)).toEqual(['a', 'b', 'c']);
  });
});

describe('GET /api/conversation_items/:id', () => {
  it('is 404 for unknown, malformed and foreign ids', async () => {
    const conversationId = await newConversation();
    const created = (await api.post('/api/conversation_items', item(conversationId))).body.data.id;
    expect((await api.get('/api/conversation_items/0190a000-0000-7000-8000-000000000000')).status).toBe(404);
    expect((await api.get('/api/conversation_items/nope')).status).toBe(404);
    expect((await client(t.app, other.owner.token).get(`/api/conversation_items/${created}`)).status).toBe(404);
  });

  it('answers 405 with Allow for other methods', async () => {
    const response = await api.request('DELETE', '/api/conversation_items/0190a000-0000-7000-8000-000000000000');
    expect(response.status).toBe(405);
    expect(response.headers.allow).toBe('GET, HEAD');
    const list = await api.get('/api/conversation_items');
    expect(list.status).toBe(405);
    expect(list.headers.allow).toBe('POST');
  });
});
