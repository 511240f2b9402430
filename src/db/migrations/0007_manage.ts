/**
 * Managing the organisation over HTTP. Every resource table already has `created_at` and `updated_at`;
 * memberships gain `updated_at` (a member's role changes), taken from `created_at` for existing rows.
 * The new list endpoints and sort keys get (organisation_id, key, id) indexes, as the first migration's
 * lists do, so that keyset paging by them costs the same at any depth.
 */
export const up = /* sql */ `
ALTER TABLE memberships ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
UPDATE memberships SET updated_at = created_at;

CREATE INDEX api_keys_org_created_at_idx ON api_keys (organisation_id, created_at, id);
CREATE INDEX api_keys_org_updated_at_idx ON api_keys (organisation_id, updated_at, id);
CREATE INDEX api_keys_org_revoked_at_idx ON api_keys (organisation_id, revoked_at, id);
CREATE INDEX conversations_org_created_at_idx ON conversations (organisation_id, created_at, id);
CREATE INDEX conversations_org_updated_at_idx ON conversations (organisation_id, updated_at, id);
CREATE INDEX ai_agents_org_id_idx ON ai_agents (organisation_id, id);
CREATE INDEX ai_agents_org_name_idx ON ai_agents (organisation_id, name, id);
CREATE INDEX ai_agents_org_published_idx ON ai_agents (organisation_id, published, id);
CREATE INDEX ai_agents_org_created_at_idx ON ai_agents (organisation_id, created_at, id);
CREATE INDEX ai_agents_org_updated_at_idx ON ai_agents (organisation_id, updated_at, id);
CREATE INDEX gateways_org_id_idx ON gateways (organisation_id, id);
CREATE INDEX gateways_org_provider_idx ON gateways (organisation_id, provider, id);
CREATE INDEX gateways_org_realm_idx ON gateways (organisation_id, realm, id);
CREATE INDEX gateways_org_created_at_idx ON gateways (organisation_id, created_at, id);
CREATE INDEX gateways_org_updated_at_idx ON gateways (organisation_id, updated_at, id);
CREATE INDEX sip_users_org_created_at_idx ON sip_users (organisation_id, created_at, id);
CREATE INDEX sip_users_org_updated_at_idx ON sip_users (organisation_id, updated_at, id);
CREATE INDEX operator_statuses_org_id_idx ON operator_statuses (organisation_id, id);
CREATE INDEX operator_statuses_org_status_idx ON operator_statuses (organisation_id, status, id);
CREATE INDEX operator_statuses_org_agent_name_idx ON operator_statuses (organisation_id, agent_name, id);
CREATE INDEX operator_statuses_org_updated_at_idx ON operator_statuses (organisation_id, updated_at, id);
CREATE INDEX operator_statuses_org_created_at_idx ON operator_statuses (organisation_id, created_at, id);
CREATE INDEX operator_status_events_org_created_at_idx ON operator_status_events (organisation_id, created_at, id);
CREATE INDEX calls_org_id_idx ON calls (organisation_id, id);
CREATE INDEX calls_org_status_idx ON calls (organisation_id, status, id);
CREATE INDEX calls_org_direction_idx ON calls (organisation_id, direction, id);
CREATE INDEX calls_org_sip_username_idx ON calls (organisation_id, sip_username, id);
CREATE INDEX calls_org_started_at_idx ON calls (organisation_id, started_at, id);
CREATE INDEX calls_org_ended_at_idx ON calls (organisation_id, ended_at, id);
CREATE INDEX calls_org_created_at_idx ON calls (organisation_id, created_at, id);
CREATE INDEX calls_org_updated_at_idx ON calls (organisation_id, updated_at, id);
CREATE INDEX call_participants_org_created_at_idx ON call_participants (organisation_id, created_at, id);
CREATE INDEX call_transcripts_org_created_at_idx ON call_transcripts (organisation_id, created_at, id);
CREATE INDEX conversation_items_org_created_at_idx ON conversation_items (organisation_id, created_at, id);
CREATE INDEX webhook_endpoints_org_created_at_idx ON webhook_endpoints (organisation_id, created_at, id);
CREATE INDEX webhook_endpoints_org_updated_at_idx ON webhook_endpoints (organisation_id, updated_at, id);
CREATE INDEX webhook_deliveries_org_created_at_idx ON webhook_deliveries (organisation_id, created_at, id);
CREATE INDEX webhook_deliveries_org_updated_at_idx ON webhook_deliveries (organisation_id, updated_at, id);
`;
