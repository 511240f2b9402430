/**
 * The declarative resource vocabulary. A resource module states its table,
 * attributes, relationships, who may do what, and its few special actions;
 * the engine derives routes, validation, queries, serialisation and OpenAPI
 * from that alone.
 */
import type { Redis } from 'ioredis';
import type { RawBuilder } from 'kysely';
import type { Config } from '../config/index.js';
import type { Database } from '../db/connection.js';
import type { Db } from '../db/schema.js';
import type { Actor } from './actor.js';
import type { Principal, PrincipalRole, Role } from './principal.js';
import type { Rendered, WriteValues } from './typed-writes.js';

/** Every resource by type. */
export type Registry = ReadonlyMap<string, ResourceDef>;

/** A record's columns (or rendering) by name. */
export type Row = Record<string, unknown>;

/** PostgreSQL type of the column behind an attribute; drives casts in filters and cursors. */
export type SqlType = 'text' | 'uuid' | 'integer' | 'boolean' | 'timestamptz' | 'jsonb' | 'text[]';

export type AttributeKind = 'string' | 'enum' | 'uuid' | 'integer' | 'boolean' | 'timestamp' | 'object' | 'string_array';

export interface AttributeDef {
  kind: AttributeKind;
  /** Column name; defaults to the attribute name. */
  column?: string;
  /** May hold null (in responses and as input). */
  nullable?: boolean;
  /** Accepted in a create payload; 'required' means it must be present. */
  create?: boolean | 'required';
  /** Accepted in an update payload. */
  update?: boolean;
  sortable?: boolean;
  filterable?: boolean;
  /**
   * Text searched by words: `filter[name][matches]=some words` (PostgreSQL full text search, `simple`
   * configuration, each word a prefix), backed by a GIN index on `to_tsvector('simple', column)`. Enough on its
   * own for `matches`, the only operator such an attribute takes unless it is also `filterable`.
   */
  searchable?: boolean;
  /** Accepted as input but never returned (e.g. gateway password). */
  writeOnly?: boolean;
  /**
   * Left out of what a website visitor reads, through the API and its event stream (a conversation's `analysis`:
   * what the organisation concluded about the visitor is the organisation's). A list of keys hides only those keys
   * of an object attribute (a conversation's `metadata.handoff_reason`: the widget shows a friendly line instead).
   */
  hiddenFromVisitors?: boolean | readonly string[];
  /**
   * Made by the create action and shown only in the response that creates the
   * record (API key tokens, webhook secrets); `null` in every later rendering.
   */
  revealedOnCreate?: boolean;
  /** Value set for `enum` attributes. */
  values?: readonly string[];
  /** Applied on create when the attribute is omitted. */
  default?: unknown | (() => unknown);
  minLength?: number;
  maxLength?: number;
  pattern?: string;
  minimum?: number;
  maximum?: number;
  /** Upper bound in bytes: of a string's UTF-8, or of an `object`'s JSON text. */
  maxBytes?: number;
  minItems?: number;
  maxItems?: number;
  /** Bounds for each element of a `string_array`. */
  items?: { minLength?: number; maxLength?: number; pattern?: string };
  /** `seconds` renders timestamps as YYYY-MM-DDTHH:MM:SSZ and stores them truncated. */
  precision?: 'seconds' | 'milliseconds';
  /** A uuid naming a record of this type, which must be visible to the caller. */
  references?: string;
  /** The resource's own create action checks the reference (e.g. while locking the row), so the engine does not. */
  referenceCheckedByAction?: boolean;
  /** Extra validation of one value; returns a message when invalid. */
  check?: (value: unknown) => string | undefined;
  /**
   * Computed value: an SQL expression over the row (aliased `t`) instead of a column. Read only, unless
   * `storedByHook`; filterable when declared so (the expression is then part of the WHERE clause).
   */
  expression?: (principal: Principal) => RawBuilder<unknown>;
  /**
   * A computed attribute that writes accept all the same: the resource's own hooks store it elsewhere
   * (a member's `role` lives in the membership, not the user row). The engine never writes it to a column.
   */
  storedByHook?: boolean;
  /** No column of the type's table: the hooks make it from or store it in other columns (a user's `password`). */
  virtual?: boolean;
  description?: string;
  /** A value for the OpenAPI examples, where the kind's own (kinds.ts) would not be accepted (an e-mail address). */
  example?: unknown;
}

