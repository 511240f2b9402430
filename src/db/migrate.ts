import fs from 'node:fs';
import { type Migration, type MigrationProvider, Migrator, sql } from 'kysely';
import type { Database } from './schema.js';

/**
 * Versioned migrations, in order: every `NNNN_name` module of `migrations/` (`.ts` from source, `.js` built),
 * each exporting `up`, plain SQL that runs on PostgreSQL and PGlite alike.
 */
const folder = new URL('./migrations/', import.meta.url);
const files = fs.readdirSync(folder).filter((f) => /^\d{4}_\w+\.(ts|js)$/.test(f));
const migrations = new Map<string, string>();
for (const file of files.sort()) migrations.set(file.replace(/\.(ts|js)$/, ''), (await import(new URL(file, folder).href)).up);

/** Every migration's name and SQL, in order (a template cluster is named after their digest: pglite-template). */
export const migrationList = (): Array<[name: string, sql: string]> => [...migrations];

/** The schema's SQL, every migration in order (declarations are checked against it at start). */
export const schemaSql = (): string => [...migrations.values()].join('\n');

const provider: MigrationProvider = {
  async getMigrations() {
    const migration = (script: string): Migration => ({
      up: async (db) => {
        // One statement at a time: the extended protocol (PGlite's) refuses several in one.
        for (const statement of splitStatements(script)) await sql.raw(statement).execute(db);
      },
    });
    return Object.fromEntries([...migrations].map(([name, script]) => [name, migration(script)]));
  },
};

/**
 * Our migrations end each statement with `;` at a line end, and have no other such `;` outside `$$`-quoted
 * function bodies (whose statements end lines too), so splitting there, outside `$$ ... $$`, is exact.
 */
export function splitStatements(script: string): string[] {
  const statements: string[] = [];
  let quoted = false;
  let current = '';
  for (const part of script.split(/(\$\$|;\s*\n)/)) {
    if (part === '$$') quoted = !quoted;
    if (!quoted && /^;\s*\n$/.test(part)) {
      statements.push(current);
      current = '';
    } else current += part;
  }
  statements.push(current);
  return statements.map((s) => s.trim()).filter(Boolean);
}

/** Applies pending migrations (under Kysely's advisory lock, so concurrent nodes are safe). */
export async function migrate(db: Database): Promise<string[]> {
  // Numbers were reserved for parts built side by side, so a database may have run a later one (0008) before
  // an earlier one (0007) exists: each migration stands alone, and the pending ones run in number order.
  const migrator = new Migrator({ db, provider, allowUnorderedMigrations: true });
  const { error, results } = await migrator.migrateToLatest();
  if (error) throw error instanceof Error ? error : new Error(String(error));
  return (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName);
}
