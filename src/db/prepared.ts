import type { PostgresPool, PostgresPoolClient } from 'kysely';
import type pg from 'pg';

/** Distinct statement texts that get a name; beyond, statements run unnamed (as before). */
const MAX_NAMED = 2000;

/** A statement that writes: INSERT, UPDATE or DELETE, alone or as the first part of a WITH. */
const WRITES = /^\s*(?:WITH\s+\w+\s+AS\s*\(\s*)?(?:INSERT|UPDATE|DELETE)\b/i;

/**
 * The pool as Kysely sees it, with every write that has parameters run as a named prepared statement:
 * node-postgres parses a name once per connection and then sends only Bind and Execute, so PostgreSQL skips
 * parsing and analysing the text (and, once it settles on a generic plan, planning) on every run after a
 * connection's first (PostgreSQL: PREPARE, "plan_cache_mode"). A create's statement carries its select list
 * and the event's rendering (a few kilobytes of SQL), which PostgreSQL otherwise parsed on every create.
 * Reads stay unnamed: a list's plan depends on the organisation (one may hold a fifth of the rows), which a
 * generic plan would not know, and measured, naming them gained nothing. The engine's statements are a
 * bounded set of texts (values are parameters), so each gets one name for the life of the process.
 */
export function preparedStatementsPool(pool: pg.Pool): PostgresPool {
  const names = new Map<string, string>();
  const wrapped = new WeakMap<pg.PoolClient, PostgresPoolClient>();
  const nameOf = (text: string): string | undefined => {
    let name = names.get(text);
    if (name === undefined && names.size < MAX_NAMED) {
      name = `parley_${names.size.toString(36)}`;
      names.set(text, name);
    }
    return name;
  };
  const wrap = (client: pg.PoolClient): PostgresPoolClient => {
    let facade = wrapped.get(client);
    if (!facade) {
      facade = {
        // biome-ignore lint/suspicious/noExplicitAny: Kysely's overloads (text with parameters, or a cursor).
        query: ((text: any, parameters?: readonly unknown[]) => {
          if (typeof text !== 'string' || !parameters || parameters.length === 0 || !WRITES.test(text)) return client.query(text, parameters as unknown[]);
          const name = nameOf(text);
          return name ? client.query({ name, text, values: parameters as unknown[] }) : client.query(text, parameters as unknown[]);
        }) as unknown as PostgresPoolClient['query'],
        release: () => client.release(),
      };
      wrapped.set(client, facade);
    }
    return facade;
  };
  return {
    connect: async () => wrap(await pool.connect()),
    end: () => pool.end(),
  };
}
