/** The demo organisation: enough data that every read endpoint shows something, written through the records service. */
import { randomBytes } from 'node:crypto';
import { DEMO_FAQ, DEMO_FAQ_TITLE } from './faq.js';
import { createOrganisation, createUserInOrganisation } from '../auth/accounts.js';
import { createApiKey } from '../auth/api-keys.js';
import type { Db } from '../db/schema.js';
import { systemActor } from '../jsonapi/actor.js';
import type { Role } from '../jsonapi/principal.js';
import type { Records } from '../jsonapi/records.js';

export interface DemoResult {
  organisation_id: string;
  publishable_key: string;
  secret_key: string;
  users: { email: string; password: string; role: Role; full_name: string }[];
  /** Whether an existing demo organisation had its passwords and keys renewed instead of being created. */
  reset?: boolean;
  /**
   * Calling the demo agent from a softphone (docs/voice.md, "Calling the demo agent"): a SIP user to register
   * as, the organisation's SIP domain, and what to dial (the agent's URI user, or the demo number).
   */
  phone?: { sip_username: string; sip_password: string; domain: string; agent_user: string; number: string };
}

const DEMO_DOMAIN = 'demo.parley.dev';
const PEOPLE: { email: string; role: Role; full_name: string }[] = [
  { email: `owner@${DEMO_DOMAIN}`, role: 'owner', full_name: 'Olivia Owner' },
  { email: `admin@${DEMO_DOMAIN}`, role: 'admin', full_name: 'Adam Admin' },
  { email: `ana@${DEMO_DOMAIN}`, role: 'operator', full_name: 'Ana Operator' },
  { email: `omar@${DEMO_DOMAIN}`, role: 'operator', full_name: 'Omar Operator' },
];
const DEMO_EMAILS = PEOPLE.map((p) => p.email);

/**
 * The demo agent's workflow, and what it does with and without a model: docs/agents.md, "The workflow". Its one
 * tool, `store_answer`, is built in: a declared tool would need an HTTPS endpoint of the organisation's.
 */
export const DEMO_WORKFLOW = {
  steps: [
    { id: 'greet', type: 'message', text: 'Hello! I am Ava, the demo agent. I can take a message or find you a human.' },
    { id: 'ask_name', type: 'question', text: 'What is your name?', store_as: 'visitor_name' },
    { id: 'ask_topic', type: 'question', text: 'Thanks! What can we help you with?', store_as: 'topic' },
    {
      id: 'answer',
      type: 'model',
      instructions:
        'Answer questions about Parley from the knowledge base: call search_knowledge first, and say so when it has no answer. ' +
        'When the visitor gives an email address, keep it with store_answer (key "email") so that an operator can write back.',
      max_turns: 3,
    },
    { id: 'handoff', type: 'handoff', reason: 'The demo agent hands every conversation to an operator after two questions.' },
  ],
  knowledge: { mode: 'tool' },
  analysis: {
    schema: {
      type: 'object',
      properties: {
        topic: { type: 'string', description: 'What the visitor wanted, in a few words.' },
        answered_from_faq: { type: 'boolean', description: 'Whether the FAQ answered the question.' },
      },
      required: ['topic'],
    },
    success_criteria: "The visitor's question was answered, or the visitor reached an operator.",
  },
};

/** `m` minutes ago, in whole seconds. */
const minutesAgo = (m: number) => new Date(Math.floor((Date.now() - m * 60_000) / 1000) * 1000);
const newPassword = () => randomBytes(9).toString('base64url');

/** The softphone the demo's README instructions register as, and the demo agent's number (Ofcom's drama range). */
export const DEMO_PHONE_USER = 'demo-phone';
export const DEMO_AGENT_NUMBER = '+442079460100';

/** What to register as and dial; the phone's password is new each time the demo is seeded or reset. */
async function demoPhone(records: Records, org: string, agentId: string, sipUserId?: string): Promise<NonNullable<DemoResult['phone']>> {
  const actor = systemActor(org, 'demo');
  const password = randomBytes(12).toString('base64url');
  const written = sipUserId
    ? await records.update(actor, 'SipUser', sipUserId, { sip_password: password })
    : await records.create(actor, 'SipUser', { sip_username: DEMO_PHONE_USER, sip_password: password });
  // `sip:demo-phone@<the organisation's domain>`, under the SIP_DOMAIN `sip serve` last started with.
  const uri = String(written.record.attributes.sip_uri);
  return {
    sip_username: DEMO_PHONE_USER,
    sip_password: password,
    domain: uri.slice(uri.indexOf('@') + 1),
    agent_user: `agent-${agentId}`,
    number: DEMO_AGENT_NUMBER,
  };
}

