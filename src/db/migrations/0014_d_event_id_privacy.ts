/**
 * Event ids that say nothing about other organisations.
 *
 * Migration 0011 put a sequence number shared by every organisation (`event_sequence`) in each event id's last
 * 62 bits (rand_b), so that ids taken one after the other sort one after the other. Any tenant could subtract
 * two of its own ids and learn how many events the whole installation wrote in between (its write rate).
 *
 * Now rand_b (RFC 9562 section 5.7: "random", monotonic within a millisecond by method 3) carries:
 *
 * - 22 bits of order within the millisecond: the microsecond of the database's clock, raised when needed above
 *   the organisation's last visible event and above the last id this session took for the organisation (several
 *   events of one statement see neither each other nor the clock move); what a tenant learns there is its own
 *   timing;
 * - 40 bits that make the id unique: the shared sequence number through a keyed permutation (a four-round
 *   Feistel network on 40 bits, round function `hashtextextended` with the installation's own random key),
 *   so two ids never collide (a permutation of distinct numbers) and nothing of the count shows.
 *
 * Order is kept as 0011 describes: an id sorts after every event of its organisation committed before it was
 * taken (the floor read under the shared lock) and readers still read a prefix. The key is made by the first
 * event, not by this migration, so that a prebuilt database (the embedded database's template) carries none.
 */
export const up = /* sql */ `
CREATE TABLE event_id_key (
  id boolean PRIMARY KEY DEFAULT true CHECK (id),
  k bigint NOT NULL
);

CREATE FUNCTION parley_event_mask(x bigint) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  key bigint;
  l bigint := (x >> 20) & 1048575;
  r bigint := x & 1048575;
  t bigint;
BEGIN
  SELECT k INTO key FROM event_id_key;
  IF key IS NULL THEN
    INSERT INTO event_id_key (id, k) VALUES (true, floor(random() * 9007199254740991)::bigint) ON CONFLICT (id) DO NOTHING;
    SELECT k INTO key FROM event_id_key;
  END IF;
  FOR i IN 1..4 LOOP
    t := r;
    r := l # (hashtextextended(r::text || ':' || i::text, key) & 1048575);
    l := t;
  END LOOP;
  RETURN (l << 20) | r;
END $$;

CREATE OR REPLACE FUNCTION parley_event_id(org uuid) RETURNS uuid LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  us bigint := floor(extract(epoch FROM clock_timestamp()) * 1000000);
  ms bigint := us / 1000;
  sub bigint := us % 1000;
  last uuid;
  prior text := current_setting('parley.last_event', true);
  hex text;
  last_ms bigint;
  last_sub bigint;
  result uuid;
BEGIN
  -- Key space 1886548089 ('parl'), the organisation's hash: shared among writers, exclusive for a reader.
  PERFORM pg_advisory_xact_lock_shared(1886548089, hashtext(org::text));
  SELECT e.id INTO last FROM events e WHERE e.organisation_id = org ORDER BY e.id DESC LIMIT 1;
  IF prior IS NOT NULL AND prior <> '' AND split_part(prior, '/', 1) = org::text
     AND (last IS NULL OR split_part(prior, '/', 2)::uuid > last) THEN
    last := split_part(prior, '/', 2)::uuid;
  END IF;
  IF last IS NOT NULL THEN
    hex := replace(last::text, '-', '');
    last_ms := ('x' || substr(hex, 1, 12))::bit(48)::bigint;
    last_sub := (('x' || substr(hex, 17, 16))::bit(64)::bigint >> 40) & 4194303;
    IF ms < last_ms OR (ms = last_ms AND sub <= last_sub) THEN
      ms := last_ms;
      sub := last_sub + 1;
      IF sub > 4194303 THEN
        ms := ms + 1;
        sub := 0;
      END IF;
    END IF;
  END IF;
  -- The variant bits (10), the order within the millisecond, the masked sequence number.
  result := (lpad(to_hex(ms), 12, '0') || '7000'
    || to_hex((sub << 40) | parley_event_mask(nextval('event_sequence') & 1099511627775) | (-9223372036854775807 - 1)))::uuid;
  PERFORM set_config('parley.last_event', org::text || '/' || result::text, false);
  RETURN result;
END $$;
`;
