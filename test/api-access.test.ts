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

const LISTS = ['/api/api_keys', '/api/conversations', '/api/sip_users', '/api/operator_status_events', '/api/call_participants', '/api/call_transcripts'];

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Mine');
  other = await seedTenant(t, 'Theirs');
  admin = client(t.app, tenant.admin.token);
  operator = client(t.app, tenant.operator.token);
  stranger = client(t.app, other.admin.token);
  // Give the first organisation one record of every kind.
  const conversation = (await admin.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
  await admin.post('/api/conversation_items', resourceDocument('ConversationItem', { content: 'x', role: 'user', conversation_id: conversation }));
  const sipUser = (await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'mine.1', user_id: tenant.operator.id }))).body.data.id;
  await operator.post('/api/operator_statuses', resourceDocument('OperatorStatus', { sip_user_id: sipUser, status: 'available' }));
  const call = await insertCall(t.db, tenant.organisationId, { conversation_id: conversation });
  await insertParticipant(t.db, tenant.organisationId, call);
  await insertTranscript(t.db, tenant.organisationId, call, 0);
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
    expect(text).not.toMatch(/token_hash|password/);
    for (const key of response.body.data) {
      expect(Object.keys(key.attributes).sort()).toEqual(['expires_at', 'key_type', 'name', 'organisation_id', 'revoked_at', 'token', 'user_id']);
      expect(key.attributes.token).toBeNull();
    }
  });

  it('are read-only', async () => {
    const response = await admin.post('/api/api_keys', resourceDocument('ApiKey', { name: 'x', key_type: 'secret' }));
    expect(response.status).toBe(405);
  });
});

describe('users through includes', () => {
  it('shows the signed-in user with organisations and sip user', async () => {
    const response = await operator.get('/api/api_keys?include=user.organisations,user.sip_user');
    const user = response.body.included.find((r: { type: string }) => r.type === 'User');
    expect(user.attributes).toEqual({ email: tenant.operator.email, full_name: tenant.operator.fullName, sip_username: 'mine.1' });
    expect(user.relationships.organisation.data.id).toBe(tenant.organisationId);
    expect(user.relationships.organisations.data.map((o: { id: string }) => o.id)).toEqual([tenant.organisationId]);
    expect(user.relationships.sip_user.data).not.toBeNull();
    expect(user).not.toHaveProperty('links');
  });
});
