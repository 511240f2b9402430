/**
 * Checks the declarations against the typed schema (db/schema.ts), so that an attribute whose column does not
 * exist, or whose kind the column cannot hold, stops the server at start instead of failing its first write
 * (a 500) or storing text where a number was declared. The schema's descriptors are themselves checked against
 * the migrated database (test/db-schema.test.ts), so together a declaration is checked against the database.
 */
import { tables } from '../db/schema.js';
import { KINDS } from './kinds.js';
import { columnOf, type AttributeDef, type ResourceDef, type SqlType } from './resource.js';

/** The column types (`udt_name`) an attribute's SQL type may be stored in. */
const COMPATIBLE: Record<SqlType, readonly string[]> = {
  text: ['text', 'varchar'],
  uuid: ['uuid'],
  integer: ['int4', 'int8'],
  boolean: ['bool'],
  timestamptz: ['timestamptz'],
  jsonb: ['jsonb'],
  'text[]': ['_text'],
};

/** Attributes with no column of their own: computed by an expression, or made and stored by the type's hooks. */
const virtual = (a: AttributeDef) => a.expression !== undefined || a.revealedOnCreate === true || a.virtual === true;

/** Throws one Error listing every mismatch; returns when there is none. */
export function verifySchema(resources: readonly ResourceDef[]): void {
  const problems = schemaProblems(resources);
  if (problems.length > 0)
    throw new Error(`Declarations do not match db/schema.ts (${problems.length}):\n${problems.map((p) => `- ${p}`).join('\n')}`);
}

/** Every mismatch between the declarations and db/schema.ts, one sentence each, prefixed with the type. */
export function schemaProblems(resources: readonly ResourceDef[]): string[] {
  const problems: string[] = [];
  for (const r of resources) {
    const columns: Record<string, { udt: string }> | undefined = (tables as Record<string, Record<string, { udt: string }>>)[r.table];
    if (!columns) {
      problems.push(`${r.type}: table \`${r.table}\` is not in db/schema.ts.`);
      continue;
    }
    for (const [name, a] of Object.entries(r.attributes)) {
      const column = columnOf(name, a);
      const stored = Object.hasOwn(columns, column) ? columns[column] : undefined;
      if (virtual(a)) {
        if (stored && a.virtual) problems.push(`${r.type}.${name}: declared \`virtual\` but \`${r.table}.${column}\` exists.`);
        continue;
      }
      if (!stored) {
        problems.push(`${r.type}.${name}: \`${r.table}\` has no column \`${column}\` (declare it \`virtual\` if the hooks store it).`);
        continue;
      }
      const type = KINDS[a.kind].sqlType;
      if (!COMPATIBLE[type].includes(stored.udt))
        problems.push(`${r.type}.${name}: a ${a.kind} attribute (${type}) cannot be stored in \`${r.table}.${column}\` (${stored.udt}).`);
    }
  }
  return problems;
}
