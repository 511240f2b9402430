import { attr, defineResource, rel } from '../jsonapi/resource.js';
import { EVERY_ROLE, ownRowsForOperators } from './scopes.js';
import { API_KEY_TYPES } from './values.js';

/** Read only over the API; keys are issued by the command line, which shows the token once. */
export default defineResource({
  type: 'ApiKey',
  path: 'api_keys',
  table: 'api_keys',
  attributes: {
    name: attr.string({ sortable: true, filterable: true }),
    key_type: attr.enum(API_KEY_TYPES, { sortable: true, filterable: true }),
    expires_at: attr.timestamp({ nullable: true, sortable: true, filterable: true }),
    organisation_id: attr.uuid({ sortable: true, filterable: true }),
    user_id: attr.uuid({ sortable: true, filterable: true }),
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
    user: rel.belongsTo('User', 'user_id'),
  },
  operations: { list: true, get: true },
  access: { read: EVERY_ROLE, visible: ownRowsForOperators('user_id') },
});
