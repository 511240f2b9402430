/** Derives every HTTP route from the resource definitions. */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { RawBuilder } from 'kysely';
import type { DatabaseHandle } from '../db/connection.js';
import { ApiError, notFound, unauthenticated } from './errors.js';
import { parseQuery, type Registry } from './query/parse.js';
import { cursorCodec, type CursorCodec } from './query/cursor.js';
import { cursorFromRow } from './query/sql.js';
import type { ParsedQuery } from './query/types.js';
import { fetchById, listRows, relatedRowsOf, renderWithIncludes, type Reader } from './read.js';
import type { Principal } from './principal.js';
import type { ActionResult, CustomAction, RelationshipDef, ResourceDef } from './resource.js';
import { linkageColumn } from './select.js';
import { requirePermission } from './scope.js';
import { document, documentJson, plainRendering, queryString, type RenderContext } from './serialize.js';
import { isPlainObject } from './kinds.js';
import { inputSpec, UUID_PATTERN, validateBody, validateDocument, type WriteKind } from './validate.js';
import { asPrincipal } from './actor.js';
import { createRecords, type Records, type RenderWritten, writtenRow } from './records.js';
import type { AppServices } from './resource.js';

export interface EngineOptions extends AppServices {
  database: DatabaseHandle;
}

type Query = Record<string, unknown>;

export function buildRegistry(resources: ResourceDef[]): Registry {
  return new Map(resources.map((r) => [r.type, r]));
}

