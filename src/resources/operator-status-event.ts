import { attr, defineResource } from '../jsonapi/index.js';
import { operatorStatusAttributes, operatorStatusRelationships } from './operator-status.js';
import { timestamps } from './timestamps.js';
import { EVERY_ROLE } from './scopes.js';
import { OPERATOR_STATUSES } from './values.js';

/** The history of availability changes; written by the service only. */
export default defineResource({
  type: 'OperatorStatusEvent',
  path: 'operator_status_events',
  table: 'operator_status_events',
  attributes: {
    ...operatorStatusAttributes,
    previous_status: attr.enum(OPERATOR_STATUSES, { nullable: true, sortable: true, filterable: true }),
    occurred_at: attr.timestamp({ sortable: true, filterable: true }),
    operator_status_id: attr.uuid({ sortable: true, filterable: true, references: 'OperatorStatus' }),
    ...timestamps,
  },
  relationships: operatorStatusRelationships,
  operations: { list: true, get: true },
  access: { read: EVERY_ROLE },
});
