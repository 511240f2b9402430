/** Opaque keyset cursors: base64url JSON of the sort values (as text) and the id. */
import type { Cursor } from './types.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function encodeCursor(cursor: Cursor): string {
  return Buffer.from(JSON.stringify([cursor.values, cursor.id])).toString('base64url');
}

/** The cursor, or undefined for anything that is not one of ours. */
export function decodeCursor(text: string): Cursor | undefined {
  if (!/^[A-Za-z0-9_-]{1,4096}$/.test(text)) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(text, 'base64url').toString('utf8'));
  } catch {
    return undefined;
  }
  if (!Array.isArray(parsed) || parsed.length !== 2) return undefined;
  const [values, id] = parsed as [unknown, unknown];
  if (typeof id !== 'string' || !UUID.test(id) || !Array.isArray(values)) return undefined;
  if (!values.every((v) => v === null || (typeof v === 'string' && !v.includes('\u0000')))) return undefined;
  return { values: values as (string | null)[], id };
}
