import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, pointers, resourceDocument, type Client } from './helpers/http.js';
import { insertAgent, insertCall } from './helpers/telephony.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let owner: Client;
let operator: Client;
let stranger: Client;
let agentId: string;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Acme');
  other = await seedTenant(t, 'Other');
  owner = client(t.app, tenant.owner.token);
  operator = client(t.app, tenant.operator.token);
  stranger = client(t.app, other.admin.token);
  agentId = await insertAgent(t.db, tenant.organisationId, 'Ava');
});
afterAll(async () => t?.close());

const conversation = (attributes: Record<string, unknown> = {}) => resourceDocument('Conversation', attributes);

describe('POST /api/conversations', () => {
  it('creates with defaults, 201 and Location', async () => {
    const response = await owner.post('/api/conversations', conversation());
    expect(response.status).toBe(201);
    const data = response.body.data;
    expect(response.headers.location).toBe(data.links.self);
    expect(data.type).toBe('Conversation');
    expect(data.attributes).toMatchObject({ channel: 'chat', mode: 'text', status: 'active', metadata: {}, ai_agent_id: null });
    expect(data.attributes.public_id).toMatch(/^[A-Za-z0-9_-]{22,}$/);
    expect(data.relationships.ai_agent).toEqual({ data: null });
    expect(data.relationships.organisation.data).toEqual({ id: tenant.organisationId, type: 'Organisation', meta: {} });
    expect(data.relationships.conversation_items.links.related).toMatch(new RegExp(`/api/conversations/${data.id}/conversation_items$`));
    expect(response.body.included).toEqual([]);
  });

  it('accepts every writable attribute and an agent of the organisation', async () => {
    const response = await operator.post(
      '/api/conversations?include=ai_agent',
      conversation({ channel: 'voice', mode: 'voice', metadata: { topic: 'billing' }, ai_agent_id: agentId }),
    );
    expect(response.status).toBe(201);
    expect(response.body.data.attributes).toMatchObject({ channel: 'voice', mode: 'voice', metadata: { topic: 'billing' } });
    expect(response.body.data.relationships.ai_agent.data.id).toBe(agentId);
    expect(response.body.included.map((r: { type: string; id: string }) => [r.type, r.id])).toEqual([['AiAgent', agentId]]);
  });

  it('reports every invalid attribute together', async () => {
    const response = await owner.post(
      '/api/conversations',
      conversation({ channel: 'fax', mode: 7, metadata: [], status: 'closed', public_id: 'x', colour: 'red' }),
    );
    expect(response.status).toBe(422);
    expect(pointers(response).sort()).toEqual(
      ['channel', 'mode', 'metadata', 'status', 'public_id', 'colour'].map((n) => `/data/attributes/${n}`).sort(),
    );
    expect(errorCodes(response)).toContain('unknown_attribute');
    expect(errorCodes(response)).toContain('invalid_attribute');
  });

  it('refuses an agent of another organisation as if it did not exist', async () => {
    const foreignAgent = await insertAgent(t.db, other.organisationId);
    const response = await owner.post('/api/conversations', conversation({ ai_agent_id: foreignAgent }));
    expect(response.status).toBe(422);
    expect(pointers(response)).toEqual(['/data/attributes/ai_agent_id']);
  });

  it('refuses metadata over 16 KiB', async () => {
    const response = await owner.post('/api/conversations', conversation({ metadata: { blob: 'x'.repeat(17 * 1024) } }));
    expect(response.status).toBe(422);
  });

  it('answers envelope errors with 400, 409 and 403', async () => {
    expect((await owner.post('/api/conversations', '{"data":')).status).toBe(400);
    expect((await owner.post('/api/conversations', {})).status).toBe(400);
    expect((await owner.post('/api/conversations', { data: { type: 'Gateway', attributes: {} } })).status).toBe(409);
    const withId = await owner.post('/api/conversations', { data: { type: 'Conversation', id: 'abc', attributes: {} } });
    expect(withId.status).toBe(403);
  });
});

