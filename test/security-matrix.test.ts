/**
 * Every endpoint x every credential kind, with the expected status, and a
 * sweep that no answer reveals another organisation's records or a secret.
 */
import { randomBytes } from 'node:crypto';
import { SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUserInOrganisation } from '../src/auth/accounts.js';
import { createApiKey, revokeApiKey } from '../src/auth/api-keys.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, resourceDocument } from './helpers/http.js';
import { insertAgent, insertCall, insertParticipant, insertTranscript } from './helpers/telephony.js';

type Credential =
  | 'none'
  | 'malformed'
  | 'alg_none'
  | 'wrong_secret'
  | 'expired'
  | 'revoked'
  | 'publishable'
  | 'operator'
  | 'admin'
  | 'other_admin'
  | 'visitor'
  | 'visitor_of_revoked_key';
const CREDENTIALS: Credential[] = [
  'none',
  'malformed',
  'alg_none',
  'wrong_secret',
  'expired',
  'revoked',
  'publishable',
  'operator',
  'admin',
  'other_admin',
  'visitor',
  'visitor_of_revoked_key',
];

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
const tokens = {} as Record<Credential, string | undefined>;
const ids = {} as Record<string, string>;
const secrets: string[] = [];

function base64url(value: unknown) {
  return Buffer.from(JSON.stringify(value)).toString('base64url');
}

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Matrix');
  other = await seedTenant(t, 'Intruder');
  const admin = client(t.app, tenant.admin.token);
  ids.conversation = (await admin.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
  ids.item = (
    await admin.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { content: 'x', role: 'user', conversation_id: ids.conversation }),
    )
  ).body.data.id;
  ids.agent = await insertAgent(t.db, tenant.organisationId);
  ids.gateway = (
    await admin.post('/api/gateways', resourceDocument('Gateway', { realm: 'm.example.com', username: 'm', password: 'gateway-secret-1' }))
  ).body.data.id;
  const sipUser = await admin.post(
    '/api/sip_users',
    resourceDocument('SipUser', { sip_username: 'matrix.op', user_id: tenant.operator.id }),
  );
  ids.sipUser = sipUser.body.data.id;
  ids.phoneNumber = await fresh.phoneNumber();
  ids.knowledge = await fresh.knowledge();
  // The SIP password is returned by design (the spec's SipUser); the gateway password never is.
  secrets.push('gateway-secret-1');
  ids.status = (
    await admin.post('/api/operator_statuses', resourceDocument('OperatorStatus', { sip_user_id: ids.sipUser, status: 'available' }))
  ).body.data.id;
  ids.event = (await admin.get('/api/operator_status_events')).body.data[0].id;
  ids.call = await insertCall(t.db, tenant.organisationId);
  ids.participant = await insertParticipant(t.db, tenant.organisationId, ids.call);
  ids.transcript = await insertTranscript(t.db, tenant.organisationId, ids.call, 0);
  ids.operatorKey = (await client(t.app, tenant.operator.token).get('/api/api_keys')).body.data[0].id;
  // A webhook endpoint (its secret is shown once, never again) and a delivery queued for it by the next change.
  const hook = await admin.post('/api/webhook_endpoints', resourceDocument('WebhookEndpoint', { url: 'https://1.1.1.1/matrix' }));
  ids.webhook = hook.body.data.id;
  secrets.push(hook.body.data.attributes.secret);
  ids.doomedWebhook = (
    await admin.post('/api/webhook_endpoints', resourceDocument('WebhookEndpoint', { url: 'https://1.1.1.1/doomed' }))
  ).body.data.id;
  await admin.post('/api/conversations', resourceDocument('Conversation', {}));
  ids.delivery = (
    await t.db.selectFrom('webhook_deliveries').select('id').where('webhook_endpoint_id', '=', ids.webhook).executeTakeFirstOrThrow()
  ).id;

  const expiring = await createApiKey(t.services.records!, {
    organisationId: tenant.organisationId,
    userId: tenant.admin.id,
    keyType: 'secret',
    name: 'expiring',
  });
  await t.db
    .updateTable('api_keys')
    .set({ expires_at: new Date(Date.now() - 1000) })
    .where('id', '=', expiring.id)
    .execute();
  const revoked = await createApiKey(t.services.records!, {
    organisationId: tenant.organisationId,
    userId: tenant.admin.id,
    keyType: 'secret',
    name: 'revoked',
  });
  await revokeApiKey(t.db, t.services.records!, revoked.id);
  // A website visitor: its credential is bound to a conversation of its own, none of the records above.
  const visitor = await client(t.app, tenant.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
  ids.visitorConversation = visitor.body.data.id;
  const doomed = await createApiKey(t.services.records!, {
    organisationId: tenant.organisationId,
    userId: tenant.owner.id,
    keyType: 'publishable',
    name: 'doomed',
  });
  const orphan = await client(t.app, doomed.token).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
  await revokeApiKey(t.db, t.services.records!, doomed.id);
  const [, payload] = tenant.secretKey.split('.');
  Object.assign(tokens, {
    none: undefined,
    malformed: 'not.a.jwt',
    alg_none: `${base64url({ alg: 'none', typ: 'JWT' })}.${payload}.`,
    wrong_secret: await new SignJWT(JSON.parse(Buffer.from(payload, 'base64url').toString()))
      .setProtectedHeader({ alg: 'HS256' })
      .sign(randomBytes(32)),
    expired: expiring.token,
    revoked: revoked.token,
    publishable: tenant.publishableKey,
    operator: tenant.operator.token,
    admin: tenant.admin.token,
    other_admin: other.admin.token,
    visitor: visitor.body.meta.token,
    visitor_of_revoked_key: orphan.body.meta.token,
  });
  secrets.push(tenant.secretKey, tenant.publishableKey, tenant.admin.token, tenant.operator.token, tenant.owner.password);
});
afterAll(async () => t?.close());

