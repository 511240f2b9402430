/**
 * A call's facts are one dialog variable (sip/kamailio.cfg, route[FACTS]: the JSON object its events start from)
 * instead of one per fact, since the dialog module writes each variable as its own row. The packed value holds
 * what nine values of up to 512 characters each held before, so the column takes any length.
 */
export const up = /* sql */ `
ALTER TABLE sip_dialog_vars ALTER COLUMN dialog_value TYPE text;
`;
