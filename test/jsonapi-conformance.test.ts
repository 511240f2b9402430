/** JSON:API 1.1 points a client library relies on: ext/profile media type parameters, page[limit], relationship linkage in writes. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, pointers, type Client } from './helpers/http.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let admin: Client;
let conversationId: string;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Conformance');
  other = await seedTenant(t, 'ConformanceOther');
  admin = client(t.app, tenant.admin.token);
  conversationId = (await admin.post('/api/conversations', { data: { type: 'Conversation' } })).body.data.id;
});
afterAll(async () => t?.close());

describe('ext and profile media type parameters', () => {
  const body = { data: { type: 'Conversation' } };

  it('refuses a request document using an unsupported extension with 415, and ignores profiles', async () => {
    for (const contentType of [
      'application/vnd.api+json; ext="https://jsonapi.org/ext/atomic"',
      'application/vnd.api+json; ext=https://example.com/ext',
      'application/vnd.api+json; profile="https://example.com/p"; ext="https://example.com/a https://example.com/b"',
    ]) {
      const response = await admin.post('/api/conversations', body, { 'content-type': contentType });
      expect(response.status, contentType).toBe(415);
      expect(response.body.errors[0]).toMatchObject({ code: 'unsupported_media_type', source: { header: 'Content-Type' } });
    }
    for (const contentType of [
      'application/vnd.api+json; profile="https://example.com/p https://example.com/q"',
      'application/vnd.api+json; ext=""',
    ]) {
      expect((await admin.post('/api/conversations', body, { 'content-type': contentType })).status, contentType).toBe(201);
    }
  });

  it('answers 406 when every JSON:API range in Accept asks for an unsupported extension', async () => {
    // JSON:API 1.1: 406 when every instance of its media type names an unsupported extension, whatever else Accept lists.
    for (const accept of [
      'application/vnd.api+json; ext="https://jsonapi.org/ext/atomic"',
      'application/vnd.api+json; ext="https://jsonapi.org/ext/atomic", */*',
    ]) {
      const refused = await admin.get('/api/conversations', { accept });
      expect(refused.status, accept).toBe(406);
      expect(refused.body.errors[0]).toMatchObject({ code: 'not_acceptable', source: { header: 'Accept' } });
    }
    for (const accept of [
      'application/vnd.api+json; ext="https://jsonapi.org/ext/atomic", application/vnd.api+json',
      'application/vnd.api+json; profile="https://example.com/p"',
    ]) {
      expect((await admin.get('/api/conversations', { accept })).status, accept).toBe(200);
    }
  });
});

describe('page[limit]', () => {
  it('clamps any positive size to 100, however large', async () => {
    for (const limit of ['101', '1000', '1000000000', '99999999999999999999999999']) {
      const response = await admin.get(`/api/conversations?page[limit]=${limit}`);
      expect(response.status, limit).toBe(200);
      expect(response.body.meta.page.limit).toBe(100);
    }
    for (const limit of ['0', '-1', 'abc', '1e3', '']) {
      const response = await admin.get(`/api/conversations?page[limit]=${limit}`);
      expect(response.status, limit).toBe(400);
      expect(response.body.errors[0].source.parameter).toBe('page[limit]');
    }
  });
});

describe('relationship linkage in create and update bodies', () => {
  const item = (extra: Record<string, unknown>) => ({
    data: { type: 'ConversationItem', attributes: { role: 'user', content: 'hello' }, ...extra },
  });
  const linkage = (type: string, id: string) => ({ conversation: { data: { type, id } } });

  it('reads every to-one reference from its linkage', async () => {
    const created = await admin.post(
      '/api/conversation_items',
      item({ relationships: linkage('Conversation', conversationId.toUpperCase()) }),
    );
    expect(created.status).toBe(201);
    expect(created.body.data.attributes.conversation_id).toBe(conversationId);
    expect(created.body.data.relationships.conversation.data.id).toBe(conversationId);
    // With the attribute as well, when both agree.
    const both = await admin.post('/api/conversation_items', {
      data: {
        type: 'ConversationItem',
        attributes: { role: 'user', content: 'again', conversation_id: conversationId },
        relationships: linkage('Conversation', conversationId),
      },
    });
    expect(both.status).toBe(201);
    // A SIP user's user, and setting a nullable reference to null through linkage on update.
    const sip = await admin.post('/api/sip_users', {
      data: {
        type: 'SipUser',
        attributes: { sip_username: 'linked-1' },
        relationships: { user: { data: { type: 'User', id: tenant.operator.id } } },
      },
    });
    expect(sip.status).toBe(201);
    expect(sip.body.data.attributes.user_id).toBe(tenant.operator.id);
    const unlinked = await admin.patch(`/api/conversations/${conversationId}`, {
      data: { type: 'Conversation', id: conversationId, relationships: { ai_agent: { data: null } } },
    });
    expect(unlinked.status).toBe(200);
    expect(unlinked.body.data.attributes.ai_agent_id).toBeNull();
    // A relationship the update cannot set is an unsupported relationship update: 403 (JSON:API 1.1 section 9.3).
    const fixed = await admin.patch(`/api/sip_users/${sip.body.data.id}`, {
      data: { type: 'SipUser', id: sip.body.data.id, relationships: { user: { data: null } } },
    });
    expect(fixed.status).toBe(403);
    expect(pointers(fixed)).toEqual(['/data/relationships/user']);
  });

  it('refuses a linkage of the wrong type, one that disagrees with the attribute, and relationships it cannot set, each on its pointer', async () => {
    const wrongType = await admin.post('/api/conversation_items', item({ relationships: linkage('Call', conversationId) }));
    expect(wrongType.status).toBe(422);
    expect(pointers(wrongType)).toEqual(['/data/relationships/conversation/data/type']);

    const otherConversation = (await admin.post('/api/conversations', { data: { type: 'Conversation' } })).body.data.id;
    const disagreeing = await admin.post('/api/conversation_items', {
      data: {
        type: 'ConversationItem',
        attributes: { role: 'user', content: 'x', conversation_id: otherConversation },
        relationships: linkage('Conversation', conversationId),
      },
    });
    expect(disagreeing.status).toBe(422);
    expect(pointers(disagreeing)).toEqual(['/data/relationships/conversation']);

    const unknown = await admin.post('/api/conversations', {
      data: {
        type: 'Conversation',
        relationships: { conversation_items: { data: [] }, organisation: { data: { type: 'Organisation', id: tenant.organisationId } } },
      },
    });
    expect(unknown.status).toBe(403);
    expect(errorCodes(unknown)).toEqual(['forbidden', 'forbidden']);
    expect(pointers(unknown)).toEqual(['/data/relationships/conversation_items', '/data/relationships/organisation']);

    const malformed = await admin.post('/api/conversation_items', item({ relationships: { conversation: { id: conversationId } } }));
    expect(malformed.status).toBe(422);
    expect(pointers(malformed)).toContain('/data/relationships/conversation');
    const badId = await admin.post('/api/conversation_items', item({ relationships: linkage('Conversation', 'not-a-uuid') }));
    expect(pointers(badId)).toEqual(['/data/relationships/conversation/data/id']);
  });

  it("checks linked records like attributes: another organisation's conversation is refused", async () => {
    const theirs = (await client(t.app, other.admin.token).post('/api/conversations', { data: { type: 'Conversation' } })).body.data.id;
    const response = await admin.post('/api/conversation_items', item({ relationships: linkage('Conversation', theirs) }));
    expect(response.status).toBe(422);
    const missing = await admin.post('/api/conversation_items', item({}));
    expect(pointers(missing)).toEqual(['/data/attributes/conversation_id']);
  });
});
