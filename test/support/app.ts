import { randomBytes } from 'node:crypto';
import type { FastifyBaseLogger, FastifyInstance } from 'fastify';
import pg from 'pg';
import { createServices } from '../../src/app.js';
import { loadConfig, type Config } from '../../src/config/index.js';
import { openDatabase, type Database, type DatabaseHandle } from '../../src/db/connection.js';
import { migrate } from '../../src/db/migrate.js';
import { buildServer } from '../../src/http/server.js';
import type { AppServices } from '../../src/jsonapi/index.js';

// Fast password hashing in tests; production keeps the default cost.
process.env.PASSWORD_HASH_COST_LOG2 ??= '10';

export interface TestApp {
  app: FastifyInstance;
  db: Database;
  database: DatabaseHandle;
  services: AppServices;
  config: Config;
  close(): Promise<void>;
}

/** A fresh PostgreSQL database (named for this test) on the server of DATABASE_URL; dropped by the returned function. */
export async function freshPostgresDatabase(baseUrl: string): Promise<{ url: string; drop(): Promise<void> }> {
  const name = `parley_t_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: baseUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = new URL(baseUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    async drop() {
      const client = new pg.Client({ connectionString: baseUrl });
      await client.connect();
      await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await client.end();
    },
  };
}

/**
 * A server on a fresh, migrated database: PostgreSQL when DATABASE_URL is set
 * (a new database per call), else embedded PGlite in memory.
 */
export async function startTestApp(env: Record<string, string> = {}, logger?: FastifyBaseLogger): Promise<TestApp> {
  const base = process.env.DATABASE_URL;
  const fresh = base ? await freshPostgresDatabase(base) : undefined;
  const config = loadConfig({
    LOG_LEVEL: 'silent',
    RATE_LIMIT_PER_MINUTE: '100000',
    ...(fresh ? { DATABASE_URL: fresh.url } : { DATA_DIR: 'memory://' }),
    ...env,
  } as NodeJS.ProcessEnv);
  const database = await openDatabase(config);
  await migrate(database.db);
  const services: AppServices = await createServices(database, config);
  const app = await buildServer({ ...services, database, logger });
  await app.ready();
  return {
    app,
    db: database.db,
    database,
    services,
    config,
    async close() {
      await app.close();
      await database.close();
      await fresh?.drop();
    },
  };
}
