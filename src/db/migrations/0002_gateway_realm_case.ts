/**
 * A gateway's name is `username@realm`; the realm is a host name, which is
 * case-insensitive, while the SIP user part is not (RFC 3261 section 19.1.4).
 */
export const up = /* sql */ `
DROP INDEX gateways_org_name_key;
CREATE UNIQUE INDEX gateways_org_name_key ON gateways (organisation_id, username, lower(realm));
`;
