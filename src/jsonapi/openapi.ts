/** The OpenAPI 3.1 document, derived from the same resource definitions as the routes. */
import { fieldNames, readableAttributes, type AttributeDef, type CustomAction, type ResourceDef } from './resource.js';

type Schema = Record<string, unknown>;
type Operation = { method: 'get' | 'post' | 'patch'; path: string };

const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
const nullable = (schema: Schema, isNullable?: boolean): Schema =>
  isNullable ? { ...schema, type: [schema.type as string, 'null'] } : schema;

/** JSON Schema of one attribute's value. */
export function attributeSchema(def: AttributeDef, role: 'read' | 'write'): Schema {
  const base: Schema = (() => {
    switch (def.kind) {
      case 'string':
        return {
          type: 'string',
          minLength: def.minLength,
          maxLength: def.maxLength,
          pattern: def.pattern,
          description: def.maxBytes ? `At most ${def.maxBytes} bytes of UTF-8.` : undefined,
        };
      case 'enum':
        return { type: 'string', enum: def.nullable ? [...def.values!, null] : [...def.values!] };
      case 'uuid':
        return { type: 'string', format: 'uuid' };
      case 'integer':
        return { type: 'integer', minimum: def.minimum, maximum: def.maximum };
      case 'boolean':
        return { type: 'boolean' };
      case 'timestamp':
        return { type: 'string', format: 'date-time' };
      case 'object':
        return { type: 'object', description: def.maxBytes ? `At most ${def.maxBytes} bytes of JSON.` : undefined };
      case 'string_array':
        return {
          type: 'array',
          minItems: def.minItems,
          maxItems: def.maxItems,
          items: { type: 'string', minLength: def.items?.minLength, maxLength: def.items?.maxLength, pattern: def.items?.pattern },
        };
    }
  })();
  const schema = nullable(base, def.nullable);
  if (role === 'write' && def.default !== undefined && typeof def.default !== 'function') schema.default = def.default;
  if (def.writeOnly) schema.writeOnly = true;
  if (def.description) schema.description = def.description;
  return prune(schema);
}

/** Drops undefined members so the document stays small and valid. */
function prune<T>(value: T): T {
  if (Array.isArray(value)) return value.map(prune) as T;
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined).map(([k, v]) => [k, prune(v)])) as T;
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
  const schemas: Record<string, Schema> = {
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
    [`${t}Document`]: {
      type: 'object',
      required: ['data', 'included', 'meta', 'jsonapi'],
      properties: { data: ref(`${t}Resource`), included: ref('Included'), meta: { type: 'object' }, jsonapi: ref('JsonApi') },
    },
    [`${t}ListDocument`]: {
      type: 'object',
      required: ['data', 'included', 'meta', 'links', 'jsonapi'],
      properties: {
        data: { type: 'array', items: ref(`${t}Resource`) },
        included: ref('Included'),
        meta: ref('PageMeta'),
        links: ref('PageLinks'),
        jsonapi: ref('JsonApi'),
      },
    },
  };
  return schemas;
}

/** The request document of a write: `data.type`, `data.attributes` (and `data.id` for updates). */
function requestSchema(type: string, input: Record<string, AttributeDef>, kind: 'create' | 'update' | 'action'): Schema {
  const properties: Record<string, Schema> = {};
  const required: string[] = [];
  for (const [name, def] of Object.entries(input)) {
    const flag = kind === 'update' ? def.update : def.create;
    if (!flag) continue;
    properties[name] = attributeSchema(def, 'write');
    if (flag === 'required') required.push(name);
  }
  const data: Schema = {
    type: 'object',
    required: kind === 'update' ? ['type', 'id'] : ['type'],
    properties: {
      type: { const: type },
      ...(kind === 'update' ? { id: { type: 'string', format: 'uuid' } } : {}),
      attributes: { type: 'object', additionalProperties: false, properties, ...(required.length ? { required } : {}) },
      relationships: { type: 'object', maxProperties: 0 },
    },
  };
  return { type: 'object', required: ['data'], properties: { data } };
}

