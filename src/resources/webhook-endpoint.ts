import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import {
  type ActionContext,
  type ActionResult,
  ApiError,
  attr,
  defineResource,
  errorObject,
  type ErrorObject,
  eventTypes,
  insertRecord,
  rel,
} from '../jsonapi/index.js';
import { ADMINS } from './scopes.js';
import { timestamps } from './timestamps.js';
import { webhookUrlProblem } from './webhook-url.js';
import { at } from './pointer.js';

/** A Standard Webhooks secret: `whsec_` and the base64 of 32 random bytes (the HMAC key). */
export const newWebhookSecret = () => `whsec_${randomBytes(32).toString('base64')}`;

/** The URL must be a safe target (SSRF) and every event type must exist: one 422 per problem. */
async function checkEndpoint(ctx: ActionContext): Promise<void> {
  const errors: ErrorObject[] = [];
  const { url, event_types: types } = ctx.values;
  if (typeof url === 'string') {
    const problem = await webhookUrlProblem(url, ctx.services.config.events.webhookAllowPrivateUrls);
    if (problem) errors.push(errorObject('invalid_attribute', `\`url\` ${problem}.`, at('url')));
  }
  if (Array.isArray(types)) {
    const known = eventTypes(ctx.registry);
    const unknown = types.filter((t) => !known.has(t as string));
    if (unknown.length > 0) {
      const detail = `\`event_types\` names unknown event types: ${unknown.join(', ')}. See GET /api/open_api or docs/events.md for the catalogue.`;
      errors.push(errorObject('invalid_attribute', detail, at('event_types')));
    }
  }
  if (errors.length > 0) throw new ApiError(errors);
}

/** Creates the endpoint with a new secret, shown in this response only. */
async function createEndpoint(ctx: ActionContext): Promise<ActionResult> {
  const secret = newWebhookSecret();
  ctx.values.secret = secret;
  return { ...(await insertRecord(ctx)), revealed: { secret } };
}

/** Enabling an endpoint again (after it was disabled for failing) starts its failure count afresh. */
async function updateEndpoint(ctx: ActionContext): Promise<void> {
  await checkEndpoint(ctx);
  if (ctx.values.enabled === true) {
    ctx.values.consecutive_failures = 0;
    ctx.values.disabled_reason = null;
  }
}

/** The endpoint's deliveries (its history and queue) go with it; their exact count is reported. */
async function removeDeliveries(ctx: ActionContext): Promise<Record<string, number>> {
  const { rows } = await sql<{ count: string }>`
    WITH gone AS (DELETE FROM webhook_deliveries WHERE webhook_endpoint_id = ${ctx.existing!.id} RETURNING 1)
    SELECT count(*) AS count FROM gone`.execute(ctx.db);
  const count = Number(rows[0].count);
  return count > 0 ? { WebhookDelivery: count } : {};
}

/** A receiver of the organisation's events (Standard Webhooks; docs/events.md). Owners and admins only. */
export default defineResource({
  type: 'WebhookEndpoint',
  path: 'webhook_endpoints',
  table: 'webhook_endpoints',
  attributes: {
    url: attr.string({
      create: 'required',
      update: true,
      minLength: 1,
      maxLength: 2048,
      sortable: true,
      filterable: true,
      description: 'https URL the events are POSTed to; must resolve to public addresses.',
    }),
    description: attr.string({ create: true, update: true, nullable: true, maxLength: 500 }),
    event_types: attr.stringArray({
      create: true,
      update: true,
      maxItems: 100,
      items: { minLength: 1, maxLength: 100 },
      default: () => [],
      description: 'Event types sent to this endpoint (e.g. ConversationItem.created); empty: every type.',
    }),
    enabled: attr.boolean({
      create: true,
      update: true,
      sortable: true,
      filterable: true,
      default: true,
      description: 'Disabled endpoints get no new deliveries; the worker disables one whose deliveries keep failing.',
    }),
    secret: attr.string({
      revealedOnCreate: true,
      description: 'Signing secret (whsec_…), shown once in the response that creates the endpoint; null afterwards.',
    }),
    consecutive_failures: attr.integer({ sortable: true, filterable: true, description: 'Failed attempts since the last successful one.' }),
    disabled_reason: attr.string({
      nullable: true,
      description: 'Why the worker disabled the endpoint; null while it is enabled or was disabled by a member.',
    }),
    ...timestamps,
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  operations: { list: true, get: true, create: true, update: true, delete: true },
  access: { read: ADMINS, create: ADMINS, update: ADMINS, delete: ADMINS },
  beforeInsert: checkEndpoint,
  beforeUpdate: updateEndpoint,
  beforeDelete: removeDeliveries,
  create: createEndpoint,
});
