/**
 * A fuzzer driven by the served OpenAPI document (/api/open_api), in the manner of Schemathesis: for every
 * operation it generates positive requests (valid by the document's parameter and body schemas) and negative
 * ones (one schema violation each) with fast-check, and checks that no answer is a 5xx, every answer is a
 * valid JSON:API document whose status and headers the operation documents, positive requests succeed with a
 * body valid by the documented response schema, and negative ones are refused with a 4xx.
 */
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUserInOrganisation } from '../src/auth/accounts.js';
import { createApiKey } from '../src/auth/api-keys.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { expectJsonApi } from './support/conformance.js';
import { client, resourceDocument } from './helpers/http.js';
import { insertCall, insertParticipant, insertTranscript } from './helpers/telephony.js';

const RUNS = Number(process.env.OPENAPI_FUZZ_RUNS ?? 150);
type Schema = Record<string, any>;
type Operation = { method: string; path: string; op: Schema };

let t: TestApp;
let tenant: Tenant;
let doc: Schema;
let operations: Operation[];
/** A record of each type, for path ids and references. */
const ids: Record<string, string> = {};
const ajv = new Ajv2020.default({ strict: false, validateSchema: false, allErrors: true });
addFormats.default(ajv);
const counts = { positive: 0, negative: 0, succeeded: 0, refused: 0 };
let serial = 0;
/** A fresh record of each deletable type: a DELETE removes its own, never the records the other operations use. */
const fresh: Record<string, () => Promise<string>> = {
  AiAgent: async () => (await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'AiAgent', { name: 'Doomed' })).id,
  Gateway: async () =>
    (
      await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'Gateway', {
        realm: `d${serial++}.example.com`,
        username: 'd',
      })
    ).id,
  SipUser: async () =>
    (await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'SipUser', { sip_username: `doomed.${serial++}` })).id,
  ApiKey: async () =>
    (
      await createApiKey(t.services.records!, {
        organisationId: tenant.organisationId,
        userId: tenant.admin.id,
        keyType: 'secret',
        name: 'doomed',
      })
    ).id,
  User: async () =>
    (
      await createUserInOrganisation(t.services.records!, {
        organisationId: tenant.organisationId,
        email: `doomed.${serial++}@fuzz.example`,
        password: 'doomed-pass-1',
        fullName: 'D',
        role: 'operator',
      })
    ).id,
  WebhookEndpoint: async () =>
    (await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'WebhookEndpoint', { url: 'https://1.1.1.1/doomed' })).id,
  Invitation: async () =>
    (
      await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'Invitation', {
        email: `doomed.${serial++}@fuzz.example`,
        role: 'operator',
      })
    ).id,
  PhoneNumber: async () =>
    (
      await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'PhoneNumber', {
        number: `+4420${String(80_000_000 + serial++)}`,
      })
    ).id,
  KnowledgeDocument: async () =>
    (
      await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'KnowledgeDocument', {
        ai_agent_id: ids.AiAgent,
        title: 'Doomed',
        content: 'Refunds take five days.',
      })
    ).id,
};
/** The id a request's path names: a fresh record for a DELETE, else the record of the operation's type. */
async function pathId(operation: Operation): Promise<string | undefined> {
  if (!operation.path.includes('{id}')) return undefined;
  const type = operation.op.tags[0];
  return operation.method === 'DELETE' ? fresh[type]() : ids[type];
}