interface Endpoint {
  name: string;
  method: 'GET' | 'POST' | 'PATCH' | 'DELETE';
  /** A delete's URL names a fresh record for each cell, so that every credential meets one. */
  url: () => string | Promise<string>;
  body?: () => unknown;
  /** Expected status for operator, admin and another organisation's admin (and a visitor, when not 403). */
  visitor?: number;
  operator: number;
  admin: number;
  other: number;
}

const doc = resourceDocument;
const unique = () => randomBytes(4).toString('hex');
/** A possible UK London number (E.164) no other cell uses. */
const randomNumber = () => `+4420${String(70_000_000 + randomBytes(3).readUIntBE(0, 3)).padStart(8, '0')}`;
/** Fresh records of our organisation, for the deletes (each cell removes, or fails to remove, its own). */
const fresh = {
  agent: async () => (await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'AiAgent', { name: 'doomed' })).id,
  gateway: async () =>
    (
      await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'Gateway', {
        realm: `d${unique()}.example.com`,
        username: 'd',
      })
    ).id,
  sipUser: async () =>
    (await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'SipUser', { sip_username: `d${unique()}` })).id,
  phoneNumber: async () =>
    (await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'PhoneNumber', { number: randomNumber() })).id,
  knowledge: async () =>
    (
      await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'KnowledgeDocument', {
        ai_agent_id: ids.agent,
        title: 'doomed',
        content: 'Refunds take five days.',
      })
    ).id,
  operatorKey: async () =>
    (
      await createApiKey(t.services.records!, {
        organisationId: tenant.organisationId,
        userId: tenant.operator.id,
        keyType: 'secret',
        name: 'doomed',
      })
    ).id,
  member: async () =>
    (
      await createUserInOrganisation(t.services.records!, {
        organisationId: tenant.organisationId,
        email: `m${unique()}@matrix.example`,
        password: 'member-pass-1',
        fullName: 'M',
        role: 'operator',
      })
    ).id,
};
const ENDPOINTS: Endpoint[] = [
  { name: 'list api keys', method: 'GET', url: () => '/api/api_keys', operator: 200, admin: 200, other: 200 },
  { name: 'get api key', method: 'GET', url: () => `/api/api_keys/${ids.operatorKey}`, operator: 200, admin: 200, other: 404 },
  {
    name: 'login',
    method: 'POST',
    url: () => '/api/users/login',
    body: () => doc('User', { email: tenant.operator.email, password: tenant.operator.password }),
    operator: 200,
    admin: 200,
    other: 401,
  },
  {
    name: 'create conversation',
    method: 'POST',
    url: () => '/api/conversations',
    body: () => doc('Conversation', {}),
    operator: 201,
    admin: 201,
    other: 201,
  },
  { name: 'list conversations', method: 'GET', url: () => '/api/conversations', operator: 200, admin: 200, other: 200, visitor: 200 },
  {
    name: 'update conversation',
    method: 'PATCH',
    url: () => `/api/conversations/${ids.conversation}`,
    body: () => doc('Conversation', { mode: 'text' }, ids.conversation),
    operator: 200,
    admin: 200,
    other: 404,
  },
  {
    name: 'create item',
    method: 'POST',
    url: () => '/api/conversation_items',
    body: () => doc('ConversationItem', { content: 'y', role: 'user', conversation_id: ids.conversation }),
    operator: 201,
    admin: 201,
    other: 422,
    visitor: 422,
  },
  {
    name: 'get item',
    method: 'GET',
    url: () => `/api/conversation_items/${ids.item}`,
    operator: 200,
    admin: 200,
    other: 404,
    visitor: 404,
  },
  {
    name: 'update agent',
    method: 'PATCH',
    url: () => `/api/ai_agents/${ids.agent}`,
    body: () => doc('AiAgent', { published: true }, ids.agent),
    operator: 403,
    admin: 200,
    other: 404,
  },
  {
    name: 'create gateway',
    method: 'POST',
    url: () => '/api/gateways',
    body: () => doc('Gateway', { realm: `g${randomBytes(4).toString('hex')}.example.com`, username: 'g' }),
    operator: 403,
    admin: 201,
    other: 201,
  },
  {
    name: 'update gateway',
    method: 'PATCH',
    url: () => `/api/gateways/${ids.gateway}`,
    body: () => doc('Gateway', { register: false }, ids.gateway),
    operator: 403,
    admin: 200,
    other: 404,
  },
  {
    name: 'create sip user',
    method: 'POST',
    url: () => '/api/sip_users',
    body: () => doc('SipUser', { sip_username: `s${randomBytes(4).toString('hex')}` }),
    operator: 403,
    admin: 201,
    other: 201,
  },
  { name: 'list sip users', method: 'GET', url: () => '/api/sip_users', operator: 200, admin: 200, other: 200 },
  {
    name: 'update sip user',
    method: 'PATCH',
    url: () => `/api/sip_users/${ids.sipUser}`,
    body: () => doc('SipUser', { sip_password: 'another-password-1' }, ids.sipUser),
    operator: 403,
    admin: 200,
    other: 404,
  },
  {
    name: 'set operator status',
    method: 'POST',
    url: () => '/api/operator_statuses',
    body: () => doc('OperatorStatus', { sip_user_id: ids.sipUser, status: 'busy' }),
    operator: 200,
    admin: 200,
    other: 422,
  },
  { name: 'get operator status', method: 'GET', url: () => `/api/operator_statuses/${ids.status}`, operator: 200, admin: 200, other: 404 },
  { name: 'list status events', method: 'GET', url: () => '/api/operator_status_events', operator: 200, admin: 200, other: 200 },
  { name: 'get status event', method: 'GET', url: () => `/api/operator_status_events/${ids.event}`, operator: 200, admin: 200, other: 404 },
  { name: 'get call', method: 'GET', url: () => `/api/calls/${ids.call}`, operator: 200, admin: 200, other: 404 },
  { name: 'list participants', method: 'GET', url: () => '/api/call_participants', operator: 200, admin: 200, other: 200 },
  {
    name: 'update participant',
    method: 'PATCH',
    url: () => `/api/call_participants/${ids.participant}`,
    body: () => doc('CallParticipant', { left_at: '2030-01-01T00:00:00Z' }, ids.participant),
    operator: 403,
    admin: 200,
    other: 404,
  },
  { name: 'list transcripts', method: 'GET', url: () => '/api/call_transcripts', operator: 200, admin: 200, other: 200 },
  // Beyond the spec's 22: the chat widget's visitor credential is opened with a publishable key only.
  { name: 'list webhook endpoints', method: 'GET', url: () => '/api/webhook_endpoints', operator: 403, admin: 200, other: 200 },
  {
    name: 'get webhook endpoint',
    method: 'GET',
    url: () => `/api/webhook_endpoints/${ids.webhook}`,
    operator: 403,
    admin: 200,
    other: 404,
  },
  {
    name: 'create webhook endpoint',
    method: 'POST',
    url: () => '/api/webhook_endpoints',
    body: () => doc('WebhookEndpoint', { url: 'https://1.1.1.1/new' }),
    operator: 403,
    admin: 201,
    other: 201,
  },
  {
    name: 'update webhook endpoint',
    method: 'PATCH',
    url: () => `/api/webhook_endpoints/${ids.webhook}`,
    body: () => doc('WebhookEndpoint', { description: 'matrix' }, ids.webhook),
    operator: 403,
    admin: 200,
    other: 404,
  },
  {
    name: 'delete webhook endpoint',
    method: 'DELETE',
    url: () => `/api/webhook_endpoints/${ids.doomedWebhook}`,
    operator: 403,
    admin: 200,
    other: 404,
  },
  { name: 'list webhook deliveries', method: 'GET', url: () => '/api/webhook_deliveries', operator: 403, admin: 200, other: 200 },
  {
    name: 'get webhook delivery',
    method: 'GET',
    url: () => `/api/webhook_deliveries/${ids.delivery}`,
    operator: 403,
    admin: 200,
    other: 404,
  },
  {
    name: 'open visitor session',
    method: 'POST',
    url: () => '/api/visitor_sessions',
    body: () => doc('Conversation', {}),
    operator: 403,
    admin: 403,
    other: 403,
  },
  // Managing the organisation over HTTP.
  { name: 'list agents', method: 'GET', url: () => '/api/ai_agents', operator: 200, admin: 200, other: 200 },
  { name: 'get agent', method: 'GET', url: () => `/api/ai_agents/${ids.agent}`, operator: 200, admin: 200, other: 404 },
  {
    name: 'create agent',
    method: 'POST',
    url: () => '/api/ai_agents',
    body: () => doc('AiAgent', { name: 'New agent' }),
    operator: 403,
    admin: 201,
    other: 201,
  },
  {
    name: 'delete agent',
    method: 'DELETE',
    url: async () => `/api/ai_agents/${await fresh.agent()}`,
    operator: 403,
    admin: 200,
    other: 404,
  },
  { name: 'list gateways', method: 'GET', url: () => '/api/gateways', operator: 403, admin: 200, other: 200 },
  { name: 'list knowledge documents', method: 'GET', url: () => '/api/knowledge_documents', operator: 200, admin: 200, other: 200 },
  {
    name: 'get knowledge document',
    method: 'GET',
    url: () => `/api/knowledge_documents/${ids.knowledge}`,
    operator: 200,
    admin: 200,
    other: 404,
  },
  {
    name: 'create knowledge document',
    method: 'POST',
    url: () => '/api/knowledge_documents',
    // Another organisation's admin names our agent: a 422 on ai_agent_id (references stay in the organisation).
    body: () => doc('KnowledgeDocument', { ai_agent_id: ids.agent, title: 'FAQ', content: 'Refunds take five days.' }),
    operator: 403,
    admin: 201,
    other: 422,
  },
  {
    name: 'delete knowledge document',
    method: 'DELETE',
    url: async () => `/api/knowledge_documents/${await fresh.knowledge()}`,
    operator: 403,
    admin: 200,
    other: 404,
  },
  { name: 'list phone numbers', method: 'GET', url: () => '/api/phone_numbers', operator: 200, admin: 200, other: 200 },
  { name: 'get phone number', method: 'GET', url: () => `/api/phone_numbers/${ids.phoneNumber}`, operator: 200, admin: 200, other: 404 },
  {
    name: 'create phone number',
    method: 'POST',
    url: () => '/api/phone_numbers',
    body: () => doc('PhoneNumber', { number: randomNumber() }),
    operator: 403,
    admin: 201,
    other: 201,
  },
  {
    name: 'update phone number',
    method: 'PATCH',
    url: () => `/api/phone_numbers/${ids.phoneNumber}`,
    body: () => doc('PhoneNumber', { gateway_id: null }, ids.phoneNumber),
    operator: 403,
    admin: 200,
    other: 404,
  },
  {
    name: 'delete phone number',
    method: 'DELETE',
    url: async () => `/api/phone_numbers/${await fresh.phoneNumber()}`,
    operator: 403,
    admin: 200,
    other: 404,
  },
  {
    name: 'update organisation',
    method: 'PATCH',
    url: () => `/api/organisations/${tenant.organisationId}`,
    body: () => doc('Organisation', { default_country: 'GB' }, tenant.organisationId),
    operator: 403,
    admin: 200,
    other: 404,
  },
  { name: 'get gateway', method: 'GET', url: () => `/api/gateways/${ids.gateway}`, operator: 403, admin: 200, other: 404 },
  {
    name: 'delete gateway',
    method: 'DELETE',
    url: async () => `/api/gateways/${await fresh.gateway()}`,
    operator: 403,
    admin: 200,
    other: 404,
  },
  { name: 'get sip user', method: 'GET', url: () => `/api/sip_users/${ids.sipUser}`, operator: 200, admin: 200, other: 404 },
  // Another SIP user than the operator's own is invisible to them: 404, not 403.
  {
    name: 'delete sip user',
    method: 'DELETE',
    url: async () => `/api/sip_users/${await fresh.sipUser()}`,
    operator: 404,
    admin: 200,
    other: 404,
  },
  {
    name: 'list operator statuses',
    method: 'GET',
    url: () => '/api/operator_statuses?filter[status]=available',
    operator: 200,
    admin: 200,
    other: 200,
  },
  { name: 'list calls', method: 'GET', url: () => '/api/calls', operator: 200, admin: 200, other: 200 },
  {
    name: 'get conversation',
    method: 'GET',
    url: () => `/api/conversations/${ids.conversation}`,
    operator: 200,
    admin: 200,
    other: 404,
    visitor: 404,
  },
  { name: 'get participant', method: 'GET', url: () => `/api/call_participants/${ids.participant}`, operator: 200, admin: 200, other: 404 },
  { name: 'get transcript', method: 'GET', url: () => `/api/call_transcripts/${ids.transcript}`, operator: 200, admin: 200, other: 404 },
  {
    name: 'create api key',
    method: 'POST',
    url: () => '/api/api_keys',
    body: () => doc('ApiKey', { name: 'new', key_type: 'secret' }),
    operator: 403,
    admin: 201,
    other: 201,
  },
  {
    name: 'update api key',
    method: 'PATCH',
    url: () => `/api/api_keys/${ids.operatorKey}`,
    body: () => doc('ApiKey', { name: 'renamed' }, ids.operatorKey),
    operator: 200,
    admin: 200,
    other: 404,
  },
  {
    name: 'delete api key',
    method: 'DELETE',
    url: async () => `/api/api_keys/${await fresh.operatorKey()}`,
    operator: 200,
    admin: 200,
    other: 404,
  },
  { name: 'list users', method: 'GET', url: () => '/api/users', operator: 200, admin: 200, other: 200 },
  { name: 'get user', method: 'GET', url: () => `/api/users/${tenant.operator.id}`, operator: 200, admin: 200, other: 404 },
  { name: 'get own user', method: 'GET', url: () => '/api/users/me', operator: 200, admin: 200, other: 200 },
  {
    name: 'invite member',
    method: 'POST',
    url: () => '/api/invitations',
    body: () => doc('Invitation', { email: `n${unique()}@matrix.example`, role: 'operator' }),
    operator: 403,
    admin: 201,
    other: 201,
  },
  // A role is changed by owners and admins only, even to the value it has.
  {
    name: 'change role',
    method: 'PATCH',
    url: () => `/api/users/${tenant.operator.id}`,
    body: () => doc('User', { role: 'operator' }, tenant.operator.id),
    operator: 403,
    admin: 200,
    other: 404,
  },
  { name: 'remove member', method: 'DELETE', url: async () => `/api/users/${await fresh.member()}`, operator: 403, admin: 200, other: 404 },
  { name: 'list organisations', method: 'GET', url: () => '/api/organisations', operator: 200, admin: 200, other: 200 },
  {
    name: 'get organisation',
    method: 'GET',
    url: () => `/api/organisations/${tenant.organisationId}`,
    operator: 200,
    admin: 200,
    other: 404,
  },
];

