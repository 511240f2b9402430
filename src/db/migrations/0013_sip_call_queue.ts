/**
 * Call events off Kamailio's hot path, and Kamailio's dialogs kept in the database (docs/sip.md).
 *
 * - `sip_call_events`: the durable queue between Kamailio and `sip serve`. A Kamailio worker hands each call
 *   event to an in-memory queue (mqueue) and goes on relaying; one Kamailio timer process drains it into this
 *   table in batches, in the order the events were queued, and keeps a batch to retry while the database is
 *   unreachable. `sip serve` consumes the rows in id order (`FOR UPDATE SKIP LOCKED` under a lease), applies
 *   each through the records service and deletes it; a consumer that dies leaves its lease to expire, and the
 *   rows are applied again, which the status machine makes harmless (exactly once in effect). `call_key` is
 *   the MD5 of the Call-ID (hex), `body` the event's JSON in base64: both only ever hold characters that
 *   need no SQL escaping, so Kamailio can write them into a statement verbatim. A row whose body is invalid
 *   or that keeps failing gets its `error` and stays, out of the queue, for an operator to read.
 *   A statement trigger sends NOTIFY `sip_call_events`, which wakes the consumer (it also polls).
 * - `sip_dialogs`, `sip_dialog_vars`: the dialog module's tables (Kamailio 5.6 schemas, versions 7 and 1),
 *   written by Kamailio (`db_mode` 2) and loaded at its start, so that a call still talking survives a restart
 *   of Kamailio or `sip serve`; reconciliation reads them instead of listing dialogs over RPC, which answers
 *   "reply too big" above a few hundred dialogs.
 */
export const up = /* sql */ `
CREATE TABLE sip_call_events (
  id bigserial PRIMARY KEY,
  call_key varchar(64) NOT NULL,
  body text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  attempts integer NOT NULL DEFAULT 0,
  lease_until timestamptz,
  error text
);
CREATE INDEX sip_call_events_call_idx ON sip_call_events (call_key, id);

CREATE FUNCTION parley_sip_call_events_queued() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('sip_call_events', ''); RETURN NULL; END $$;

CREATE TRIGGER sip_call_events_queued AFTER INSERT ON sip_call_events
  FOR EACH STATEMENT EXECUTE FUNCTION parley_sip_call_events_queued();

CREATE TABLE sip_dialogs (
  id serial PRIMARY KEY,
  hash_entry integer NOT NULL,
  hash_id integer NOT NULL,
  callid varchar(255) NOT NULL,
  from_uri varchar(255) NOT NULL,
  from_tag varchar(128) NOT NULL,
  to_uri varchar(255) NOT NULL,
  to_tag varchar(128) NOT NULL,
  caller_cseq varchar(20) NOT NULL,
  callee_cseq varchar(20) NOT NULL,
  caller_route_set varchar(512),
  callee_route_set varchar(512),
  caller_contact varchar(255) NOT NULL,
  callee_contact varchar(255) NOT NULL,
  caller_sock varchar(64) NOT NULL,
  callee_sock varchar(64) NOT NULL,
  state integer NOT NULL,
  start_time integer NOT NULL,
  timeout integer NOT NULL DEFAULT 0,
  sflags integer NOT NULL DEFAULT 0,
  iflags integer NOT NULL DEFAULT 0,
  toroute_name varchar(32),
  req_uri varchar(255) NOT NULL,
  xdata varchar(512)
);
CREATE INDEX sip_dialogs_hash_idx ON sip_dialogs (hash_entry, hash_id);
CREATE INDEX sip_dialogs_callid_idx ON sip_dialogs (callid);

CREATE TABLE sip_dialog_vars (
  id serial PRIMARY KEY,
  hash_entry integer NOT NULL,
  hash_id integer NOT NULL,
  dialog_key varchar(128) NOT NULL,
  dialog_value varchar(512) NOT NULL
);
CREATE INDEX sip_dialog_vars_hash_idx ON sip_dialog_vars (hash_entry, hash_id);

INSERT INTO kamailio_version (table_name, table_version) VALUES ('sip_dialogs', 7), ('sip_dialog_vars', 1);
`;
