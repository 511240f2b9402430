import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import type { Config } from '../config/index.js';
import type { Database } from '../db/connection.js';

/**
 * The HS256 key for every token: SIGNING_SECRET when set, else a secret
 * generated once and kept in the database, so that every node shares it.
 */
export async function loadSigningKey(db: Database, config: Config): Promise<Uint8Array> {
  if (config.signingSecret) return new TextEncoder().encode(config.signingSecret);
  await sql`INSERT INTO settings (key, value) VALUES ('signing_secret', ${randomBytes(32).toString('base64url')})
            ON CONFLICT (key) DO NOTHING`.execute(db);
  const { rows } = await sql<{ value: string }>`SELECT value FROM settings WHERE key = 'signing_secret'`.execute(db);
  return Buffer.from(rows[0].value, 'base64url');
}
