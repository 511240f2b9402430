import { uuidv7 } from 'uuidv7';
import type { Database } from '../db/connection.js';

/** AI agents are created here (the API only updates them). */
export async function createAgent(db: Database, input: { organisationId: string; name: string }) {
  const name = input.name?.trim();
  if (!name || name.length > 120) throw new Error('agent name must be 1 to 120 characters');
  const organisation = await db.selectFrom('organisations').select('id').where('id', '=', input.organisationId).executeTakeFirst();
  if (!organisation) throw new Error(`no organisation ${input.organisationId}`);
  const id = uuidv7();
  const now = new Date();
  await db.insertInto('ai_agents').values({ id, organisation_id: input.organisationId, name, created_at: now, updated_at: now }).execute();
  return { id, name, organisation_id: input.organisationId, languages: ['en'], workflow: {}, published: false };
}
