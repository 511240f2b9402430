/**
 * Announces every change to the records a credential depends on (API keys, user sessions, memberships and
 * users) on the `parley_credentials` notification channel, so that each server process drops the credentials
 * it has verified recently (src/auth/credential-cache.ts) whoever made the change: the API, the command line,
 * another process. A trigger covers every writer without code in each write path.
 *
 * Statement-level triggers: one notification per statement (PostgreSQL folds identical notifications of one
 * transaction into one), sent only when the transaction commits, and none for a rollback. The payload is the
 * table's name; a subscriber drops everything it holds, since such changes are rare.
 * Inserts are not announced: a new key or session cannot make a cached credential wrong.
 */
export const up = /* sql */ `
CREATE FUNCTION parley_credentials_changed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('parley_credentials', TG_TABLE_NAME); RETURN NULL; END $$;

CREATE TRIGGER api_keys_credentials_changed AFTER UPDATE OR DELETE OR TRUNCATE ON api_keys
  FOR EACH STATEMENT EXECUTE FUNCTION parley_credentials_changed();

CREATE TRIGGER user_sessions_credentials_changed AFTER UPDATE OR DELETE OR TRUNCATE ON user_sessions
  FOR EACH STATEMENT EXECUTE FUNCTION parley_credentials_changed();

CREATE TRIGGER memberships_credentials_changed AFTER UPDATE OR DELETE OR TRUNCATE ON memberships
  FOR EACH STATEMENT EXECUTE FUNCTION parley_credentials_changed();

CREATE TRIGGER users_credentials_changed AFTER UPDATE OR DELETE OR TRUNCATE ON users
  FOR EACH STATEMENT EXECUTE FUNCTION parley_credentials_changed();
`;
