import { attr, defineResource, rel } from '../jsonapi/resource.js';
import { EVERY_ROLE } from './scopes.js';
import { CALL_DIRECTIONS, CALL_STATUSES } from './values.js';

/** Written by the telephony side; read only over the API. */
export default defineResource({
  type: 'Call',
  path: 'calls',
  table: 'calls',
  attributes: {
    direction: attr.enum(CALL_DIRECTIONS),
    from_number: attr.string({ nullable: true }),
    to_number: attr.string({ nullable: true }),
    sip_username: attr.string({ nullable: true }),
    status: attr.enum(CALL_STATUSES),
    call_uuid: attr.string(),
    call_source: attr.string({ nullable: true }),
    started_at: attr.timestamp({ nullable: true }),
    ended_at: attr.timestamp({ nullable: true }),
    duration_seconds: attr.integer({ nullable: true }),
    conversation_id: attr.uuid({ nullable: true, references: 'Conversation' }),
  },
  relationships: {
    conversation: rel.belongsTo('Conversation', 'conversation_id'),
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  operations: { get: true },
  access: { read: EVERY_ROLE },
});
