/**
 * Each organisation's signing secret for its agents' tool calls (docs/agents.md, "Tools"): a Standard Webhooks
 * secret (`whsec_…`), made when the organisation's first tool is called or when an owner or admin asks for it
 * (`POST /api/organisations/tool_secret`, which makes a new one and shows it once). Bookkeeping of the agent
 * runtime, not a resource: it is never listed or read back over the API.
 */
export const up = /* sql */ `
CREATE TABLE tool_secrets (
  organisation_id uuid PRIMARY KEY REFERENCES organisations(id) ON DELETE CASCADE,
  secret text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
`;