/**
 * Seeds the demo organisation in one transaction (a failure leaves nothing behind). When it exists already, its users
 * get new passwords and it gets new keys (the old demo keys are revoked), so the credentials can be printed again.
 */
export async function seedDemo(db: Db, records: Records): Promise<DemoResult> {
  // Read before the transaction: the embedded database has one connection, which the transaction holds.
  const members = await db
    .selectFrom('users')
    .innerJoin('memberships', 'memberships.user_id', 'users.id')
    .select(['users.id', 'users.email', 'memberships.organisation_id'])
    .where('users.email', 'in', DEMO_EMAILS)
    .execute();
  if (members.length === 0) return records.transaction((tx) => seedDemoIn(tx));
  const org = members[0].organisation_id;
  const agent = await db
    .selectFrom('ai_agents')
    .select('id')
    .where('organisation_id', '=', org)
    .where('name', '=', 'Ava')
    .executeTakeFirst();
  const phone = await db
    .selectFrom('sip_users')
    .select('id')
    .where('organisation_id', '=', org)
    .where('sip_username', '=', DEMO_PHONE_USER)
    .executeTakeFirst();
  const oldKeys = await db
    .selectFrom('api_keys')
    .select('id')
    .where('organisation_id', '=', org)
    .where('name', 'in', ['Website widget', 'Back office'])
    .where('revoked_at', 'is', null)
    .execute();
  return records.transaction(async (tx) => {
    const result = await resetDemo(tx, org, members, oldKeys);
    return agent ? { ...result, phone: await demoPhone(tx, org, agent.id, phone?.id) } : result;
  });
}

async function issueKeys(records: Records, organisationId: string, ownerId: string) {
  const publishable = await createApiKey(records, { organisationId, userId: ownerId, keyType: 'publishable', name: 'Website widget' });
  const secret = await createApiKey(records, { organisationId, userId: ownerId, keyType: 'secret', name: 'Back office' });
  return { publishable_key: publishable.token, secret_key: secret.token };
}

type Row = { id: string };
async function resetDemo(records: Records, org: string, members: (Row & { email: string })[], oldKeys: Row[]): Promise<DemoResult> {
  const actor = systemActor(org, 'demo');
  const users = [];
  let ownerId = '';
  for (const person of PEOPLE) {
    const member = members.find((m) => m.email === person.email);
    if (!member) continue;
    const password = newPassword();
    await records.update(actor, 'User', member.id, { password });
    if (person.role === 'owner') ownerId = member.id;
    users.push({ ...person, password });
  }
  for (const { id } of oldKeys) await records.update(actor, 'ApiKey', id, { revoked_at: new Date() });
  return { organisation_id: org, ...(await issueKeys(records, org, ownerId)), users, reset: true };
}

