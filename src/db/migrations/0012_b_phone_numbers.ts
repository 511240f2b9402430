/**
 * Phone numbers and how the SIP edge routes calls to them (issue 21).
 *
 * - `phone_numbers`: an E.164 number (RFC 3966 global number, `+` and up to 15 digits, ITU-T E.164), unique in
 *   the installation (a number belongs to one organisation), optionally tied to the gateway (trunk) it arrives
 *   on, routed to an AI agent, a SIP user, or, with neither, the organisation's available operators. At most one
 *   target (a CHECK). Both references stay inside the organisation (composite foreign keys).
 * - Kamailio resolves calls with two functions through sqlops (values checked by the routing script first):
 *   `parley_sip_did(source address, dialled)` for a request from a carrier: the number must be one of an
 *   organisation's numbers AND the address inside one of that organisation's gateways' `inbound_acl` (the
 *   number's own gateway when it names one), so two organisations may share a carrier address.
 *   `parley_sip_dial(organisation, dialled)` for a registered phone: `agent-<id>`, a SIP user of its
 *   organisation, one of its numbers, or another number (outbound). Both return the same columns.
 *   `parley_sip_operators(organisation)`: the SIP users of operators whose status is `available`;
 *   `parley_sip_contact_user(organisation, contact)`: whose registered contact answered a forked call.
 */
export const up = /* sql */ `
CREATE TABLE phone_numbers (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  number text NOT NULL CHECK (number ~ '^\\+[1-9][0-9]{1,14}$'),
  gateway_id uuid,
  ai_agent_id uuid,
  sip_user_id uuid,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  CHECK (ai_agent_id IS NULL OR sip_user_id IS NULL),
  FOREIGN KEY (organisation_id, gateway_id) REFERENCES gateways (organisation_id, id),
  FOREIGN KEY (organisation_id, ai_agent_id) REFERENCES ai_agents (organisation_id, id),
  FOREIGN KEY (organisation_id, sip_user_id) REFERENCES sip_users (organisation_id, id)
);
CREATE UNIQUE INDEX phone_numbers_number_key ON phone_numbers (number);
CREATE INDEX phone_numbers_org_created_idx ON phone_numbers (organisation_id, created_at, id);

CREATE FUNCTION parley_sip_target(n phone_numbers) RETURNS TABLE (
  organisation_id varchar, org_domain varchar, kind varchar, target_id varchar, target_user varchar, number varchar
) LANGUAGE sql STABLE AS $$
  SELECT n.organisation_id::varchar, parley_sip_domain(o.slug)::varchar,
         CASE WHEN n.ai_agent_id IS NOT NULL THEN 'ai_agent' WHEN n.sip_user_id IS NOT NULL THEN 'sip_user' ELSE 'operators' END::varchar,
         coalesce(n.ai_agent_id, n.sip_user_id)::varchar,
         (SELECT s.sip_username FROM sip_users s WHERE s.id = n.sip_user_id)::varchar,
         n.number::varchar
  FROM organisations o WHERE o.id = n.organisation_id
$$;

CREATE FUNCTION parley_sip_did(source text, dialled text) RETURNS TABLE (
  organisation_id varchar, org_domain varchar, kind varchar, target_id varchar, target_user varchar, number varchar
) LANGUAGE sql STABLE AS $$
  SELECT t.* FROM phone_numbers n CROSS JOIN LATERAL parley_sip_target(n) t
  WHERE n.number = '+' || regexp_replace($2, '[^0-9]', '', 'g')
    AND EXISTS (
      SELECT 1 FROM gateways g CROSS JOIN LATERAL unnest(g.inbound_acl) AS acl(block)
      WHERE g.organisation_id = n.organisation_id AND (n.gateway_id IS NULL OR g.id = n.gateway_id)
        AND $1::inet <<= acl.block::cidr)
$$;

CREATE FUNCTION parley_sip_dial(organisation text, dialled text) RETURNS TABLE (
  organisation_id varchar, org_domain varchar, kind varchar, target_id varchar, target_user varchar, number varchar
) LANGUAGE sql STABLE AS $$
  SELECT * FROM (
    SELECT a.organisation_id::varchar, parley_sip_domain(o.slug)::varchar, 'ai_agent'::varchar, a.id::varchar, NULL::varchar, $2::varchar
    FROM ai_agents a JOIN organisations o ON o.id = a.organisation_id
    WHERE $2 ~* '^agent-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
      AND a.organisation_id::text = $1 AND a.id::text = lower(substr($2, 7))
    UNION ALL
    SELECT s.organisation_id::varchar, parley_sip_domain(o.slug)::varchar, 'sip_user'::varchar, s.id::varchar, s.sip_username::varchar, $2::varchar
    FROM sip_users s JOIN organisations o ON o.id = s.organisation_id
    WHERE s.organisation_id::text = $1 AND s.sip_username = $2
    UNION ALL
    SELECT t.* FROM phone_numbers n CROSS JOIN LATERAL parley_sip_target(n) t
    WHERE n.organisation_id::text = $1 AND $2 ~ '^\\+?[0-9]{2,15}$'
      AND n.number = '+' || regexp_replace($2, '[^0-9]', '', 'g')
  ) r LIMIT 1
$$;

CREATE FUNCTION parley_sip_operators(organisation text) RETURNS TABLE (sip_username varchar) LANGUAGE sql STABLE AS $$
  SELECT s.sip_username::varchar FROM sip_users s JOIN operator_statuses st ON st.sip_user_id = s.id
  WHERE s.organisation_id::text = $1 AND s.user_id IS NOT NULL AND st.status = 'available'
  ORDER BY s.sip_username
$$;

CREATE FUNCTION parley_sip_contact_user(organisation text, contact text) RETURNS TABLE (sip_user_id varchar) LANGUAGE sql STABLE AS $$
  SELECT s.id::varchar FROM sip_locations l
  JOIN sip_users s ON s.sip_username = l.username
  JOIN organisations o ON o.id = s.organisation_id AND parley_sip_domain(o.slug) = l.domain
  WHERE s.organisation_id::text = $1 AND l.contact = $2
  LIMIT 1
$$;
`;
