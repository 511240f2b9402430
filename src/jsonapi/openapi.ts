/** The OpenAPI 3.1 document, derived from the same resource definitions as the routes. */
import { KINDS, operatorProblem, type Schema } from './kinds.js';
import { eventTypes } from './outbox.js';
import type { PrincipalRole } from './principal.js';
import { filterableAttribute, includePaths, sortableNames } from './query/parse.js';
import { MAX_FILTER_CONDITIONS, MAX_FILTER_DEPTH, MAX_IN_VALUES, PAGE_LIMITS } from './query/parse.js';
import { FILTER_OPERATORS } from './query/types.js';
import { inputSpec, writableLinkage } from './validate.js';
import { fieldNames, readableAttributes, type AttributeDef, type CustomAction, type Registry, type ResourceDef } from './resource.js';

const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
const nullable = (schema: Schema, isNullable?: boolean): Schema =>
  isNullable ? { ...schema, type: [schema.type as string, 'null'] } : schema;

/** JSON Schema of one attribute's value. */
function attributeSchema(def: AttributeDef, role: 'read' | 'write'): Schema {
  const base = KINDS[def.kind].schema(def);
  // A value shown only in the response that creates the record is null in every other response.
  const schema = nullable(base, def.nullable || (role === 'read' && def.revealedOnCreate));
  if (role === 'write' && def.default !== undefined && typeof def.default !== 'function') schema.default = def.default;
  if (def.writeOnly) schema.writeOnly = true;
  if (def.description) schema.description = def.description;
  return prune(schema);
}

/** Drops undefined members so the document stays small and valid. */
function prune<T>(value: T): T {
  if (Array.isArray(value)) return value.map(prune) as T;
  if (value && typeof value === 'object') {
    return Object.fromEntries(
      Object.entries(value)
        .filter(([, v]) => v !== undefined)
        .map(([k, v]) => [k, prune(v)]),
    ) as T;
  }
  return value;
}

const identifierSchema = (type: string): Schema => ({
  type: 'object',
  required: ['id', 'type'],
  properties: { id: { type: 'string' }, type: { const: type }, meta: { type: 'object' } },
});

function resourceSchemas(resource: ResourceDef): Record<string, Schema> {
  const t = resource.type;
  const attributes: Record<string, Schema> = {};
  for (const name of readableAttributes(resource)) attributes[name] = attributeSchema(resource.attributes[name], 'read');
  const relationships: Record<string, Schema> = {};
  for (const [name, relationship] of Object.entries(resource.relationships)) {
    relationships[name] =
      relationship.cardinality === 'one'
        ? { type: 'object', properties: { data: { oneOf: [identifierSchema(relationship.type), { type: 'null' }] } } }
        : {
            type: 'object',
            properties: {
              data: { type: 'array', items: identifierSchema(relationship.type) },
              links: { type: 'object', properties: { related: { type: 'string', format: 'uri' } } },
              meta: { type: 'object' },
            },
          };
  }
  return {
    [`${t}Attributes`]: { type: 'object', properties: attributes },
    [`${t}Resource`]: {
      type: 'object',
      required: ['id', 'type', 'attributes', 'relationships'],
      properties: {
        id: { type: 'string', format: 'uuid' },
        type: { const: t },
        attributes: ref(`${t}Attributes`),
        relationships: { type: 'object', properties: relationships },
        links: { type: 'object', properties: { self: { type: 'string', format: 'uri' } } },
        meta: { type: 'object' },
      },
    },
    [`${t}Document`]: document(ref(`${t}Resource`), { type: 'object' }),
    [`${t}RelatedDocument`]: document(
      { oneOf: [ref(`${t}Resource`), { type: 'null' }] },
      { type: 'object' },
      {
        type: 'object',
        required: ['self'],
        properties: { self: { type: 'string', format: 'uri' } },
      },
    ),
    [`${t}ListDocument`]: document({ type: 'array', items: ref(`${t}Resource`) }, ref('PageMeta'), ref('PageLinks')),
  };
}

/** A top-level document with `data` and `included` (and `links` when given). */
const document = (data: Schema, meta: Schema, links?: Schema): Schema => ({
  type: 'object',
  required: links ? ['data', 'included', 'meta', 'links', 'jsonapi'] : ['data', 'included', 'meta', 'jsonapi'],
  properties: { data, included: ref('Included'), meta, ...(links ? { links } : {}), jsonapi: ref('JsonApi') },
});

