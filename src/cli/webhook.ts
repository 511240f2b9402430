/** `parley webhook`: create and list webhook endpoints (docs/events.md). */
import { sql } from 'kysely';
import { systemActor } from '../jsonapi/actor.js';
import { withDatabase } from './database.js';

export const webhookCreate = (o: { org: string; url: string; eventTypes?: string; description?: string; json?: boolean }) =>
  withDatabase(!!o.json, async (_db, records) => {
    const { id, record } = await records.create(systemActor(o.org, 'cli'), 'WebhookEndpoint', {
      url: o.url,
      event_types: o.eventTypes
        ?.split(',')
        .map((t) => t.trim())
        .filter(Boolean),
      description: o.description,
    });
    const created = { id, ...record.attributes, organisation_id: o.org };
    const types = record.attributes.event_types.join(', ') || 'every type';
    return {
      result: created,
      text: `webhook endpoint ${id} -> ${o.url} (${types}); signing secret, shown once:\n${record.attributes.secret}`,
    };
  });

export const webhookList = (o: { org: string; json?: boolean }) =>
  withDatabase(!!o.json, async (db) => {
    const deliveries = (status: string) =>
      sql<number>`(SELECT count(*)::int FROM webhook_deliveries d WHERE d.webhook_endpoint_id = w.id AND d.status = ${status})`;
    const rows = await db
      .selectFrom('webhook_endpoints as w')
      .select(['w.id', 'w.url', 'w.event_types', 'w.enabled', 'w.description', 'w.consecutive_failures', 'w.disabled_reason'])
      .select([deliveries('pending').as('pending'), deliveries('failed').as('failed'), deliveries('succeeded').as('succeeded')])
      .where('w.organisation_id', '=', o.org)
      .orderBy('w.id')
      .execute();
    const lines = rows.map((w) => {
      const state = w.enabled ? 'enabled' : `DISABLED${w.disabled_reason ? ` (${w.disabled_reason})` : ''}`;
      const types = w.event_types.join(',') || '*';
      return `${w.id}  ${w.url}  ${types}  ${state}  deliveries: ${w.succeeded} succeeded, ${w.pending} pending, ${w.failed} failed`;
    });
    return {
      result: { organisation_id: o.org, webhook_endpoints: rows },
      text: lines.length ? lines.join('\n') : 'no webhook endpoints',
    };
  });
