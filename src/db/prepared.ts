import { sql, type PostgresPool, type PostgresPoolClient, type RawBuilder } from 'kysely';
import type pg from 'pg';

/** Distinct statement texts that get a name; beyond, statements run unnamed (as before). */
const MAX_NAMED = 2000;

/** A statement that writes: INSERT, UPDATE or DELETE, alone or as the first part of a WITH. */
const WRITES = /^\s*(?:WITH\s+\w+\s+AS\s*\(\s*)?(?:INSERT|UPDATE|DELETE)\b/i;

/** The comment that opens a read whose best plan does not depend on its parameters' values (`genericPlan`). */
const GENERIC_PLAN_MARK = '/* generic plan */';

/**
 * A read whose plan is the same whatever its parameters' values (a lookup by primary key, a page of an
 * organisation's records in an indexed order with no filter on values): run as a named statement under
 * `plan_cache_mode = force_generic_plan`, planned once per connection (docs/architecture.md, "Statements on
 * PostgreSQL", says why). A read whose best plan depends on its values stays unmarked.
 */
export function genericPlan<T>(statement: RawBuilder<T>): RawBuilder<T> {
  return sql<T>`${sql.raw(GENERIC_PLAN_MARK)} ${statement}`;
}

/** A read run as a named statement in PostgreSQL's default plan mode (`auto`): parsed once per connection. */
export const preparedPlan = <T>(statement: RawBuilder<T>): RawBuilder<T> => sql<T>`${sql.raw(PREPARED_MARK)} ${statement}`;
const PREPARED_MARK = '/* prepared */';

type PlanMode = 'auto' | 'generic';

/** A pooled connection as the facade keeps it: its session's plan mode, and whether this checkout chose it. */
interface Held {
  mode: PlanMode;
  chosen: boolean;
  facade: PostgresPoolClient;
}

/**
 * The pool as Kysely sees it, with every write that has parameters, and every read marked by `genericPlan` or
 * `preparedPlan`, run as a named prepared statement: node-postgres parses a name once per connection and then
 * sends only Bind and Execute (docs/architecture.md, "Statements on PostgreSQL"). The engine's statements are a
 * bounded set of texts (values are parameters), so each gets one name for the life of the process.
 *
 * The plan mode is a connection's setting: the first statement of a checkout chooses it, `force_generic_plan`
 * for a marked read and PostgreSQL's default (`auto`) for anything else, so a transaction (which opens with
 * BEGIN) always runs in the default mode. The connection keeps its mode until a checkout needs the other,
 * which costs one `SET` then; under a steady load of one kind no checkout changes it.
 */
export function preparedStatementsPool(pool: pg.Pool): PostgresPool {
  const names = new Map<string, string>();
  const held = new WeakMap<pg.PoolClient, Held>();
  const nameOf = (text: string): string | undefined => {
    let name = names.get(text);
    if (name === undefined && names.size < MAX_NAMED) {
      name = `parley_${names.size.toString(36)}`;
      names.set(text, name);
    }
    return name;
  };
  const run = (client: pg.PoolClient, text: string, parameters: unknown[], named: boolean) => {
    const name = named ? nameOf(text) : undefined;
    return name ? client.query({ name, text, values: parameters }) : client.query(text, parameters);
  };
  const hold = (client: pg.PoolClient): Held => {
    const state: Held = {
      mode: 'auto',
      chosen: false,
      facade: {
        // biome-ignore lint/suspicious/noExplicitAny: Kysely's overloads (text with parameters, or a cursor).
        query: ((text: any, parameters?: readonly unknown[]) => {
          if (typeof text !== 'string') return client.query(text, parameters as unknown[]);
          const values = (parameters ?? []) as unknown[];
          const marked = values.length > 0 && text.startsWith(GENERIC_PLAN_MARK);
          const named = values.length > 0 && (marked || text.startsWith(PREPARED_MARK) || WRITES.test(text));
          if (!state.chosen) {
            state.chosen = true;
            const wanted: PlanMode = marked ? 'generic' : 'auto';
            if (wanted !== state.mode) {
              // Outside any transaction (this is the checkout's first statement), so the setting holds.
              const setting = wanted === 'generic' ? 'SET plan_cache_mode = force_generic_plan' : 'RESET plan_cache_mode';
              return client.query(setting).then(() => {
                state.mode = wanted;
                return run(client, text, values, named);
              });
            }
          }
          return run(client, text, values, named);
        }) as unknown as PostgresPoolClient['query'],
        release: () => client.release(),
      },
    };
    held.set(client, state);
    return state;
  };
  return {
    connect: async () => {
      const client = await pool.connect();
      const state = held.get(client) ?? hold(client);
      state.chosen = false;
      return state.facade;
    },
    end: () => pool.end(),
  };
}
