/**
 * Each of these tables had two indexes on (organisation_id, id): the unique one that composite foreign keys
 * name (`<table>_organisation_id_id_key`) and a plain one made for the same lookups. Every row version written
 * paid for both; the unique one serves every query the plain one did. Measured on the SIP edge, where a call
 * writes nine row versions of calls, conversations and call_participants (docs/benchmarks.md).
 */
export const up = /* sql */ `
DROP INDEX ai_agents_org_id_idx, api_keys_org_id_idx, call_participants_org_id_idx, call_transcripts_org_id_idx,
  calls_org_id_idx, conversations_org_id_idx, gateways_org_id_idx, operator_status_events_org_id_idx,
  operator_statuses_org_id_idx, sip_users_org_id_idx;
`;