export function registerResources(app: FastifyInstance, resources: ResourceDef[], options: EngineOptions): Registry {
  const registry = buildRegistry(resources);
  const db = options.database.db;

  const records: Records = options.records ?? createRecords({ db, registry, services: options });

  /** The authenticated caller of a request, as a reader and as the actor of its writes. */
  const context = (request: FastifyRequest) => {
    const principal = request.principal;
    // Authentication runs before every /api route; should a request ever arrive without it, it is refused, not a 500.
    if (!principal) throw unauthenticated();
    const reader: Reader = { db, principal, registry };
    return { principal, reader, actor: asPrincipal(principal) };
  };
  const renderContext = (request: FastifyRequest, principal: Principal, query: ParsedQuery): RenderContext => ({
    // Absolute base for links: the configured public URL, else the request's own origin.
    baseUrl: options.config.publicUrl ?? `${request.protocol}://${request.host}`,
    principal,
    registry,
    fields: query.fields,
    includeLimits: { records: options.config.includeMaxRecords, bytes: options.config.includeMaxBytes },
  });

  /** Renders one record as a single-resource document (404 when it is not visible). */
  async function single(
    request: FastifyRequest,
    resource: ResourceDef,
    id: string,
    query: ParsedQuery,
    meta = {},
    on = db,
    written?: ActionResult,
  ) {
    const { principal } = context(request);
    const reader: Reader = { db: on, principal, registry };
    // A write's record: the row the write returned when it has one (no read-back).
    const row = await writtenRow(reader, resource, written ?? { id, status: 200 });
    const ctx = renderContext(request, principal, query);
    if (written?.revealed) ctx.revealed = new Map([[id, written.revealed]]);
    const { data, included } = await renderWithIncludes(reader, resource, [row], query.include, ctx);
    return document(data[0], included, meta);
  }

  /** A GET of one record, whose id `idOf` gives (from the path, or an alias's), rendered as text when it is plain. */
  async function getOne(
    request: FastifyRequest,
    reply: FastifyReply,
    resource: ResourceDef,
    idOf: (principal: Principal) => string | null,
  ) {
    const { principal, reader } = context(request);
    requirePermission(resource, principal, 'read');
    const query = parseQuery(request.query as Query, resource, registry, 'single');
    const id = idOf(principal);
    if (!id) throw notFound();
    const ctx = renderContext(request, principal, query);
    if (!noIncludes(query) || !plainRendering(resource, ctx)) return single(request, resource, id, query);
    const row = await fetchById(reader, resource, id);
    if (!row) throw notFound();
    return reply.send(documentJson(resource, row, ctx, {}));
  }

  /**
   * One page of `resource`'s records as a list document whose links are built on `url`: the collection, or
   * a record's to-many related link, which `within` narrows the rows to.
   */
  async function listPage(request: FastifyRequest, reply: FastifyReply, resource: ResourceDef, url: string, within?: RawBuilder<unknown>) {
    const { principal, reader } = context(request);
    // Cursors are bound to the caller's organisation: another organisation's cursor does not verify.
    const cursors = cursorCodec(options.signingKey, principal.organisationId);
    const query = parseQuery(request.query as Query, resource, registry, 'list', { cursors });
    const result = await listRows(reader, resource, query, within);
    const ctx = renderContext(request, principal, query);
    const page: Record<string, unknown> = { limit: query.page.limit };
    if (query.page.offset !== undefined) page.offset = query.page.offset;
    if (result.total !== undefined) page.total = result.total;
    const links = listLinks(`${ctx.baseUrl}${url}`, request.query as Query, query, result, cursors);
    if (noIncludes(query) && plainRendering(resource, ctx)) {
      return reply.send(documentJson(resource, result.rows, ctx, { page }, links));
    }
    const { data, included } = await renderWithIncludes(reader, resource, result.rows, query.include, ctx);
    return document(data, included, { page }, links);
  }

  /**
   * `GET /api/{path}/{id}/{relationship}`: the related resource(s) of one record, as JSON:API's related
   * resource link (section 6.3.1) answers: a to-many relationship as a list of the related type (filtered,
   * sorted and paged as a list), a to-one as a single document whose data is the record or null. The
   * parent must be visible (404), and the related type readable by the caller's role (403).
   */
  function registerRelated(resource: ResourceDef, member: string, name: string, relationship: RelationshipDef, allowVisitor: boolean) {
    const url = `${member}/${name}`;
    const related = registry.get(relationship.type);
    if (!related) return;
    app.get(url, { config: { allowVisitor: allowVisitor && related.access.read.includes('visitor') } }, async (request, reply) => {
      const { principal, reader } = context(request);
      requirePermission(resource, principal, 'read');
      const id = idParam(request);
      const parent = await fetchById(reader, resource, id);
      if (!parent) throw notFound();
      requirePermission(related, principal, 'read');
      if (relationship.cardinality === 'many') {
        return listPage(request, reply, related, `/api/${resource.path}/${id}/${name}`, relatedRowsOf(relationship, id));
      }
      const query = parseQuery(request.query as Query, related, registry, 'single');
      const ctx = renderContext(request, principal, query);
      const self = `${ctx.baseUrl}/api/${resource.path}/${id}/${name}`;
      const relatedId = relationship.resolve ? relationship.resolve(principal) : parent[linkageColumn(name)];
      const row = relatedId ? await fetchById(reader, related, String(relatedId)) : undefined;
      if (!row) return document(null, [], {}, { self });
      const { data, included } = await renderWithIncludes(reader, related, [row], query.include, ctx);
      return document(data[0], included, {}, { self });
    });
    methodNotAllowed(app, url, ['GET']);
  }

  function created(reply: FastifyReply, doc: Record<string, unknown>, status: 200 | 201) {
    const self = ((doc.data as Record<string, unknown>).links as { self?: string } | undefined)?.self;
    if (status === 201 && self) reply.header('Location', self);
    return reply.code(status).send(doc);
  }

  for (const resource of resources) {
    for (const [name, action] of Object.entries(resource.actions ?? {})) if (action.path) registerAction(resource, name, action);
    if (!resource.path) continue;
    const collection = `/api/${resource.path}`;
    const member = `${collection}/:id`;
    const relationships = Object.keys(resource.relationships);
    /**
     * The body's values, once the records service has checked 404 and 403 (it calls this), and where a reference
     * given as linkage came from: a reference the service refuses is reported on the relationship the client sent.
     */
    const body = (request: FastifyRequest, kind: WriteKind, id?: string) => {
      let relocate = (error: unknown) => error;
      const validated = () => {
        const spec = inputSpec(resource.attributes, kind === 'update' ? 'update' : 'create');
        const document = validateDocument(request.body, { type: resource.type, kind, id, relationships, ...spec });
        relocate = document.relocate;
        return document.values;
      };
      return { validated, relocate: (error: unknown) => Promise.reject(relocate(error)) };
    };
    const allowed = { [collection]: [] as string[], [member]: [] as string[] };
    /** Route options: a visitor credential reaches only what the resource's access rules grant visitors. */
    const visitorMay = (operation: 'read' | 'create' | 'update') => ({
      config: { allowVisitor: resource.access[operation]?.includes('visitor') ?? false },
    });

    if (resource.operations.list) {
      allowed[collection].push('GET');
      app.get(collection, visitorMay('read'), async (request, reply) => {
        requirePermission(resource, context(request).principal, 'read');
        return listPage(request, reply, resource, collection);
      });
    }

    for (const [alias, { resolve }] of Object.entries(resource.aliases ?? {})) {
      // A fixed name under the collection (`/api/users/me`): the router prefers it to the `:id` route.
      const url = `${collection}/${alias}`;
      app.get(url, visitorMay('read'), (request, reply) => getOne(request, reply, resource, resolve));
      methodNotAllowed(app, url, ['GET']);
    }

    if (resource.operations.get) {
      allowed[member].push('GET');
      app.get(member, visitorMay('read'), (request, reply) => getOne(request, reply, resource, () => idParam(request)));
      for (const [name, relationship] of Object.entries(resource.relationships)) {
        registerRelated(resource, member, name, relationship, visitorMay('read').config.allowVisitor);
      }
    }

    if (resource.operations.create) {
      allowed[collection].push('POST');
      app.post(collection, visitorMay('create'), async (request, reply) => {
        const { principal, actor } = context(request);
        requirePermission(resource, principal, 'create');
        const query = parseQuery(request.query as Query, resource, registry, 'single');
        const { validated, relocate } = body(request, 'create');
        const render: RenderWritten<Record<string, unknown>> = (trx, result) =>
          single(request, resource, result.id, query, {}, trx, result);
        const { status, record } = await records.create(actor, resource.type, {}, { render, validated }).catch(relocate);
        return created(reply, record, status);
      });
    }

    if (resource.operations.update) {
      allowed[member].push('PATCH');
      app.patch(member, visitorMay('update'), async (request) => {
        const { principal, actor } = context(request);
        requirePermission(resource, principal, 'read');
        const id = idParam(request);
        const query = parseQuery(request.query as Query, resource, registry, 'single');
        // The service answers 404 for an invisible record before 403, and both before the body's own problems.
        const { validated, relocate } = body(request, 'update', id);
        const render: RenderWritten<Record<string, unknown>> = (trx) => single(request, resource, id, query, {}, trx);
        const { record } = await records.update(actor, resource.type, id, {}, { render, validated }).catch(relocate);
        return record;
      });
    }

    if (resource.operations.delete) {
      allowed[member].push('DELETE');
      app.delete(member, async (request) => {
        const { principal, actor } = context(request);
        requirePermission(resource, principal, 'read');
        const id = idParam(request);
        parseQuery(request.query as Query, resource, registry, 'delete');
        const { removed } = await records.delete(actor, resource.type, id);
        // 200 with a meta-only document (JSON:API 1.1 section 9.3.3), so the exact counts of a cascade are told.
        return { meta: { removed }, jsonapi: { version: '1.0' } };
      });
    }

    for (const [url, methods] of Object.entries(allowed)) if (methods.length > 0) methodNotAllowed(app, url, methods);
  }

  function registerAction(resource: ResourceDef, name: string, action: CustomAction) {
    const url = action.member ? `/api/${resource.path}/:id/${action.path}` : `/api/${action.path}`;
    const input = inputSpec(action.input, 'create');
    const addressBudget = action.rateLimitPerAddress?.(options);
    const config = {
      allowPublishable: action.allowPublishable ?? false,
      allowVisitor: action.roles?.includes('visitor') ?? false,
      ...(addressBudget ? { addressBudget } : {}),
    };
    const refused = action.onRefusedBody;
    const routeOptions = {
      config,
      ...(action.bodyLimit !== undefined ? { bodyLimit: action.bodyLimit } : {}),
      ...(refused
        ? {
            onError: async (request: FastifyRequest, _reply: unknown, error: Error & { status?: number; statusCode?: number }) => {
              const status = error instanceof ApiError ? error.status : (error.statusCode ?? 500);
              if (REFUSED_BODY_STATUSES.has(status)) await refused(options, request.ip);
            },
          }
        : {}),
    };
    app.post(url, routeOptions, async (request, reply) => {
      const { actor } = context(request);
      const id = action.member ? idParam(request) : undefined;
      // A member action reads its query like a PATCH (before the 404); a collection action after its role check.
      const readQuery = () => parseQuery(request.query as Query, resource, registry, 'single');
      let query = action.member ? readQuery() : undefined;
      const body = () => {
        query ??= readQuery();
        return validateBody(request.body, { type: resource.type, ...(id ? { kind: 'update', id } : { kind: 'action' }), ...input });
      };
      // The response closes before it has finished only when the connection went first: the client is gone.
      const gone = new AbortController();
      reply.raw.once('close', () => {
        if (!reply.raw.writableFinished) gone.abort();
      });
      const render: RenderWritten<Record<string, unknown>> = (trx, result) =>
        single(request, resource, result.id, query!, result.meta ?? {}, trx, id ? result : undefined);
      const { status, record } = await records.perform(actor, resource.type, name, id, body, {
        render,
        clientAddress: request.ip,
        signal: gone.signal,
      });
      return created(reply, record, status);
    });
    methodNotAllowed(app, url, ['POST']);
  }

  return registry;
}

