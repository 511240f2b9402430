/**
 * Property-based hostile input over every endpoint: random and malformed
 * bodies, ids, query strings, headers and encodings. Every answer must be a
 * JSON:API document that passes the official schema, never a 5xx, and a
 * rejected request must leave every table exactly as it was.
 */
import fc from 'fast-check';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { expectJsonApi } from './support/conformance.js';
import { client, resourceDocument } from './helpers/http.js';
import { insertCall, insertParticipant } from './helpers/telephony.js';

const RUNS = Number(process.env.FUZZ_RUNS ?? 500);
const TABLES = [
  'conversations',
  'conversation_items',
  'ai_agents',
  'gateways',
  'sip_users',
  'operator_statuses',
  'operator_status_events',
  'call_participants',
  'api_keys',
  'users',
  'memberships',
  'user_sessions',
  'calls',
  'organisations',
];

let t: TestApp;
let tenant: Tenant;
let ids: Record<string, string>;
let generated = 0;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Fuzz');
  const api = client(t.app, tenant.owner.token);
  const conversation = (await api.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
  const item = (
    await api.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { content: 'x', role: 'user', conversation_id: conversation }),
    )
  ).body.data.id;
  const sipUser = (await api.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'fuzz.1' }))).body.data.id;
  const gateway = (await api.post('/api/gateways', resourceDocument('Gateway', { realm: 'fuzz.example.com', username: 'f' }))).body.data.id;
  const status = (
    await api.post('/api/operator_statuses', resourceDocument('OperatorStatus', { sip_user_id: sipUser, status: 'available' }))
  ).body.data.id;
  const call = await insertCall(t.db, tenant.organisationId);
  const participant = await insertParticipant(t.db, tenant.organisationId, call);
  const agent = (await t.db.selectFrom('ai_agents').select('id').where('organisation_id', '=', tenant.organisationId).executeTakeFirst())
    ?.id;
  const key = (await t.db.selectFrom('api_keys').select('id').where('user_id', '=', tenant.operator.id).executeTakeFirstOrThrow()).id;
  ids = {
    conversation,
    item,
    sipUser,
    gateway,
    status,
    call,
    participant,
    agent: agent ?? conversation,
    key,
    user: tenant.operator.id,
    owner: tenant.owner.id,
    organisation: tenant.organisationId,
  };
});
afterAll(async () => {
  console.log(`fuzz: ${generated} generated requests, 0 answered 5xx`);
  await t?.close();
});

/** A fingerprint of every table's rows, to prove a rejected request changed nothing. */
async function snapshot(): Promise<string> {
  const parts: string[] = [];
  for (const table of TABLES) {
    const { rows } = await sql<{ digest: string }>`
      SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) AS digest FROM ${sql.table(table)} t`.execute(t.db);
    parts.push(rows[0].digest);
  }
  return parts.join(',');
}

const text = fc.oneof(
  fc.string(),
  fc.string({ unit: 'binary' }),
  fc.constantFrom(
    '',
    ' ',
    '\u0000',
    '\ud800',
    '%',
    '%zz',
    '[]',
    '{}',
    'null',
    '-1',
    '1e309',
    'true',
    "' OR 1=1 --",
    '../../etc',
    'x'.repeat(5000),
  ),
);
const jsonValue = fc.oneof(fc.jsonValue({ maxDepth: 3 }), text, fc.constantFrom(null, 0, -1, 2 ** 31, 1.5, true, [], {}));
const attributeNames = fc.constantFrom(
  'content',
  'role',
  'conversation_id',
  'organisation_id',
  'status',
  'mode',
  'channel',
  'metadata',
  'ai_agent_id',
  'sip_username',
  'sip_password',
  'user_id',
  'sip_user_id',
  'source',
  'left_at',
  'realm',
  'username',
  'password',
  'inbound_acl',
  'languages',
  'workflow',
  'name',
  'published',
  'content_index',
  'item_id',
  'occurred_at',
  'id',
  'email',
  'key_type',
  'revoked_at',
  'expires_at',
  'full_name',
  'current_password',
  'initial_password',
  'revoke_tokens',
  'token',
  'created_at',
  'updated_at',
);
const types = fc.constantFrom(
  'Conversation',
  'ConversationItem',
  'AiAgent',
  'Gateway',
  'SipUser',
  'OperatorStatus',
  'CallParticipant',
  'User',
  'ApiKey',
  'Nope',
  '',
);

const body = fc.oneof(
  fc.record({
    data: fc.record(
      {
        type: fc.oneof(types, jsonValue),
        id: fc.oneof(fc.uuid(), text),
        attributes: fc.oneof(fc.dictionary(attributeNames, jsonValue, { maxKeys: 6 }), jsonValue),
        relationships: fc.oneof(fc.constant({}), jsonValue),
      },
      { requiredKeys: [] },
    ),
  }),
  jsonValue,
);

const queryParameter = fc.oneof(
  fc.tuple(
    fc.constantFrom(
      'include',
      'sort',
      'fields[Conversation]',
      'fields[Nope]',
      'filter[status]',
      'filter[id][in]',
      'filter[or][0][mode]',
      'filter[and]',
      'filter[not][channel]',
      'filter[metadata][contains]',
      'filter[occurred_at][less_than]',
      'page[limit]',
      'page[offset]',
      'page[after]',
      'page[before]',
      'page[count]',
      'page',
      'filter',
      'bogus',
      'filter[content_index][greater_than]',
      'filter[x][y][z][w][v][u]',
    ),
    text,
  ),
  fc.tuple(text, text),
);
/** Percent-encodes, and sometimes leaves a broken escape in, to exercise the decoder. */
const encode = (value: string) => encodeURIComponent(value.toWellFormed());
const rawGarbage = fc.constantFrom('', '', '', '%', '%zz', '%C3', '%00', '&&', '=');
const queryString = fc
  .tuple(fc.array(queryParameter, { maxLength: 4 }), rawGarbage)
  .map(
    ([pairs, garbage]) => pairs.map(([k, v]) => `${encode(k).replace(/%5B/g, '[').replace(/%5D/g, ']')}=${encode(v)}`).join('&') + garbage,
  );