/** What a request body does: a member action names its record like an update and takes attributes like a create. */
type RequestKind = 'create' | 'update' | 'action' | 'member';

/**
 * The request body of a write: its document's schema (`data.type`, `data.attributes`, and `data.id` for updates,
 * closed like the server), and an example built from the operation's required attributes (and ids to replace
 * with your own).
 */
function requestBody(type: string, input: Record<string, AttributeDef>, kind: RequestKind): Schema {
  const spec = inputSpec(input, kind === 'update' ? 'update' : 'create');
  const properties: Record<string, Schema> = {};
  for (const [name, def] of Object.entries(spec.accepted)) properties[name] = attributeSchema(def, 'write');
  const relationships: Record<string, Schema> = {};
  // Every accepted reference `x_id` may also be sent as the linkage of the to-one relationship `x`.
  for (const [relationship, { attribute, type: target }] of writableLinkage(spec.accepted)) {
    const linkage: Schema = {
      type: 'object',
      required: ['type', 'id'],
      additionalProperties: false,
      properties: { type: { const: target }, id: { type: 'string', format: 'uuid' }, meta: { type: 'object' } },
    };
    relationships[relationship] = {
      type: 'object',
      required: ['data'],
      properties: {
        data: spec.accepted[attribute].nullable ? { oneOf: [linkage, { type: 'null' }] } : linkage,
        links: { type: 'object' },
        meta: { type: 'object' },
      },
      additionalProperties: false,
      description: `The same as the attribute \`${attribute}\`; both may be given when they agree.`,
    };
  }
  const withId = kind === 'update' || kind === 'member';
  const data: Schema = {
    type: 'object',
    required: withId ? ['type', 'id'] : ['type'],
    additionalProperties: false,
    properties: {
      type: { const: type },
      ...(withId ? { id: { type: 'string', format: 'uuid' } } : {}),
      attributes: { type: 'object', additionalProperties: false, properties, ...(spec.required.length ? { required: spec.required } : {}) },
      relationships: { type: 'object', additionalProperties: false, properties: relationships },
      meta: { type: 'object' },
      links: { type: 'object' },
      ...(withId ? {} : { lid: { type: 'string' } }),
    },
  };
  const example: Record<string, unknown> = {};
  for (const [name, def] of Object.entries(spec.accepted)) {
    // An update's example changes one attribute (not a reference, whose id the reader would have to replace).
    if (spec.required.includes(name) || (kind === 'update' && Object.keys(example).length === 0 && !def.references))
      example[name] =
        def.default !== undefined && typeof def.default !== 'function' ? def.default : (def.example ?? KINDS[def.kind].example(def));
  }
  const schema = {
    type: 'object',
    required: ['data'],
    additionalProperties: false,
    properties: { data, meta: { type: 'object' }, jsonapi: { type: 'object' } },
  };
  const id = withId ? { id: '00000000-0000-7000-8000-000000000000' } : {};
  return { required: true, content: jsonApi(schema, { data: { type, ...id, attributes: example } }) };
}

const ERROR_RESPONSES: Record<number, string> = {
  400: 'Malformed request or query parameter',
  401: 'Missing, malformed, forged, expired or revoked credential',
  403: 'Not allowed for this credential or role',
  404: 'No such record visible to the caller',
  405: 'Method not allowed on this path',
  406: 'Not acceptable',
  409: 'Type or id mismatch, or uniqueness violation',
  413: 'Body too large, or too complex (more than 4,096 members in one object or array, or 16,384 values)',
  415: 'Unsupported media type',
  422: 'Invalid, missing or unknown attributes',
  429: 'Rate limited',
  500: 'Internal error',
  503: 'Database unavailable',
};

/** Every operation under /api may answer these: credentials, Accept, method, limits, failures. */
const COMMON_ERRORS = [400, 401, 405, 406, 429, 500, 503];

function errors(statuses: number[]): Record<string, Schema> {
  const all = [...new Set([...COMMON_ERRORS, ...statuses])].sort();
  return Object.fromEntries(all.map((s) => [String(s), { $ref: `#/components/responses/Error${s}` }]));
}

const header = (name: string) => ({ $ref: `#/components/headers/${name}` });
const RATE_LIMIT_HEADERS = Object.fromEntries(['RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset'].map((n) => [n, header(n)]));