const ERROR_RESPONSES: Record<number, string> = {
  400: 'Malformed request or query parameter',
  401: 'Missing, malformed, forged, expired or revoked credential',
  403: 'Not allowed for this credential or role',
  404: 'No such record visible to the caller',
  405: 'Method not allowed on this path',
  406: 'Not acceptable',
  409: 'Type or id mismatch, or uniqueness violation',
  413: 'Body too large',
  415: 'Unsupported media type',
  422: 'Invalid, missing or unknown attributes',
  429: 'Rate limited',
  500: 'Internal error',
  503: 'Database unavailable',
};

function errors(statuses: number[]): Record<string, Schema> {
  return Object.fromEntries(statuses.map((s) => [String(s), { $ref: `#/components/responses/Error${s}` }]));
}

const jsonApi = (schema: Schema) => ({ 'application/vnd.api+json': { schema } });

function queryParameters(resource: ResourceDef, list: boolean): Schema[] {
  const parameters: Schema[] = [
    { name: 'include', in: 'query', schema: { type: 'string' }, description: 'Comma-separated relationship paths (at most two levels).' },
    {
      name: 'fields',
      in: 'query',
      style: 'deepObject',
      explode: true,
      schema: { type: 'object', additionalProperties: { type: 'string' } },
      description: `Sparse fieldsets, fields[Type]=a,b. ${resource.type}: ${fieldNames(resource).join(', ')}.`,
    },
  ];
  if (!list) return parameters;
  const sortable = ['id', ...Object.entries(resource.attributes).filter(([, a]) => a.sortable).map(([n]) => n)];
  const filterable = ['id', ...Object.entries(resource.attributes).filter(([, a]) => a.filterable).map(([n]) => n)];
  parameters.push(
    {
      name: 'filter',
      in: 'query',
      style: 'deepObject',
      explode: true,
      schema: { type: 'object' },
      description:
        `filter[attr]=v or filter[attr][op]=v with op in eq, not_eq, in, less_than, greater_than, less_than_or_equal, ` +
        `greater_than_or_equal, is_nil, contains; nest with filter[and][N], filter[or][N], filter[not]. Filterable: ${filterable.join(', ')}.`,
    },
    {
      name: 'sort',
      in: 'query',
      schema: { type: 'string' },
      description: `Comma-separated keys of ${sortable.join(', ')}; prefix none or + (ascending, nulls last), - (descending, nulls first), ++ (ascending, nulls first), -- (descending, nulls last).`,
    },
    { name: 'page[limit]', in: 'query', schema: { type: 'integer', minimum: 1, default: 25 }, description: 'Page size; above 100 is clamped to 100.' },
    { name: 'page[offset]', in: 'query', schema: { type: 'integer', minimum: 0, maximum: 10000 } },
    { name: 'page[after]', in: 'query', schema: { type: 'string' }, description: 'Keyset cursor from links.next.' },
    { name: 'page[before]', in: 'query', schema: { type: 'string' }, description: 'Keyset cursor from links.prev.' },
    { name: 'page[count]', in: 'query', schema: { type: 'boolean' }, description: 'Adds meta.page.total.' },
  );
  return parameters;
}

const idParameter = { name: 'id', in: 'path', required: true, schema: { type: 'string' } };

/** method + path of every operation the definitions yield (the spec's 22). */
export function openApiOperations(resources: ResourceDef[]): Operation[] {
  const operations: Operation[] = [];
  for (const r of resources) {
    if (!r.path) {
      for (const action of Object.values(r.actions ?? {})) operations.push({ method: 'post', path: `/api/${action.path}` });
      continue;
    }
    if (r.operations.list) operations.push({ method: 'get', path: `/api/${r.path}` });
    if (r.operations.get) operations.push({ method: 'get', path: `/api/${r.path}/{id}` });
    if (r.operations.create) operations.push({ method: 'post', path: `/api/${r.path}` });
    if (r.operations.update) operations.push({ method: 'patch', path: `/api/${r.path}/{id}` });
    for (const action of Object.values(r.actions ?? {})) operations.push({ method: 'post', path: `/api/${action.path}` });
  }
  return operations;
}

function actionOperation(resource: ResourceDef, name: string, action: CustomAction): Schema {
  return {
    operationId: name,
    summary: action.summary,
    tags: [resource.type],
    parameters: queryParameters(resource, false),
    requestBody: { required: true, content: jsonApi(requestSchema(resource.type, action.input, 'action')) },
    responses: { '200': { description: 'OK', content: jsonApi(ref(`${resource.type}Document`)) }, ...errors([400, 401, 403, 409, 415, 422, 429, 500, 503]) },
  };
}

