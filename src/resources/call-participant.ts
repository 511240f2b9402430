import { type ActionContext, ApiError, attr, defineResource, rel } from '../jsonapi/index.js';
import { timestamps } from './timestamps.js';
import { ADMINS, EVERY_ROLE } from './scopes.js';
import { PARTICIPANT_ROLES } from './values.js';

function leftAfterJoined(ctx: ActionContext): void {
  const left = ctx.values.left_at;
  const joined = ctx.existing?.joined_at;
  if (left instanceof Date && joined instanceof Date && left < joined) {
    throw ApiError.of('invalid_attribute', 'left_at must not be before joined_at.', { pointer: '/data/attributes/left_at' });
  }
}

export default defineResource({
  type: 'CallParticipant',
  path: 'call_participants',
  table: 'call_participants',
  attributes: {
    member_uuid: attr.string({ sortable: true, filterable: true }),
    role: attr.enum(PARTICIPANT_ROLES, { sortable: true, filterable: true }),
    joined_at: attr.timestamp({ precision: 'seconds', sortable: true, filterable: true }),
    left_at: attr.timestamp({ precision: 'seconds', nullable: true, update: true, sortable: true, filterable: true }),
    call_id: attr.uuid({ sortable: true, filterable: true, references: 'Call' }),
    organisation_id: attr.uuid({ sortable: true, filterable: true }),
    ...timestamps,
  },
  relationships: {
    call: rel.belongsTo('Call', 'call_id'),
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  operations: { list: true, get: true, update: true },
  access: { read: EVERY_ROLE, update: ADMINS },
  beforeUpdate: leftAfterJoined,
});