/** Headers of each error response beyond the rate-limit ones. */
const ERROR_HEADERS: Record<number, Record<string, Schema>> = {
  401: { 'WWW-Authenticate': header('WWW-Authenticate') },
  405: { Allow: header('Allow') },
  429: { 'Retry-After': header('Retry-After') },
  503: { 'Retry-After': header('Retry-After') },
};

const HEADERS: Record<string, Schema> = {
  'RateLimit-Limit': {
    description: 'Requests allowed per minute for this credential (IETF RateLimit header draft).',
    schema: { type: 'integer' },
  },
  'RateLimit-Remaining': { description: 'Requests left in the current window.', schema: { type: 'integer' } },
  'RateLimit-Reset': { description: 'Seconds until the window resets.', schema: { type: 'integer' } },
  'Retry-After': { description: 'Seconds to wait before retrying (RFC 9110 section 10.2.3).', schema: { type: 'integer' } },
  'WWW-Authenticate': { description: 'Always `Bearer` (RFC 6750).', schema: { type: 'string' } },
  Allow: { description: 'The methods the path offers.', schema: { type: 'string' } },
  Location: { description: "The new record's URL (`data.links.self`).", schema: { type: 'string', format: 'uri' } },
};

const ok = (description: string, schema: Schema, extra: Record<string, Schema> = {}) => ({
  description,
  headers: { ...RATE_LIMIT_HEADERS, ...extra },
  content: jsonApi(schema),
});

const bearer = (description: string) => ({ type: 'http', scheme: 'bearer', bearerFormat: 'JWT', description });
const SECURITY = {
  userToken: bearer(
    'A user access token from POST /api/users/login: acts as that user with the role of their membership (owner, admin or operator).',
  ),
  secretKey: bearer(
    "A secret API key (server to server), issued by owners and admins (POST /api/api_keys) or the command line: acts as the key's user with their role. Keep it secret.",
  ),
  publishableKey: bearer(
    'A publishable API key (may appear in a web page): only signs users in (POST /api/users/login); 403 everywhere else.',
  ),
};
const MEMBER_SECURITY = [{ userToken: [] }, { secretKey: [] }];

const rolesText = (roles: readonly PrincipalRole[] | undefined) =>
  roles && (roles.length < 3 || roles.includes('visitor')) ? `Roles: ${roles.join(', ')}.` : 'Roles: owner, admin, operator.';

const jsonApi = (schema: Schema, example?: unknown) => ({ 'application/vnd.api+json': { schema, example } });

const escapeRegExp = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
/** `^(a|b)(,(a|b))*$`: a comma-separated list of the given words. */
const listPattern = (words: string[], prefix = '') => {
  const one = `${prefix}(${words.map(escapeRegExp).join('|')})`;
  return `^${one}(,${one})*$`;
};

