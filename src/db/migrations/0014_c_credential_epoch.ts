/**
 * A credential epoch: a counter that every committed change to the records a credential depends on (API
 * keys, user sessions, memberships, users) moves, in the changing transaction, so that it is visible exactly
 * when the change is. The credential cache (src/auth/credential-cache.ts) keeps the epoch its entry was read
 * at and, on PostgreSQL, serves an entry only after a read of the epoch that began after the request arrived
 * finds it unchanged. Migration 0009's notifications reach other processes a moment after the commit; a
 * client that got the revoking response could ask another process in that moment and be served with the old
 * credential (about 2% of trials in the third review). The epoch closes that window: a request that starts
 * after the revoking response reads the new epoch.
 *
 * Deferred constraint triggers (run at COMMIT, after everything else the transaction did): the epoch row's
 * lock is the last lock such a transaction takes, so no deadlock cycle runs through it, and only
 * credential-changing transactions (revocations, role changes, removals: rare) wait for each other there.
 * TRUNCATE, which row triggers do not see, moves it at once.
 */
export const up = /* sql */ `
CREATE TABLE credential_epoch (
  id boolean PRIMARY KEY DEFAULT true CHECK (id),
  n bigint NOT NULL
);
INSERT INTO credential_epoch (id, n) VALUES (true, 0);

CREATE FUNCTION parley_credential_epoch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE credential_epoch SET n = n + 1; RETURN NULL; END $$;

CREATE CONSTRAINT TRIGGER api_keys_credential_epoch AFTER UPDATE OR DELETE ON api_keys DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION parley_credential_epoch();
CREATE CONSTRAINT TRIGGER user_sessions_credential_epoch AFTER UPDATE OR DELETE ON user_sessions DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION parley_credential_epoch();
CREATE CONSTRAINT TRIGGER memberships_credential_epoch AFTER UPDATE OR DELETE ON memberships DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION parley_credential_epoch();
CREATE CONSTRAINT TRIGGER users_credential_epoch AFTER UPDATE OR DELETE ON users DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION parley_credential_epoch();

CREATE TRIGGER api_keys_credential_epoch_truncate AFTER TRUNCATE ON api_keys FOR EACH STATEMENT EXECUTE FUNCTION parley_credential_epoch();
CREATE TRIGGER user_sessions_credential_epoch_truncate AFTER TRUNCATE ON user_sessions FOR EACH STATEMENT EXECUTE FUNCTION parley_credential_epoch();
CREATE TRIGGER memberships_credential_epoch_truncate AFTER TRUNCATE ON memberships FOR EACH STATEMENT EXECUTE FUNCTION parley_credential_epoch();
CREATE TRIGGER users_credential_epoch_truncate AFTER TRUNCATE ON users FOR EACH STATEMENT EXECUTE FUNCTION parley_credential_epoch();
`;
