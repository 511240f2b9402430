import { Validator } from '@seriousme/openapi-schema-validator';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildOpenApi } from '../src/jsonapi/openapi.js';
import { resources } from '../src/resources/index.js';
import { startTestApp, type TestApp } from './support/app.js';

/** The 22 operations of the spec's endpoint table. */
const SPEC = [
  'get /api/api_keys',
  'get /api/api_keys/{id}',
  'post /api/users/login',
  'post /api/conversations',
  'get /api/conversations',
  'patch /api/conversations/{id}',
  'post /api/conversation_items',
  'get /api/conversation_items/{id}',
  'patch /api/ai_agents/{id}',
  'post /api/gateways',
  'patch /api/gateways/{id}',
  'post /api/sip_users',
  'get /api/sip_users',
  'patch /api/sip_users/{id}',
  'post /api/operator_statuses',
  'get /api/operator_statuses/{id}',
  'get /api/operator_status_events',
  'get /api/operator_status_events/{id}',
  'get /api/calls/{id}',
  'get /api/call_participants',
  'patch /api/call_participants/{id}',
  'get /api/call_transcripts',
];
/** Part two's additions (CONTRACT sections 9-12): each new endpoint appears in the document too. */
const BEYOND_SPEC = [
  'post /api/visitor_sessions',
  // Managing the organisation over HTTP: every type readable by its links.self, and removable where users expect.
  'get /api/ai_agents',
  'get /api/ai_agents/{id}',
  'post /api/ai_agents',
  'delete /api/ai_agents/{id}',
  'get /api/gateways',
  'get /api/gateways/{id}',
  'delete /api/gateways/{id}',
  'get /api/sip_users/{id}',
  'delete /api/sip_users/{id}',
  'get /api/operator_statuses',
  'get /api/calls',
  'get /api/conversations/{id}',
  'get /api/call_participants/{id}',
  'get /api/call_transcripts/{id}',
  'post /api/api_keys',
  'patch /api/api_keys/{id}',
  'delete /api/api_keys/{id}',
  'get /api/users',
  'get /api/users/{id}',
  'get /api/users/me',
  'post /api/users/accept_invitation',
  'get /api/invitations',
  'get /api/invitations/{id}',
  'post /api/invitations',
  'delete /api/invitations/{id}',
  'patch /api/users/{id}',
  'delete /api/users/{id}',
  'get /api/organisations',
  'get /api/organisations/{id}',
  // Issue 21: an organisation's default_country, and its phone numbers.
  'patch /api/organisations/{id}',
  'get /api/phone_numbers',
  'get /api/phone_numbers/{id}',
  'post /api/phone_numbers',
  'patch /api/phone_numbers/{id}',
  'delete /api/phone_numbers/{id}',
  'get /api/knowledge_documents',
  'get /api/knowledge_documents/{id}',
  'post /api/knowledge_documents',
  'delete /api/knowledge_documents/{id}',
  'get /api/events',
  'post /api/conversations/{id}/typing',
  'get /api/webhook_endpoints',
  'get /api/webhook_endpoints/{id}',
  'post /api/webhook_endpoints',
  'patch /api/webhook_endpoints/{id}',
  'delete /api/webhook_endpoints/{id}',
  'get /api/webhook_deliveries',
  'get /api/webhook_deliveries/{id}',
  // Issue 27: the organisation's signing secret for agent tool calls; agent test suites over the API.
  'post /api/organisations/tool_secret',
  'post /api/ai_agents/test',
  // Issue 24: the browser softphone's short-lived SIP credential.
  'post /api/sip_users/credential',
  // Issue 25: conversation control as named actions on one conversation.
  'post /api/conversations/{id}/take_over',
  'post /api/conversations/{id}/hand_back',
  'post /api/conversations/{id}/hand_off',
  'post /api/conversations/{id}/assign',
];

/** Each record's related links (JSON:API section 6.3.1): one path per relationship of a type with a member URL. */
const RELATED = resources
  .filter((r) => r.path && r.operations.get)
  .flatMap((r) => Object.keys(r.relationships).map((name) => `get /api/${r.path}/{id}/${name}`));

const doc = buildOpenApi(resources) as any;