export interface RelationshipDef {
  /** Related resource type name, e.g. 'AiAgent'. */
  type: string;
  cardinality: 'one' | 'many';
  /** Column on this table holding the related id (belongs-to). */
  foreignKey?: string;
  /** Column on the related table pointing back at this record (has-one / has-many). */
  inverseKey?: string;
  /** Many-to-many through a join table: this id in `from`, related id in `to`. */
  through?: { table: string; from: string; to: string };
  /** Whether `include` may name it. Default: true for to-one, false for to-many. */
  includable?: boolean;
  /** Value for the linkage when it is not a column (e.g. the caller's organisation). */
  resolve?: (principal: Principal) => string | null;
}

/** Row-level scope: an SQL condition on the table (under `alias`), or undefined for no restriction. */
export type Scope = ((principal: Principal, alias: string) => RawBuilder<unknown> | undefined) & {
  /**
   * The same condition judged on a record's column values, where it is a plain comparison: the event stream
   * applies it to each event's record without a query (src/events/stream.ts). Undefined: no restriction.
   */
  onColumns?: (principal: Principal, columns: Record<string, unknown>) => boolean | undefined;
  /**
   * The column naming the one conversation a visitor's rows belong to (a visitor sees exactly the rows whose
   * column is its conversation): the event stream hands a visitor only its conversation's events.
   */
  visitorConversationColumn?: string;
};

export interface AccessRules {
  /** Roles that may read the type at all (others get 403). */
  read: readonly PrincipalRole[];
  create?: readonly PrincipalRole[];
  update?: readonly PrincipalRole[];
  delete?: readonly Role[];
  /** Limits which rows a role sees, beyond the organisation (e.g. operators: their own). */
  visible?: Scope;
  /**
   * Limits which of the visible rows a role may update or delete (e.g. operators: their own user record);
   * a visible row outside it is a 403. Undefined: every visible row.
   */
  writable?: Scope;
  /** Who may change which rows under `writable`, in words: the 403's detail and the OpenAPI description. */
  writableNote?: string;
}

/** What a custom action receives. */
export interface ActionContext {
  db: Db;
  services: AppServices;
  /** The principal the engine scopes by (for a system actor: the organisation, with no user). */
  principal: Principal;
  actor: Actor;
  /** The records service inside this write's transaction, for records a write makes along (status history). */
  records: Records;
  resource: ResourceDef;
  /** Validated attributes of the request, with defaults applied on create. */
  values: Record<string, unknown>;
  /** Attribute names the request itself gave, before defaults were applied. */
  provided: ReadonlySet<string>;
  /** For update: the current row (columns by name). */
  existing?: Record<string, unknown>;
  /** Every resource by type (select lists that name related tables). */
  registry: Registry;
  /**
   * Set by the records service on a create whose change makes an event: `insertRecord` may store the event in
   * its own statement (then its result says `evented`), showing the row as inserted. An action that changes
   * the row after inserting it clears this first, so that the event is rendered from the final row.
   */
  eventOnInsert?: { type: string; occurredAt: Date };
  /**
   * Set by an update hook that stored a change outside the type's columns (a member's role, in `memberships`):
   * the update is then an `updated` event although no column of the record's own table changed.
   */
  storedElsewhere?: boolean;
}

/** The outcome of a write: which record to render and with which status. */
export interface ActionResult {
  id: string;
  /** 201 for a new record, 200 for an existing one (idempotent repeats, upserts). */
  status: 200 | 201;
  /** Values of `revealedOnCreate` attributes, for the response to this create only. */
  revealed?: Record<string, unknown>;
  /** An idempotent repeat that changed nothing: no event. (A 200 otherwise is an upsert's update, an `updated` event.) */
  unchanged?: boolean;
  /**
   * The stored record as the actor's select list reads it, when the action already has it (`insertRecord`
   * returns it from the INSERT itself), so that the write renders its response and its event without
   * reading the row back. `STORED_VISIBLE` in it says whether the actor's row scope covers it.
   */
  row?: Record<string, unknown>;
  /** The write's event is stored already (`insertRecord` inserted it with the record). */
  evented?: boolean;
  /** A custom action's top-level `meta` (a login's token). */
  meta?: Record<string, unknown>;
}

