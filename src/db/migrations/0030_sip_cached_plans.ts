/**
 * Kamailio's per-request lookups with plans kept between requests. A plain query on the `sip_subscriber` view (four
 * unions, nine relations) took 3-5 ms to plan and 0.1 ms to run, on every REGISTER and INVITE; `parley_sip_dial`
 * and the other SQL functions, inlined into the caller's query, were planned anew each time too. PL/pgSQL keeps
 * a statement's plan per connection; forced generic, since each is a lookup by key whose plan does not depend on
 * the values (the default plans the first five calls of every connection anew). docs/sip.md, "Data":
 *
 * - `parley_sip_credentials(user, realm)`: the digest check's row of `sip_subscriber` (sip/kamailio.cfg,
 *   route[DIGEST]); the view stays the one definition of who may authenticate.
 * - The routing functions keep their bodies (0012_b, 0012_c) and become PL/pgSQL (`use_column`: a name in a body
 *   is the column, as it was in SQL, never the function's own output of that name).
 */
export const up = /* sql */ `
CREATE FUNCTION parley_sip_credentials(auth_user text, realm text) RETURNS TABLE (
  password varchar, organisation_id varchar, sip_user_id varchar, org_domain varchar, sip_username varchar
) LANGUAGE sql STABLE AS $$
  SELECT password, organisation_id, sip_user_id, org_domain, sip_username FROM sip_subscriber
  WHERE username = $1 AND domain = $2
$$;

DO $$
DECLARE f record;
BEGIN
  FOR f IN SELECT p.proname, pg_get_function_arguments(p.oid) AS args, pg_get_function_result(p.oid) AS result,
                  p.prosrc
           FROM pg_proc p
           WHERE p.proname IN ('parley_sip_credentials', 'parley_sip_did', 'parley_sip_dial', 'parley_sip_outbound',
                               'parley_sip_operators', 'parley_sip_contact_user')
  LOOP
    EXECUTE format('CREATE OR REPLACE FUNCTION %I(%s) RETURNS %s LANGUAGE plpgsql STABLE '
                   'SET plan_cache_mode = force_generic_plan AS %L',
                   f.proname, f.args, f.result,
                   E'#variable_conflict use_column\\nBEGIN\\nRETURN QUERY' || f.prosrc || E';\\nEND');
  END LOOP;
END
$$;
`;
