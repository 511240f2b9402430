/**
 * What Kamailio (the SIP edge, `parley sip serve`) reads and writes in Parley's database.
 * Kamailio's modules read fixed column sets (Kamailio 5.6's schemas in /usr/share/kamailio/postgres);
 * views map Parley's own tables onto them, so an edit through the API is what Kamailio sees:
 * - `sip_subscriber` (auth_db, table version 7): one row per SIP user whose `sip_username` no other
 *   organisation uses. Users register as `<sip_username>@<SIP_DOMAIN>` in one SIP domain, so a name
 *   shared by two organisations would be ambiguous; it is left out (refused) instead of guessed.
 *   Kamailio computes HA1 = MD5(username:realm:password) (RFC 2617 section 3.2.2.2) itself, because the
 *   realm (SIP_DOMAIN) is a setting of `sip serve`, not data.
 * - `sip_uacreg` (uac, version 5): gateways with `register: true` and a password, registered by Kamailio.
 * - `sip_address` (permissions, version 6): one row per CIDR block of a gateway's `inbound_acl`; its tag is
 *   the organisation, so an INVITE from that block is that organisation's inbound trunk call.
 * - `sip_locations` (usrloc, version 9): a table Kamailio writes (write-through), read by Parley for the
 *   SIP user's `registered` attribute. Expiry times are Unix seconds (usrloc `expires_type` 1).
 * db_postgres hands `text` columns to modules as blobs, which uac and permissions refuse: view columns are varchar.
 * Kamailio checks each table's version in its own `kamailio_version` table (core `version_table`).
 */
export const up = /* sql */ `
CREATE INDEX sip_users_username_idx ON sip_users (sip_username);

CREATE TABLE kamailio_version (
  id serial PRIMARY KEY,
  table_name varchar(32) NOT NULL UNIQUE,
  table_version integer NOT NULL DEFAULT 0
);
INSERT INTO kamailio_version (table_name, table_version) VALUES
  ('version', 1), ('sip_subscriber', 7), ('sip_locations', 9), ('location_attrs', 1), ('sip_uacreg', 5), ('sip_address', 6);

CREATE VIEW sip_subscriber AS
SELECT s.sip_username::varchar(64) AS username,
       ''::varchar(64) AS domain,
       s.sip_password::varchar(128) AS password,
       s.id::varchar(36) AS sip_user_id,
       s.organisation_id::varchar(36) AS organisation_id
FROM sip_users s
WHERE NOT EXISTS (
  SELECT 1 FROM sip_users other WHERE other.sip_username = s.sip_username AND other.organisation_id <> s.organisation_id
);

CREATE TABLE sip_locations (
  id serial PRIMARY KEY,
  ruid varchar(64) NOT NULL DEFAULT '' UNIQUE,
  username varchar(64) NOT NULL DEFAULT '',
  domain varchar(64),
  contact varchar(512) NOT NULL DEFAULT '',
  received varchar(128),
  path varchar(512),
  expires bigint NOT NULL DEFAULT 0,
  q real NOT NULL DEFAULT 1.0,
  callid varchar(255) NOT NULL DEFAULT 'Default-Call-ID',
  cseq integer NOT NULL DEFAULT 1,
  last_modified bigint NOT NULL DEFAULT 0,
  flags integer NOT NULL DEFAULT 0,
  cflags integer NOT NULL DEFAULT 0,
  user_agent varchar(255) NOT NULL DEFAULT '',
  socket varchar(64),
  methods integer,
  instance varchar(255),
  reg_id integer NOT NULL DEFAULT 0,
  server_id integer NOT NULL DEFAULT 0,
  connection_id integer NOT NULL DEFAULT 0,
  keepalive integer NOT NULL DEFAULT 0,
  partition integer NOT NULL DEFAULT 0
);
CREATE INDEX sip_locations_account_idx ON sip_locations (username, domain, contact);
CREATE INDEX sip_locations_expires_idx ON sip_locations (expires);

CREATE VIEW sip_uacreg AS
SELECT ('x' || substr(md5(g.id::text), 1, 7))::bit(28)::int AS id,
       g.id::varchar(64) AS l_uuid,
       g.username::varchar(64) AS l_username,
       g.realm::varchar(64) AS l_domain,
       g.username::varchar(64) AS r_username,
       g.realm::varchar(64) AS r_domain,
       g.realm::varchar(64) AS realm,
       g.username::varchar(64) AS auth_username,
       g.password::varchar(64) AS auth_password,
       ''::varchar(128) AS auth_ha1,
       ('sip:' || coalesce(g.proxy, g.realm))::varchar(255) AS auth_proxy,
       300 AS expires,
       0 AS flags,
       0 AS reg_delay,
       ''::varchar(255) AS contact_addr,
       ''::varchar(128) AS socket
FROM gateways g
WHERE g.register AND g.password IS NOT NULL;

CREATE VIEW sip_address AS
SELECT row_number() OVER (ORDER BY g.id, acl.block)::int AS id,
       1 AS grp,
       host(acl.block::cidr)::varchar(50) AS ip_addr,
       masklen(acl.block::cidr) AS mask,
       0 AS port,
       g.organisation_id::varchar(64) AS tag
FROM gateways g CROSS JOIN LATERAL unnest(g.inbound_acl) AS acl(block);
`;