beforeAll(async () => {
  // The login throttle has its own tests; here generated sign-ins (refused bodies count as failures) must not
  // exhaust it within one run, whatever the number of runs.
  t = await startTestApp({ LOGIN_FAILURES_PER_WINDOW: '1000000' });
  tenant = await seedTenant(t, 'OpenApiFuzz');
  const api = client(t.app, tenant.owner.token);
  ids.Conversation = (await api.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
  ids.ConversationItem = (
    await api.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { content: 'x', role: 'user', conversation_id: ids.Conversation }),
    )
  ).body.data.id;
  ids.SipUser = (await api.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'fuzz.openapi' }))).body.data.id;
  ids.Gateway = (await api.post('/api/gateways', resourceDocument('Gateway', { realm: 'fuzz.example.com', username: 'f' }))).body.data.id;
  ids.OperatorStatus = (
    await api.post('/api/operator_statuses', resourceDocument('OperatorStatus', { sip_user_id: ids.SipUser, status: 'available' }))
  ).body.data.id;
  ids.OperatorStatusEvent = (
    await t.db
      .selectFrom('operator_status_events')
      .select('id')
      .where('organisation_id', '=', tenant.organisationId)
      .executeTakeFirstOrThrow()
  ).id;
  ids.Call = await insertCall(t.db, tenant.organisationId);
  ids.CallParticipant = await insertParticipant(t.db, tenant.organisationId, ids.Call);
  ids.CallTranscript = await insertTranscript(t.db, tenant.organisationId, ids.Call, 0);
  // A key no request here authenticates with (the admin's), since PATCH may revoke it.
  ids.ApiKey = (await t.db.selectFrom('api_keys').select('id').where('user_id', '=', tenant.admin.id).executeTakeFirstOrThrow()).id;
  ids.User = tenant.owner.id;
  ids.Organisation = tenant.organisationId;
  ids.AiAgent = (await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'AiAgent', { name: 'Fuzz agent' })).id;
  ids.WebhookEndpoint = await newWebhookEndpoint();
  ids.Invitation = await fresh.Invitation();
  ids.PhoneNumber = await fresh.PhoneNumber();
  ids.KnowledgeDocument = await fresh.KnowledgeDocument();

  const served = await t.app.inject({ url: '/api/open_api' });
  doc = JSON.parse(served.body);
  ajv.addSchema({ ...doc, $id: 'openapi' });
  // JSON:API operations; the event stream (text/event-stream, never ending) has its own tests (events.test.ts).
  operations = Object.entries(doc.paths as Record<string, Record<string, Schema>>)
    .flatMap(([path, methods]) => Object.entries(methods).map(([method, op]) => ({ method: method.toUpperCase(), path, op })))
    .filter(({ op }) => !op.responses['200']?.content?.['text/event-stream']);
});
afterAll(async () => {
  console.log(
    `OpenAPI fuzz: ${operations?.length ?? 0} operations, ${counts.positive} positive requests (${counts.succeeded} succeeded), ` +
      `${counts.negative} negative (${counts.refused} refused with 4xx), 0 answered 5xx`,
  );
  await t?.close();
});

/** Follows a local `$ref` of the document. */
function deref(schema: Schema): Schema {
  let current = schema;
  while (current?.$ref)
    current = current.$ref
      .slice(2)
      .split('/')
      .reduce((node: Schema, key: string) => node[key], doc);
  return current;
}

