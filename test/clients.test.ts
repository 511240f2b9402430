/**
 * Real JSON:API client libraries drive a listening server over HTTP:
 * Kitsu reads (query serialisation, deserialising, linking includes),
 * Jsona serialises write documents and deserialises their answers, and
 * Kitsu, Jsona, devour-client and jsonapi-serializer each make their normal
 * create call, with the conversation as relationship linkage.
 */
import type { AddressInfo } from 'node:net';
import JsonApi from 'devour-client';
import { Deserializer, Serializer } from 'jsonapi-serializer';
import Kitsu from 'kitsu';
import { Jsona } from 'jsona';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { expectJsonApi } from './support/conformance.js';
import { insertCall, insertTranscript } from './helpers/telephony.js';

let t: TestApp;
let tenant: Tenant;
let base: string;
let kitsu: Kitsu;
const jsona = new Jsona();

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Clients');
  await t.app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(t.app.server.address() as AddressInfo).port}`;
  kitsu = new Kitsu({
    baseURL: `${base}/api`,
    headers: { Authorization: `Bearer ${tenant.admin.token}` },
    pluralize: false,
    camelCaseTypes: false,
    resourceCase: 'none',
  });
});
afterAll(async () => t?.close());

/** Sends a Jsona-serialised document and returns the status and the deserialised record. */
async function write(method: 'POST' | 'PATCH', path: string, stuff: Record<string, unknown>) {
  const body = jsona.serialize({ stuff });
  const response = await fetch(`${base}${path}`, {
    method,
    headers: {
      Authorization: `Bearer ${tenant.admin.token}`,
      'Content-Type': 'application/vnd.api+json',
      Accept: 'application/vnd.api+json',
    },
    body: JSON.stringify(body),
  });
  const document = (await response.json()) as any;
  expectJsonApi(document);
  return {
    status: response.status,
    location: response.headers.get('location'),
    record: response.ok ? (jsona.deserialize(document) as Record<string, any>) : undefined,
    document,
  };
}

describe('JSON:API client libraries over HTTP', () => {
  it('create, update and read back conversations and items', async () => {
    const created = await write('POST', '/api/conversations', { type: 'Conversation', channel: 'sms', metadata: { from: 'jsona' } });
    expect(created.status).toBe(201);
    expect(created.location).toBe(`${base}/api/conversations/${created.record!.id}`);
    expect(created.record).toMatchObject({ type: 'Conversation', channel: 'sms', status: 'active', metadata: { from: 'jsona' } });
    const id = created.record!.id;
    for (const content of ['first', 'second']) {
      const item = await write('POST', '/api/conversation_items', { type: 'ConversationItem', content, role: 'user', conversation_id: id });
      expect(item.status).toBe(201);
    }
    const updated = await write('PATCH', `/api/conversations/${id}`, { type: 'Conversation', id, status: 'pending' });
    expect(updated.status).toBe(200);
    expect(updated.record!.status).toBe('pending');

    const listed = await kitsu.get('conversations', {
      params: { filter: { id }, include: 'conversation_items,organisation', fields: { ConversationItem: 'content,content_index' } },
    });
    expect(listed.data).toHaveLength(1);
    const conversation = listed.data[0];
    expect(conversation.status).toBe('pending');
    expect(conversation.conversation_items.data.map((i: { content: string }) => i.content)).toEqual(['first', 'second']);
    expect(conversation.organisation.data).toMatchObject({ id: tenant.organisationId, name: 'Clients' });
  });

  it('pages through a list with page[limit] and the next links', async () => {
    const callId = await insertCall(t.db, tenant.organisationId);
    for (let i = 0; i < 7; i++) await insertTranscript(t.db, tenant.organisationId, callId, i);
    const seen: number[] = [];
    let response = await kitsu.get('call_transcripts', {
      params: { filter: { call_id: callId }, sort: '-content_index', page: { limit: 3 } },
    });
    for (;;) {
      seen.push(...response.data.map((r: { content_index: number }) => r.content_index));
      if (!response.links?.next) break;
      const next = new URL(response.links.next);
      const raw = (await fetch(next, { headers: { Authorization: `Bearer ${tenant.admin.token}` } }).then((r) => r.json())) as any;
      expectJsonApi(raw);
      response = { data: jsona.deserialize(raw) as Record<string, any>[], links: raw.links };
    }
    expect(seen).toEqual([6, 5, 4, 3, 2, 1, 0]);
  });

  it("follows related links: a conversation's items, an item's conversation (Kitsu and Jsona)", async () => {
    const id = (await write('POST', '/api/conversations', { type: 'Conversation', channel: 'chat' })).record!.id;
    for (const content of ['one', 'two', 'three']) {
      expect(
        (await write('POST', '/api/conversation_items', { type: 'ConversationItem', content, role: 'user', conversation_id: id })).status,
      ).toBe(201);
    }
    const read = await fetch(`${base}/api/conversations/${id}`, { headers: { Authorization: `Bearer ${tenant.admin.token}` } });
    const related = ((await read.json()) as any).data.relationships.conversation_items.links.related;
    expect(related).toBe(`${base}/api/conversations/${id}/conversation_items`);
    // Kitsu reads a relationship by path, as it does for `users/1/followers`.
    const items = await kitsu.get(`conversations/${id}/conversation_items`, { params: { page: { limit: 2 } } });
    expect(items.data.map((i: { content: string }) => i.content)).toEqual(['one', 'two']);
    expect(items.links.next).toContain(`/api/conversations/${id}/conversation_items?`);
    // The related link itself, deserialised by Jsona: the items, not the conversation.
    const followed = (await fetch(related, { headers: { Authorization: `Bearer ${tenant.admin.token}` } }).then((r) => r.json())) as any;
    expectJsonApi(followed);
    expect((jsona.deserialize(followed) as Record<string, any>[]).map((i) => i.type)).toEqual([
      'ConversationItem',
      'ConversationItem',
      'ConversationItem',
    ]);
    const conversation = await kitsu.get(`conversation_items/${items.data[0].id}/conversation`);
    expect(conversation.data).toMatchObject({ id, type: 'Conversation', channel: 'chat' });
  });

  it('deletes with devour-client, which sends the JSON:API Content-Type without a body', async () => {
    const devour = new JsonApi({ apiUrl: `${base}/api`, pluralize: false, bearer: tenant.admin.token, logger: false });
    devour.define('AiAgent', { name: '' }, { collectionPath: 'ai_agents' });
    const agent = await write('POST', '/api/ai_agents', { type: 'AiAgent', name: 'Short-lived' });
    expect(agent.status).toBe(201);
    await devour.destroy('AiAgent', agent.record!.id);
    const gone = await fetch(`${base}/api/ai_agents/${agent.record!.id}`, { headers: { Authorization: `Bearer ${tenant.admin.token}` } });
    expect(gone.status).toBe(404);
  });

  it('reports errors as JSON:API error objects the client can read', async () => {
    const refused = await write('POST', '/api/conversations', { type: 'Conversation', channel: 'pigeon' });
    expect(refused.status).toBe(422);
    expect(refused.document.errors[0]).toMatchObject({
      status: '422',
      code: 'invalid_attribute',
      source: { pointer: '/data/attributes/channel' },
    });
    await expect(kitsu.get('conversations', { params: { sort: 'colour' } })).rejects.toMatchObject({ response: { status: 400 } });
  });
});

describe('creates with relationship linkage, as each client library sends it', () => {
  let conversationId: string;
  beforeAll(async () => {
    conversationId = (await write('POST', '/api/conversations', { type: 'Conversation' })).record!.id;
  });

  /** The item as the API shows it afterwards. */
  async function stored(id: string) {
    const response = await fetch(`${base}/api/conversation_items/${id}`, { headers: { Authorization: `Bearer ${tenant.admin.token}` } });
    const document = (await response.json()) as any;
    expectJsonApi(document);
    return document.data;
  }

  it('Kitsu', async () => {
    // Kitsu sends its model name as the type and derives the URL from it; the URL is mapped to the collection.
    const typed = new Kitsu({
      baseURL: `${base}/api`,
      headers: { Authorization: `Bearer ${tenant.admin.token}` },
      camelCaseTypes: false,
      resourceCase: 'none',
      pluralize: false,
    });
    // Kitsu names the collection after the type; ours is the spec's snake_case path.
    typed.axios.interceptors.request.use((config) => {
      if ((config as { url?: string }).url === 'ConversationItem') (config as { url?: string }).url = 'conversation_items';
      return config;
    });
    const response = await typed.create('ConversationItem', {
      content: 'from kitsu',
      role: 'user',
      conversation: { data: { type: 'Conversation', id: conversationId } },
    });
    expect(response.data).toMatchObject({ content: 'from kitsu', conversation: { data: { id: conversationId } } });
    expect((await stored(response.data.id)).attributes.conversation_id).toBe(conversationId);
  });

  it('Jsona', async () => {
    const created = await write('POST', '/api/conversation_items', {
      type: 'ConversationItem',
      content: 'from jsona',
      role: 'user',
      conversation: { type: 'Conversation', id: conversationId },
      relationshipNames: ['conversation'],
    });
    expect(created.document.data?.attributes?.conversation_id, JSON.stringify(created.document)).toBe(conversationId);
    expect(created.status).toBe(201);
  });

  it('devour-client', async () => {
    const devour = new JsonApi({ apiUrl: `${base}/api`, pluralize: false, bearer: tenant.admin.token, logger: false });
    devour.define(
      'ConversationItem',
      { content: '', role: '', conversation_id: '', conversation: { jsonApi: 'hasOne', type: 'Conversation' } },
      { collectionPath: 'conversation_items', readOnly: ['conversation_id'] },
    );
    devour.define('Conversation', { status: '' }, { collectionPath: 'conversations' });
    const { data } = await devour.create('ConversationItem', {
      content: 'from devour',
      role: 'user',
      conversation: { id: conversationId },
    });
    expect(data).toMatchObject({ content: 'from devour', conversation_id: conversationId });
    expect((await stored(data.id)).attributes.content).toBe('from devour');
  });

  it('jsonapi-serializer', async () => {
    const serializer = new Serializer('ConversationItem', {
      attributes: ['content', 'role', 'conversation'],
      conversation: { ref: 'id' },
      keyForAttribute: 'snake_case',
      pluralizeType: false,
      typeForAttribute: (attribute: string) => (attribute === 'conversation' ? 'Conversation' : attribute),
    });
    const body = serializer.serialize({ content: 'from jsonapi-serializer', role: 'user', conversation: { id: conversationId } });
    const response = await fetch(`${base}/api/conversation_items`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${tenant.admin.token}`, 'Content-Type': 'application/vnd.api+json' },
      body: JSON.stringify(body),
    });
    const document = (await response.json()) as any;
    expectJsonApi(document);
    expect(response.status, JSON.stringify(document)).toBe(201);
    const item = await new Deserializer({ keyForAttribute: 'snake_case' }).deserialize(document);
    expect(item).toMatchObject({ content: 'from jsonapi-serializer', conversation_id: conversationId });
  });
});
