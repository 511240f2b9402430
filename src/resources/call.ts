import { sql } from 'kysely';
import { attr, defineResource, rel } from '../jsonapi/index.js';
import { EVERY_ROLE } from './scopes.js';
import { timestamps } from './timestamps.js';
import { CALL_DIRECTIONS, CALL_STATUSES } from './values.js';

/** Written by the telephony side; read only over the API. */
export default defineResource({
  type: 'Call',
  path: 'calls',
  table: 'calls',
  attributes: {
    direction: attr.enum(CALL_DIRECTIONS, { sortable: true, filterable: true }),
    from_number: attr.string({ nullable: true, sortable: true, filterable: true }),
    to_number: attr.string({ nullable: true, sortable: true, filterable: true }),
    sip_username: attr.string({ nullable: true, sortable: true, filterable: true }),
    status: attr.enum(CALL_STATUSES, { sortable: true, filterable: true }),
    call_uuid: attr.string({ sortable: true, filterable: true }),
    call_source: attr.string({ nullable: true }),
    started_at: attr.timestamp({ nullable: true, sortable: true, filterable: true }),
    /** When it was answered, to the millisecond (null when it was not); duration_seconds counts from here. */
    answered_at: attr.timestamp({ nullable: true, sortable: true, filterable: true }),
    ended_at: attr.timestamp({ nullable: true, sortable: true, filterable: true }),
    duration_seconds: attr.integer({ nullable: true, sortable: true, filterable: true }),
    /** The SIP final response of a call that did not complete (480 for an unregistered callee...). */
    sip_code: attr.integer({ nullable: true, sortable: true, filterable: true }),
    /** Why the SIP edge refused or ended the call, when it did (`not registered`, `voice runtime unavailable`...). */
    end_reason: attr.string({ nullable: true }),
    conversation_id: attr.uuid({ nullable: true, sortable: true, filterable: true, references: 'Conversation' }),
    /**
     * The SIP users who took part (each leg's `member_uuid` that names one), so that "the calls of this
     * operator" is `filter[participant_sip_user_ids][contains]=<sip user id>`.
     */
    participant_sip_user_ids: attr.stringArray({
      filterable: true,
      description: "Ids of the SIP users among the call's participants.",
      expression: () => sql`ARRAY(SELECT s.id::text FROM call_participants p
        JOIN sip_users s ON s.organisation_id = p.organisation_id AND s.id::text = p.member_uuid
        WHERE p.organisation_id = t.organisation_id AND p.call_id = t.id ORDER BY p.joined_at, p.id)`,
    }),
    ...timestamps,
  },
  relationships: {
    conversation: rel.belongsTo('Conversation', 'conversation_id'),
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  operations: { list: true, get: true },
  access: { read: EVERY_ROLE },
});