describe('PATCH /api/conversations/:id', () => {
  it('moves between statuses and updates writable attributes', async () => {
    const created = (await owner.post('/api/conversations', conversation())).body.data;
    for (const status of ['pending', 'closed', 'active']) {
      const response = await operator.patch(`/api/conversations/${created.id}`, resourceDocument('Conversation', { status }, created.id));
      expect(response.status).toBe(200);
      expect(response.body.data.attributes.status).toBe(status);
    }
    const response = await owner.patch(
      `/api/conversations/${created.id}`,
      resourceDocument('Conversation', { mode: 'voice', metadata: { a: 1 }, ai_agent_id: agentId }, created.id),
    );
    expect(response.body.data.attributes).toMatchObject({ mode: 'voice', metadata: { a: 1 }, ai_agent_id: agentId });
    const cleared = await owner.patch(
      `/api/conversations/${created.id}`,
      resourceDocument('Conversation', { ai_agent_id: null }, created.id),
    );
    expect(cleared.body.data.attributes.ai_agent_id).toBeNull();
  });

  it('refuses create-only attributes, bad ids and mismatches', async () => {
    const created = (await owner.post('/api/conversations', conversation())).body.data;
    const channel = await owner.patch(`/api/conversations/${created.id}`, resourceDocument('Conversation', { channel: 'sms' }, created.id));
    expect(channel.status).toBe(422);
    expect(errorCodes(channel)).toEqual(['unknown_attribute']);
    const mismatch = await owner.patch(
      `/api/conversations/${created.id}`,
      resourceDocument('Conversation', {}, '0190a000-0000-7000-8000-000000000000'),
    );
    expect(mismatch.status).toBe(409);
    const missingId = await owner.patch(`/api/conversations/${created.id}`, { data: { type: 'Conversation', attributes: {} } });
    expect(missingId.status).toBe(400);
    expect((await owner.patch('/api/conversations/not-a-uuid', resourceDocument('Conversation', {}, 'not-a-uuid'))).status).toBe(404);
  });

  it('hides other organisations\u2019 conversations: 404, never 403', async () => {
    const created = (await owner.post('/api/conversations', conversation())).body.data;
    const response = await stranger.patch(
      `/api/conversations/${created.id}`,
      resourceDocument('Conversation', { status: 'closed' }, created.id),
    );
    expect(response.status).toBe(404);
    const list = await stranger.get(`/api/conversations?filter[id]=${created.id}`);
    expect(list.body.data).toEqual([]);
  });
});

