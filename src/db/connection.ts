import fs from 'node:fs';
import { Kysely, PGliteDialect, PostgresDialect } from 'kysely';
import pg from 'pg';
import type { Config } from '../config/index.js';

/** The engine queries tables named by resource definitions, so the schema type stays open. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Database = Kysely<any>;

export interface DatabaseHandle {
  db: Database;
  kind: 'postgres' | 'pglite';
  close(): Promise<void>;
}

export async function openDatabase(config: Config): Promise<DatabaseHandle> {
  if (config.databaseUrl) {
    const pool = new pg.Pool({
      connectionString: config.databaseUrl,
      max: config.databasePoolSize,
      connectionTimeoutMillis: config.databaseTimeoutMs,
      statement_timeout: config.databaseTimeoutMs,
      query_timeout: config.databaseTimeoutMs + 1000,
      idleTimeoutMillis: 30_000,
    });
    // A lost server connection must not crash the process: the query in flight fails
    // (503), and the pool drops the broken client and opens a new one when asked.
    pool.on('error', () => {});
    pool.on('connect', (client) => client.on('error', () => {}));
    const db: Database = new Kysely({ dialect: new PostgresDialect({ pool }) });
    return { db, kind: 'postgres', close: () => db.destroy() };
  }
  const { PGlite } = await import('@electric-sql/pglite');
  if (!config.dataDir.startsWith('memory://')) fs.mkdirSync(config.dataDir, { recursive: true });
  const pglite = await PGlite.create(config.dataDir);
  const db: Database = new Kysely({ dialect: new PGliteDialect({ pglite }) });
  return { db, kind: 'pglite', close: () => db.destroy() };
}
