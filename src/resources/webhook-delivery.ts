import { sql } from 'kysely';
import { type ActionContext, attr, defineResource, rel } from '../jsonapi/index.js';
import { ADMINS } from './scopes.js';
import { timestamps } from './timestamps.js';

export const DELIVERY_STATUSES = ['pending', 'succeeded', 'failed'] as const;

/** One attempt's outcome on the locked delivery, and the endpoint's count of failures in a row (`endpoint`). */
async function recordAttempt({ db, existing, values: v }: ActionContext) {
  const id = String(existing?.id);
  const retry = v.retry_in_ms === null ? null : sql`now() + make_interval(secs => ${v.retry_in_ms}::integer / 1000.0)`;
  await sql`UPDATE webhook_deliveries SET status = ${v.status}, last_status_code = ${v.last_status_code}, last_error = ${v.last_error},
      next_attempt_at = ${retry}, lease_until = NULL, updated_at = now() WHERE id = ${id}`.execute(db);
  const endpoint = existing?.webhook_endpoint_id;
  if (v.endpoint === 'reset')
    await sql`UPDATE webhook_endpoints SET consecutive_failures = 0 WHERE id = ${endpoint} AND consecutive_failures <> 0`.execute(db);
  if (v.endpoint === 'failed')
    await sql`UPDATE webhook_endpoints SET consecutive_failures = consecutive_failures + 1 WHERE id = ${endpoint}`.execute(db);
  return { id, status: 200 as const };
}

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
  actions: {
    // Bookkeeping, eventless by the type's declaration: the delivery worker records each attempt here (not routed).
    record_attempt: {
      member: true,
      summary: "Record an attempt's outcome",
      roles: [],
      input: {
        status: attr.enum(DELIVERY_STATUSES, { create: 'required' }),
        last_status_code: attr.integer({ create: true, nullable: true }),
        last_error: attr.string({ create: true, nullable: true, maxLength: 2000 }),
        retry_in_ms: attr.integer({ create: true, nullable: true, minimum: 0 }),
        endpoint: attr.enum(['reset', 'failed', 'same'], { create: 'required' }),
      },
      run: recordAttempt,
    },
  },
});
