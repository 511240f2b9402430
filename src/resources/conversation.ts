import { randomBytes } from 'node:crypto';
import { attr, defineResource, rel } from '../jsonapi/index.js';
import { openVisitorSession } from '../auth/visitors.js';
import { conversationControl } from './conversation-control.js';
import { timestamps } from './timestamps.js';
import { EVERY_ROLE, EVERY_ROLE_AND_VISITORS, ownConversationForVisitors } from './scopes.js';
import { CONVERSATION_CHANNELS, CONVERSATION_MODES, CONVERSATION_STATUSES } from './values.js';

/** 128 random bits, URL-safe: unguessable public handle for a widget. */
/** Largest `metadata`, in bytes of JSON (the agent runtime fits a question's answers into it). */
export const CONVERSATION_METADATA_MAX_BYTES = 16 * 1024;

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
      default: () => ({}),
    }),
    ai_agent_id: attr.uuid({ create: true, update: true, nullable: true, sortable: true, filterable: true, references: 'AiAgent' }),
    ...timestamps,
  },
  relationships: {
    ai_agent: rel.belongsTo('AiAgent', 'ai_agent_id'),
    call: rel.hasOne('Call', 'conversation_id'),
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
    conversation_items: rel.hasMany('ConversationItem', 'conversation_id', { includable: true }),
  },
  operations: { list: true, get: true, create: true, update: true },
  access: { read: EVERY_ROLE_AND_VISITORS, create: EVERY_ROLE, update: EVERY_ROLE, visible: ownConversationForVisitors('id') },
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
