/**
 * Short-lived SIP credentials for the browser softphone (issue 24, CONTRACT section 15).
 *
 * - `sip_credentials`: one row per credential the API issued (`POST /api/sip_users/credential`): a digest
 *   username of its own (`<sip_username>~<random>`, which no SIP user can have: `~` is outside their pattern),
 *   a random password, the member it was issued to and the credential that asked for it (a user session or a
 *   secret API key), and its expiry. The page never holds the SIP user's stored `sip_password`.
 * - `sip_subscriber` (Kamailio's auth_db view) gains these rows while they stand: not expired, the session or key
 *   behind them neither revoked nor expired, the member still in the organisation, and, for an operator, the SIP
 *   user still theirs. Kamailio reads the view on every REGISTER and INVITE, so expiry and revocation apply to the
 *   very next request, without a reload. The new `sip_username` column names the SIP user a row authenticates as
 *   (sip/kamailio.cfg compares it with the To or From user, since the digest username differs).
 * - The username column widens to 128 characters (a SIP user's 64 plus the credential's suffix).
 */
export const up = /* sql */ `
CREATE TABLE sip_credentials (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id) ON DELETE CASCADE,
  sip_user_id uuid NOT NULL REFERENCES sip_users (id) ON DELETE CASCADE,
  user_id uuid NOT NULL,
  session_id uuid REFERENCES user_sessions (id) ON DELETE CASCADE,
  api_key_id uuid REFERENCES api_keys (id) ON DELETE CASCADE,
  username text NOT NULL UNIQUE,
  password text NOT NULL,
  expires_at timestamptz NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  CHECK ((session_id IS NULL) <> (api_key_id IS NULL))
);
CREATE INDEX sip_credentials_org_expires_idx ON sip_credentials (organisation_id, expires_at);
CREATE INDEX sip_credentials_sip_user_idx ON sip_credentials (sip_user_id);

CREATE VIEW sip_credentials_standing AS
SELECT c.username, c.password, s.id AS sip_user_id, s.organisation_id, s.sip_username, o.slug
FROM sip_credentials c
JOIN sip_users s ON s.id = c.sip_user_id AND s.organisation_id = c.organisation_id
JOIN organisations o ON o.id = s.organisation_id
JOIN memberships m ON m.organisation_id = c.organisation_id AND m.user_id = c.user_id
WHERE c.expires_at > now()
  AND (m.role <> 'operator' OR s.user_id = c.user_id)
  AND (c.session_id IS NULL OR EXISTS (
    SELECT 1 FROM user_sessions us WHERE us.id = c.session_id AND us.revoked_at IS NULL AND us.expires_at > now()))
  AND (c.api_key_id IS NULL OR EXISTS (
    SELECT 1 FROM api_keys k WHERE k.id = c.api_key_id AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())));

DROP VIEW sip_subscriber;
CREATE VIEW sip_subscriber AS
SELECT s.sip_username::varchar(128) AS username,
       parley_sip_domain(o.slug)::varchar(128) AS domain,
       s.sip_password::varchar(128) AS password,
       s.id::varchar(36) AS sip_user_id,
       s.organisation_id::varchar(36) AS organisation_id,
       parley_sip_domain(o.slug)::varchar(128) AS org_domain,
       s.sip_username::varchar(64) AS sip_username
FROM sip_users s JOIN organisations o ON o.id = s.organisation_id
UNION ALL
SELECT s.sip_username::varchar(128),
       st.domain::varchar(128),
       s.sip_password::varchar(128),
       s.id::varchar(36),
       s.organisation_id::varchar(36),
       parley_sip_domain(o.slug)::varchar(128),
       s.sip_username::varchar(64)
FROM sip_users s JOIN organisations o ON o.id = s.organisation_id CROSS JOIN sip_settings st
WHERE (SELECT count(*) FROM organisations) = 1
UNION ALL
SELECT c.username::varchar(128),
       parley_sip_domain(c.slug)::varchar(128),
       c.password::varchar(128),
       c.sip_user_id::varchar(36),
       c.organisation_id::varchar(36),
       parley_sip_domain(c.slug)::varchar(128),
       c.sip_username::varchar(64)
FROM sip_credentials_standing c
UNION ALL
SELECT c.username::varchar(128),
       st.domain::varchar(128),
       c.password::varchar(128),
       c.sip_user_id::varchar(36),
       c.organisation_id::varchar(36),
       parley_sip_domain(c.slug)::varchar(128),
       c.sip_username::varchar(64)
FROM sip_credentials_standing c CROSS JOIN sip_settings st
WHERE (SELECT count(*) FROM organisations) = 1;
`;
