/**
 * An organisation's event ids in commit order, settled inside COMMIT.
 *
 * The outbox (src/jsonapi/outbox.ts) inserts each event with an id from the writer's clock. A deferred
 * constraint trigger on `events` runs at COMMIT, after everything else the transaction did (PostgreSQL,
 * CREATE CONSTRAINT TRIGGER ... INITIALLY DEFERRED), and moves the organisation's `event_order` row to the
 * event's id. That upsert locks the row until the transaction ends (INSERT ... ON CONFLICT DO UPDATE: "all
 * rows will be locked", whether or not the WHERE lets it update) and compares with the row's latest
 * committed version, so an organisation's commits pass this point one at a time and each event's id sorts
 * after every id committed before it. When the id from the writer's clock does not (another transaction
 * committed a later id first, or another process's clock is ahead), the event takes the next id after the
 * organisation's last one instead. The same trigger queues the event's webhook deliveries (one per enabled
 * endpoint of the organisation that wants the type) and notifies `parley_events` with `<organisation>:<id>`
 * (sent by PostgreSQL only on commit).
 *
 * Settling ids inside COMMIT keeps the lock for the time PostgreSQL itself needs to commit, without a round
 * trip to the writer while it is held (taking the lock in a statement of its own, the writer's next
 * statement and its COMMIT waited on the writer's process, which under load made an organisation's commits
 * pass at a few hundred per second). The row's lock is the last one a transaction takes, so no deadlock
 * cycle runs through it; different organisations never wait for each other.
 *
 * The rows start from the events already stored.
 */
export const up = /* sql */ `
CREATE TABLE event_order (
  organisation_id uuid PRIMARY KEY REFERENCES organisations (id) ON DELETE CASCADE,
  last_id uuid NOT NULL
);

INSERT INTO event_order (organisation_id, last_id)
  SELECT organisation_id, max(id::text)::uuid FROM events GROUP BY organisation_id;

CREATE FUNCTION parley_event_id_after(last uuid) RETURNS uuid LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
  hex text := replace(last::text, '-', '');
  -- The variant bits and rand_b (RFC 9562 section 5.7): the last 64 bits, negative as a bigint.
  low bigint := ('x' || substr(hex, 17, 16))::bit(64)::bigint;
BEGIN
  IF low = -4611686018427387905 THEN
    -- rand_b is exhausted (0xbfffffffffffffff): the next millisecond, rand_b from zero.
    RETURN (lpad(to_hex(('x' || substr(hex, 1, 12))::bit(48)::bigint + 1), 12, '0') || substr(hex, 13, 4) || '8000000000000000')::uuid;
  END IF;
  RETURN (substr(hex, 1, 16) || lpad(to_hex(low + 1), 16, '0'))::uuid;
END $$;

CREATE FUNCTION parley_settle_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  settled uuid := NEW.id;
BEGIN
  INSERT INTO event_order AS o (organisation_id, last_id) VALUES (NEW.organisation_id, NEW.id)
    ON CONFLICT (organisation_id) DO UPDATE SET last_id = EXCLUDED.last_id WHERE o.last_id < EXCLUDED.last_id;
  IF NOT FOUND THEN
    UPDATE event_order SET last_id = parley_event_id_after(last_id) WHERE organisation_id = NEW.organisation_id
      RETURNING last_id INTO settled;
    UPDATE events SET id = settled WHERE id = NEW.id;
  END IF;
  -- Delivery ids: a UUIDv7 of the event's millisecond (the event id's first 48 bits), random after.
  INSERT INTO webhook_deliveries (id, organisation_id, webhook_endpoint_id, event_id, event_type, status, next_attempt_at, created_at, updated_at)
    SELECT (substr(settled::text, 1, 14) || '7' || substr(gen_random_uuid()::text, 16))::uuid, NEW.organisation_id, w.id, settled, NEW.type,
           'pending', now(), now(), now()
    FROM webhook_endpoints w
    WHERE w.organisation_id = NEW.organisation_id AND w.enabled AND (cardinality(w.event_types) = 0 OR NEW.type = ANY (w.event_types));
  PERFORM pg_notify('parley_events', NEW.organisation_id::text || ':' || settled::text);
  RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER events_settle AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION parley_settle_event();
`;