function queryParameters(resource: ResourceDef, list: boolean, registry: Registry): Schema[] {
  const includes = includePaths(resource, registry);
  const parameters: Schema[] = [
    queryParameter(
      'include',
      includes.length ? { type: 'string', pattern: listPattern(includes) } : { type: 'string', maxLength: 0 },
      `Comma-separated relationship paths: ${includes.join(', ') || 'none'}. At most 1000 included records and 8 MiB per response (else 400 invalid_includes).`,
    ),
    {
      name: 'fields',
      in: 'query',
      style: 'deepObject',
      explode: true,
      schema: {
        type: 'object',
        additionalProperties: false,
        properties: Object.fromEntries(
          [...registry.values()].map((r) => [r.type, { type: 'string', pattern: `^(${listPattern(fieldNames(r)).slice(1, -1)})?$` }]),
        ),
      },
      description: `Sparse fieldsets, fields[Type]=a,b. ${resource.type}: ${fieldNames(resource).join(', ')}.`,
      // What "Try it out" pre-fills: without an example, a generator fills every type with "string" (400).
      example: { [resource.type]: fieldNames(resource).slice(0, 2).join(',') },
    },
  ];
  if (!list) return parameters;
  const sortable = sortableNames(resource);
  // As the parser judges them: `id`, filterable or searchable attributes, the type's searches.
  const candidates = ['id', ...Object.keys(resource.attributes), ...Object.keys(resource.searches ?? {})];
  const filterable = candidates.filter((n) => filterableAttribute(resource, n));
  const condition = (name: string): Schema => {
    const def = filterableAttribute(resource, name)!;
    const value = (KINDS[def.kind].filterSchema ?? KINDS[def.kind].schema)(def);
    const operators: Record<string, Schema> = {};
    for (const operator of FILTER_OPERATORS) {
      if (operatorProblem(def, operator)) continue;
      operators[operator] =
        operator === 'is_nil'
          ? { type: 'string', enum: ['true', 'false'] }
          : operator === 'in'
            ? {
                oneOf: [
                  { type: 'string', description: 'Comma-separated values' },
                  { type: 'array', minItems: 1, maxItems: MAX_IN_VALUES, items: value },
                ],
              }
            : value;
    }
    const eq = operatorProblem(def, 'eq') ? [] : [value];
    return { oneOf: [...eq, { type: 'object', minProperties: 1, additionalProperties: false, properties: operators }] };
  };
  parameters.push(
    {
      name: 'filter',
      in: 'query',
      style: 'deepObject',
      explode: true,
      schema: {
        type: 'object',
        additionalProperties: false,
        properties: {
          ...Object.fromEntries(filterable.map((n) => [n, condition(n)])),
          and: { type: ['object', 'array'] },
          or: { type: ['object', 'array'] },
          not: { type: 'object' },
        },
      },
      description:
        `filter[attr]=v or filter[attr][op]=v with op in ${FILTER_OPERATORS.join(', ')}; nest with filter[and][N], filter[or][N], filter[not] ` +
        `(${MAX_FILTER_DEPTH} levels, ${MAX_FILTER_CONDITIONS} conditions, ${MAX_IN_VALUES} \`in\` values). Filterable: ${filterable.join(', ')}.`,
      // A condition every organisation's records meet, instead of a generated value for every attribute (400).
      example: filterable.includes('created_at') ? { created_at: { less_than: '2999-01-01T00:00:00Z' } } : {},
    },
    queryParameter(
      'sort',
      { type: 'string', pattern: listPattern(sortable, '(\\+{1,2}|-{1,2})?') },
      `Comma-separated keys of ${sortable.join(', ')}, each at most once; prefix none or + (ascending, nulls last), - (descending, nulls first), ++ (ascending, nulls first), -- (descending, nulls last).`,
    ),
    queryParameter(
      'page[limit]',
      { type: 'integer', minimum: 1, default: PAGE_LIMITS.defaultLimit },
      `Page size; any larger value is clamped to ${PAGE_LIMITS.maxLimit}.`,
    ),
    queryParameter(
      'page[offset]',
      { type: 'integer', minimum: 0, maximum: PAGE_LIMITS.maxOffset },
      'Offset paging; not with page[after] or page[before].',
    ),
    queryParameter(
      'page[after]',
      { type: 'string', pattern: CURSOR_PATTERN },
      'Keyset cursor from links.next (bound to the sort and the organisation).',
    ),
    queryParameter('page[before]', { type: 'string', pattern: CURSOR_PATTERN }, 'Keyset cursor from links.prev.'),
    queryParameter('page[count]', { type: 'boolean' }, 'Adds meta.page.total.'),
  );
  return parameters;
}

/** A parameter of the query string. */
const queryParameter = (name: string, schema: Schema, description: string) => ({ name, in: 'query', schema, description });

const CURSOR_PATTERN = '^[A-Za-z0-9_-]{1,4096}\\.[A-Za-z0-9_-]{22}$';

const idParameter = {
  name: 'id',
  in: 'path',
  required: true,
  schema: { type: 'string', format: 'uuid' },
  description: 'The record id (a malformed or unknown id is a 404).',
};

/** POST /api/conversations/{id}/typing: an ephemeral signal, not a resource (docs/events.md, "Typing"). */
function typingOperation(): Schema {
  return {
    operationId: 'signalTyping',
    summary: 'Say that the caller is typing in a conversation',
    description:
      'An ephemeral signal, not a resource: nothing is stored. The event streams (GET /api/events) of those who may read the ' +
      'conversation get a `Conversation.typing` message without an `id:` (never replayed), `data` being `{type: "Conversation", ' +
      'id, meta: {typing: {role, user_id, name, expires_at}}}`; the signal stands for 6 s, so clients repeat it while typing. ' +
      'Repeats within 2 s are answered (`meta.typing.coalesced: true`) but not passed on. No body is needed. A visitor credential (POST /api/visitor_sessions) signals in its own conversation only. ' +
      'A closed conversation is a 409.',
    tags: ['Conversation'],
    security: MEMBER_SECURITY,
    parameters: [idParameter],
    responses: {
      '202': ok('Passed on (or coalesced with the signal that stands)', ref('TypingDocument')),
      ...errors([403, 404, 409, 429]),
    },
  };
}