export function buildOpenApi(resources: ResourceDef[], options: { serverUrl?: string; version?: string } = {}): Record<string, unknown> {
  const schemas: Record<string, Schema> = {
    JsonApi: { type: 'object', properties: { version: { const: '1.0' } } },
    Included: { type: 'array', items: { type: 'object', required: ['id', 'type'] } },
    PageMeta: {
      type: 'object',
      properties: { page: { type: 'object', properties: { limit: { type: 'integer' }, offset: { type: 'integer' }, total: { type: 'integer' } } } },
    },
    PageLinks: {
      type: 'object',
      properties: Object.fromEntries(['self', 'first', 'next', 'prev'].map((k) => [k, { type: ['string', 'null'], format: 'uri' }])),
    },
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
              id: { type: 'string' },
              status: { type: 'string' },
              code: { type: 'string' },
              title: { type: 'string' },
              detail: { type: 'string' },
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

  for (const r of resources) {
    Object.assign(schemas, resourceSchemas(r));
    for (const [name, action] of Object.entries(r.actions ?? {})) at(`/api/${action.path}`).post = actionOperation(r, name, action);
    if (!r.path) continue;
    const collection = `/api/${r.path}`;
    const member = `${collection}/{id}`;
    const type = r.type;
    if (r.operations.list) {
      at(collection).get = {
        operationId: `list${type}s`,
        summary: `List ${type} records`,
        tags: [type],
        parameters: queryParameters(r, true),
        responses: { '200': { description: 'OK', content: jsonApi(ref(`${type}ListDocument`)) }, ...errors([400, 401, 403, 406, 429, 500, 503]) },
      };
    }
    if (r.operations.get) {
      at(member).get = {
        operationId: `get${type}`,
        summary: `Read one ${type}`,
        tags: [type],
        parameters: [idParameter, ...queryParameters(r, false)],
        responses: { '200': { description: 'OK', content: jsonApi(ref(`${type}Document`)) }, ...errors([400, 401, 403, 404, 406, 429, 500, 503]) },
      };
    }
    if (r.operations.create) {
      const extra = r.create ? { '200': { description: 'The existing record (idempotent repeat or update)', content: jsonApi(ref(`${type}Document`)) } } : {};
      at(collection).post = {
        operationId: `create${type}`,
        summary: `Create a ${type}`,
        tags: [type],
        parameters: queryParameters(r, false),
        requestBody: { required: true, content: jsonApi(requestSchema(type, r.attributes, 'create')) },
        responses: {
          '201': {
            description: 'Created',
            headers: { Location: { schema: { type: 'string', format: 'uri' } } },
            content: jsonApi(ref(`${type}Document`)),
          },
          ...extra,
          ...errors([400, 401, 403, 406, 409, 413, 415, 422, 429, 500, 503]),
        },
      };
    }
    if (r.operations.update) {
      at(member).patch = {
        operationId: `update${type}`,
        summary: `Update a ${type}`,
        tags: [type],
        parameters: [idParameter, ...queryParameters(r, false)],
        requestBody: { required: true, content: jsonApi(requestSchema(type, r.attributes, 'update')) },
        responses: { '200': { description: 'OK', content: jsonApi(ref(`${type}Document`)) }, ...errors([400, 401, 403, 404, 406, 409, 413, 415, 422, 429, 500, 503]) },
      };
    }
  }

  const responses = Object.fromEntries(
    Object.entries(ERROR_RESPONSES).map(([status, description]) => [`Error${status}`, { description, content: jsonApi(ref('ErrorDocument')) }]),
  );
  return prune({
    openapi: '3.1.0',
    info: {
      title: 'Parley API',
      version: options.version ?? '0.1.0',
      description: 'Conversations, AI agents, operators and SIP telephony for one organisation per credential. JSON:API 1.0.',
    },
    servers: [{ url: options.serverUrl ?? '/' }],
    security: [{ bearer: [] }],
    paths,
    components: {
      schemas,
      responses,
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' } },
    },
  });
}
