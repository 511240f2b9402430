import { attr, defineResource, rel } from '../jsonapi/index.js';
import { ADMINS } from './scopes.js';
import { timestamps } from './timestamps.js';

export const DELIVERY_STATUSES = ['pending', 'succeeded', 'failed'] as const;

/**
 * One event to one endpoint: queued with the event, in its transaction, and worked off by the delivery
 * worker (src/events/webhooks.ts). Read only. Not itself an event: a delivery's progress would otherwise
 * queue further deliveries without end.
 */
export default defineResource({
  type: 'WebhookDelivery',
  path: 'webhook_deliveries',
  table: 'webhook_deliveries',
  attributes: {
    webhook_endpoint_id: attr.uuid({ sortable: true, filterable: true, references: 'WebhookEndpoint' }),
    event_id: attr.uuid({ sortable: true, filterable: true }),
    event_type: attr.string({ sortable: true, filterable: true }),
    status: attr.enum(DELIVERY_STATUSES, { sortable: true, filterable: true }),
    attempts: attr.integer({ sortable: true, filterable: true }),
    last_status_code: attr.integer({ nullable: true, sortable: true, filterable: true }),
    last_error: attr.string({ nullable: true }),
    next_attempt_at: attr.timestamp({
      nullable: true,
      sortable: true,
      filterable: true,
      description: 'When the next attempt is due; null once succeeded or failed.',
    }),
    ...timestamps,
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
    webhook_endpoint: rel.belongsTo('WebhookEndpoint', 'webhook_endpoint_id'),
  },
  operations: { list: true, get: true },
  access: { read: ADMINS },
  events: false,
  description: 'A delivery of one event to one webhook endpoint, with its attempts.',
});