/** GET /api/events: server-sent events, not a JSON:API document (docs/events.md). */
function eventStreamOperation(registry: Registry): Schema {
  const types = [...eventTypes(registry)];
  return {
    operationId: 'streamEvents',
    summary: "Stream the organisation's events (server-sent events)",
    description:
      "A `text/event-stream` (WHATWG HTML, server-sent events) of the changes in the caller's organisation that its role may read: " +
      'each message has `id:` (the event id, a UUIDv7 in commit order), `event:` (the type) and `data:` (the event JSON ' +
      '`{id, type, occurred_at, organisation_id, data}`, `data` being the resource object as a GET renders it). `Last-Event-ID` ' +
      '(or `page[after]`) replays the retained events after that id, then the stream goes live; a comment line comes every 15 s. ' +
      'A client that reads too slowly is disconnected (it resumes with Last-Event-ID); each credential may hold a few streams at once (429). ' +
      `Event types: ${types.join(', ')}.`,
    tags: ['Event'],
    security: MEMBER_SECURITY,
    parameters: [
      queryParameter(
        'filter[type]',
        { type: 'string', pattern: listPattern(types) },
        'Comma-separated event types; an unknown one is a 400 naming it.',
      ),
      queryParameter('page[after]', { type: 'string', format: 'uuid' }, 'Replay the retained events after this event id.'),
      {
        name: 'Last-Event-ID',
        in: 'header',
        schema: { type: 'string', format: 'uuid' },
        description: 'Sent by reconnecting clients: replay after this event id (wins over page[after]).',
      },
    ],
    responses: {
      '200': {
        description: 'The event stream',
        content: {
          'text/event-stream': {
            schema: { type: 'string' },
            example:
              'id: 01a2…\nevent: Conversation.created\ndata: {"id":"01a2…","type":"Conversation.created","occurred_at":"…","organisation_id":"…","data":{…}}\n\n',
          },
        },
      },
      ...errors([403]),
    },
  };
}

/** The limits of actions that check a password (sign-in, accepting an invitation). */
const PASSWORD_ACTION_TEXT =
  ' Failed attempts (a refused body among them) are limited per organisation and e-mail and per client network, its /24 or /64 (429 with Retry-After); the body is at most 16 KiB (413); when too many passwords are being checked at once, 503 with Retry-After.';

/** A custom action's path: under the collection, or under one record (`member`). */
const actionPath = (r: ResourceDef, action: CustomAction) => (action.member ? `/api/${r.path}/{id}/${action.path}` : `/api/${action.path}`);

function actionOperation(resource: ResourceDef, name: string, action: CustomAction, registry: Registry): Schema {
  const kind = action.member ? 'member' : 'action';
  const member = ` On one record, changed in one transaction with it locked (404 when you cannot see it); an \`${resource.type}.updated\` event.`;
  return {
    operationId: name,
    summary: action.summary,
    description: `${action.summary}. ${action.allowPublishable ? "Takes a publishable key (the organisation is the key's). " : ''}${rolesText(action.roles)}${action.member ? member : ''}${'password' in action.input ? PASSWORD_ACTION_TEXT : ''}`,
    tags: [resource.type],
    security: action.allowPublishable ? [{ publishableKey: [] }, ...MEMBER_SECURITY] : MEMBER_SECURITY,
    parameters: [...(action.member ? [idParameter] : []), ...queryParameters(resource, false, registry)],
    requestBody: requestBody(resource.type, action.input, kind),
    responses: {
      [String(action.status ?? 200)]: ok(action.status === 201 ? 'Created' : 'OK', ref(`${resource.type}Document`)),
      ...errors(action.member ? [403, 404, 409, 415, 422] : [403, 409, 413, 415, 422, 429]),
    },
  };
}

/** A document of `meta` alone, with one member `name`. */
const metaDocument = (name: string, schema: Schema): Schema => ({
  type: 'object',
  required: ['meta', 'jsonapi'],
  properties: { meta: { type: 'object', required: [name], properties: { [name]: schema } }, jsonapi: ref('JsonApi') },
});