export interface ResourceDef {
  /** JSON:API type, exactly as the spec names it. */
  type: string;
  /** Collection path under /api, or undefined when the type has no endpoint of its own. */
  path?: string;
  table: string;
  attributes: Record<string, AttributeDef>;
  relationships: Record<string, RelationshipDef>;
  /** Endpoints this type has. */
  operations: { list?: boolean; get?: boolean; create?: boolean; update?: boolean; delete?: boolean };
  access: AccessRules;
  /**
   * Tenancy: the condition that keeps rows inside the caller's organisation.
   * Defaults to `organisation_id = principal.organisationId`.
   */
  tenancy?: Scope;
  /** Computes derived columns before an insert (after validation and defaults). */
  beforeInsert?: (ctx: ActionContext) => Promise<void> | void;
  /** Computes derived columns or checks cross-field rules before an update. */
  beforeUpdate?: (ctx: ActionContext) => Promise<void> | void;
  /**
   * Runs before a delete, on the locked row: refuses it (e.g. the last owner) or removes dependants
   * that the delete means to take along, returning their exact counts by type.
   */
  beforeDelete?: (ctx: ActionContext) => Promise<Record<string, number> | undefined> | Record<string, number> | undefined;
  /**
   * Replaces the generic delete of the row (after `beforeDelete`), for a record that is not one row of
   * `table` alone: removing a member deletes the membership, not the user. Returns the exact counts by type.
   */
  remove?: (ctx: ActionContext) => Promise<Record<string, number>>;
  /**
   * Fixed names that stand for a record under the member path, read with GET: `me` for the caller's own
   * user (`GET /api/users/me`). `resolve` gives the record's id for the principal (null: no such record, 404).
   */
  aliases?: Record<string, { summary: string; resolve: (principal: Principal) => string | null }>;
  /** Replaces the generic insert (e.g. upserts, idempotent creates). Runs in a transaction. */
  create?: (ctx: ActionContext) => Promise<ActionResult>;
  /**
   * A create that can be made, with its event, by one statement: the records service tries it first, alone and
   * outside any transaction (PostgreSQL commits it at once, so a row lock it takes is held for that statement
   * only, with no round trip to the server process before the COMMIT). Undefined when it wrote nothing (the
   * create then runs `create` in a transaction, as without it). Not taken inside a caller's transaction, for a
   * type with `beforeInsert`, or when its event cannot be stored by that statement. The response is rendered
   * after the commit, so it may write only a record that its actor can read.
   */
  createAtOnce?: (ctx: ActionContext) => Promise<ActionResult | undefined>;
  /** Unique constraint (index) name -> attribute it protects; a violation is a 409 on that pointer. */
  uniqueConstraints?: Record<string, string>;
  /** Order of lists without `sort` (before the final `id`); default: creation order (`id`). */
  defaultSort?: readonly string[];
  /** Special actions with their own path, e.g. login. */
  actions?: Record<string, CustomAction>;
  /**
   * Searches by words that are not an attribute of the type: `filter[name][matches]=words` is the condition
   * the function makes from the tsquery (each word a prefix, all required), e.g. "an item of the conversation
   * matches" as an EXISTS over an indexed `to_tsvector('simple', content)`.
   */
  searches?: Record<string, (query: RawBuilder<unknown>) => RawBuilder<unknown>>;
  /**
   * Whether creates, updates and deletes of this type are events (the outbox, GET /api/events, webhooks).
   * Default true; false only for bookkeeping that would feed on itself (webhook deliveries).
   */
  events?: boolean;
  /**
   * Further event actions of this type besides created/updated/deleted (`Conversation.analysed`): a write
   * through the records service names one in `WriteOptions.event`, and it is queued after the `updated` event.
   */
  extraEvents?: readonly string[];
  /** Event actions a visitor's stream never carries (`analysed`: it exists to announce a hidden attribute). */
  eventsHiddenFromVisitors?: readonly string[];
}

