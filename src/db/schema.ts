/**
 * The database schema as TypeScript sees it: one descriptor per table that the migrations create, from which
 * the row types for Kysely are derived. Code outside the JSON:API engine (the agent runtime, the SIP edge, the
 * command line, authentication, the demo) queries through `Db = Kysely<Schema>`, so a misspelt table or column
 * or a wrong value type is a compile error there. The engine names tables at run time from resource
 * declarations and keeps its open `Kysely<any>`.
 *
 * The descriptors are values, not only types, so that a test can compare them with the migrated database
 * (information_schema) on both PostgreSQL and PGlite: a migration that adds a table or column without this
 * file following fails that test instead of leaving the types silently stale.
 */
import type { ColumnType, Kysely } from 'kysely';

/** One column: its PostgreSQL type (as information_schema's `udt_name` spells it), null-ability and default. */
export class Column<T, Nullable extends boolean = false, Defaulted extends boolean = false> {
  declare readonly _value?: T;
  constructor(
    readonly udt: string,
    readonly nullable: Nullable,
    readonly defaulted: Defaulted,
  ) {}
  /** The column accepts NULL. */
  null(): Column<T, true, Defaulted> {
    return new Column(this.udt, true, this.defaulted);
  }
  /** The column has a default (or is serial), so inserts may leave it out. */
  default(): Column<T, Nullable, true> {
    return new Column(this.udt, this.nullable, true);
  }
}

/** JSON as PostgreSQL's jsonb stores it. */
export type Json = string | number | boolean | null | Json[] | { [key: string]: Json };

const uuid = () => new Column<string>('uuid', false, false);
const text = () => new Column<string>('text', false, false);
const varchar = () => new Column<string>('varchar', false, false);
const integer = () => new Column<number>('int4', false, false);
const serial = () => new Column<number, false, true>('int4', false, true);
// node-postgres returns int8 as a string (it may exceed Number.MAX_SAFE_INTEGER).
const bigint = () => new Column<string | number>('int8', false, false);
const bigserial = () => new Column<string | number, false, true>('int8', false, true);
const real = () => new Column<number>('float4', false, false);
const boolean = () => new Column<boolean>('bool', false, false);
const timestamptz = () => new Column<Date>('timestamptz', false, false);
const jsonb = () => new Column<Json>('jsonb', false, false);
const textArray = () => new Column<string[]>('_text', false, false);

/** `created_at` and `updated_at`, which every resource table has. */
const stamps = () => ({ created_at: timestamptz().default(), updated_at: timestamptz().default() });

/** An operator's status: the current one (operator_statuses) and each change (operator_status_events). */
const operatorStatus = () => ({
  id: uuid(),
  organisation_id: uuid(),
  sip_user_id: uuid().null(),
  user_id: uuid().null(),
  agent_name: text(),
  status: text(),
  source: text(),
  changed_by_user_id: uuid().null(),
  ...stamps(),
});