/** Answers that refuse a request's body (as opposed to its credentials or the server's state). */
const REFUSED_BODY_STATUSES = new Set([400, 413, 415, 422]);

/**
 * 405 with `Allow` for the methods `url` does not offer (HEAD comes with GET).
 * `public` paths answer it without a credential, like their own routes.
 */
export function methodNotAllowed(app: FastifyInstance, url: string, methods: string[], options: { public?: boolean } = {}): void {
  const allow = [...methods, ...(methods.includes('GET') ? ['HEAD'] : [])].join(', ');
  app.route({
    // Every method the server routes (the HTTP server registers all that Node parses); HEAD comes with GET.
    method: app.supportedMethods.filter((m) => !methods.includes(m) && !(m === 'HEAD' && methods.includes('GET'))),
    url,
    config: { public: options.public ?? false },
    // Answered before the body is read, after the refused credential (a global preParsing hook, which runs
    // first): a 405 needs no body, and Fastify would otherwise refuse a body-less QUERY (RFC 10008 wants a
    // Content-Type) with 400 before any handler.
    preParsing: async (_request, reply) => {
      reply.header('Allow', allow);
      throw ApiError.of('method_not_allowed', `Allowed: ${allow}.`);
    },
    handler: async () => {
      throw ApiError.of('method_not_allowed', `Allowed: ${allow}.`);
    },
  });
}

