/**
 * The fair webhook claim (src/events/webhooks.ts): per endpoint, its due deliveries oldest first and the
 * number it has in flight, both from indexes of pending deliveries only, so that claiming costs what is
 * pending, however many deliveries have succeeded or failed before.
 */
export const up = /* sql */ `
CREATE INDEX webhook_deliveries_endpoint_due_idx ON webhook_deliveries (webhook_endpoint_id, next_attempt_at, id) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_endpoint_leased_idx ON webhook_deliveries (webhook_endpoint_id, lease_until) WHERE status = 'pending' AND lease_until IS NOT NULL;
`;