export function buildOpenApi(resources: ResourceDef[], options: { serverUrl?: string; version?: string } = {}): Record<string, unknown> {
  const schemas: Record<string, Schema> = {
    JsonApi: { type: 'object', properties: { version: { const: '1.0' } } },
    Included: { type: 'array', items: { type: 'object', required: ['id', 'type'] } },
    PageMeta: {
      type: 'object',
      properties: {
        page: { type: 'object', properties: { limit: { type: 'integer' }, offset: { type: 'integer' }, total: { type: 'integer' } } },
      },
    },
    PageLinks: {
      type: 'object',
      properties: Object.fromEntries(['self', 'first', 'next', 'prev'].map((k) => [k, { type: ['string', 'null'], format: 'uri' }])),
    },
    TypingDocument: metaDocument('typing', {
      type: 'object',
      required: ['expires_at', 'coalesced'],
      properties: {
        expires_at: { type: 'string', format: 'date-time', description: 'When the signal that stands expires.' },
        coalesced: { type: 'boolean', description: 'A repeat within 2 s: answered, not passed on.' },
      },
    }),
    DeleteDocument: metaDocument('removed', {
      type: 'object',
      description: 'Exact counts of the records the delete removed, by type: the record itself and what it took along.',
      additionalProperties: { type: 'integer', minimum: 1 },
    }),
    ErrorDocument: {
      type: 'object',
      required: ['errors', 'jsonapi'],
      properties: {
        errors: {
          type: 'array',
          items: {
            type: 'object',
            required: ['id', 'status', 'code', 'title'],
            properties: {
              ...Object.fromEntries(['id', 'status', 'code', 'title', 'detail'].map((name) => [name, { type: 'string' }])),
              source: {
                type: 'object',
                properties: { pointer: { type: 'string' }, parameter: { type: 'string' }, header: { type: 'string' } },
              },
              meta: { type: 'object' },
            },
          },
        },
        jsonapi: { $ref: '#/components/schemas/JsonApi' },
      },
    },
  };
  const paths: Record<string, Record<string, Schema>> = {};
  const at = (path: string) => (paths[path] ??= {});

  const registry: Registry = new Map(resources.map((r) => [r.type, r]));
  for (const r of resources) {
    Object.assign(schemas, resourceSchemas(r));
    for (const [name, action] of Object.entries(r.actions ?? {}))
      if (action.path) at(actionPath(r, action)).post = actionOperation(r, name, action, registry);
    if (!r.path) continue;
    const collection = `/api/${r.path}`;
    const member = `${collection}/{id}`;
    const type = r.type;
    const tagged = { tags: [type], security: MEMBER_SECURITY };
    const visible = r.access.visible ? ' Operators see only their own records.' : '';
    const writable = r.access.writable ? ` ${r.access.writableNote ?? 'Operators change only their own record'} (403 for others).` : '';
    if (r.operations.list) {
      at(collection).get = {
        operationId: `list${type}s`,
        summary: `List ${type} records`,
        description: `The ${type} records of the caller's organisation, filtered, sorted and paged (keyset cursors in the links, or page[offset]). ${rolesText(r.access.read)}${visible}`,
        ...tagged,
        parameters: queryParameters(r, true, registry),
        responses: { '200': ok('OK', ref(`${type}ListDocument`)), ...errors([403]) },
      };
    }
    if (r.operations.get) {
      at(member).get = {
        operationId: `get${type}`,
        summary: `Read one ${type}`,
        description: `One ${type} of the caller's organisation; 404 for an unknown id or another organisation's record. ${rolesText(r.access.read)}${visible}`,
        ...tagged,
        parameters: [idParameter, ...queryParameters(r, false, registry)],
        responses: { '200': ok('OK', ref(`${type}Document`)), ...errors([403, 404]) },
      };
      // The relationships whose related link answers (routes.ts, `registerRelated`): those of a known type.
      for (const [name, relationship] of Object.entries(r.relationships)) {
        const related = registry.get(relationship.type);
        if (!related) continue;
        const many = relationship.cardinality === 'many';
        at(`${member}/${name}`).get = {
          operationId: `get${type}${name.replace(/(?:^|_)([^_])/g, (_, letter: string) => letter.toUpperCase())}`,
          summary: `Read the ${name} of one ${type}`,
          description: many
            ? `The ${related.type} records of the ${type}'s \`${name}\` relationship (its related link), filtered, sorted and paged as a list. 404 when the ${type} is not visible. ${rolesText(related.access.read)}`
            : `The ${type}'s \`${name}\` (its related link): the ${related.type}, or \`data: null\` when there is none or the caller may not see it. 404 when the ${type} is not visible. ${rolesText(related.access.read)}`,
          ...tagged,
          parameters: [idParameter, ...queryParameters(related, many, registry)],
          responses: {
            '200': ok('OK', ref(many ? `${related.type}ListDocument` : `${related.type}RelatedDocument`)),
            ...errors([403, 404]),
          },
        };
      }
    }
    for (const [alias, { summary }] of Object.entries(r.aliases ?? {})) {
      at(`${collection}/${alias}`).get = {
        operationId: `get${type}${alias[0].toUpperCase()}${alias.slice(1)}`,
        summary,
        description: `${summary}. ${rolesText(r.access.read)}`,
        ...tagged,
        parameters: queryParameters(r, false, registry),
        responses: { '200': ok('OK', ref(`${type}Document`)), ...errors([403, 404]) },
      };
    }
    if (r.operations.create) {
      const extra = r.create ? { '200': ok('The existing record (idempotent repeat or update)', ref(`${type}Document`)) } : {};
      at(collection).post = {
        operationId: `create${type}`,
        summary: `Create a ${type}`,
        description: `Creates a ${type} in the caller's organisation. References may be given as \`x_id\` attributes or as relationship linkage; ids in the example must be replaced with your own records'. ${rolesText(r.access.create)}`,
        ...tagged,
        parameters: queryParameters(r, false, registry),
        requestBody: requestBody(type, r.attributes, 'create'),
        responses: {
          '201': ok('Created', ref(`${type}Document`), { Location: header('Location') }),
          ...extra,
          ...errors([403, 409, 413, 415, 422]),
        },
      };
    }
    if (r.operations.update) {
      at(member).patch = {
        operationId: `update${type}`,
        summary: `Update a ${type}`,
        description: `Changes the attributes given; others keep their values. \`data.id\` must equal the path's id (409 otherwise). ${rolesText(r.access.update)}${visible}${writable}`,
        ...tagged,
        parameters: [idParameter, ...queryParameters(r, false, registry)],
        requestBody: requestBody(type, r.attributes, 'update'),
        responses: { '200': ok('OK', ref(`${type}Document`)), ...errors([403, 404, 409, 413, 415, 422]) },
      };
    }

    if (r.operations.delete) {
      at(member).delete = {
        operationId: `delete${type}`,
        summary: `Delete a ${type}`,
        description:
          `Removes the ${type} and answers 200 with \`meta.removed\`, the exact counts by type of what went. A record that others ` +
          `still name is refused with 409, one error per referencing type with its count (see docs/api.md for what each type ` +
          `takes along instead). ${rolesText(r.access.delete)}${visible}`,
        ...tagged,
        parameters: [idParameter],
        responses: { '200': ok('Deleted', ref('DeleteDocument')), ...errors([403, 404, 409]) },
      };
    }
  }
  if (resources.some((r) => r.events !== false)) at('/api/events').get = eventStreamOperation(registry);
  if (resources.some((r) => r.type === 'Conversation' && r.events !== false)) at('/api/conversations/{id}/typing').post = typingOperation();

  const responses = Object.fromEntries(
    Object.entries(ERROR_RESPONSES).map(([status, description]) => [
      `Error${status}`,
      { description, headers: { ...RATE_LIMIT_HEADERS, ...(ERROR_HEADERS[Number(status)] ?? {}) }, content: jsonApi(ref('ErrorDocument')) },
    ]),
  );
  return prune({
    openapi: '3.1.0',
    info: {
      title: 'Parley API',
      version: options.version ?? '0.1.0',
      description:
        'Conversations, AI agents, operators and SIP telephony for one organisation per credential. JSON:API 1.0 ' +
        '(application/vnd.api+json; no extensions, profiles ignored). Every request carries `Authorization: Bearer <credential>`: ' +
        "a user token (from login), a secret key, or a publishable key (login only). Each acts with its user's role in the " +
        'organisation: owner and admin manage everything, operators read and write conversations and their own SIP user and status. ' +
        'Every response under /api carries RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset; a method a path does not ' +
        'offer answers 405 with Allow.',
    },
    servers: [{ url: options.serverUrl ?? '/' }],
    security: MEMBER_SECURITY,
    paths,
    components: {
      schemas,
      responses,
      headers: HEADERS,
      securitySchemes: SECURITY,
    },
  });
}
