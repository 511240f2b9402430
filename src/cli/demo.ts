/** The demo organisation: enough data that every read endpoint shows something. */
import { randomBytes } from 'node:crypto';
import { uuidv7 } from 'uuidv7';
import { createOrganisation, createUserInOrganisation } from '../auth/accounts.js';
import { createApiKey } from '../auth/api-keys.js';
import { inTransaction, type Database } from '../db/connection.js';
import type { AppServices, Role } from '../jsonapi/resource.js';

export interface DemoResult {
  organisation_id: string;
  publishable_key: string;
  secret_key: string;
  users: { email: string; password: string; role: Role; full_name: string }[];
}

const minutesAgo = (m: number) => {
  const date = new Date(Date.now() - m * 60_000);
  date.setUTCMilliseconds(0);
  return date;
};

/** Seeds the demo organisation in one transaction: a failure (e.g. the demo users exist already) leaves nothing behind. */
export async function seedDemo(db: Database, services: AppServices): Promise<DemoResult> {
  return inTransaction(db, (trx) => seedDemoIn(trx, services));
}

async function seedDemoIn(db: Database, services: AppServices): Promise<DemoResult> {
  const organisation = await createOrganisation(db, { name: 'Demo' });
  const org = organisation.id;
  const people: { email: string; password: string; role: Role; full_name: string }[] = [
    { email: 'owner@demo.parley.dev', role: 'owner', full_name: 'Olivia Owner' },
    { email: 'admin@demo.parley.dev', role: 'admin', full_name: 'Adam Admin' },
    { email: 'ana@demo.parley.dev', role: 'operator', full_name: 'Ana Operator' },
    { email: 'omar@demo.parley.dev', role: 'operator', full_name: 'Omar Operator' },
  ].map((p) => ({ ...p, role: p.role as Role, password: randomBytes(9).toString('base64url') }));
  const users = [];
  for (const person of people) {
    users.push(await createUserInOrganisation(db, { organisationId: org, email: person.email, password: person.password, fullName: person.full_name, role: person.role }));
  }
  const [owner, , ana, omar] = users;
  const publishable = await createApiKey(db, services, { organisationId: org, userId: owner.id, keyType: 'publishable', name: 'Website widget' });
  const secret = await createApiKey(db, services, { organisationId: org, userId: owner.id, keyType: 'secret', name: 'Back office' });

  const now = new Date();
  const stamp = { created_at: now, updated_at: now };
  const agentId = uuidv7();
  await db.insertInto('ai_agents').values({
    id: agentId, organisation_id: org, name: 'Ava', voice: 'alloy', tone: 'friendly', languages: ['en', 'fr'],
    workflow: JSON.stringify({ greeting: 'Hello! How can I help?', handover: 'operator' }),
    system_prompt: 'You are Ava, a helpful support agent.', safety_guardrails: 'Never ask for card numbers.', published: true, ...stamp,
  }).execute();
  await db.insertInto('gateways').values({
    id: uuidv7(), organisation_id: org, name: 'demo-trunk@sip.example.com', provider: 'generic', username: 'demo-trunk',
    password: randomBytes(12).toString('base64url'), realm: 'sip.example.com', register: true, inbound_acl: ['203.0.113.0/24'], ...stamp,
  }).execute();

  const sipUsers: string[] = [];
  for (const [user, name] of [[ana, 'ana'], [omar, 'omar']] as const) {
    const id = uuidv7();
    sipUsers.push(id);
    await db.insertInto('sip_users').values({ id, organisation_id: org, sip_username: name, sip_password: randomBytes(18).toString('base64url'), user_id: user.id, ...stamp }).execute();
  }
  const statusId = uuidv7();
  const history: [string | null, string, number][] = [[null, 'available', 90], ['available', 'busy', 60], ['busy', 'available', 20]];
  await db.insertInto('operator_statuses').values({
    id: statusId, organisation_id: org, sip_user_id: sipUsers[0], agent_name: ana.full_name, status: 'available', source: 'widget', changed_by_user_id: ana.id, ...stamp,
  }).execute();
  for (const [previous, status, ago] of history) {
    await db.insertInto('operator_status_events').values({
      id: uuidv7(), organisation_id: org, operator_status_id: statusId, sip_user_id: sipUsers[0], agent_name: ana.full_name,
      status, previous_status: previous, source: 'widget', changed_by_user_id: ana.id, occurred_at: minutesAgo(ago), ...stamp,
    }).execute();
  }

  const conversations: string[] = [];
  const scripts = [
    ['chat', 'text', 'active', ['Hi, my invoice looks wrong.', 'Sorry to hear that! Which invoice number?', 'INV-1042.']],
    ['voice', 'voice', 'closed', ['I would like to change my address.', 'Of course, I have updated it.']],
    ['sms', 'text', 'pending', ['Can a human call me back?']],
  ] as const;
  for (const [channel, mode, status, lines] of scripts) {
    const id = uuidv7();
    conversations.push(id);
    await db.insertInto('conversations').values({
      id, organisation_id: org, channel, mode, status, public_id: randomBytes(16).toString('base64url'), ai_agent_id: agentId,
      metadata: JSON.stringify({ source: 'demo' }), next_content_index: lines.length, ...stamp,
    }).execute();
    for (const [index, content] of lines.entries()) {
      await db.insertInto('conversation_items').values({
        id: uuidv7(), organisation_id: org, conversation_id: id, content, role: index % 2 === 0 ? 'user' : 'assistant', modality: 'text',
        content_index: index, item_id: `demo_${index}`, metadata: '{}', occurred_at: minutesAgo(30 - index), ...stamp,
      }).execute();
    }
  }

  const calls: [string, number | null, string | null][] = [['completed', 185, conversations[1]], ['in_progress', null, null], ['no_answer', null, null], ['failed', null, null]];
  for (const [index, [status, duration, conversationId]] of calls.entries()) {
    const id = uuidv7();
    const startedAt = minutesAgo(120 - index * 10);
    const ended = status === 'in_progress' ? null : new Date(startedAt.getTime() + (duration ?? 30) * 1000);
    await db.insertInto('calls').values({
      id, organisation_id: org, direction: index % 2 === 0 ? 'inbound' : 'outbound', from_number: '+442071838750', to_number: '+442079460000',
      sip_username: 'ana', status, call_uuid: `demo-call-${index}`, call_source: 'sip', started_at: startedAt, ended_at: ended,
      duration_seconds: duration, conversation_id: conversationId, ...stamp,
    }).execute();
    const roles = status === 'completed' || status === 'in_progress' ? ['caller', 'agent'] : ['caller'];
    for (const [r, role] of roles.entries()) {
      await db.insertInto('call_participants').values({
        id: uuidv7(), organisation_id: org, call_id: id, member_uuid: `member-${index}-${r}`, role, joined_at: startedAt,
        left_at: ended, ...stamp,
      }).execute();
    }
    if (status === 'completed' || status === 'in_progress') {
      const lines: [string, string][] = [['caller', 'Hello, I need to change my address.'], ['agent', 'Sure, what is the new address?'], ['caller', '12 Market Street.']];
      for (const [i, [speaker, content]] of lines.entries()) {
        await db.insertInto('call_transcripts').values({
          id: uuidv7(), organisation_id: org, call_id: id, content, speaker, content_index: i, item_id: `demo_t${i}`,
          occurred_at: new Date(startedAt.getTime() + i * 5000), ...stamp,
        }).execute();
      }
    }
  }
  return { organisation_id: org, publishable_key: publishable.token, secret_key: secret.token, users: people };
}

/** Whether the database holds no organisation yet (a first start). */
export async function isEmpty(db: Database): Promise<boolean> {
  const row = await db.selectFrom('organisations').select('id').limit(1).executeTakeFirst();
  return row === undefined;
}