/** Words of a `^(a|b)(,(a|b))*$` pattern (include paths, sort keys, field names). */
function listWords(pattern: string): string[] {
  const match = /\(([^()]*)\)/.exec(pattern.replace(/^\^\(?\(\\\+\{1,2\}\|-\{1,2\}\)\?/, '^'));
  return match ? match[1].split('|').map((w) => w.replace(/\\(.)/g, '$1')) : [];
}

/** A value valid by `schema` (the subset of JSON Schema the document uses). */
function arbitrary(schema: Schema, name = ''): fc.Arbitrary<unknown> {
  schema = deref(schema);
  if (schema.const !== undefined) return fc.constant(schema.const);
  if (schema.enum) return fc.constantFrom(...schema.enum);
  if (schema.oneOf) return fc.oneof(...schema.oneOf.map((s: Schema) => arbitrary(s, name)));
  const types: string[] = Array.isArray(schema.type) ? schema.type : [schema.type];
  if (types.includes('null') && types.length > 1)
    return fc.oneof(fc.constant(null), arbitrary({ ...schema, type: types.find((x) => x !== 'null') }, name));
  switch (types[0]) {
    case 'integer': {
      const min = schema.minimum ?? -1000;
      return fc.integer({ min, max: Math.min(schema.maximum ?? 1000, min + 1000) });
    }
    case 'boolean':
      return fc.boolean();
    case 'array':
      return fc.array(arbitrary(schema.items ?? {}, name), {
        minLength: schema.minItems ?? 0,
        maxLength: Math.min(schema.maxItems ?? 3, 3),
      });
    case 'object':
      if (schema.properties) {
        const required = schema.required ?? [];
        const entries = Object.entries(schema.properties as Record<string, Schema>).map(
          ([key, value]) => [key, arbitrary(value, key)] as const,
        );
        return fc.record(Object.fromEntries(entries), { requiredKeys: required });
      }
      return fc.constantFrom({}, { source: 'fuzz' }, { nested: { n: 1 } });
    default: {
      if (schema.format === 'uuid') return fc.uuid();
      if (schema.format === 'date-time')
        return fc.date({ min: new Date('2000-01-01'), max: new Date('2100-01-01'), noInvalidDate: true }).map((d) => d.toISOString());
      if (name === 'inbound_acl' || name === 'proxy')
        return fc.constantFrom('192.0.2.0/24', '2001:db8::/32').map((v) => (name === 'proxy' ? 'sip.example.com:5060' : v));
      const min = schema.minLength ?? 0;
      const max = Math.min(schema.maxLength ?? 40, 40);
      const text = schema.pattern
        ? fc
            .stringMatching(new RegExp(schema.pattern, 'u'))
            .filter((v) => [...v].length >= min && [...v].length <= (schema.maxLength ?? Infinity))
        : fc.string({ minLength: min, maxLength: Math.max(min, max) });
      return text;
    }
  }
}

/** A positive query for the operation: each parameter in the form its schema gives. */
function positiveQuery(op: Schema): fc.Arbitrary<Record<string, string>> {
  const parameters = (op.parameters ?? []).map(deref).filter((p: Schema) => p.in === 'query') as Schema[];
  const parts: fc.Arbitrary<Record<string, string>>[] = [];
  for (const p of parameters) {
    if (p.name === 'include') {
      const words = p.schema.pattern ? listWords(p.schema.pattern) : [];
      if (words.length)
        parts.push(
          fc
            .subarray(words, { maxLength: Math.min(2, words.length) })
            .map((w): Record<string, string> => (w.length ? { include: w.join(',') } : {})),
        );
    } else if (p.name === 'sort') {
      const words = listWords(p.schema.pattern);
      parts.push(
        fc
          .uniqueArray(fc.constantFrom(...words), { maxLength: 3 })
          .chain((keys) =>
            fc
              .tuple(...keys.map((k) => fc.constantFrom('', '-', '+', '--', '++').map((prefix) => `${encodeURIComponent(prefix)}${k}`)))
              .map((list): Record<string, string> => (list.length ? { sort: list.join(',') } : {})),
          ),
      );
    } else if (p.name === 'fields') {
      const types = Object.entries(p.schema.properties as Record<string, Schema>);
      parts.push(
        fc
          .subarray(types, { maxLength: Math.min(2, types.length) })
          .chain((chosen) =>
            fc
              .tuple(
                ...chosen.map(([type, s]) =>
                  fc
                    .subarray(listWords(s.pattern.replace(/^\^\(/, '^').replace(/\)\?\$$/, '$')))
                    .map((names) => [`fields[${type}]`, names.join(',')] as const),
                ),
              )
              .map((pairs) => Object.fromEntries(pairs)),
          ),
      );
    } else if (p.name === 'filter') {
      const attributes = Object.entries(p.schema.properties as Record<string, Schema>).filter(
        ([n, s]) => !['and', 'or', 'not'].includes(n) && s.oneOf.length > 1,
      );
      parts.push(
        fc
          .subarray(attributes, { maxLength: Math.min(2, attributes.length) })
          .chain((chosen) =>
            fc
              .tuple(
                ...chosen.map(([n, s]) =>
                  (arbitrary(s.oneOf[0]) as fc.Arbitrary<string>).map(
                    (v) => [`filter[${n}]`, s.oneOf[0].contentMediaType ? '{}' : v] as const,
                  ),
                ),
              )
              .map((pairs) => Object.fromEntries(pairs)),
          ),
      );
    } else if (p.name === 'page[limit]') {
      parts.push(
        fc
          .option(fc.integer({ min: 1, max: 1_000_000_000 }), { nil: undefined })
          .map((v): Record<string, string> => (v === undefined ? {} : { 'page[limit]': String(v) })),
      );
    } else if (p.name === 'page[count]') {
      parts.push(
        fc
          .option(fc.boolean(), { nil: undefined })
          .map((v): Record<string, string> => (v === undefined ? {} : { 'page[count]': String(v) })),
      );
    }
  }
  return fc.tuple(...parts).map((list) => Object.assign({}, ...list));
}

/** A positive body: the request schema's values, references naming this organisation's records. */
function positiveBody(op: Schema, id: string | undefined): fc.Arbitrary<Schema> | undefined {
  const content = op.requestBody?.content?.['application/vnd.api+json'];
  if (!content) return undefined;
  const data = deref(content.schema).properties.data;
  const attributesSchema = data.properties.attributes;
  const relationships = data.properties.relationships.properties as Record<string, Schema>;
  const referenced = new Map(
    Object.entries(relationships).map(([name, s]) => [
      `${name}_id`,
      (s.properties.data.oneOf?.[0] ?? s.properties.data).properties.type.const as string,
    ]),
  );
  const required: string[] = attributesSchema.required ?? [];
  const entries = Object.entries(attributesSchema.properties as Record<string, Schema>).map(([name, s]) => {
    const type = referenced.get(name);
    return [name, type ? fc.constant(ids[type]) : arbitrary(s, name)] as const;
  });
  return fc.tuple(fc.record(Object.fromEntries(entries), { requiredKeys: required }), fc.boolean()).map(([attributes, asLinkage]) => {
    const body: Schema = { data: { type: data.properties.type.const, ...(id ? { id } : {}), attributes } };
    // References go as relationship linkage half the time, as JSON:API clients send them.
    if (asLinkage) {
      for (const [name, type] of referenced) {
        if (attributes[name] === undefined) continue;
        body.data.relationships ??= {};
        body.data.relationships[name.slice(0, -3)] = { data: attributes[name] === null ? null : { type, id: attributes[name] } };
        delete attributes[name];
      }
    }
    return body;
  });
}

/** 422s that JSON Schema cannot foresee: cross-field rules, state (a closed conversation), numbering, CIDR and host checks. */
// A reference attribute (`*_id`) naming no record of the organisation is a semantic refusal the schema cannot express.
// A user's current password (checked against the stored hash), an API key's revocation (final, never in the future),
// a webhook URL (its host must resolve to public addresses) and its event types too; an invitation's expiry (within
// 30 days of now) and its token (an invitation that exists, for the e-mail given). A phone number must be a possible
// E.164 number (libphonenumber's lengths per country) and a default_country one with a numbering plan.
// A reference sent as a relationship meets the same rules as its `*_id` attribute (a phone number's one target).
const SEMANTIC_POINTERS =
  /^\/data\/(attributes\/([a-z_]+_id|left_at|joined_at|content_index|inbound_acl|proxy|languages|workflow|realm|current_password|revoked_at|url|event_types|expires_at|invitation_token|number|default_country)|relationships\/[a-z_]+)/;

/** A webhook endpoint, and a delivery queued for it by the next change (its deliveries go with it when deleted). */
async function newWebhookEndpoint(): Promise<string> {
  const actor = systemActor(tenant.organisationId, 'test');
  const { id } = await t.services.records!.create(actor, 'WebhookEndpoint', { url: 'https://1.1.1.1/fuzz' });
  await t.services.records!.create(actor, 'Conversation', {});
  ids.WebhookDelivery = (
    await t.db.selectFrom('webhook_deliveries').select('id').where('webhook_endpoint_id', '=', id).executeTakeFirstOrThrow()
  ).id;
  return id;
}

async function send(operation: Operation, query: Record<string, string>, body: unknown, credential: string, id?: string) {
  const path = operation.path.replace('{id}', id ?? '');
  // A value with '%' goes as it is (malformed escapes are part of the fuzzing), but for '#' and '&', which would end
  // the query or split it before the server sees it.
  const search = Object.entries(query)
    .map(
      ([k, v]) =>
        `${k.replace(/[^[\]]+/g, encodeURIComponent)}=${v.includes('%') ? v.replace(/[#&]/g, encodeURIComponent) : encodeURIComponent(v)}`,
    )
    .join('&');
  const response = await t.app.inject({
    method: operation.method as 'GET',
    url: search ? `${path}?${search}` : path,
    headers: { authorization: `Bearer ${credential}`, ...(body === undefined ? {} : { 'content-type': 'application/vnd.api+json' }) },
    payload: body === undefined ? undefined : JSON.stringify(body),
  });
  const label = `${operation.method} ${path}?${search} ${JSON.stringify(body)?.slice(0, 300)} -> ${response.statusCode} ${response.body.slice(0, 500)}`;
  expect(response.statusCode, label).toBeLessThan(500);
  const documented = operation.op.responses[String(response.statusCode)];
  expect(documented, `undocumented status: ${label}`).toBeDefined();
  const parsed = JSON.parse(response.body);
  expectJsonApi(parsed);
  // Every header the response documents is sent.
  for (const name of Object.keys(deref(documented).headers ?? {}))
    expect(response.headers[name.toLowerCase()], `${name}: ${label}`).toBeDefined();
  return { status: response.statusCode, body: parsed, label, documented: deref(documented) };
}

function credentialFor(operation: Operation): string {
  return operation.op.security?.some((s: Schema) => 'publishableKey' in s) ? tenant.publishableKey : tenant.owner.token;
}

describe('requests generated from the OpenAPI document', () => {
  it(`positive requests succeed with documented statuses, headers and bodies (${RUNS} runs)`, async () => {
    const arbitraries = () =>
      fc.integer({ min: 0, max: operations.length - 1 }).chain((index) => {
        const operation = operations[index];
        const login = operation.path === '/api/users/login';
        const body = login
          ? fc.constant({ data: { type: 'User', attributes: { email: tenant.owner.email, password: tenant.owner.password } } })
          : (positiveBody(operation.op, operation.path.includes('{id}') ? ids[operation.op.tags[0]] : undefined) ?? fc.constant(undefined));
        return fc.tuple(fc.constant(index), positiveQuery(operation.op), body);
      });
    await fc.assert(
      fc.asyncProperty(arbitraries(), async ([index, query, body]) => {
        const operation = operations[index];
        counts.positive += 1;
        const {
          status,
          body: answer,
          label,
          documented,
        } = await send(operation, query, body, credentialFor(operation), await pathId(operation));
        if (status < 300) {
          counts.succeeded += 1;
          const schema = documented.content['application/vnd.api+json'].schema;
          const validate = ajv.getSchema(`openapi${schema.$ref}`)!;
          expect(validate(answer), `${label}\n${ajv.errorsText(validate.errors)}`).toBe(true);
        } else if (status === 409 && operation.method !== 'GET') {
          // Uniqueness (a SIP username, an item index taken), documented as 409.
        } else {
          expect(status, label).toBe(422);
          expect(operation.method).not.toBe('GET');
          for (const error of answer.errors) expect(error.source?.pointer, label).toMatch(SEMANTIC_POINTERS);
        }
      }),
      { numRuns: RUNS, seed: Number(process.env.FUZZ_SEED ?? Date.now() % 2 ** 31) },
    );
    expect(counts.succeeded).toBeGreaterThan(RUNS / 2);
  }, 60_000);

  it(`negative requests (one schema violation each) are refused with a documented 4xx (${RUNS} runs)`, async () => {
    type Mutation = (query: Record<string, string>, body: Schema | undefined) => [Record<string, string>, Schema | undefined] | undefined;
    const mutations: Mutation[] = [
      (q, b) => [{ ...q, bogus: '1' }, b],
      (q, b) => [{ ...q, include: 'no_such_relationship' }, b],
      (q, b) => [{ ...q, 'fields[NoSuchType]': 'a' }, b],
      (q, b) => (b ? [q, { ...b, data: { ...b.data, type: 'NoSuchType' } }] : undefined),
      (q, b) => (b ? [q, { ...b, data: { ...b.data, attributes: { ...b.data.attributes, no_such_attribute: 1 } } }] : undefined),
      (q, b) => (b ? [q, { ...b, data: { ...b.data, relationships: { no_such_relationship: { data: null } } } }] : undefined),
      (q, b) => (b ? [q, { ...b, extra_member: true }] : undefined),
      (q, b) => (b ? [q, { data: [] }] : undefined),
      (q, b) => {
        const first = b && Object.keys(b.data.attributes ?? {})[0];
        return first ? [q, { ...b, data: { ...b.data, attributes: { ...b.data.attributes, [first]: [[1]] } } }] : undefined;
      },
    ];
    const listMutations: Mutation[] = [
      (q, b) => [{ ...q, 'page[limit]': '0' }, b],
      (q, b) => [{ ...q, sort: 'no_such_key' }, b],
      (q, b) => [{ ...q, 'filter[no_such_attribute]': 'x' }, b],
      (q, b) => [{ ...q, 'page[after]': 'forged.AAAAAAAAAAAAAAAAAAAAAA' }, b],
      (q, b) => [{ ...q, 'page[offset]': '10001' }, b],
    ];
    const arbitraries = () =>
      fc.integer({ min: 0, max: operations.length - 1 }).chain((index) => {
        const operation = operations[index];
        const body =
          positiveBody(operation.op, operation.path.includes('{id}') ? ids[operation.op.tags[0]] : undefined) ?? fc.constant(undefined);
        const list = (operation.op.parameters ?? []).some((p: Schema) => deref(p).name === 'sort');
        return fc.tuple(
          fc.constant(index),
          positiveQuery(operation.op),
          body,
          fc.constantFrom(...mutations, ...(list ? listMutations : [])),
        );
      });
    await fc.assert(
      fc.asyncProperty(arbitraries(), async ([index, query, body, mutate]) => {
        const operation = operations[index];
        const mutated = mutate(query, body as Schema | undefined);
        fc.pre(mutated !== undefined);
        counts.negative += 1;
        const { status, label } = await send(operation, mutated![0], mutated![1], credentialFor(operation), await pathId(operation));
        expect(status >= 400 && status < 500, label).toBe(true);
        counts.refused += 1;
      }),
      { numRuns: RUNS, seed: Number(process.env.FUZZ_SEED ?? Date.now() % 2 ** 31) },
    );
  }, 60_000);

  it('answers every method a documented path does not offer with 405 and Allow', async () => {
    for (const [path, methods] of Object.entries(doc.paths as Record<string, Schema>)) {
      const offered = Object.keys(methods).map((m) => m.toUpperCase());
      const url = path.replace('{id}', ids[(Object.values(methods)[0] as Schema).tags[0]]);
      for (const method of ['GET', 'POST', 'PATCH', 'PUT', 'DELETE', 'OPTIONS', 'TRACE'].filter((m) => !offered.includes(m))) {
        const response = await t.app.inject({ method: method as 'GET', url, headers: { authorization: `Bearer ${tenant.owner.token}` } });
        expect(response.statusCode, `${method} ${url}`).toBe(405);
        const allow = String(response.headers.allow).split(', ');
        expect(allow.filter((m) => m !== 'HEAD').sort(), `${method} ${url}`).toEqual([...offered].sort());
        expectJsonApi(response.json());
      }
    }
  });
});
