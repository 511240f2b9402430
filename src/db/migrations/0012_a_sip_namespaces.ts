/**
 * One SIP namespace per organisation (issue 21).
 *
 * - `organisations.slug`: a stable, unique DNS label made from the name (lower-case letters, digits and
 *   hyphens; a second organisation of the same name gets the first 8 hex digits of its id appended). It is
 *   stored, so renaming an organisation never moves its phones to another domain.
 * - `organisations.default_country`: ISO 3166-1 alpha-2 country whose national numbers the organisation writes
 *   and dials without the international prefix (null: only international numbers).
 * - `sip_settings`: one row holding the installation's `SIP_DOMAIN`, written by `parley sip serve` when it
 *   starts, so that the views Kamailio reads and the API (Organisation `sip_domain`, SipUser `sip_uri`) derive
 *   the same domains from it: `<slug>.<SIP_DOMAIN>` (`parley_sip_domain`).
 * - `sip_subscriber` now has one row per SIP user in its organisation's domain (auth_db and is_subscriber with
 *   `use_domain`): a registration or a call is resolved by (domain, user), never by the user alone, so two
 *   organisations may both have `alice`. While the installation has exactly one organisation, its users are
 *   also found in the bare `SIP_DOMAIN` (the single-tenant case); `org_domain` is the domain they are stored
 *   under (Kamailio saves and looks up registrations there whichever name was used).
 * - `calls.sip_code` and `calls.end_reason`: the SIP final response of a call that did not complete and why
 *   (a call to an unregistered user, to an AI agent before the voice runtime, refused by policy).
 */
export const up = /* sql */ `
ALTER TABLE organisations ADD COLUMN slug text;
UPDATE organisations o SET slug = d.slug
FROM (
  SELECT id,
         CASE WHEN row_number() OVER (PARTITION BY base ORDER BY created_at, id) = 1 THEN base
              ELSE base || '-' || substr(id::text, 1, 8) END AS slug
  FROM (
    SELECT id, created_at,
           coalesce(nullif(trim(both '-' FROM left(regexp_replace(lower(name), '[^a-z0-9]+', '-', 'g'), 40)), ''), 'org') AS base
    FROM organisations
  ) b
) d
WHERE d.id = o.id;
ALTER TABLE organisations ALTER COLUMN slug SET NOT NULL;
ALTER TABLE organisations ADD CONSTRAINT organisations_slug_key UNIQUE (slug);
ALTER TABLE organisations ADD COLUMN default_country text CHECK (default_country ~ '^[A-Z]{2}$');
ALTER TABLE organisations ADD CONSTRAINT organisations_slug_check CHECK (slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$');

CREATE TABLE sip_settings (
  id integer PRIMARY KEY CHECK (id = 1),
  domain text NOT NULL
);
INSERT INTO sip_settings (id, domain) VALUES (1, 'parley.local');

CREATE FUNCTION parley_sip_domain(slug text) RETURNS text LANGUAGE sql STABLE AS $$
  SELECT $1 || '.' || (SELECT s.domain FROM sip_settings s WHERE s.id = 1)
$$;

DROP VIEW sip_subscriber;
CREATE VIEW sip_subscriber AS
SELECT s.sip_username::varchar(64) AS username,
       parley_sip_domain(o.slug)::varchar(128) AS domain,
       s.sip_password::varchar(128) AS password,
       s.id::varchar(36) AS sip_user_id,
       s.organisation_id::varchar(36) AS organisation_id,
       parley_sip_domain(o.slug)::varchar(128) AS org_domain
FROM sip_users s JOIN organisations o ON o.id = s.organisation_id
UNION ALL
SELECT s.sip_username::varchar(64),
       st.domain::varchar(128),
       s.sip_password::varchar(128),
       s.id::varchar(36),
       s.organisation_id::varchar(36),
       parley_sip_domain(o.slug)::varchar(128)
FROM sip_users s JOIN organisations o ON o.id = s.organisation_id CROSS JOIN sip_settings st
WHERE (SELECT count(*) FROM organisations) = 1;

ALTER TABLE calls ADD COLUMN sip_code integer CHECK (sip_code BETWEEN 100 AND 699);
ALTER TABLE calls ADD COLUMN end_reason text;
`;
