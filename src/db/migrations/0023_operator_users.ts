/**
 * Availability for every operator, with or without a SIP user (docs/api.md, "OperatorStatus").
 *
 * Until now a status was keyed by its SIP user, and routing of handoffs found the operator through the SIP
 * user's `user_id`, so a chat-only operator could never be available. A status now names its user as well:
 * `user_id` is set for a SIP user that has a user (filled in here for the existing rows) and for an operator
 * without a SIP user, whose status has no `sip_user_id`. Each operator has one current status (the unique
 * index on the user), each SIP user too (the existing one); a row names at least one of them.
 *
 * The same migration indexes the items' content for search by words (below).
 *
 * The current status's user is a member of the organisation (removing the member removes or detaches it,
 * src/resources/user.ts); the history keeps the user it was about, like `changed_by_user_id`.
 */
export const up = /* sql */ `
ALTER TABLE operator_statuses ADD COLUMN user_id uuid;
ALTER TABLE operator_statuses ALTER COLUMN sip_user_id DROP NOT NULL;
UPDATE operator_statuses os SET user_id = s.user_id FROM sip_users s WHERE s.id = os.sip_user_id;
ALTER TABLE operator_statuses ADD CONSTRAINT operator_statuses_user_fkey
  FOREIGN KEY (organisation_id, user_id) REFERENCES memberships (organisation_id, user_id);
ALTER TABLE operator_statuses ADD CONSTRAINT operator_statuses_names_operator
  CHECK (sip_user_id IS NOT NULL OR user_id IS NOT NULL);
CREATE UNIQUE INDEX operator_statuses_org_user_key ON operator_statuses (organisation_id, user_id);
CREATE INDEX operator_statuses_org_user_idx ON operator_statuses (organisation_id, user_id, id);

ALTER TABLE operator_status_events ADD COLUMN user_id uuid REFERENCES users (id);
ALTER TABLE operator_status_events ALTER COLUMN sip_user_id DROP NOT NULL;
UPDATE operator_status_events e SET user_id = os.user_id FROM operator_statuses os WHERE os.id = e.operator_status_id;
CREATE INDEX operator_status_events_org_user_idx ON operator_status_events (organisation_id, user_id, id);

-- Search by content (docs/api.md, "Search"): \`filter[content][matches]\` is full text search over the items'
-- content with the \`simple\` configuration (no stemming, so every language is searched alike; each word a
-- prefix), answered by this index; tenancy's organisation_id condition is ANDed with it by the engine.
CREATE INDEX conversation_items_content_search_idx ON conversation_items USING gin (to_tsvector('simple', content));
`;
