/** What the administration commands share: the migrated database with its records service, and printing rows. */
import { createServices } from '../app.js';
import { type Config, loadConfig } from '../config/index.js';
import { openDatabase } from '../db/connection.js';
import { migrate } from '../db/migrate.js';
import type { Db } from '../db/schema.js';
import type { Records } from '../jsonapi/records.js';
import { UUID_PATTERN } from '../jsonapi/validate.js';
import type { Output } from './command.js';

/** Opens the configured database (migrated), runs `work`, prints its result, closes. */
export async function withDatabase(
  json: boolean,
  work: (db: Db, records: Records, config: Config) => Promise<{ result: Output; text: string }>,
): Promise<void> {
  const config = loadConfig();
  const database = await openDatabase(config);
  try {
    await migrate(database.db);
    const services = await createServices(database, config);
    const { result, text } = await work(database.db, services.records!, config);
    console.log(json ? JSON.stringify(result) : text);
  } finally {
    await database.close();
  }
}

/** A listed organisation must exist: an unknown (or malformed) id is an error, not an empty list. */
export async function requireOrganisation(db: Db, id: string): Promise<void> {
  const found = UUID_PATTERN.test(id) && (await db.selectFrom('organisations').select('id').where('id', '=', id).executeTakeFirst());
  if (!found) throw new Error(`no organisation ${id}`);
}

export const iso = (value: unknown): string | null => (value instanceof Date ? value.toISOString() : value == null ? null : String(value));

/** Rows as aligned text columns, for people; --json gives the same rows to programs. */
export function table(rows: Record<string, unknown>[], columns: string[]): string {
  if (rows.length === 0) return '(none)';
  const cells = [columns, ...rows.map((r) => columns.map((c) => String(r[c] ?? '-')))];
  const widths = columns.map((_, i) => Math.max(...cells.map((row) => row[i].length)));
  return cells
    .map((row) =>
      row
        .map((cell, i) => cell.padEnd(widths[i]))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}