type Target = { method: 'GET' | 'POST' | 'PATCH' | 'DELETE' | 'PUT'; path: string };
function targets(): fc.Arbitrary<Target> {
  const id = fc.oneof(fc.constantFrom(...Object.values(ids)), fc.uuid(), text.map(encode));
  const paths = [
    ['GET', '/api/api_keys'],
    ['POST', '/api/users/login'],
    ['POST', '/api/conversations'],
    ['GET', '/api/conversations'],
    ['POST', '/api/conversation_items'],
    ['POST', '/api/gateways'],
    ['POST', '/api/sip_users'],
    ['GET', '/api/sip_users'],
    ['POST', '/api/operator_statuses'],
    ['GET', '/api/operator_status_events'],
    ['GET', '/api/call_participants'],
    ['GET', '/api/call_transcripts'],
    ['DELETE', '/api/conversations'],
    ['GET', '/api/ai_agents'],
    ['POST', '/api/ai_agents'],
    ['GET', '/api/gateways'],
    ['GET', '/api/operator_statuses'],
    ['GET', '/api/calls'],
    ['POST', '/api/api_keys'],
    ['GET', '/api/users'],
    ['POST', '/api/invitations'],
    ['GET', '/api/users/me'],
    ['PATCH', '/api/users/me'],
    ['GET', '/api/organisations'],
  ] as const;
  const members = [
    ['GET', '/api/api_keys/'],
    ['PATCH', '/api/conversations/'],
    ['GET', '/api/conversation_items/'],
    ['PATCH', '/api/ai_agents/'],
    ['PATCH', '/api/gateways/'],
    ['PATCH', '/api/sip_users/'],
    ['GET', '/api/operator_statuses/'],
    ['GET', '/api/operator_status_events/'],
    ['GET', '/api/calls/'],
    ['PATCH', '/api/call_participants/'],
    ['PUT', '/api/calls/'],
    ['GET', '/api/ai_agents/'],
    ['DELETE', '/api/ai_agents/'],
    ['GET', '/api/gateways/'],
    ['DELETE', '/api/gateways/'],
    ['GET', '/api/sip_users/'],
    ['DELETE', '/api/sip_users/'],
    ['GET', '/api/conversations/'],
    ['GET', '/api/call_participants/'],
    ['GET', '/api/call_transcripts/'],
    ['PATCH', '/api/api_keys/'],
    ['DELETE', '/api/api_keys/'],
    ['GET', '/api/users/'],
    ['PATCH', '/api/users/'],
    ['DELETE', '/api/users/'],
    ['GET', '/api/organisations/'],
  ] as const;
  return fc.oneof(
    fc.constantFrom(...paths).map(([method, path]) => ({ method, path })),
    fc.tuple(fc.constantFrom(...members), id).map(([[method, path], value]) => ({ method, path: `${path}${value}` })),
  );
}

const headers = fc.record(
  {
    'content-type': fc.constantFrom(
      'application/vnd.api+json',
      'application/json',
      'application/vnd.api+json; charset=utf-8',
      'text/plain',
      'application/vnd.api+json; ext=x',
      '',
    ),
    accept: fc.constantFrom('application/vnd.api+json', '*/*', 'application/vnd.api+json; q=0.5', 'text/html', ''),
    authorization: fc.constantFrom('own', 'none', 'Bearer garbage', 'Basic abc', 'Bearer '),
  },
  { requiredKeys: ['authorization'] },
);

describe('hostile requests', () => {
  it(
    `answer every request with a valid JSON:API document and never a 5xx (${RUNS} runs)`,
    async () => {
      await fc.assert(
        fc.asyncProperty(
          targets(),
          queryString,
          fc.option(body, { nil: undefined }),
          headers,
          fc.boolean(),
          async (target, query, payload, requestHeaders, rawText) => {
            generated += 1;
            const before = target.method === 'GET' ? undefined : await snapshot();
            const authorization =
              requestHeaders.authorization === 'own'
                ? `Bearer ${tenant.owner.token}`
                : requestHeaders.authorization === 'none'
                  ? undefined
                  : requestHeaders.authorization;
            const response = await t.app.inject({
              method: target.method,
              url: query ? `${target.path}?${query}` : target.path,
              headers: {
                ...(authorization ? { authorization } : {}),
                ...(requestHeaders['content-type'] ? { 'content-type': requestHeaders['content-type'] } : {}),
                ...(requestHeaders.accept ? { accept: requestHeaders.accept } : {}),
              },
              payload: payload === undefined ? undefined : rawText ? JSON.stringify(payload).slice(0, -1) : JSON.stringify(payload),
            });
            expect(response.statusCode, `${target.method} ${target.path}?${query} -> ${response.body}`).toBeLessThan(500);
            if (response.body) expectJsonApi(JSON.parse(response.body));
            if (before !== undefined && response.statusCode >= 400) expect(await snapshot()).toBe(before);
          },
        ),
        { numRuns: RUNS, seed: Number(process.env.FUZZ_SEED ?? Date.now() % 2 ** 31) },
      );
    },
    30_000 + RUNS * 100,
  );
});
