/**
 * Event ids in commit order without making an organisation's commits wait for each other.
 *
 * Migration 0010 settled each event's id at COMMIT under the organisation's `event_order` row lock and sent a
 * NOTIFY from the same transaction. Both serialised an organisation's commits: a row lock and the lock that
 * PostgreSQL takes to queue a transaction's notifications (database-wide) are released only after the commit
 * record is flushed, so each writer waited for the one before it to flush, then for the scheduler to run it
 * again. Measured on the bench (item creates at 32 connections, one organisation), either one alone held
 * creates with events at about 0.7-0.8 of creates without.
 *
 * Now an event takes its id in the transaction's last statement before COMMIT (the outbox writes events
 * there, src/jsonapi/outbox.ts), from `parley_event_id`, under a *shared* advisory lock of the organisation,
 * which writers never wait for among themselves:
 *
 * - the id is a UUIDv7 (RFC 9562 section 5.7) of the database's clock, never before the millisecond of the
 *   organisation's last visible event (a clock that steps back does not reorder), with a sequence number in
 *   its last 62 bits (rand_b; rand_a is zero), so that ids drawn one after the other sort one after the other;
 * - readers (`parley_read_events`) take the same lock *exclusively* for the duration of one statement: it is
 *   granted once every transaction that drew an id before it has ended, and while it is held no one draws.
 *   The rows it returns are therefore a prefix of the organisation's events in id order: no event with a
 *   smaller id can commit afterwards, so a client resuming after the last id it saw misses nothing.
 *
 * Two transactions whose last statements run at the same moment may take their ids in either order; no
 * reader can see one event without the other's transaction having ended. No row is written twice (0010's
 * trigger rewrote the id of every event that lost the race, a second copy of the row in the WAL). The
 * NOTIFY goes: each server process announces the organisations it wrote to after its commits
 * (src/db/connection.ts, `notifyAfterCommit`). Webhook deliveries are queued by a statement trigger, in the
 * writing transaction.
 */
export const up = /* sql */ `
DROP TRIGGER events_settle ON events;
DROP FUNCTION parley_settle_event();
DROP FUNCTION parley_event_id_after(uuid);
DROP TABLE event_order;
-- Retention prunes by id (its first 48 bits are the millisecond it was written, never earlier): one index less to write.
DROP INDEX events_occurred_idx;

-- rand_b has 62 bits.
CREATE SEQUENCE event_sequence AS bigint MAXVALUE 4611686018427387903;

-- VOLATILE: its query sees what committed before it ran (PostgreSQL, "Function Volatility Categories").
CREATE FUNCTION parley_event_id(org uuid) RETURNS uuid LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  ms bigint := floor(extract(epoch FROM clock_timestamp()) * 1000);
  last uuid;
BEGIN
  -- Key space 1886548089 ('parl'), the organisation's hash: shared among writers, exclusive for a reader.
  PERFORM pg_advisory_xact_lock_shared(1886548089, hashtext(org::text));
  SELECT e.id INTO last FROM events e WHERE e.organisation_id = org ORDER BY e.id DESC LIMIT 1;
  IF last IS NOT NULL THEN
    ms := GREATEST(ms, ('x' || substr(replace(last::text, '-', ''), 1, 12))::bit(48)::bigint);
  END IF;
  -- The variant bits (10) and the sequence number: to_hex reads a negative bigint as its 64 bits.
  RETURN (lpad(to_hex(ms), 12, '0') || '7000' || to_hex(nextval('event_sequence') | (-9223372036854775807 - 1)))::uuid;
END $$;

-- One delivery per new event and enabled endpoint of its organisation that wants its type. Delivery ids: a
-- UUIDv7 of the event's millisecond (the event id's first 48 bits), random after.
CREATE FUNCTION parley_queue_deliveries() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO webhook_deliveries (id, organisation_id, webhook_endpoint_id, event_id, event_type, status, next_attempt_at, created_at, updated_at)
    SELECT (substr(e.id::text, 1, 14) || '7' || substr(gen_random_uuid()::text, 16))::uuid, e.organisation_id, w.id, e.id, e.type,
           'pending', now(), now(), now()
    FROM inserted e JOIN webhook_endpoints w ON w.organisation_id = e.organisation_id
    WHERE w.enabled AND (cardinality(w.event_types) = 0 OR e.type = ANY (w.event_types));
  RETURN NULL;
END $$;

CREATE TRIGGER events_queue_deliveries AFTER INSERT ON events REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION parley_queue_deliveries();

-- An organisation's events after \`after\` (all when NULL), in id order, each with its event JSON: VOLATILE, so
-- the query below takes its snapshot after the lock is granted (PostgreSQL, "Function Volatility Categories").
CREATE FUNCTION parley_read_events(org uuid, after uuid, max_rows integer)
  RETURNS TABLE (id uuid, type text, organisation_id uuid, event_json text) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(1886548089, hashtext(org::text));
  RETURN QUERY
    SELECT e.id, e.type, e.organisation_id,
      json_build_object('id', e.id, 'type', e.type,
        'occurred_at', to_char(e.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
        'organisation_id', e.organisation_id, 'data', e.data)::text
    FROM events e
    WHERE e.organisation_id = org AND (after IS NULL OR e.id > after)
    ORDER BY e.id LIMIT max_rows;
END $$;

-- The id of an organisation's last event, under the same lock (where a live stream starts).
CREATE FUNCTION parley_last_event_id(org uuid) RETURNS uuid LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  last uuid;
BEGIN
  PERFORM pg_advisory_xact_lock(1886548089, hashtext(org::text));
  SELECT e.id INTO last FROM events e WHERE e.organisation_id = org ORDER BY e.id DESC LIMIT 1;
  RETURN last;
END $$;
`;
