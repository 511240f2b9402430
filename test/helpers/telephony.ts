import { uuidv7 } from 'uuidv7';
import type { Database } from '../../src/db/connection.js';

/** The telephony side writes calls, participants and transcripts; tests stand in for it. */
export async function insertCall(db: Database, organisationId: string, overrides: Record<string, unknown> = {}): Promise<string> {
  const id = uuidv7();
  await db
    .insertInto('calls')
    .values({
      id,
      organisation_id: organisationId,
      direction: 'inbound',
      from_number: '+441234567890',
      to_number: '+442000000000',
      sip_username: null,
      status: 'initiated',
      call_uuid: `call-${id}`,
      call_source: 'sip',
      started_at: new Date(),
      ...overrides,
    })
    .execute();
  return id;
}

export async function insertParticipant(
  db: Database,
  organisationId: string,
  callId: string,
  overrides: Record<string, unknown> = {},
): Promise<string> {
  const id = uuidv7();
  await db
    .insertInto('call_participants')
    .values({
      id,
      organisation_id: organisationId,
      call_id: callId,
      member_uuid: `member-${id}`,
      role: 'caller',
      joined_at: new Date('2026-01-01T10:00:00Z'),
      left_at: null,
      ...overrides,
    })
    .execute();
  return id;
}

export async function insertTranscript(
  db: Database,
  organisationId: string,
  callId: string,
  contentIndex: number,
  overrides: Record<string, unknown> = {},
): Promise<string> {
  const id = uuidv7();
  await db
    .insertInto('call_transcripts')
    .values({
      id,
      organisation_id: organisationId,
      call_id: callId,
      content: `line ${contentIndex}`,
      speaker: 'caller',
      content_index: contentIndex,
      item_id: `t-${contentIndex}`,
      occurred_at: new Date(Date.UTC(2026, 0, 1, 10, 0, contentIndex)),
      ...overrides,
    })
    .execute();
  return id;
}

export async function insertAgent(db: Database, organisationId: string, name = 'Agent'): Promise<string> {
  const id = uuidv7();
  await db.insertInto('ai_agents').values({ id, organisation_id: organisationId, name }).execute();
  return id;
}