describe('GET /api/conversations', () => {
  let ids: string[];
  let fresh: Tenant;
  beforeAll(async () => {
    fresh = await seedTenant(t, 'Lists');
    const api = client(t.app, fresh.owner.token);
    ids = [];
    const specs = [
      { channel: 'chat', mode: 'text', metadata: { n: 3 } },
      { channel: 'sms', mode: 'voice', metadata: { n: 1 } },
      { channel: 'voice', mode: 'text', metadata: { n: 2 } },
      { channel: 'chat', mode: 'voice', metadata: { n: 1, tag: 'vip' } },
      { channel: 'sms', mode: 'text', metadata: {} },
    ];
    for (const spec of specs) ids.push((await api.post('/api/conversations', conversation(spec))).body.data.id);
    await api.patch(`/api/conversations/${ids[1]}`, resourceDocument('Conversation', { status: 'closed' }, ids[1]));
    owner = client(t.app, fresh.owner.token);
  });
  afterAll(() => {
    owner = client(t.app, tenant.owner.token);
  });

  it('lists in creation order with links and meta', async () => {
    const response = await owner.get('/api/conversations');
    expect(response.status).toBe(200);
    expect(response.body.data.map((r: { id: string }) => r.id)).toEqual(ids);
    expect(response.body.meta.page.limit).toBe(25);
    expect(response.body.links.next).toBeNull();
    expect(response.body.links.prev).toBeNull();
    expect(response.body.links.self).toMatch(/^http/);
  });

  it('filters by equality, operators and nesting', async () => {
    const ofChannel = await owner.get('/api/conversations?filter[channel]=sms');
    expect(ofChannel.body.data.map((r: { id: string }) => r.id)).toEqual([ids[1], ids[4]]);
    const inList = await owner.get('/api/conversations?filter[channel][in]=voice,sms&filter[status][not_eq]=closed');
    expect(inList.body.data.map((r: { id: string }) => r.id)).toEqual([ids[2], ids[4]]);
    const either = await owner.get('/api/conversations?filter[or][0][mode]=voice&filter[or][1][channel]=voice');
    expect(either.body.data.map((r: { id: string }) => r.id)).toEqual([ids[1], ids[2], ids[3]]);
    const negated = await owner.get('/api/conversations?filter[not][channel]=chat');
    expect(negated.body.data).toHaveLength(3);
    const contains = await owner.get(`/api/conversations?filter[metadata][contains]=${encodeURIComponent('{"tag":"vip"}')}`);
    expect(contains.body.data.map((r: { id: string }) => r.id)).toEqual([ids[3]]);
    const none = await owner.get('/api/conversations?filter[ai_agent_id][is_nil]=false');
    expect(none.body.data).toEqual([]);
  });

  it('sorts with every prefix and id as the tie-break', async () => {
    const byChannel = await owner.get('/api/conversations?sort=channel,-mode');
    expect(byChannel.body.data.map((r: { attributes: { channel: string } }) => r.attributes.channel)).toEqual([
      'chat',
      'chat',
      'sms',
      'sms',
      'voice',
    ]);
    const descending = await owner.get('/api/conversations?sort=-id');
    expect(descending.body.data.map((r: { id: string }) => r.id)).toEqual([...ids].reverse());
    for (const prefix of ['+', '%2B', '++', '--', '-']) {
      const response = await owner.get(`/api/conversations?sort=${prefix}status`);
      expect(response.status).toBe(200);
    }
  });

  it('pages by offset and by keyset, with counts', async () => {
    const first = await owner.get('/api/conversations?page[limit]=2&page[count]=true');
    expect(first.body.meta.page).toEqual({ limit: 2, total: 5 });
    expect(first.body.data.map((r: { id: string }) => r.id)).toEqual(ids.slice(0, 2));
    const seen: string[] = [];
    let next: string | null = '/api/conversations?page[limit]=2';
    while (next) {
      const page = await owner.get(next.replace(/^https?:\/\/[^/]+/, ''));
      seen.push(...page.body.data.map((r: { id: string }) => r.id));
      next = page.body.links.next;
    }
    expect(seen).toEqual(ids);
    const offset = await owner.get('/api/conversations?page[limit]=2&page[offset]=2');
    expect(offset.body.data.map((r: { id: string }) => r.id)).toEqual(ids.slice(2, 4));
    expect(offset.body.meta.page).toEqual({ limit: 2, offset: 2 });
    expect(offset.body.links.prev).toContain('page%5Boffset%5D=0');
    const clamped = await owner.get('/api/conversations?page[limit]=1000');
    expect(clamped.body.meta.page.limit).toBe(100);
  });

  it('restricts fields and names bad parameters', async () => {
    const sparse = await owner.get('/api/conversations?fields[Conversation]=status,organisation');
    expect(Object.keys(sparse.body.data[0].attributes)).toEqual(['status']);
    expect(Object.keys(sparse.body.data[0].relationships)).toEqual(['organisation']);
    const bad = await owner.get('/api/conversations?sort=colour&filter[mode][like]=x&page[limit]=0&include=organisation.users&bogus=1');
    expect(bad.status).toBe(400);
    expect(errorCodes(bad).sort()).toEqual([
      'invalid_filter',
      'invalid_includes',
      'invalid_pagination',
      'invalid_sort',
      'unknown_parameter',
    ]);
    for (const error of bad.body.errors) expect(error.source.parameter).toBeTruthy();
  });

  it('includes conversation items and the call, two levels deep', async () => {
    const id = ids[0];
    for (const content of ['hello', 'world']) {
      await owner.post('/api/conversation_items', resourceDocument('ConversationItem', { content, role: 'user', conversation_id: id }));
    }
    const callId = await insertCall(t.db, fresh.organisationId, { conversation_id: id });
    const response = await owner.get(`/api/conversations?filter[id]=${id}&include=conversation_items,call.conversation`);
    const data = response.body.data[0];
    expect(data.relationships.conversation_items.data).toHaveLength(2);
    expect(data.relationships.call.data.id).toBe(callId);
    const types = response.body.included.map((r: { type: string }) => r.type).sort();
    expect(types).toEqual(['Call', 'ConversationItem', 'ConversationItem']);
  });
});
