/**
 * An API key's role ceiling: the role of whoever issued it. A key acts with its user's role in the
 * organisation, but never above its ceiling, so a key an admin issued for an operator does not become an
 * owner's key when that operator is later made an owner (the admin keeps a copy of every key they issue).
 * NULL: no ceiling beyond the member's role (keys the command line or the demo issue: the installation's
 * operator stands above every role).
 *
 * Keys issued before this migration take their user's role now as their ceiling: who issued them is not
 * recorded, and their user's role is the most any of them could be used for today.
 */
export const up = /* sql */ `
ALTER TABLE api_keys ADD COLUMN role_ceiling text CHECK (role_ceiling IN ('owner', 'admin', 'operator'));

UPDATE api_keys k SET role_ceiling = m.role FROM memberships m
  WHERE m.organisation_id = k.organisation_id AND m.user_id = k.user_id;
`;
