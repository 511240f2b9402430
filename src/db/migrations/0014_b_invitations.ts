/**
 * Invitations: how a person joins an organisation over the API (docs/api.md, "Members and roles"). An owner
 * or admin invites an e-mail address with a role; the invitation's token (shown once, only its SHA-256 kept)
 * goes to the person, who accepts it by signing in with that address's account or, when the address has
 * none, by choosing a password. The membership exists only from the acceptance on. Inviting never looks at
 * the accounts, so the answer is the same whether the address has an account anywhere or not.
 */
export const up = /* sql */ `
CREATE TABLE invitations (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  email text NOT NULL CHECK (char_length(email) BETWEEN 3 AND 254),
  role text NOT NULL CHECK (role IN ('owner', 'admin', 'operator')),
  invited_by_user_id uuid,
  token_hash text NOT NULL UNIQUE,
  expires_at timestamptz NOT NULL,
  accepted_at timestamptz,
  user_id uuid,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX invitations_org_id_idx ON invitations (organisation_id, id);
CREATE INDEX invitations_org_email_idx ON invitations (organisation_id, email, id);
CREATE INDEX invitations_org_expires_at_idx ON invitations (organisation_id, expires_at, id);
CREATE INDEX invitations_org_accepted_at_idx ON invitations (organisation_id, accepted_at, id);
CREATE INDEX invitations_org_created_at_idx ON invitations (organisation_id, created_at, id);
CREATE INDEX invitations_org_updated_at_idx ON invitations (organisation_id, updated_at, id);
`;
