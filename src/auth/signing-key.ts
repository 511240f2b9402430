import { randomBytes } from 'node:crypto';
import type { Config } from '../config/index.js';
import type { Db } from '../db/schema.js';

/**
 * The HS256 key for every token: SIGNING_SECRET when set, else a secret
 * generated once and kept in the database, so that every node shares it.
 */
export async function loadSigningKey(db: Db, config: Config): Promise<Uint8Array> {
  if (config.signingSecret) return new TextEncoder().encode(config.signingSecret);
  await db
    .insertInto('settings')
    .values({ key: 'signing_secret', value: randomBytes(32).toString('base64url') })
    .onConflict((conflict) => conflict.column('key').doNothing())
    .execute();
  const row = await db.selectFrom('settings').select('value').where('key', '=', 'signing_secret').executeTakeFirstOrThrow();
  return Buffer.from(row.value, 'base64url');
}