export const tables = {
  settings: { key: text(), value: text() },
  credential_epoch: { id: boolean().default(), n: bigint() },
  event_id_key: { id: boolean().default(), k: bigint() },
  organisations: {
    id: uuid(),
    name: text(),
    slug: text(),
    default_country: text().null(),
    transcribe_calls: boolean().default(),
    ...stamps(),
  },
  users: { id: uuid(), email: text(), full_name: text().default(), password_hash: text(), ...stamps() },
  memberships: { organisation_id: uuid(), user_id: uuid(), role: text(), ...stamps() },
  api_keys: {
    id: uuid(),
    organisation_id: uuid(),
    user_id: uuid(),
    name: text(),
    key_type: text(),
    token_hash: text(),
    expires_at: timestamptz().null(),
    revoked_at: timestamptz().null(),
    role_ceiling: text().null(),
    ...stamps(),
  },
  invitations: {
    id: uuid(),
    organisation_id: uuid(),
    email: text(),
    role: text(),
    invited_by_user_id: uuid().null(),
    token_hash: text(),
    expires_at: timestamptz(),
    accepted_at: timestamptz().null(),
    user_id: uuid().null(),
    ...stamps(),
  },
  user_sessions: {
    id: uuid(),
    organisation_id: uuid(),
    user_id: uuid(),
    expires_at: timestamptz(),
    revoked_at: timestamptz().null(),
    created_at: timestamptz().default(),
  },
  ai_agents: {
    id: uuid(),
    organisation_id: uuid(),
    name: text(),
    voice: text().null(),
    tone: text().null(),
    languages: textArray().default(),
    workflow: jsonb().default(),
    system_prompt: text().null(),
    safety_guardrails: text().null(),
    published: boolean().default(),
    ...stamps(),
  },
  conversations: {
    id: uuid(),
    organisation_id: uuid(),
    channel: text(),
    mode: text(),
    status: text(),
    public_id: text(),
    ai_agent_id: uuid().null(),
    metadata: jsonb().default(),
    next_content_index: integer().default(),
    // Migration 0025: the analysis of the finished conversation (docs/agents.md).
    analysis: jsonb().null(),
    ...stamps(),
  },
  conversation_items: {
    id: uuid(),
    organisation_id: uuid(),
    conversation_id: uuid(),
    content: text(),
    role: text(),
    modality: text(),
    content_index: integer(),
    item_id: text(),
    metadata: jsonb().default(),
    occurred_at: timestamptz(),
    ...stamps(),
  },
  gateways: {
    id: uuid(),
    organisation_id: uuid(),
    name: text(),
    provider: text(),
    username: text(),
    password: text().null(),
    realm: text(),
    proxy: text().null(),
    register: boolean().default(),
    from_domain: text().null(),
    from_user: text().null(),
    inbound_acl: textArray().default(),
    ...stamps(),
  },
  sip_users: {
    id: uuid(),
    organisation_id: uuid(),
    sip_username: text(),
    sip_password: text(),
    user_id: uuid().null(),
    ...stamps(),
  },
  operator_statuses: operatorStatus(),
  // Every column of operator_statuses, and the change's own.
  operator_status_events: {
    ...operatorStatus(),
    operator_status_id: uuid(),
    previous_status: text().null(),
    occurred_at: timestamptz().default(),
  },
  calls: {
    id: uuid(),
    organisation_id: uuid(),
    direction: text(),
    from_number: text().null(),
    to_number: text().null(),
    sip_username: text().null(),
    status: text(),
    call_uuid: text(),
    call_source: text().null(),
    started_at: timestamptz().null(),
    ended_at: timestamptz().null(),
    duration_seconds: integer().null(),
    conversation_id: uuid().null(),
    sip_code: integer().null(),
    end_reason: text().null(),
    answered_at: timestamptz().null(),
    ...stamps(),
  },
  call_participants: {
    id: uuid(),
    organisation_id: uuid(),
    call_id: uuid(),
    member_uuid: text(),
    role: text(),
    joined_at: timestamptz(),
    left_at: timestamptz().null(),
    ...stamps(),
  },
  call_transcripts: {
    id: uuid(),
    organisation_id: uuid(),
    call_id: uuid(),
    content: text(),
    speaker: text(),
    content_index: integer(),
    item_id: text(),
    occurred_at: timestamptz(),
    metadata: jsonb().default(),
    ...stamps(),
  },
  // Kamailio's own tables (migration 0005): its table versions and the registrations it writes through.
  phone_numbers: {
    id: uuid(),
    organisation_id: uuid(),
    number: text(),
    gateway_id: uuid().null(),
    ai_agent_id: uuid().null(),
    sip_user_id: uuid().null(),
    ...stamps(),
  },
  // The installation's SIP_DOMAIN as `sip serve` last started with it (migration 0012).
  sip_settings: { id: integer(), domain: text() },
  kamailio_version: { id: serial(), table_name: varchar(), table_version: integer().default() },
  sip_locations: {
    id: serial(),
    ruid: varchar().default(),
    username: varchar().default(),
    domain: varchar().null(),
    contact: varchar().default(),
    received: varchar().null(),
    path: varchar().null(),
    expires: bigint().default(),
    q: real().default(),
    callid: varchar().default(),
    cseq: integer().default(),
    last_modified: bigint().default(),
    flags: integer().default(),
    cflags: integer().default(),
    user_agent: varchar().default(),
    socket: varchar().null(),
    methods: integer().null(),
    instance: varchar().null(),
    reg_id: integer().default(),
    server_id: integer().default(),
    connection_id: integer().default(),
    keepalive: integer().default(),
    partition: integer().default(),
  },
  // Short-lived credentials of the browser softphone (migration 0022), read by Kamailio through sip_subscriber.
  sip_credentials: {
    id: uuid(),
    organisation_id: uuid(),
    sip_user_id: uuid(),
    user_id: uuid(),
    session_id: uuid().null(),
    api_key_id: uuid().null(),
    username: text(),
    password: text(),
    expires_at: timestamptz(),
    created_at: timestamptz().default(),
  },
  // The call event queue and Kamailio's dialogs (migration 0013).
  sip_call_events: {
    id: bigserial(),
    call_key: varchar(),
    body: text(),
    created_at: timestamptz().default(),
    attempts: integer().default(),
    lease_until: timestamptz().null(),
    error: text().null(),
  },
  sip_dialogs: {
    id: serial(),
    hash_entry: integer(),
    hash_id: integer(),
    callid: varchar(),
    from_uri: varchar(),
    from_tag: varchar(),
    to_uri: varchar(),
    to_tag: varchar(),
    caller_cseq: varchar(),
    callee_cseq: varchar(),
    caller_route_set: varchar().null(),
    callee_route_set: varchar().null(),
    caller_contact: varchar(),
    callee_contact: varchar(),
    caller_sock: varchar(),
    callee_sock: varchar(),
    state: integer(),
    start_time: integer(),
    timeout: integer().default(),
    sflags: integer().default(),
    iflags: integer().default(),
    toroute_name: varchar().null(),
    req_uri: varchar(),
    xdata: varchar().null(),
  },
  sip_dialog_vars: { id: serial(), hash_entry: integer(), hash_id: integer(), dialog_key: varchar(), dialog_value: text() },
  // The outbox and webhooks (migration 0006).
  events: { id: uuid(), organisation_id: uuid(), type: text(), occurred_at: timestamptz(), data: jsonb() },
  webhook_endpoints: {
    id: uuid(),
    organisation_id: uuid(),
    url: text(),
    event_types: textArray().default(),
    enabled: boolean().default(),
    description: text().null(),
    secret: text(),
    consecutive_failures: integer().default(),
    disabled_reason: text().null(),
    ...stamps(),
  },
  webhook_deliveries: {
    id: uuid(),
    organisation_id: uuid(),
    webhook_endpoint_id: uuid(),
    event_id: uuid(),
    event_type: text(),
    status: text().default(),
    attempts: integer().default(),
    last_status_code: integer().null(),
    last_error: text().null(),
    next_attempt_at: timestamptz().null(),
    lease_until: timestamptz().null(),
    ...stamps(),
  },
  // The agent runtime's bookkeeping (migration 0008).
  agent_turns: {
    conversation_id: uuid(),
    organisation_id: uuid(),
    last_handled_index: integer().default(),
    workflow_state: jsonb().default(),
    lease_until: timestamptz().null(),
    lease_token: text().null(),
    attempts: integer().default(),
    last_error: text().null(),
    // Migration 0015: failed attempts at one user item (its content_index).
    failures: integer().default(),
    failed_index: integer().null(),
    ...stamps(),
  },
  // Each organisation's signing secret for its agents' tool calls (migration 0024).
  tool_secrets: { organisation_id: uuid(), secret: text(), ...stamps() },
  // Conversations that may need an agent turn (migration 0018): the runtime's queue of pending work.
  agent_work: {
    conversation_id: uuid(),
    organisation_id: uuid(),
    queued_at: timestamptz().default(),
    version: bigint().default(),
    parked: boolean().default(),
  },
  // The knowledge base (migration 0025): documents and their indexed chunks.
  knowledge_documents: {
    id: uuid(),
    organisation_id: uuid(),
    ai_agent_id: uuid(),
    title: text(),
    content: text(),
    content_type: text(),
    ...stamps(),
  },
  knowledge_chunks: {
    id: uuid(),
    organisation_id: uuid(),
    ai_agent_id: uuid(),
    document_id: uuid(),
    chunk_index: integer(),
    content: text(),
    language: new Column<string>('regconfig', false, false),
    // Generated from `content` (never written).
    tsv: new Column<string>('tsvector', false, false).null(),
  },
  // Conversations whose analysis is due (migration 0025).
  analysis_work: {
    conversation_id: uuid(),
    organisation_id: uuid(),
    queued_at: timestamptz().default(),
    available_at: timestamptz().default(),
    version: bigint().default(),
    attempts: integer().default(),
    lease_until: timestamptz().null(),
    last_error: text().null(),
  },
  agent_handoffs: {
    conversation_id: uuid(),
    organisation_id: uuid(),
    reason: text(),
    requested_at: timestamptz().default(),
    assigned_user_id: uuid().null(),
    assigned_at: timestamptz().null(),
  },
};

type Nullable<T, N> = N extends true ? T | null : T;
/** A defaulted column may be left out of an insert (Kysely's `Generated`), in any case it may be written. */
type ValueOf<C> =
  C extends Column<infer T, infer N, infer D>
    ? D extends true
      ? ColumnType<Nullable<T, N>, Nullable<T, N> | undefined, Nullable<T, N>>
      : Nullable<T, N>
    : never;

export type Schema = { [Table in keyof typeof tables]: { [Name in keyof (typeof tables)[Table]]: ValueOf<(typeof tables)[Table][Name]> } };

/** The typed database for code outside the engine. */
export type Db = Kysely<Schema>;

/** The engine's open database type (see above), declared here so that the migrations need not import the connection that runs them. */
// biome-ignore lint/suspicious/noExplicitAny: the engine names tables at run time.
export type Database = Kysely<any>;
