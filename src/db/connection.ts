import fs from 'node:fs';
import path from 'node:path';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import type { Config } from '../config/index.js';
import { exposeLocally, sharedLocally } from './local-socket.js';
import { Mutex, PGliteDialect } from './pglite-dialect.js';

/** The engine queries tables named by resource definitions, so the schema type stays open. */
// biome-ignore lint/suspicious/noExplicitAny: the engine names tables at run time.
export type Database = Kysely<any>;

/** Runs `work` in a transaction, or in the caller's when `db` is one already (Kysely does not nest them). */
export function inTransaction<T>(db: Database, work: (trx: Database) => Promise<T>): Promise<T> {
  return db.isTransaction ? work(db) : db.transaction().execute(work);
}

export interface DatabaseHandle {
  db: Database;
  kind: 'postgres' | 'pglite';
  close(): Promise<void>;
}

export interface OpenOptions {
  /** Serve the embedded database to local commands on a socket in DATA_DIR while open (the server does). */
  shareLocally?: boolean;
}

export async function openDatabase(config: Config, { shareLocally = false }: OpenOptions = {}): Promise<DatabaseHandle> {
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
  const inMemory = config.dataDir.startsWith('memory://');
  if (!inMemory) fs.mkdirSync(config.dataDir, { recursive: true });
  let unlock: () => void;
  try {
    unlock = inMemory ? () => {} : lockDataDir(config.dataDir);
  } catch (error) {
    // The server holds it and shares it: work through the server's socket.
    if (error instanceof DataDirInUse && sharedLocally(config.dataDir)) return openShared(config);
    throw error;
  }
  let stopSharing = async () => {};
  try {
    const pglite = await PGlite.create(config.dataDir);
    const mutex = new Mutex();
    const db: Database = new Kysely({ dialect: new PGliteDialect(pglite, mutex) });
    if (shareLocally && !inMemory) stopSharing = await exposeLocally(pglite, mutex, config.dataDir);
    return {
      db,
      kind: 'pglite',
      close: async () => {
        await stopSharing();
        await db.destroy();
        unlock();
      },
    };
  } catch (error) {
    await stopSharing();
    unlock();
    throw error;
  }
}

/** The embedded database of a running server, through its local socket (PostgreSQL protocol, one connection). */
function openShared(config: Config): DatabaseHandle {
  const pool = new pg.Pool({
    host: config.dataDir,
    user: 'postgres',
    database: 'postgres',
    max: 1,
    connectionTimeoutMillis: config.databaseTimeoutMs,
  });
  pool.on('error', () => {});
  const db: Database = new Kysely({ dialect: new PostgresDialect({ pool }) });
  return { db, kind: 'pglite', close: () => db.destroy() };
}

class DataDirInUse extends Error {}

/**
 * The embedded database lives in one process at a time: a second process (a
 * command while the server runs) would work on its own copy and its writes
 * would be lost or overwrite the other's. A lock file holding the owner's pid
 * refuses that; a lock left by a process that no longer runs is taken over.
 * A server shares its database with local commands through a socket instead.
 */
function lockDataDir(dataDir: string): () => void {
  const lockFile = path.join(dataDir, 'parley.lock');
  const mine = String(process.pid);
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      fs.writeFileSync(lockFile, mine, { flag: 'wx' });
      return () => {
        if (fs.readFileSync(lockFile, 'utf8') === mine) fs.rmSync(lockFile, { force: true });
      };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      const owner = Number(fs.readFileSync(lockFile, 'utf8'));
      if (isRunning(owner)) {
        throw new DataDirInUse(
          `The embedded database in ${dataDir} is in use by process ${owner}. Stop it first, or use PostgreSQL ` +
            `(DATABASE_URL) to share a database between processes. (Lock file: ${lockFile}.)`,
        );
      }
      fs.rmSync(lockFile, { force: true });
    }
  }
  throw new Error(`Could not lock the embedded database in ${dataDir} (${lockFile}).`);
}

function isRunning(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}
