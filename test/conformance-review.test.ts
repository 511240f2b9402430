/**
 * The third outside review's conformance findings (a Schemathesis run and six JSON:API client libraries):
 * body-less requests, top-level members, `__proto__`, RFC 6901 pointers, relationships an operation cannot
 * set, `QUERY`, early years and the pointer of a linked reference.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, pointers, type Client } from './helpers/http.js';

let t: TestApp;
let tenant: Tenant;
let admin: Client;
let conversationId: string;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Review');
  admin = client(t.app, tenant.admin.token);
  conversationId = (await admin.post('/api/conversations', { data: { type: 'Conversation' } })).body.data.id;
});
afterAll(async () => t?.close());

const JSONAPI = 'application/vnd.api+json';

describe('requests without a body', () => {
  it('DELETE with a JSON:API or JSON Content-Type and no body is served', async () => {
    for (const contentType of [JSONAPI, 'application/json']) {
      const agent = await admin.post('/api/ai_agents', { data: { type: 'AiAgent', attributes: { name: `Temp ${contentType}` } } });
      expect(agent.status).toBe(201);
      const response = await admin.request('DELETE', `/api/ai_agents/${agent.body.data.id}`, undefined, { 'content-type': contentType });
      expect(response.status, contentType).toBe(200);
      expect(response.body.meta.removed).toEqual({ AiAgent: 1 });
    }
  });

  it('a POST or PATCH that needs a body and has none says so, not "not valid JSON"', async () => {
    const response = await admin.request('POST', '/api/conversations', undefined, { 'content-type': JSONAPI });
    expect(response.status).toBe(400);
    expect(response.body.errors[0].detail).not.toMatch(/not valid JSON/);
    expect(response.body.errors[0].source).toEqual({ pointer: '' });
  });

  it('QUERY, with or without a body, is 405 with Allow', async () => {
    for (const body of [undefined, '{}']) {
      const response = await t.app.inject({
        method: 'QUERY' as 'GET',
        url: '/api/conversations',
        headers: { authorization: `Bearer ${tenant.admin.token}`, ...(body ? { 'content-type': JSONAPI } : {}) },
        payload: body,
      });
      expect(response.statusCode, String(body)).toBe(405);
      expect(response.headers.allow).toBe('GET, POST, HEAD');
    }
  });
});

describe('top-level and resource object members', () => {
  const post = (doc: unknown) => admin.post('/api/conversations', doc);

  it('refuses wrong-typed members with 400 on their pointer', async () => {
    const cases: [unknown, string][] = [
      [{ data: { type: 'Conversation' }, jsonapi: [null, null] }, '/jsonapi'],
      [{ data: { type: 'Conversation' }, jsonapi: { version: 1 } }, '/jsonapi/version'],
      [{ data: { type: 'Conversation' }, jsonapi: { meta: 'x' } }, '/jsonapi/meta'],
      [{ data: { type: 'Conversation' }, meta: [1] }, '/meta'],
      [{ data: { type: 'Conversation' }, meta: 'x' }, '/meta'],
      [{ data: { type: 'Conversation' }, links: 'x' }, '/links'],
      [{ data: { type: 'Conversation', links: 7 } }, '/data/links'],
      [{ data: { type: 'Conversation', lid: 7 } }, '/data/lid'],
      [{ data: { type: 'Conversation', meta: null } }, '/data/meta'],
    ];
    for (const [doc, at] of cases) {
      const response = await post(doc);
      expect(response.status, JSON.stringify(doc)).toBe(400);
      expect(pointers(response), JSON.stringify(doc)).toEqual([at]);
    }
  });

  it('accepts well-typed members, top-level links included (and ignores them)', async () => {
    const response = await post({
      data: { type: 'Conversation', lid: 'local-1', links: { self: 'https://example.com/x' }, meta: { a: 1 } },
      jsonapi: { version: '1.1', meta: {}, ext: [], profile: ['https://example.com/p'] },
      meta: { anything: [1, 2] },
      links: { self: 'https://example.com/request' },
    });
    expect(response.status).toBe(201);
  });

  it('takes `__proto__` and `constructor` as ordinary member names, never as prototypes', async () => {
    const text = `{"data":{"type":"ConversationItem","attributes":{"conversation_id":"${conversationId}","role":"user","content":"x",
      "metadata":{"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}}}}`;
    const created = await admin.post('/api/conversation_items', text);
    expect(created.status).toBe(201);
    expect(Object.keys(created.body.data.attributes.metadata)).toEqual(['__proto__', 'constructor']);
    expect(Object.hasOwn(created.body.data.attributes.metadata, '__proto__')).toBe(true);
    const read = await admin.get(`/api/conversation_items/${created.body.data.id}`);
    expect(JSON.stringify(read.body.data.attributes.metadata)).toBe(
      '{"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}',
    );
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();

    const attribute = await admin.post(
      '/api/conversations',
      '{"data":{"type":"Conversation","attributes":{"__proto__":{"status":"closed"}}}}',
    );
    expect(attribute.status).toBe(422);
    expect(errorCodes(attribute)).toEqual(['unknown_attribute']);
    expect(pointers(attribute)).toEqual(['/data/attributes/__proto__']);
    const topLevel = await admin.post('/api/conversations', '{"data":{"type":"Conversation"},"__proto__":{"x":1}}');
    expect(topLevel.status).toBe(400);
    expect(pointers(topLevel)).toEqual(['/__proto__']);
    const relationship = await admin.post(
      '/api/conversations',
      '{"data":{"type":"Conversation","relationships":{"__proto__":{"data":null}}}}',
    );
    expect(relationship.status).toBe(422);
    expect(pointers(relationship)).toEqual(['/data/relationships/__proto__']);
  });
});

describe('error pointers', () => {
  it('escape `~` and `/` in member names (RFC 6901)', async () => {
    const response = await admin.post('/api/conversations', {
      data: { type: 'Conversation', attributes: { 'a~b': 1, 'c/d': 2 }, relationships: { 'e/f~': { data: null } } },
    });
    expect(response.status).toBe(422);
    expect(pointers(response).sort()).toEqual(['/data/attributes/a~0b', '/data/attributes/c~1d', '/data/relationships/e~1f~0']);
    const top = await admin.post('/api/conversations', { data: { type: 'Conversation', 'x/y': 1 } });
    expect(pointers(top)).toEqual(['/data/x~1y']);
  });

  it("point at the relationship a reference came from: another organisation's record sent as `organisation`", async () => {
    const other = await seedTenant(t, 'ReviewOther');
    const response = await admin.post('/api/conversation_items', {
      data: {
        type: 'ConversationItem',
        attributes: { role: 'user', content: 'x' },
        relationships: {
          conversation: { data: { type: 'Conversation', id: conversationId } },
          organisation: { data: { type: 'Organisation', id: other.organisationId } },
        },
      },
    });
    expect(response.status).toBe(422);
    expect(pointers(response)).toEqual(['/data/relationships/organisation']);
    const conversation = await admin.post('/api/conversation_items', {
      data: {
        type: 'ConversationItem',
        attributes: { role: 'user', content: 'x' },
        relationships: { conversation: { data: { type: 'Conversation', id: '00000000-0000-7000-8000-000000000000' } } },
      },
    });
    expect(conversation.status).toBe(422);
    expect(pointers(conversation)).toEqual(['/data/relationships/conversation']);
  });
});

describe('relationships an operation cannot set', () => {
  it('are 403 on their pointer (JSON:API: an unsupported relationship update), unknown names 422', async () => {
    const patch = await admin.patch(`/api/conversations/${conversationId}`, {
      data: {
        type: 'Conversation',
        id: conversationId,
        relationships: { organisation: { data: { type: 'Organisation', id: tenant.organisationId } } },
      },
    });
    expect(patch.status).toBe(403);
    expect(errorCodes(patch)).toEqual(['forbidden']);
    expect(pointers(patch)).toEqual(['/data/relationships/organisation']);
    const toMany = await admin.patch(`/api/conversations/${conversationId}`, {
      data: { type: 'Conversation', id: conversationId, relationships: { conversation_items: { data: [] } } },
    });
    expect(toMany.status).toBe(403);
    const unknown = await admin.patch(`/api/conversations/${conversationId}`, {
      data: { type: 'Conversation', id: conversationId, relationships: { nothing: { data: null } } },
    });
    expect(unknown.status).toBe(422);
    expect(errorCodes(unknown)).toEqual(['unknown_attribute']);
  });
});

describe('timestamps before the year 1000', () => {
  it('are refused with a message naming the supported years', async () => {
    for (const value of ['0999-12-31T23:59:59Z', '0001-01-01T00:00:00Z', '1000-01-01T00:30:00+01:00']) {
      const response = await admin.post('/api/conversation_items', {
        data: { type: 'ConversationItem', attributes: { conversation_id: conversationId, role: 'user', content: 'x', occurred_at: value } },
      });
      expect(response.status, value).toBe(422);
      expect(pointers(response)).toEqual(['/data/attributes/occurred_at']);
      expect(response.body.errors[0].detail, value).toMatch(/years 1000 to 9999/);
    }
    const filter = await admin.get('/api/conversations?filter[created_at][greater_than]=0999-01-01T00:00:00Z');
    expect(filter.status).toBe(400);
    expect(filter.body.errors[0].detail).toMatch(/years 1000 to 9999/);
  });
});

describe('related links', () => {
  it("answer with the related records: a conversation's items (paged), an item's conversation, null when unset", async () => {
    const id = (await admin.post('/api/conversations', { data: { type: 'Conversation' } })).body.data.id;
    for (const content of ['a', 'b', 'c']) {
      const item = await admin.post('/api/conversation_items', {
        data: { type: 'ConversationItem', attributes: { conversation_id: id, role: 'user', content } },
      });
      expect(item.status).toBe(201);
    }
    const conversation = await admin.get(`/api/conversations/${id}`);
    const related = new URL(conversation.body.data.relationships.conversation_items.links.related);
    expect(related.pathname).toBe(`/api/conversations/${id}/conversation_items`);
    const page = await admin.get(`${related.pathname}?page[limit]=2`);
    expect(page.status).toBe(200);
    expect(page.body.data.map((i: { attributes: { content: string } }) => i.attributes.content)).toEqual(['a', 'b']);
    const next = new URL(page.body.links.next);
    expect(next.pathname).toBe(related.pathname);
    const rest = await admin.get(`${next.pathname}${next.search}`);
    expect(rest.body.data.map((i: { attributes: { content: string } }) => i.attributes.content)).toEqual(['c']);

    const itemId = page.body.data[0].id;
    const parent = await admin.get(`/api/conversation_items/${itemId}/conversation?include=organisation`);
    expect(parent.status).toBe(200);
    expect(parent.body.data).toMatchObject({ id, type: 'Conversation' });
    expect(parent.body.included.map((r: { type: string }) => r.type)).toEqual(['Organisation']);
    const none = await admin.get(`/api/conversations/${id}/ai_agent`);
    expect(none.status).toBe(200);
    expect(none.body.data).toBeNull();
    const organisations = await admin.get(`/api/users/${tenant.admin.id}/organisations`);
    expect(organisations.body.data.map((o: { id: string }) => o.id)).toEqual([tenant.organisationId]);
  });

  it("are 404 for another organisation's record, 405 for other methods, and keep role scopes", async () => {
    const other = await seedTenant(t, 'ReviewRelated');
    const theirs = await client(t.app, other.admin.token).post('/api/conversations', { data: { type: 'Conversation' } });
    expect((await admin.get(`/api/conversations/${theirs.body.data.id}/conversation_items`)).status).toBe(404);
    expect((await admin.get(`/api/conversations/${theirs.body.data.id}/organisation`)).status).toBe(404);
    const patch = await admin.patch(`/api/conversations/${conversationId}/conversation_items`, { data: [] });
    expect(patch.status).toBe(405);
    expect(patch.headers.allow).toBe('GET, HEAD');
    // A visitor reads its own conversation's items through the related link, but not the organisation (403),
    // and another conversation's items not at all (404).
    const opened = await client(t.app, tenant.publishableKey).post('/api/visitor_sessions', { data: { type: 'Conversation' } });
    expect(opened.status).toBe(201);
    const visitor = client(t.app, opened.body.meta.token);
    const own = opened.body.data.id;
    expect(
      (
        await visitor.post('/api/conversation_items', {
          data: { type: 'ConversationItem', attributes: { conversation_id: own, role: 'user', content: 'hi' } },
        })
      ).status,
    ).toBe(201);
    const items = await visitor.get(`/api/conversations/${own}/conversation_items`);
    expect(items.status).toBe(200);
    expect(items.body.data.map((i: { attributes: { content: string } }) => i.attributes.content)).toEqual(['hi']);
    expect((await visitor.get(`/api/conversations/${own}/organisation`)).status).toBe(403);
    expect((await visitor.get(`/api/conversations/${conversationId}/conversation_items`)).status).toBe(404);
  });
});