describe('the OpenAPI document', () => {
  it('is valid OpenAPI 3.1', async () => {
    const result = await new Validator().validate(doc);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    expect(doc.openapi).toBe('3.1.0');
  });

  it('lists exactly the 22 operations of the spec and the later additions', () => {
    const listed = Object.entries(doc.paths).flatMap(([path, methods]) => Object.keys(methods as object).map((m) => `${m} ${path}`));
    expect(listed.sort()).toEqual([...SPEC, ...BEYOND_SPEC, ...RELATED].sort());
    expect(RELATED).toEqual(
      expect.arrayContaining([
        'get /api/conversations/{id}/conversation_items',
        'get /api/conversation_items/{id}/conversation',
        'get /api/users/{id}/organisations',
      ]),
    );
  });

  it('describes success and error responses and bearer security for each', () => {
    for (const [path, methods] of Object.entries(doc.paths)) {
      for (const [method, operation] of Object.entries(
        methods as Record<string, { responses: Record<string, unknown>; operationId: string }>,
      )) {
        const codes = Object.keys(operation.responses);
        expect(
          codes.some((c) => c.startsWith('2')),
          `${method} ${path}`,
        ).toBe(true);
        expect(codes).toContain('401');
        expect(operation.operationId).toBeTruthy();
      }
    }
    for (const scheme of ['userToken', 'secretKey', 'publishableKey']) {
      expect(doc.components.securitySchemes[scheme]).toMatchObject({ type: 'http', scheme: 'bearer' });
      expect(doc.components.securitySchemes[scheme].description).toBeTruthy();
    }
    expect(doc.paths['/api/users/login'].post.security).toContainEqual({ publishableKey: [] });
    expect(doc.paths['/api/conversations'].get.security).not.toContainEqual({ publishableKey: [] });
  });

  it('derives request attributes from the definitions', () => {
    const body = doc.paths['/api/conversations'].post.requestBody.content['application/vnd.api+json'].schema;
    expect(Object.keys(body.properties.data.properties.attributes.properties).sort()).toEqual([
      'ai_agent_id',
      'channel',
      'metadata',
      'mode',
    ]);
    const update = doc.paths['/api/sip_users/{id}'].patch.requestBody.content['application/vnd.api+json'].schema;
    expect(Object.keys(update.properties.data.properties.attributes.properties)).toEqual(['sip_password']);
    const gateway = doc.components.schemas.GatewayAttributes.properties;
    expect(gateway).not.toHaveProperty('password');
    expect(doc.components.schemas.ConversationAttributes.properties.status.enum).toEqual(['active', 'pending', 'closed']);
  });

  it('documents deletes with their counts and 409, and timestamps on every type', () => {
    for (const [path, methods] of Object.entries(doc.paths as Record<string, Record<string, any>>)) {
      if (!methods.delete) continue;
      expect(Object.keys(methods.delete.responses), path).toEqual(expect.arrayContaining(['200', '403', '404', '409']));
      expect(methods.delete.responses['200'].content['application/vnd.api+json'].schema).toEqual({
        $ref: '#/components/schemas/DeleteDocument',
      });
    }
    for (const r of resources) {
      const attributes = doc.components.schemas[`${r.type}Attributes`].properties;
      expect(attributes.created_at, r.type).toMatchObject({ type: 'string', format: 'date-time' });
      expect(attributes.updated_at, r.type).toMatchObject({ type: 'string', format: 'date-time' });
    }
    // A new user's password is never returned; the generated one only in the create response (nullable otherwise).
    expect(doc.components.schemas.UserAttributes.properties).not.toHaveProperty('password');
    expect(doc.components.schemas.UserAttributes.properties.initial_password.type).toEqual(['string', 'null']);
  });
});

describe('served documentation', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(async () => t?.close());

  it('answers /api/open_api and /docs without a credential', async () => {
    const spec = await t.app.inject({ url: '/api/open_api' });
    expect(spec.statusCode).toBe(200);
    expect(JSON.parse(spec.body).paths['/api/users/login']).toBeDefined();
    const ui = await t.app.inject({ url: '/docs/' });
    expect(ui.statusCode).toBe(200);
    expect(ui.body).toContain('<html');
  });
});