/** No `include`: the document's primary data is all there is to render. */
const noIncludes = (query: ParsedQuery) => Object.keys(query.include).length === 0;

/** The `:id` path parameter; a malformed id names no record. */
function idParam(request: FastifyRequest): string {
  const id = (request.params as { id: string }).id;
  if (!UUID_PATTERN.test(id)) throw notFound();
  return id.toLowerCase();
}

/** self, first, next and prev links of a list page (keyset unless the request pages by offset). */
function listLinks(
  collectionUrl: string,
  raw: Query,
  query: ParsedQuery,
  result: { rows: Record<string, unknown>[]; hasMore: boolean },
  cursors: CursorCodec,
): Record<string, string | null> {
  const { page, sort } = query;
  const { after: _a, before: _b, offset: _o, ...keepPage } = isPlainObject(raw.page) ? raw.page : {};
  const link = (extra: Query) => `${collectionUrl}${queryString({ ...raw, page: { ...keepPage, ...extra } })}`;
  const first = result.rows[0];
  const last = result.rows[result.rows.length - 1];
  const links: Record<string, string | null> = {
    self: `${collectionUrl}${queryString(raw)}`,
    first: link({}),
    next: null,
    prev: null,
  };
  if (page.offset !== undefined) {
    if (result.hasMore) links.next = link({ offset: page.offset + page.limit });
    if (page.offset > 0) links.prev = link({ offset: Math.max(0, page.offset - page.limit) });
    return links;
  }
  const forwardMore = page.before ? true : result.hasMore;
  const backwardMore = page.before ? result.hasMore : page.after !== undefined;
  if (forwardMore && last) links.next = link({ after: cursors.encode(sort, cursorFromRow(sort, last)) });
  if (backwardMore && first) links.prev = link({ before: cursors.encode(sort, cursorFromRow(sort, first)) });
  return links;
}
