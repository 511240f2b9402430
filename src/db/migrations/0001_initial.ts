/**
 * The initial schema. Every tenant-owned table carries `organisation_id` and a
 * UNIQUE (organisation_id, id) key, so that references between tables are
 * composite foreign keys that cannot cross an organisation.
 * Each list endpoint's sorts are served by (organisation_id, key, id) indexes, except
 * for unbounded text and JSON keys, whose values may exceed a btree entry.
 */
export const up = /* sql */ `
CREATE TABLE settings (
  key text PRIMARY KEY,
  value text NOT NULL
);

CREATE TABLE organisations (
  id uuid PRIMARY KEY,
  name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
  id uuid PRIMARY KEY,
  email text NOT NULL CHECK (char_length(email) BETWEEN 3 AND 254),
  full_name text NOT NULL DEFAULT '' CHECK (char_length(full_name) <= 200),
  password_hash text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX users_email_key ON users (lower(email));

CREATE TABLE memberships (
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  user_id uuid NOT NULL REFERENCES users (id),
  role text NOT NULL CHECK (role IN ('owner', 'admin', 'operator')),
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (organisation_id, user_id)
);
CREATE INDEX memberships_user_idx ON memberships (user_id, organisation_id);

CREATE TABLE api_keys (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  user_id uuid NOT NULL,
  name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 120),
  key_type text NOT NULL CHECK (key_type IN ('publishable', 'secret')),
  token_hash text NOT NULL,
  expires_at timestamptz,
  revoked_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, user_id) REFERENCES memberships (organisation_id, user_id)
);
CREATE INDEX api_keys_org_id_idx ON api_keys (organisation_id, id);
CREATE INDEX api_keys_org_name_idx ON api_keys (organisation_id, name, id);
CREATE INDEX api_keys_org_key_type_idx ON api_keys (organisation_id, key_type, id);
CREATE INDEX api_keys_org_expires_at_idx ON api_keys (organisation_id, expires_at, id);
CREATE INDEX api_keys_org_user_idx ON api_keys (organisation_id, user_id, id);

CREATE TABLE user_sessions (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL,
  user_id uuid NOT NULL,
  expires_at timestamptz NOT NULL,
  revoked_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (organisation_id, user_id) REFERENCES memberships (organisation_id, user_id) ON DELETE CASCADE
);
CREATE INDEX user_sessions_user_idx ON user_sessions (user_id);

CREATE TABLE ai_agents (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  name text NOT NULL,
  voice text,
  tone text,
  languages text[] NOT NULL DEFAULT ARRAY['en']::text[],
  workflow jsonb NOT NULL DEFAULT '{}'::jsonb,
  system_prompt text,
  safety_guardrails text,
  published boolean NOT NULL DEFAULT false,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id)
);

CREATE TABLE conversations (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  channel text NOT NULL,
  mode text NOT NULL,
  status text NOT NULL,
  public_id text NOT NULL UNIQUE,
  ai_agent_id uuid,
  metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
  next_content_index integer NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, ai_agent_id) REFERENCES ai_agents (organisation_id, id)
);
CREATE INDEX conversations_org_id_idx ON conversations (organisation_id, id);
CREATE INDEX conversations_org_status_idx ON conversations (organisation_id, status, id);
CREATE INDEX conversations_org_channel_idx ON conversations (organisation_id, channel, id);
CREATE INDEX conversations_org_mode_idx ON conversations (organisation_id, mode, id);
CREATE INDEX conversations_org_public_id_idx ON conversations (organisation_id, public_id, id);
CREATE INDEX conversations_org_ai_agent_idx ON conversations (organisation_id, ai_agent_id, id);

CREATE TABLE conversation_items (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  conversation_id uuid NOT NULL,
  content text NOT NULL,
  role text NOT NULL,
  modality text NOT NULL,
  content_index integer NOT NULL CHECK (content_index >= 0),
  item_id text NOT NULL,
  metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
  occurred_at timestamptz NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, conversation_id) REFERENCES conversations (organisation_id, id)
);
CREATE UNIQUE INDEX conversation_items_index_key ON conversation_items (conversation_id, content_index);
CREATE UNIQUE INDEX conversation_items_item_id_key ON conversation_items (conversation_id, item_id);

CREATE TABLE gateways (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  name text NOT NULL,
  provider text NOT NULL,
  username text NOT NULL,
  password text,
  realm text NOT NULL,
  proxy text,
  register boolean NOT NULL DEFAULT true,
  from_domain text,
  from_user text,
  inbound_acl text[] NOT NULL DEFAULT ARRAY[]::text[],
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id)
);
CREATE UNIQUE INDEX gateways_org_name_key ON gateways (organisation_id, name);

CREATE TABLE sip_users (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  sip_username text NOT NULL,
  sip_password text NOT NULL,
  user_id uuid,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, user_id) REFERENCES memberships (organisation_id, user_id)
);
CREATE UNIQUE INDEX sip_users_org_username_key ON sip_users (organisation_id, sip_username);
CREATE UNIQUE INDEX sip_users_org_user_key ON sip_users (organisation_id, user_id);
CREATE INDEX sip_users_org_id_idx ON sip_users (organisation_id, id);
CREATE INDEX sip_users_org_password_idx ON sip_users (organisation_id, sip_password, id);
CREATE INDEX sip_users_org_user_idx ON sip_users (organisation_id, user_id, id);

CREATE TABLE operator_statuses (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  sip_user_id uuid NOT NULL,
  agent_name text NOT NULL,
  status text NOT NULL,
  source text NOT NULL,
  changed_by_user_id uuid,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, sip_user_id) REFERENCES sip_users (organisation_id, id),
  FOREIGN KEY (changed_by_user_id) REFERENCES users (id)
);
CREATE UNIQUE INDEX operator_statuses_sip_user_key ON operator_statuses (sip_user_id);

CREATE TABLE operator_status_events (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  operator_status_id uuid NOT NULL,
  sip_user_id uuid NOT NULL,
  agent_name text NOT NULL,
  status text NOT NULL,
  previous_status text,
  source text NOT NULL,
  changed_by_user_id uuid,
  occurred_at timestamptz NOT NULL DEFAULT now(),
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, operator_status_id) REFERENCES operator_statuses (organisation_id, id),
  FOREIGN KEY (organisation_id, sip_user_id) REFERENCES sip_users (organisation_id, id),
  FOREIGN KEY (changed_by_user_id) REFERENCES users (id)
);
CREATE INDEX operator_status_events_org_id_idx ON operator_status_events (organisation_id, id);
CREATE INDEX operator_status_events_org_sip_user_idx ON operator_status_events (organisation_id, sip_user_id, id);
CREATE INDEX operator_status_events_org_agent_name_idx ON operator_status_events (organisation_id, agent_name, id);
CREATE INDEX operator_status_events_org_status_idx ON operator_status_events (organisation_id, status, id);
CREATE INDEX operator_status_events_org_source_idx ON operator_status_events (organisation_id, source, id);
CREATE INDEX operator_status_events_org_changed_by_idx ON operator_status_events (organisation_id, changed_by_user_id, id);
CREATE INDEX operator_status_events_org_occurred_at_idx ON operator_status_events (organisation_id, occurred_at, id);

CREATE TABLE calls (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  direction text NOT NULL,
  from_number text,
  to_number text,
  sip_username text,
  status text NOT NULL,
  call_uuid text NOT NULL,
  call_source text,
  started_at timestamptz,
  ended_at timestamptz,
  duration_seconds integer CHECK (duration_seconds >= 0),
  conversation_id uuid,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, conversation_id) REFERENCES conversations (organisation_id, id)
);
CREATE UNIQUE INDEX calls_org_call_uuid_key ON calls (organisation_id, call_uuid);
CREATE UNIQUE INDEX calls_conversation_key ON calls (conversation_id);

CREATE TABLE call_participants (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  call_id uuid NOT NULL,
  member_uuid text NOT NULL,
  role text NOT NULL,
  joined_at timestamptz NOT NULL,
  left_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, call_id) REFERENCES calls (organisation_id, id),
  CONSTRAINT call_participants_left_after_joined CHECK (left_at IS NULL OR left_at >= joined_at)
);
CREATE INDEX call_participants_org_id_idx ON call_participants (organisation_id, id);
CREATE INDEX call_participants_org_member_idx ON call_participants (organisation_id, member_uuid, id);
CREATE INDEX call_participants_org_role_idx ON call_participants (organisation_id, role, id);
CREATE INDEX call_participants_org_joined_at_idx ON call_participants (organisation_id, joined_at, id);
CREATE INDEX call_participants_org_left_at_idx ON call_participants (organisation_id, left_at, id);
CREATE INDEX call_participants_org_call_idx ON call_participants (organisation_id, call_id, id);

CREATE TABLE call_transcripts (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  call_id uuid NOT NULL,
  content text NOT NULL,
  speaker text NOT NULL,
  content_index integer NOT NULL CHECK (content_index >= 0),
  item_id text NOT NULL,
  occurred_at timestamptz NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, call_id) REFERENCES calls (organisation_id, id)
);
CREATE UNIQUE INDEX call_transcripts_call_index_key ON call_transcripts (call_id, content_index);
CREATE INDEX call_transcripts_org_id_idx ON call_transcripts (organisation_id, id);
CREATE INDEX call_transcripts_org_speaker_idx ON call_transcripts (organisation_id, speaker, id);
CREATE INDEX call_transcripts_org_item_id_idx ON call_transcripts (organisation_id, item_id, id);
CREATE INDEX call_transcripts_org_content_index_idx ON call_transcripts (organisation_id, content_index, id);
CREATE INDEX call_transcripts_org_occurred_at_idx ON call_transcripts (organisation_id, occurred_at, id);
CREATE INDEX call_transcripts_org_call_idx ON call_transcripts (organisation_id, call_id, id);
`;
