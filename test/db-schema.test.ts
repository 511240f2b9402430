import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tables } from '../src/db/schema.js';
import { startTestApp, type TestApp } from './support/app.js';

/**
 * The typed schema (src/db/schema.ts) against the migrated database: every base table with every column, its
 * type, null-ability and default. A migration that src/db/schema.ts does not follow fails here.
 */
describe('typed database schema', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(async () => t?.close());

  it('describes every table and column the migrations create, with type, null-ability and default', async () => {
    const { rows } = await sql<{
      table_name: string;
      column_name: string;
      udt_name: string;
      is_nullable: string;
      column_default: string | null;
    }>`
      SELECT c.table_name, c.column_name, c.udt_name, c.is_nullable, c.column_default
      FROM information_schema.columns c
      JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
      WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE' AND c.table_name NOT LIKE 'kysely_%'
      ORDER BY c.table_name, c.ordinal_position`.execute(t.db);
    const actual: Record<string, Record<string, string>> = {};
    for (const row of rows) {
      actual[row.table_name] ??= {};
      actual[row.table_name][row.column_name] =
        `${row.udt_name}${row.is_nullable === 'YES' ? ' null' : ''}${row.column_default !== null ? ' default' : ''}`;
    }
    const described: Record<string, Record<string, string>> = {};
    for (const [table, columns] of Object.entries(tables)) {
      described[table] = {};
      for (const [name, column] of Object.entries(columns)) {
        described[table][name] = `${column.udt}${column.nullable ? ' null' : ''}${column.defaulted ? ' default' : ''}`;
      }
    }
    expect(described).toEqual(actual);
  });
});