async function seedDemoIn(records: Records): Promise<DemoResult> {
  const { id: org } = await createOrganisation(records, { name: 'Demo' });
  const actor = systemActor(org, 'demo');
  const people = PEOPLE.map((p) => ({ ...p, password: newPassword() }));
  const users = [];
  for (const person of people)
    users.push(await createUserInOrganisation(records, { ...person, organisationId: org, fullName: person.full_name }));
  const [owner, , ana, omar] = users;
  const keys = await issueKeys(records, org, owner.id);

  const agent = await records.create(actor, 'AiAgent', {
    name: 'Ava',
    voice: 'alloy',
    tone: 'friendly',
    languages: ['en', 'fr'],
    workflow: DEMO_WORKFLOW,
    system_prompt: 'You are Ava, a helpful support agent.',
    safety_guardrails: 'Never ask for card numbers.',
    published: true,
  });
  await records.create(actor, 'KnowledgeDocument', {
    ai_agent_id: agent.id,
    title: DEMO_FAQ_TITLE,
    content: DEMO_FAQ,
    content_type: 'text/markdown',
  });
  await records.create(actor, 'Gateway', {
    provider: 'generic',
    username: 'demo-trunk',
    password: randomBytes(12).toString('base64url'),
    realm: 'sip.example.com',
    register: true,
    inbound_acl: ['203.0.113.0/24'],
  });

  // The agent answers calls to its number (dialled by a registered phone of the organisation, or arriving from a
  // carrier through a gateway listing the caller's address) and to agent-<id> (docs/voice.md).
  await records.create(actor, 'PhoneNumber', { number: DEMO_AGENT_NUMBER, ai_agent_id: agent.id });
  const phone = await demoPhone(records, org, agent.id);

  const anaPhone = await records.create(actor, 'SipUser', { sip_username: 'ana', user_id: ana.id });
  await records.create(actor, 'SipUser', { sip_username: 'omar', user_id: omar.id });
  // Ana's history: available, busy on a call, available again (each change an OperatorStatusEvent).
  for (const status of ['available', 'busy', 'available'])
    await records.create(actor, 'OperatorStatus', { sip_user_id: anaPhone.id, status, source: 'widget' });

  const conversations: string[] = [];
  const scripts = [
    [
      'chat',
      'text',
      'active',
      [
        'Hi, my invoice looks wrong.',
        'Sorry to hear that! Which invoice number?',
        'INV-1042.',
        'Thanks, I have passed INV-1042 to our billing team.',
      ],
    ],
    ['voice', 'voice', 'closed', ['I would like to change my address.', 'Of course, I have updated it.']],
    ['sms', 'text', 'pending', ['Can a human call me back?']],
  ] as const;
  for (const [channel, mode, status, lines] of scripts) {
    // Created without the agent, which is attached after the items: each seeded user item is followed by a reply, so
    // the agent runtime takes these conversations up after their history (docs/agents.md) and answers nothing in them.
    const conversation = await records.create(actor, 'Conversation', { channel, mode, metadata: { source: 'demo' } });
    conversations.push(conversation.id);
    for (const [index, content] of lines.entries()) {
      await records.create(actor, 'ConversationItem', {
        conversation_id: conversation.id,
        content,
        role: index % 2 === 0 ? 'user' : 'assistant',
        item_id: `demo_${index}`,
        occurred_at: minutesAgo(30 - index),
      });
    }
    await records.update(actor, 'Conversation', conversation.id, { status, ai_agent_id: agent.id });
  }

  const calls: [string, number | null, string | null][] = [
    ['completed', 185, conversations[1]],
    ['in_progress', null, null],
    ['no_answer', null, null],
    ['failed', null, null],
  ];
  for (const [index, [status, duration, conversationId]] of calls.entries()) {
    const startedAt = minutesAgo(120 - index * 10);
    const ended = status === 'in_progress' ? null : new Date(startedAt.getTime() + (duration ?? 30) * 1000);
    const call = await records.create(actor, 'Call', {
      direction: index % 2 === 0 ? 'inbound' : 'outbound',
      from_number: '+442071838750',
      to_number: '+442079460000',
      sip_username: 'ana',
      status,
      call_uuid: `demo-call-${index}`,
      call_source: 'sip',
      started_at: startedAt,
      ended_at: ended,
      duration_seconds: duration,
      conversation_id: conversationId,
    });
    const roles = status === 'completed' || status === 'in_progress' ? ['caller', 'agent'] : ['caller'];
    for (const [r, role] of roles.entries()) {
      await records.create(actor, 'CallParticipant', {
        call_id: call.id,
        member_uuid: `member-${index}-${r}`,
        role,
        joined_at: startedAt,
        left_at: ended,
      });
    }
    if (status === 'completed' || status === 'in_progress') {
      const lines: [string, string][] = [
        ['caller', 'Hello, I need to change my address.'],
        ['agent', 'Sure, what is the new address?'],
        ['caller', '12 Market Street.'],
      ];
      for (const [i, [speaker, content]] of lines.entries()) {
        await records.create(actor, 'CallTranscript', {
          call_id: call.id,
          content,
          speaker,
          content_index: i,
          item_id: `demo_t${i}`,
          occurred_at: new Date(startedAt.getTime() + i * 5000),
        });
      }
    }
  }
  return { organisation_id: org, ...keys, users: people, phone };
}

/** Whether the database holds no organisation yet (a first start). */
export async function isEmpty(db: Db): Promise<boolean> {
  const row = await db.selectFrom('organisations').select('id').limit(1).executeTakeFirst();
  return row === undefined;
}
