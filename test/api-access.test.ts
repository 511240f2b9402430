import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, resourceDocument, type Client } from './helpers/http.js';
import { insertCall, insertParticipant, insertTranscript } from './helpers/telephony.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let admin: Client;
let operator: Client;
let stranger: Client;

const LISTS = [
  '/api/api_keys',
  '/api/conversations',
  '/api/sip_users',
  '/api/operator_status_events',
  '/api/call_participants',
  '/api/call_transcripts',
  '/api/ai_agents',
  '/api/gateways',
  '/api/operator_statuses',
  '/api/calls',
  '/api/users',
  '/api/organisations',
];

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Mine');
  other = await seedTenant(t, 'Theirs');
  admin = client(t.app, tenant.admin.token);
  operator = client(t.app, tenant.operator.token);
  stranger = client(t.app, other.admin.token);
  // Give the first organisation one record of every kind.
  const conversation = (await admin.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
  await admin.post(
    '/api/conversation_items',
    resourceDocument('ConversationItem', { content: 'x', role: 'user', conversation_id: conversation }),
  );
  const sipUser = (await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'mine.1', user_id: tenant.operator.id })))
    .body.data.id;
  await operator.post('/api/operator_statuses', resourceDocument('OperatorStatus', { sip_user_id: sipUser, status: 'available' }));
  const call = await insertCall(t.db, tenant.organisationId, { conversation_id: conversation });
  await insertParticipant(t.db, tenant.organisationId, call);
  await insertTranscript(t.db, tenant.organisationId, call, 0);
  await admin.post('/api/ai_agents', resourceDocument('AiAgent', { name: 'Mine' }));
  await admin.post('/api/gateways', resourceDocument('Gateway', { realm: 'mine.example.com', username: 'mine' }));
});
afterAll(async () => t?.close());

describe('tenancy', () => {
  it('shows another organisation none of our records, whatever the query', async () => {
    const mine = new Set<string>();
    for (const list of LISTS) {
      const response = await admin.get(`${list}?page[limit]=100`);
      expect(response.body.data.length, list).toBeGreaterThan(0);
      for (const record of response.body.data) mine.add(record.id);
    }
    for (const list of LISTS) {
      const includes: Record<string, string> = {
        '/api/api_keys': 'organisation,user',
        '/api/conversations': 'ai_agent,call,organisation,conversation_items',
        '/api/sip_users': 'organisation,user',
        '/api/operator_status_events': 'changed_by_user,organisation,sip_user',
        '/api/call_participants': 'call.conversation,organisation',
        '/api/call_transcripts': 'call.conversation,organisation',
        '/api/ai_agents': 'organisation',
        '/api/gateways': 'organisation',
        '/api/operator_statuses': 'changed_by_user,organisation,sip_user.user',
        '/api/calls': 'conversation.conversation_items,organisation',
        '/api/users': 'organisations,sip_user,organisation',
        '/api/organisations': '',
      };
      const response = await stranger.get(`${list}?page[limit]=100&include=${includes[list]}`);
      for (const record of [...response.body.data, ...response.body.included]) {
        expect(mine.has(record.id), `${list} revealed ${record.type} ${record.id}`).toBe(false);
        if (record.type === 'Organisation') expect(record.id).toBe(other.organisationId);
      }
      for (const id of mine) {
        const filtered = await stranger.get(`${list}?filter[id]=${id}`);
        expect(filtered.body.data).toEqual([]);
      }
    }
  });
});