/**
 * A special action, run by the records service (`records.perform`) inside its transaction: POST /api/{path}
 * with a `data` of this resource's type, or, `member`, POST /api/{type's path}/{id}/{path} on one record.
 */
export interface CustomAction {
  /** Undefined: not routed; the live parts call it through `records.perform` (bookkeeping such as a webhook attempt). */
  path?: string;
  /**
   * On one record: the service locks it and passes it as `existing` (404 when the actor cannot see it, 403
   * outside `access.writable`, before the body's problems); the change is an `updated` event unless `unchanged`.
   */
  member?: boolean;
  /**
   * false: runs outside a transaction (a password check under a throttle whose count must outlive a refusal; an
   * agent test suite that waits on the model and stores nothing).
   */
  transaction?: false;
  summary: string;
  /** Attributes the action accepts (validated like a create payload). */
  input: Record<string, AttributeDef>;
  /** Whether a publishable key may call it (login). */
  allowPublishable?: boolean;
  /** Roles allowed; default: every member role (never a visitor unless named). */
  roles?: readonly PrincipalRole[];
  /** Status of a successful call (default 200; 201 when it creates a record). */
  status?: 200 | 201;
  /** A tighter request budget for this route, per client address (e.g. issuing visitor credentials). */
  rateLimitPerAddress?: (services: AppServices) => { max: number; timeWindowMs: number };
  /** Largest body this route reads, in bytes (default: `BODY_LIMIT_BYTES`); beyond, 413. */
  bodyLimit?: number;
  /**
   * Called when a request's body is refused (malformed, too large or too complex, invalid: 400, 413, 415, 422),
   * before the answer: login counts such a request as a failed attempt of its address.
   */
  onRefusedBody?: (services: AppServices, clientAddress: string) => Promise<void>;
  /** `signal` aborts when the client goes away before its answer (work it would wait for may be skipped). */
  run: (ctx: ActionContext & { clientAddress: string; signal: AbortSignal }) => Promise<ActionResult>;
}

/*
 * What hooks and actions are handed: the records service and the process's services. Declared here with the
 * vocabulary that names them, so that the engine's modules import one another without loops.
 */

/** Renders the written record inside the transaction: once COMMIT succeeds nothing can fail any more. */
export type RenderWritten<T> = (trx: Database, result: ActionResult) => Promise<T>;

export interface WriteOptions<T> {
  /** How to render the stored record (HTTP: the request's document); default: the resource object. */
  render?: RenderWritten<T>;
  /** An update's further event, one of the type's `extraEvents` (`analysed`), queued after its `updated` event. */
  event?: string;
  /**
   * The values, validated by the caller against the operation's `inputSpec` (validate.ts): called in place of
   * validating the `values` argument, once the record is locked and the role checked, so that a body's problems
   * (422) come after 404 and 403 and are found once (the JSON:API routes).
   */
  validated?: () => Record<string, unknown>;
}

export interface Written<T = Row> {
  id: string;
  /** 201 for a new record, 200 for an existing one (idempotent repeats, upserts, updates). */
  status: 200 | 201;
  record: T;
}

export interface Deleted {
  id: string;
  /** Exact counts of the records the delete removed, by type (the record itself and any cascade). */
  removed: Record<string, number>;
}

