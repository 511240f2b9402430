/**
 * Live events. `events` is the transactional outbox: one row per committed create, update or delete of a
 * record, written in the writing transaction (src/jsonapi/outbox.ts), so an event exists exactly when its
 * change does. Ids are UUIDv7 assigned under a per-organisation lock at commit time, so they sort in commit
 * order within an organisation (what resuming with Last-Event-ID relies on). Rows older than the retention are
 * pruned in the background. `webhook_endpoints` are the receivers an organisation registers;
 * `webhook_deliveries` is one row per (endpoint, event), written with the event, and the delivery worker's
 * queue (claimed with FOR UPDATE SKIP LOCKED, leased while an attempt is in flight).
 */
export const up = /* sql */ `
CREATE TABLE events (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id) ON DELETE CASCADE,
  type text NOT NULL,
  occurred_at timestamptz NOT NULL,
  data jsonb NOT NULL
);
CREATE INDEX events_organisation_idx ON events (organisation_id, id);
CREATE INDEX events_occurred_idx ON events (occurred_at);

CREATE TABLE webhook_endpoints (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  url text NOT NULL CHECK (char_length(url) BETWEEN 1 AND 2048),
  description text CHECK (char_length(description) <= 500),
  event_types text[] NOT NULL DEFAULT '{}',
  enabled boolean NOT NULL DEFAULT true,
  secret text NOT NULL,
  consecutive_failures integer NOT NULL DEFAULT 0,
  disabled_reason text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_organisation_idx ON webhook_endpoints (organisation_id, id);

CREATE TABLE webhook_deliveries (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  webhook_endpoint_id uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
  event_id uuid NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  event_type text NOT NULL,
  status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'succeeded', 'failed')),
  attempts integer NOT NULL DEFAULT 0,
  last_status_code integer,
  last_error text,
  next_attempt_at timestamptz,
  lease_until timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_organisation_idx ON webhook_deliveries (organisation_id, id);
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (webhook_endpoint_id);
CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id);
`;
