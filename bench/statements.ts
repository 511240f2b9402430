/**
 * Counts the statements this process sends to PostgreSQL, at the driver (below Kysely and the pool): each
 * `pg` client query is one statement or one simple-query string, BEGIN/COMMIT, LISTEN and notifications
 * included. One counter for every bench process that reports statements (bench/streams-server.ts,
 * bench/voice.ts, bench/voice-runtime.ts), so that their figures count the same thing. Bench only.
 */
import pg from 'pg';

let counted = 0;
let installed = false;

/** Starts counting (once per process; later calls share the count). */
export function countStatements(): { readonly count: number; reset(): void } {
  if (!installed) {
    installed = true;
    const query = pg.Client.prototype.query;
    pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
      counted++;
      return (query as (...a: unknown[]) => unknown).apply(this, args);
    } as typeof query;
  }
  return {
    get count() {
      return counted;
    },
    reset() {
      counted = 0;
    },
  };
}