export interface Records {
  /** Typed by resource when `type` is a literal (typed-writes.ts); `T` the record `render` makes. */
  create<T = never, K extends string = string>(
    actor: Actor,
    type: K,
    values: WriteValues<K>,
    options?: WriteOptions<T>,
  ): Promise<Written<Rendered<T, K>>>;
  update<T = never, K extends string = string>(
    actor: Actor,
    type: K,
    id: string,
    values: WriteValues<K>,
    options?: WriteOptions<T>,
  ): Promise<Written<Rendered<T, K>>>;
  /**
   * System creates of one type as one INSERT per set of columns given (a batch: the SIP edge's calls of a queue
   * drain), each validated, defaulted and checked as `create` does, with its `created` event; in input order.
   */
  createMany(actor: Actor, type: string, inputs: Record<string, unknown>[]): Promise<Written[]>;
  /** System updates of one type as one UPDATE per set of columns written, each as `update` does it; in input order. */
  updateMany(actor: Actor, type: string, changes: { id: string; values: Record<string, unknown> }[]): Promise<Written[]>;
  delete(actor: Actor, type: string, id: string): Promise<Deleted>;
  /**
   * Runs the type's custom action `name` (on record `id` for a member action). `input` may be a function, called
   * once the record is locked and the role checked, so that a body's problems come after 404 and 403.
   */
  perform<T = Row>(
    actor: Actor,
    type: string,
    name: string,
    id: string | undefined,
    input: Record<string, unknown> | (() => Record<string, unknown>),
    options?: WriteOptions<T> & { clientAddress?: string; signal?: AbortSignal },
  ): Promise<Written<T> & { meta?: Record<string, unknown> }>;
  /**
   * Several writes in one transaction (e.g. a call with its conversation and participants). `trx` is the
   * transaction itself, for reads and for rows that are not resources (the SIP edge's queue rows, taken in the
   * transaction that writes the records they become).
   */
  transaction<T>(work: (records: Records, trx: Database) => Promise<T>): Promise<T>;
}

/** The service container: process-wide services that actions and writers need. */
export interface AppServices {
  config: Config;
  /** HS256 key for every JWT the service issues and verifies. */
  signingKey: Uint8Array;
  /** Shared counters (rate limits, login throttling) when REDIS_URL is set. */
  redis?: Redis;
  /** The one write path; set once the resources are registered (see createRecords). */
  records?: Records;
  /**
   * Runs an agent test suite (src/agents/suite.ts) as a dry run and returns its report; set by the application
   * (the agents live outside the resources). Throws an ApiError for an unknown agent or a bad suite.
   */
  agentTests?: (organisationId: string, agentId: string, suite: unknown) => Promise<unknown>;
}

export function defineResource<const R extends ResourceDef>(resource: R): R {
  return resource;
}

type AttrOptions = Omit<AttributeDef, 'kind'>;

/** Attribute builders: `attr.string({ create: true, maxLength: 120 })`. */
export const attr = {
  string: (o: AttrOptions = {}): AttributeDef => ({ kind: 'string', ...o }),
  enum: (values: readonly string[], o: AttrOptions = {}): AttributeDef => ({ kind: 'enum', values, ...o }),
  uuid: (o: AttrOptions = {}): AttributeDef => ({ kind: 'uuid', ...o }),
  integer: (o: AttrOptions = {}): AttributeDef => ({ kind: 'integer', ...o }),
  boolean: (o: AttrOptions = {}): AttributeDef => ({ kind: 'boolean', ...o }),
  timestamp: (o: AttrOptions = {}): AttributeDef => ({ kind: 'timestamp', ...o }),
  object: (o: AttrOptions = {}): AttributeDef => ({ kind: 'object', ...o }),
  stringArray: (o: AttrOptions = {}): AttributeDef => ({ kind: 'string_array', ...o }),
};

const relationship =
  (cardinality: RelationshipDef['cardinality'], key: 'foreignKey' | 'inverseKey') =>
  (type: string, column: string, o: Partial<RelationshipDef> = {}): RelationshipDef => ({ type, cardinality, [key]: column, ...o });

/** Relationship builders: `rel.belongsTo('AiAgent', 'ai_agent_id')`. */
export const rel = {
  belongsTo: relationship('one', 'foreignKey'),
  hasOne: relationship('one', 'inverseKey'),
  hasMany: relationship('many', 'inverseKey'),
};

export const columnOf = (name: string, a: AttributeDef): string => a.column ?? name;

/** Attribute names a response may carry. */
export function readableAttributes(r: ResourceDef): string[] {
  return Object.keys(r.attributes).filter((n) => !r.attributes[n].writeOnly);
}

/** Names accepted in fields[Type] for this resource: its readable attributes and relationships. */
export function fieldNames(r: ResourceDef): string[] {
  return ['id', ...readableAttributes(r), ...Object.keys(r.relationships)];
}