function expected(endpoint: Endpoint, credential: Credential): number {
  switch (credential) {
    case 'publishable':
      return endpoint.name === 'login' ? 200 : endpoint.name === 'open visitor session' ? 201 : 403;
    case 'visitor':
      return endpoint.visitor ?? 403;
    case 'operator':
      return endpoint.operator;
    case 'admin':
      return endpoint.admin;
    case 'other_admin':
      return endpoint.other;
    default:
      return 401;
  }
}

describe('security matrix', () => {
  it(`${ENDPOINTS.length} endpoints x ${CREDENTIALS.length} credentials answer as expected`, async () => {
    expect(ENDPOINTS).toHaveLength(65);
    const failures: string[] = [];
    const ourIds = new Set([tenant.organisationId, ...Object.values(ids)]);
    // The visitor may see its own conversation, and nothing else of the organisation.
    const hiddenFromVisitor = new Set([...ourIds].filter((id) => id !== ids.visitorConversation));
    for (const endpoint of ENDPOINTS) {
      for (const credential of CREDENTIALS) {
        const api = client(t.app, tokens[credential]);
        const response = await api.request(endpoint.method, await endpoint.url(), endpoint.body?.());
        const want = expected(endpoint, credential);
        if (response.status !== want) failures.push(`${endpoint.name} as ${credential}: ${response.status}, expected ${want}`);
        if (want === 401 && response.headers['www-authenticate'] !== 'Bearer')
          failures.push(`${endpoint.name} as ${credential}: no WWW-Authenticate`);
        const text = JSON.stringify(response.body ?? '');
        for (const secret of secrets) if (text.includes(secret)) failures.push(`${endpoint.name} as ${credential} revealed a secret`);
        if (credential === 'other_admin' || credential === 'visitor') {
          for (const record of [...[response.body?.data ?? []].flat(), ...(response.body?.included ?? [])]) {
            if ((credential === 'visitor' ? hiddenFromVisitor : ourIds).has(record.id))
              failures.push(`${endpoint.name} as ${credential} revealed ${record.type} ${record.id}`);
          }
        }
      }
    }
    console.log(`security matrix: ${ENDPOINTS.length * CREDENTIALS.length} cells, ${failures.length} failures`);
    expect(failures).toEqual([]);
  });
});