describe('API keys', () => {
  it('admins see every key of the organisation, operators their own', async () => {
    const all = await admin.get('/api/api_keys?sort=name');
    const owners = new Set(all.body.data.map((k: { attributes: { user_id: string } }) => k.attributes.user_id));
    expect(owners.size).toBeGreaterThan(1);
    const own = await operator.get('/api/api_keys');
    expect(own.body.data.length).toBeGreaterThan(0);
    for (const key of own.body.data) expect(key.attributes.user_id).toBe(tenant.operator.id);
    const someoneElses = all.body.data.find((k: { attributes: { user_id: string } }) => k.attributes.user_id !== tenant.operator.id);
    expect((await operator.get(`/api/api_keys/${someoneElses.id}`)).status).toBe(404);
  });

  it('never reveal a token or its hash', async () => {
    const response = await admin.get('/api/api_keys?include=user');
    const text = JSON.stringify(response.body);
    expect(text).not.toContain(tenant.secretKey);
    expect(text).not.toContain(tenant.publishableKey);
    expect(text).not.toMatch(/token_hash|password_hash|argon|scrypt/);
    for (const key of response.body.data) {
      expect(Object.keys(key.attributes).sort()).toEqual([
        'created_at',
        'expires_at',
        'key_type',
        'name',
        'organisation_id',
        'revoked_at',
        'role_ceiling',
        'token',
        'updated_at',
        'user_id',
      ]);
      expect(key.attributes.token).toBeNull();
    }
    // The users included carry no password: a generated one is shown only in the response that creates the user.
    for (const user of response.body.included) {
      expect(user.attributes).not.toHaveProperty('password');
      expect(user.attributes.initial_password).toBeNull();
    }
  });

  it('are issued by owners and admins only', async () => {
    expect((await operator.post('/api/api_keys', resourceDocument('ApiKey', { name: 'x', key_type: 'secret' }))).status).toBe(403);
    const created = await admin.post('/api/api_keys', resourceDocument('ApiKey', { name: 'x', key_type: 'secret' }));
    expect(created.status).toBe(201);
    expect(created.body.data.attributes.user_id).toBe(tenant.admin.id);
  });
});

describe('writes across organisations', () => {
  it("never reach another organisation's records: 404 for ids, 422 for references", async () => {
    const agent = (await admin.post('/api/ai_agents', resourceDocument('AiAgent', { name: 'Guarded' }))).body.data.id;
    const gateway = (await admin.post('/api/gateways', resourceDocument('Gateway', { realm: 'guarded.example.com', username: 'g' }))).body
      .data.id;
    const sipUser = (await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'guarded.1' }))).body.data.id;
    const key = (await admin.get('/api/api_keys')).body.data[0].id;
    for (const url of [
      `/api/ai_agents/${agent}`,
      `/api/gateways/${gateway}`,
      `/api/sip_users/${sipUser}`,
      `/api/api_keys/${key}`,
      `/api/users/${tenant.operator.id}`,
    ]) {
      expect((await stranger.request('DELETE', url)).status, url).toBe(404);
      expect((await stranger.get(url)).status, url).toBe(404);
    }
    expect(
      (await stranger.patch(`/api/users/${tenant.operator.id}`, resourceDocument('User', { role: 'admin' }, tenant.operator.id))).status,
    ).toBe(404);
    expect(
      (await stranger.patch(`/api/api_keys/${key}`, resourceDocument('ApiKey', { revoked_at: new Date().toISOString() }, key))).status,
    ).toBe(404);
    const foreignKey = await stranger.post(
      '/api/api_keys',
      resourceDocument('ApiKey', { name: 'x', key_type: 'secret', user_id: tenant.operator.id }),
    );
    expect(foreignKey.status).toBe(422);
    expect(foreignKey.body.errors[0].source.pointer).toBe('/data/attributes/user_id');
    // Every record above is still there.
    for (const url of [
      `/api/ai_agents/${agent}`,
      `/api/gateways/${gateway}`,
      `/api/sip_users/${sipUser}`,
      `/api/api_keys/${key}`,
      `/api/users/${tenant.operator.id}`,
    ]) {
      expect((await admin.get(url)).status, url).toBe(200);
    }
    expect((await admin.get(`/api/users/${tenant.operator.id}`)).body.data.attributes.role).toBe('operator');
  });
});

describe('users through includes', () => {
  it('shows the signed-in user with organisations and sip user', async () => {
    const response = await operator.get('/api/api_keys?include=user.organisations,user.sip_user');
    const user = response.body.included.find((r: { type: string }) => r.type === 'User');
    expect(user.attributes).toEqual({
      email: tenant.operator.email,
      full_name: tenant.operator.fullName,
      sip_username: 'mine.1',
      role: 'operator',
      initial_password: null,
      created_at: expect.stringMatching(/Z$/),
      updated_at: expect.stringMatching(/Z$/),
    });
    expect(user.relationships.organisation.data.id).toBe(tenant.organisationId);
    expect(user.relationships.organisations.data.map((o: { id: string }) => o.id)).toEqual([tenant.organisationId]);
    expect(user.relationships.sip_user.data).not.toBeNull();
    // A user's self link is its record under /api/users, which answers GET.
    expect(new URL(user.links.self).pathname).toBe(`/api/users/${tenant.operator.id}`);
  });
});
