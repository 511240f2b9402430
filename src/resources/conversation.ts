import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { attr, defineResource, rel } from '../jsonapi/index.js';
import { openVisitorSession } from '../auth/visitors.js';
import { conversationControl } from './conversation-control.js';
import { timestamps } from './timestamps.js';
import { EVERY_ROLE, EVERY_ROLE_AND_VISITORS, ownConversationForVisitors } from './scopes.js';
import { CONVERSATION_CHANNELS, CONVERSATION_MODES, CONVERSATION_STATUSES } from './values.js';

/** Largest `metadata`, in bytes of JSON (the agent runtime fits a question's answers into it). */
export const CONVERSATION_METADATA_MAX_BYTES = 16 * 1024;

/** 128 random bits, URL-safe: unguessable public handle for a widget. */
const newPublicId = () => randomBytes(16).toString('base64url');

export default defineResource({
  type: 'Conversation',
  path: 'conversations',
  table: 'conversations',
  attributes: {
    status: attr.enum(CONVERSATION_STATUSES, { update: true, sortable: true, filterable: true, default: 'active' }),
    channel: attr.enum(CONVERSATION_CHANNELS, { create: true, sortable: true, filterable: true, default: 'chat' }),
    mode: attr.enum(CONVERSATION_MODES, { create: true, update: true, sortable: true, filterable: true, default: 'text' }),
    public_id: attr.string({ sortable: true, filterable: true, default: newPublicId }),
    metadata: attr.object({
      create: true,
      update: true,
      sortable: true,
      filterable: true,
      maxBytes: CONVERSATION_METADATA_MAX_BYTES,
      // Why the agent handed off is the organisation's note (docs/agents.md); the widget says it in friendly words.
      hiddenFromVisitors: ['handoff_reason'],
      default: () => ({}),
    }),
    ai_agent_id: attr.uuid({ create: true, update: true, nullable: true, sortable: true, filterable: true, references: 'AiAgent' }),
    /** Written by the agent runtime when the conversation closes (docs/agents.md, "Analysis"); no client writes it. */
    analysis: attr.object({
      nullable: true,
      // What the organisation concluded about a conversation is not shown to its website visitor (docs/agents.md).
      hiddenFromVisitors: true,
      maxBytes: 64 * 1024,
      description:
        "The analysis of the finished conversation (read-only): summary, data (per the agent workflow's analysis schema), success, analysed_at; or skipped/error with analysed_at. Null until the conversation closes and is analysed.",
    }),
    ...timestamps,
  },
  relationships: {
    ai_agent: rel.belongsTo('AiAgent', 'ai_agent_id'),
    call: rel.hasOne('Call', 'conversation_id'),
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
    conversation_items: rel.hasMany('ConversationItem', 'conversation_id', { includable: true }),
  },
  operations: { list: true, get: true, create: true, update: true },
  // Written with the analysis (src/agents/analysis.ts), after that write's `Conversation.updated`.
  extraEvents: ['analysed'],
  eventsHiddenFromVisitors: ['analysed'],
  access: { read: EVERY_ROLE_AND_VISITORS, create: EVERY_ROLE, update: EVERY_ROLE, visible: ownConversationForVisitors('id') },
  // Search by content (docs/api.md, "Search"): `filter[content][matches]=refund invoice` is the conversations
  // with an item containing every word, answered by the items' GIN index (migration 0023).
  searches: {
    content: (query) => sql`EXISTS (SELECT 1 FROM conversation_items i
      WHERE i.conversation_id = t.id AND i.organisation_id = t.organisation_id AND to_tsvector('simple', i.content) @@ ${query})`,
  },
  actions: {
    visitorSession: {
      path: 'visitor_sessions',
      summary: 'With a publishable key: open a chat conversation for a website visitor; returns it and a visitor token in meta.token',
      allowPublishable: true,
      status: 201,
      input: { ai_agent_id: attr.uuid({ create: true, nullable: true }) },
      rateLimitPerAddress: (services) => ({ max: services.config.visitorSessionsPerHour, timeWindowMs: 3600_000 }),
      run: openVisitorSession,
    },
    ...conversationControl,
  },
});
