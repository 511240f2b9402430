/**
 * The agent runtime (CONTRACT section 10) against a local OpenAI-compatible
 * model server: replies, order, exactly-once claims, leases, guardrails,
 * workflow validation, handoff and queueing, provider failures and 429.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentRuntime, claimCandidates } from '../src/agents/runtime.js';
import type { Config } from '../src/config/index.js';
import { openDatabase, type DatabaseHandle } from '../src/db/connection.js';
import { DEMO_WORKFLOW, seedDemo } from '../src/demo/demo.js';
import { DEMO_FAQ, DEMO_FAQ_TITLE } from '../src/demo/faq.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { startTestApp, type TestApp } from './support/app.js';
import { expectJsonApi } from './support/conformance.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, pointers, resourceDocument, type Client } from './helpers/http.js';
import { startModelServer, type ModelServer } from './helpers/model-server.js';

let t: TestApp;
let tenant: Tenant;
let owner: Client;
let model: ModelServer;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Agents');
  owner = client(t.app, tenant.owner.token);
  model = await startModelServer();
});
afterAll(async () => {
  await model?.close();
  await t?.close();
});

const records = () => t.services.records!;
const actor = () => systemActor(tenant.organisationId, 'test');

function config(overrides: Partial<Config> = {}): Config {
  return {
    ...t.config,
    agentPollMs: 20,
    agentLeaseMs: 5000,
    agentConcurrency: 8,
    llmBaseUrl: model.url,
    llmApiKey: 'test-key',
    llmModel: 'test-model',
    llmMaxRetries: 1,
    llmTimeoutMs: 5000,
    ...overrides,
  };
}
const noModel = () => config({ llmBaseUrl: undefined, llmApiKey: undefined });

async function withRuntime<T>(cfg: Config, work: (runtime: AgentRuntime) => Promise<T>, db = t.db): Promise<T> {
  const runtime = new AgentRuntime({ db, services: t.services, config: cfg });
  runtime.start();
  try {
    return await work(runtime);
  } finally {
    await runtime.stop();
  }
}

async function newAgent(attributes: Record<string, unknown> = {}): Promise<string> {
  const created = await records().create(actor(), 'AiAgent', { name: 'Ava', published: true, languages: ['en'], ...attributes });
  return created.id;
}

async function newConversation(agentId: string, attributes: Record<string, unknown> = {}): Promise<string> {
  const response = await owner.post('/api/conversations', resourceDocument('Conversation', { ai_agent_id: agentId, ...attributes }));
  expect(response.status).toBe(201);
  return response.body.data.id;
}

async function say(conversationId: string, content: string, role = 'user') {
  const response = await owner.post(
    '/api/conversation_items',
    resourceDocument('ConversationItem', { conversation_id: conversationId, content, role }),
  );
  expect(response.status).toBe(201);
  return response.body.data;
}

interface StoredItem {
  id: string;
  item_id: string;
  role: string;
  content: string;
  modality: string;
  content_index: number;
  metadata: Record<string, any>;
}
async function items(conversationId: string): Promise<StoredItem[]> {
  const { rows } = await sql<StoredItem>`SELECT id, item_id, role, content, modality, content_index, metadata FROM conversation_items
    WHERE conversation_id = ${conversationId} ORDER BY content_index`.execute(t.db);
  return rows;
}
async function conversationRow(id: string) {
  const { rows } = await sql<{
    status: string;
    metadata: Record<string, any>;
  }>`SELECT status, metadata FROM conversations WHERE id = ${id}`.execute(t.db);
  return rows[0];
}

async function waitFor<T>(check: () => Promise<T | undefined | false>, what: string, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}
const settle = (ms = 300) => new Promise((r) => setTimeout(r, ms));

/** Every user item has exactly one reply, `reply_<id>`, and replies come in the order of the user items. */
function expectOneReplyEach(list: StoredItem[]) {
  const users = list.filter((i) => i.role === 'user');
  const replies = list.filter((i) => i.role === 'assistant');
  expect(replies).toHaveLength(users.length);
  const replyIndex = users.map((u) => {
    const mine = replies.filter((r) => r.item_id === `reply_${u.id.replaceAll('-', '')}`);
    expect(mine, `replies to ${u.content}`).toHaveLength(1);
    expect(mine[0].content_index).toBeGreaterThan(u.content_index);
    expect(mine[0].metadata.in_reply_to).toBe(u.item_id);
    return mine[0].content_index;
  });
  expect(replyIndex).toEqual([...replyIndex].sort((a, b) => a - b));
}

async function makeOperator(userId: string, sipUsername: string) {
  const sip = await records().create(actor(), 'SipUser', { sip_username: sipUsername, user_id: userId });
  return {
    setStatus: (status: string) => records().create(actor(), 'OperatorStatus', { sip_user_id: sip.id, status, source: 'api' }),
  };
}

describe('workflow validation', () => {
  it('PATCH answers 422 at each exact pointer inside the workflow, and the agent keeps its old workflow', async () => {
    const agentId = await newAgent({ workflow: DEMO_WORKFLOW });
    const bad = {
      steps: [
        { type: 'message' },
        { type: 'question', text: 'Name?', store_as: 'has space' },
        { type: 'teleport', text: 'x' },
        { type: 'handoff', reason: 'r', when: { matches: '([' } },
        { id: 'a', type: 'end' },
        { id: 'a', type: 'end', colour: 'red' },
      ],
    };
    const response = await owner.patch(`/api/ai_agents/${agentId}`, resourceDocument('AiAgent', { workflow: bad }, agentId));
    expect(response.status).toBe(422);
    expect(pointers(response).sort()).toEqual(
      [
        '/data/attributes/workflow/steps/0/text',
        '/data/attributes/workflow/steps/1/store_as',
        '/data/attributes/workflow/steps/2/type',
        '/data/attributes/workflow/steps/3/when/matches',
        '/data/attributes/workflow/steps/5/colour',
        '/data/attributes/workflow/steps/5/id',
      ].sort(),
    );
    const notObject = await owner.patch(
      `/api/ai_agents/${agentId}`,
      resourceDocument('AiAgent', { workflow: { steps: 'none', extra: 1 } }, agentId),
    );
    expect(notObject.status).toBe(422);
    expect(pointers(notObject).sort()).toEqual(['/data/attributes/workflow/extra', '/data/attributes/workflow/steps']);
    const stored = await sql<{ workflow: unknown }>`SELECT workflow FROM ai_agents WHERE id = ${agentId}`.execute(t.db);
    expect(stored.rows[0].workflow).toEqual(DEMO_WORKFLOW);
    const good = await owner.patch(
      `/api/ai_agents/${agentId}`,
      resourceDocument(
        'AiAgent',
        {
          workflow: {
            steps: [
              { type: 'model', max_turns: 2 },
              { type: 'end', text: 'Bye', close: true },
            ],
          },
        },
        agentId,
      ),
    );
    expect(good.status).toBe(200);
  });

  it('the records service refuses an invalid workflow on create too (command line, seed)', async () => {
    await expect(
      records().create(actor(), 'AiAgent', { name: 'Bad', workflow: { steps: [{ type: 'question', text: 'Q?' }] } }),
    ).rejects.toMatchObject({
      errors: [expect.objectContaining({ source: { pointer: '/data/attributes/workflow/steps/0/store_as' } })],
    });
  });
});

describe('the demo agent with a model', () => {
  it('answers the topic from its FAQ (search_knowledge, cited) and keeps the email address the visitor gives with store_answer', async () => {
    const agentId = await newAgent({ workflow: DEMO_WORKFLOW });
    const faq = await records().create(actor(), 'KnowledgeDocument', {
      ai_agent_id: agentId,
      title: DEMO_FAQ_TITLE,
      content: DEMO_FAQ,
      content_type: 'text/markdown',
    });
    const conversationId = await newConversation(agentId);
    await withRuntime(config(), async () => {
      await say(conversationId, 'Hello');
      await waitFor(async () => (await items(conversationId)).length >= 2, 'the greeting');
      await say(conversationId, 'Sam');
      await waitFor(async () => (await items(conversationId)).length >= 4, 'the second question');
      const seen = model.requests.length;
      model.script(
        { toolCalls: [{ name: 'search_knowledge', arguments: { query: 'embed the chat widget' } }] },
        { toolCalls: [{ name: 'store_answer', arguments: { key: 'email', value: 'sam@example.com' } }] },
        { text: 'Add the widget script to your page; an operator will write to you at sam@example.com.' },
      );
      await say(conversationId, 'How do I embed the chat widget? I am sam@example.com');
      await waitFor(
        async () => (await items(conversationId)).some((i) => i.role === 'assistant' && i.content.includes('widget script')),
        'the answer',
      );
      // The model step's instructions name both tools, and both are offered.
      const first = model.requests[seen].body;
      expect(first.messages[0].content).toContain('store_answer');
      expect(first.tools!.map((tool) => tool.function.name)).toEqual(expect.arrayContaining(['search_knowledge', 'store_answer']));
    });
    const list = await items(conversationId);
    expect(
      list
        .filter((i) => i.role === 'tool')
        .map((i) => [(i.metadata.tool as { name: string }).name, (i.metadata.tool as { ok: boolean }).ok]),
    ).toEqual([
      ['search_knowledge', true],
      ['store_answer', true],
    ]);
    const reply = list.findLast((i) => i.role === 'assistant')!;
    expect((reply.metadata.sources as { document_id: string }[]).map((x) => x.document_id)).toContain(faq.id);
    expect((await conversationRow(conversationId)).metadata).toMatchObject({ visitor_name: 'Sam', email: 'sam@example.com' });
  });
});

describe('scripted workflow with no model', () => {
  it('answers each user item with the demo steps, stores the answers, hands off to the available operator', async () => {
    const agentId = await newAgent({ workflow: DEMO_WORKFLOW });
    const ana = await makeOperator(tenant.operator.id, 'scripted-op');
    await ana.setStatus('available');
    const conversationId = await newConversation(agentId);
    await withRuntime(noModel(), async () => {
      await say(conversationId, 'Hello');
      await waitFor(async () => (await items(conversationId)).length >= 2, 'the greeting');
      await say(conversationId, 'Sam');
      await waitFor(async () => (await items(conversationId)).length >= 4, 'the second question');
      await say(conversationId, 'My invoice');
      await waitFor(async () => (await conversationRow(conversationId)).metadata.assigned_operator, 'the assignment');
    });
    const list = await items(conversationId);
    expect(list.map((i) => [i.role, i.content])).toEqual([
      ['user', 'Hello'],
      ['assistant', `${DEMO_WORKFLOW.steps[0].text}\n\n${DEMO_WORKFLOW.steps[1].text}`],
      ['user', 'Sam'],
      ['assistant', DEMO_WORKFLOW.steps[2].text],
      ['user', 'My invoice'],
      ['assistant', 'I am passing you to a colleague, who will be with you shortly.'],
      ['system', `Handed to an operator: ${DEMO_WORKFLOW.steps[4].reason}`],
    ]);
    expectOneReplyEach(list);
    expect(list[1].metadata).toMatchObject({ source: 'workflow' });
    const row = await conversationRow(conversationId);
    expect(row.status).toBe('pending');
    expect(row.metadata).toMatchObject({ visitor_name: 'Sam', topic: 'My invoice', assigned_operator: tenant.operator.id });
    expect(model.requests.filter((r) => JSON.stringify(r.body).includes('My invoice'))).toHaveLength(0);
    await ana.setStatus('offline');
  });

  it('agent run prints the next reply without storing it', async () => {
    const agentId = await newAgent({ workflow: DEMO_WORKFLOW });
    const conversationId = await newConversation(agentId);
    await say(conversationId, 'Hi');
    const runtime = new AgentRuntime({ db: t.db, services: t.services, config: noModel() });
    const result = await runtime.dryRun(conversationId);
    expect(result).toMatchObject({
      reply: { content: expect.stringContaining('What is your name?') },
      state: { step: 2, awaiting: 'visitor_name' },
    });
    expect(await items(conversationId)).toHaveLength(1);
    await records().update(actor(), 'Conversation', conversationId, { status: 'closed' });
  });

  it('the demo seed leaves its conversations unanswered by the runtime', async () => {
    const demo = await seedDemo(t.db, records());
    const { rows } = await sql<{ id: string; n: number }>`
      SELECT c.id, (SELECT count(*)::int FROM conversation_items i WHERE i.conversation_id = c.id) AS n
      FROM conversations c WHERE c.organisation_id = ${demo.organisation_id} ORDER BY c.id`.execute(t.db);
    await withRuntime(noModel(), async () => {
      await settle(500);
    });
    const after = await sql<{ id: string; n: number }>`
      SELECT c.id, (SELECT count(*)::int FROM conversation_items i WHERE i.conversation_id = c.id) AS n
      FROM conversations c WHERE c.organisation_id = ${demo.organisation_id} ORDER BY c.id`.execute(t.db);
    expect(after.rows).toEqual(rows);
  });
});

describe('model turns', () => {
  it('one reply per user item, in order, under bursts; metadata has model, latency and usage; same modality', async () => {
    const agentId = await newAgent({ system_prompt: 'You are Ava.', tone: 'warm', languages: ['en', 'fr'] });
    const conversations = await Promise.all([1, 2, 3, 4].map(() => newConversation(agentId)));
    await withRuntime(config(), async () => {
      await Promise.all(
        conversations.map(async (c, n) => {
          for (let i = 0; i < 6; i++) await say(c, `message ${n}.${i}`);
        }),
      );
      await waitFor(async () => {
        for (const c of conversations) if ((await items(c)).filter((i) => i.role === 'assistant').length < 6) return false;
        return true;
      }, 'all replies');
      await settle();
    });
    for (const c of conversations) {
      const list = await items(c);
      expectOneReplyEach(list);
      const reply = list.find((i) => i.role === 'assistant')!;
      expect(reply.modality).toBe('text');
      expect(reply.metadata).toMatchObject({
        source: 'model',
        model: 'test-model',
        usage: { prompt_tokens: 11, completion_tokens: 7, total_tokens: 18 },
      });
      expect(reply.metadata.latency_ms).toBeGreaterThanOrEqual(0);
    }
    const request = model.requests.find((r) => r.body.messages.some((m) => m.content === 'message 0.0'))!;
    expect(request.body.stream).toBe(true);
    expect(request.body.messages[0]).toMatchObject({ role: 'system', content: expect.stringContaining('You are Ava.') });
    expect(request.body.messages[0].content).toContain('Tone: warm.');
    expect(request.body.messages[0].content).toContain('en, fr');
    expect(JSON.stringify(request.body.tools)).toContain('handoff_to_operator');
  });

  it('an audio user item gets an audio reply; the history is bounded by the token budget', async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    for (let i = 0; i < 10; i++) {
      await records().create(actor(), 'ConversationItem', {
        conversation_id: conversationId,
        role: i % 2 ? 'assistant' : 'user',
        content: `${i} ${'x'.repeat(400)}`,
      });
    }
    await sql`INSERT INTO agent_turns (conversation_id, organisation_id, last_handled_index) VALUES (${conversationId}, ${tenant.organisationId}, 9)`.execute(
      t.db,
    );
    const seen = model.requests.length;
    await withRuntime(config({ llmHistoryTokens: 350 }), async () => {
      const response = await owner.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: conversationId, content: 'spoken', role: 'user', modality: 'audio' }),
      );
      expect(response.status).toBe(201);
      await waitFor(async () => (await items(conversationId)).length === 12, 'the reply');
    });
    const list = await items(conversationId);
    expect(list[11]).toMatchObject({ role: 'assistant', modality: 'audio', content: 'You said: spoken' });
    const sent = model.requests.slice(seen)[0].body.messages;
    // 350 tokens at 4 characters each hold the new message and two earlier items of ~100 tokens, not all ten.
    expect(sent.length).toBeLessThan(6);
    expect(sent[sent.length - 1]).toEqual({ role: 'user', content: 'spoken' });
  });

  it('an operator item stops the agent until it is handed back', async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    await withRuntime(config(), async () => {
      await say(conversationId, 'first');
      await waitFor(async () => (await items(conversationId)).length === 2, 'first reply');
      await say(conversationId, 'I will take this one', 'operator');
      await waitFor(async () => (await conversationRow(conversationId)).metadata.agent_paused === true, 'the pause');
      await say(conversationId, 'to the human');
      await settle();
      expect((await items(conversationId)).map((i) => i.role)).toEqual(['user', 'assistant', 'operator', 'user']);
      // Hand back: the console clears agent_paused; items from the pause stay the operator's.
      const row = await conversationRow(conversationId);
      await records().update(actor(), 'Conversation', conversationId, { metadata: { ...row.metadata, agent_paused: false } });
      await say(conversationId, 'back to the agent');
      await waitFor(async () => (await items(conversationId)).length === 6, 'reply after hand back');
      await settle();
    });
    const list = await items(conversationId);
    expect(list.map((i) => [i.role, i.content])).toEqual([
      ['user', 'first'],
      ['assistant', 'You said: first'],
      ['operator', 'I will take this one'],
      ['user', 'to the human'],
      ['user', 'back to the agent'],
      ['assistant', 'You said: back to the agent'],
    ]);
  });

  it('an unpublished agent or a closed conversation gets no reply', async () => {
    const agentId = await newAgent({ published: false });
    const conversationId = await newConversation(agentId);
    const seen = model.requests.length;
    await withRuntime(config(), async () => {
      await say(conversationId, 'anyone?');
      await settle(400);
    });
    expect(await items(conversationId)).toHaveLength(1);
    expect(model.requests.length).toBe(seen);
    await records().update(actor(), 'Conversation', conversationId, { status: 'closed' });
  });
});

describe('guardrails', () => {
  const rules = [
    '# card data never goes through the agent',
    'block: card number',
    '/\\b\\d{4}-\\d{4}-\\d{4}-\\d{4}\\b/',
    'Never ask for card numbers.',
  ].join('\n');

  it('a blocked input gets a refusal without reaching the model; a blocked output is refused; instructions reach the prompt', async () => {
    const agentId = await newAgent({ safety_guardrails: rules });
    const conversationId = await newConversation(agentId);
    const seen = model.requests.length;
    await withRuntime(config(), async () => {
      await say(conversationId, 'Here is my Card   Number');
      await waitFor(async () => (await items(conversationId)).length === 2, 'input refusal');
      // (Other requests may be analyses of conversations that earlier tests closed.)
      expect(model.requests.slice(seen).filter((r) => JSON.stringify(r.body).includes('Card   Number'))).toHaveLength(0);
      model.script({ text: 'Sure, use 4111-1111-1111-1111 to pay.' });
      await say(conversationId, 'how do I pay?');
      await waitFor(async () => (await items(conversationId)).length === 4, 'output refusal');
    });
    const list = await items(conversationId);
    expect(list[1]).toMatchObject({
      role: 'assistant',
      metadata: { source: 'guardrail', guardrail: { rule: 'block: card number', stage: 'input' } },
    });
    expect(list[3]).toMatchObject({
      role: 'assistant',
      metadata: { guardrail: { rule: '/\\b\\d{4}-\\d{4}-\\d{4}-\\d{4}\\b/', stage: 'output' }, model: 'test-model' },
    });
    expect(list[3].content).not.toContain('4111');
    const turn = model.requests.slice(seen).find((r) => JSON.stringify(r.body).includes('how do I pay?'));
    expect(turn?.body.messages[0].content).toContain('Never ask for card numbers.');
  });
});

describe('handoff', () => {
  it("the model's handoff_to_operator tool queues the conversation with nobody available; it is assigned to the operator idle longest once available", async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    const first = await makeOperator(tenant.admin.id, 'queue-op-admin');
    const second = await makeOperator(tenant.owner.id, 'queue-op-owner');
    await withRuntime(config(), async () => {
      model.script({ text: '', toolCalls: [{ name: 'handoff_to_operator', arguments: { reason: 'The user wants a refund.' } }] });
      await say(conversationId, 'I want a human for my refund');
      await waitFor(async () => (await conversationRow(conversationId)).status === 'pending', 'the handoff');
      await settle(300);
      expect((await conversationRow(conversationId)).metadata.assigned_operator).toBeUndefined();
      const list = await items(conversationId);
      // The tool call is recorded (a `tool` item) before the reply and the handoff's system item.
      expect(list.map((i) => i.role)).toEqual(['user', 'tool', 'assistant', 'system']);
      expect(list[3].content).toContain('The user wants a refund.');
      expect(list[3].metadata).toMatchObject({ handoff: { reason: 'The user wants a refund.', rule: 'model_tool' } });
      await first.setStatus('available');
      await settle(50);
      await second.setStatus('available');
      await waitFor(async () => (await conversationRow(conversationId)).metadata.assigned_operator, 'the assignment');
    });
    expect((await conversationRow(conversationId)).metadata.assigned_operator).toBe(tenant.admin.id);
    await first.setStatus('offline');
    await second.setStatus('offline');
  });
});

describe('model failures', () => {
  it('a model that keeps failing ends the turn in a system item and a handoff, with no assistant item', async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    model.always(() => ({ status: 500 }));
    try {
      await withRuntime(config({ llmMaxRetries: 1 }), async () => {
        await say(conversationId, 'hello?');
        await waitFor(async () => (await conversationRow(conversationId)).status === 'pending', 'the failure handoff');
      });
    } finally {
      model.always(undefined);
    }
    const list = await items(conversationId);
    expect(list.map((i) => i.role)).toEqual(['user', 'system']);
    expect(list[1].metadata).toMatchObject({ handoff: { rule: 'model_failure' } });
  });

  it('an empty answer is retried; a 429 waits for Retry-After', async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    const seen = model.requests.length;
    model.script({ empty: true }, { status: 429, headers: { 'retry-after': '1' } }, { text: 'finally' });
    await withRuntime(config({ llmMaxRetries: 2 }), async () => {
      await say(conversationId, 'are you there?');
      await waitFor(async () => (await items(conversationId)).length === 2, 'the reply');
    });
    const list = await items(conversationId);
    expect(list[1]).toMatchObject({ role: 'assistant', content: 'finally', metadata: { attempts: 2 } });
    const sent = model.requests.slice(seen);
    expect(sent).toHaveLength(3);
    expect(sent[2].at - sent[1].at).toBeGreaterThanOrEqual(950);
  });
});

describe('claims', () => {
  it('a worker killed mid-turn: its lease runs out, another worker runs the turn once, the dead one commits nothing', async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    let release!: () => void;
    const hung = new Promise<void>((r) => (release = r));
    model.script({ text: 'from the dead worker', until: hung });
    const short = config({ agentLeaseMs: 400 });
    const a = new AgentRuntime({ db: t.db, services: t.services, config: short });
    a.start();
    await say(conversationId, 'hello');
    await waitFor(async () => model.requests.some((r) => r.body.messages.some((m) => m.content === 'hello')), 'the first request');
    a.crash();
    await withRuntime(short, async () => {
      await waitFor(async () => (await items(conversationId)).length === 2, 'the retried turn');
      release();
      await settle(300);
    });
    await a.stop();
    const list = await items(conversationId);
    expect(list.map((i) => [i.role, i.content])).toEqual([
      ['user', 'hello'],
      ['assistant', 'You said: hello'],
    ]);
    const turn = await sql<{
      attempts: number;
      lease_token: string | null;
    }>`SELECT attempts, lease_token FROM agent_turns WHERE conversation_id = ${conversationId}`.execute(t.db);
    expect(turn.rows[0]).toMatchObject({ attempts: 0, lease_token: null });
  });

  it('two workers, each with its own database connection, never answer twice', async () => {
    const agentId = await newAgent();
    const conversations = await Promise.all([1, 2, 3, 4, 5, 6].map(() => newConversation(agentId)));
    // PostgreSQL: a second pool, as a second process would have; the embedded database has one connection to share.
    const second: DatabaseHandle | undefined = t.database.kind === 'postgres' ? await openDatabase(t.config) : undefined;
    const turnsBy = { a: 0, b: 0 };
    const a = new AgentRuntime({ db: t.db, services: t.services, config: config(), onTurn: () => turnsBy.a++ });
    const b = new AgentRuntime({ db: second?.db ?? t.db, services: t.services, config: config(), onTurn: () => turnsBy.b++ });
    a.start();
    b.start();
    try {
      await Promise.all(
        conversations.map(async (c, n) => {
          for (let i = 0; i < 5; i++) await say(c, `burst ${n}.${i}`);
        }),
      );
      await waitFor(async () => {
        for (const c of conversations) if ((await items(c)).filter((i) => i.role === 'assistant').length < 5) return false;
        return true;
      }, 'all replies');
      await settle();
    } finally {
      await a.stop();
      await b.stop();
      await second?.close();
    }
    for (const c of conversations) expectOneReplyEach(await items(c));
    // Each committed turn is one reply: 30 user items, 30 turns between the two workers, none run twice.
    expect(turnsBy.a + turnsBy.b).toBe(30);
  });
});

describe('finding work: the agent_work queue', () => {
  const work = async (conversationId: string) =>
    (await sql<{ parked: boolean }>`SELECT parked FROM agent_work WHERE conversation_id = ${conversationId}`.execute(t.db)).rows[0];
  // A safety-net poll far beyond the test: whatever is answered was found through a notification.
  const notifiedOnly = () => config({ agentPollMs: 600_000 });
  async function withListeningRuntime<T>(work: () => Promise<T>): Promise<T> {
    const runtime = new AgentRuntime({ db: t.db, services: t.services, config: notifiedOnly(), listen: t.database.listen });
    runtime.start();
    try {
      return await work();
    } finally {
      await runtime.stop();
    }
  }

  it('a new user item is answered once, woken by the outbox notification; the queue then holds nothing for it', async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    await withListeningRuntime(async () => {
      await settle(100); // the runtime's first look is over: only a notification can bring the item to it
      await say(conversationId, 'hello');
      await waitFor(async () => (await items(conversationId)).length === 2, 'the reply', 10_000);
      await waitFor(async () => (await work(conversationId)) === undefined, 'the queue emptied', 5_000);
    });
    expectOneReplyEach(await items(conversationId));
  });

  it("an unpublished agent's conversations are parked; publishing the agent gets them answered", async () => {
    const agentId = await newAgent({ published: false });
    const conversations = [await newConversation(agentId), await newConversation(agentId)];
    await withListeningRuntime(async () => {
      for (const c of conversations) await say(c, `waiting in ${c}`);
      await waitFor(async () => {
        for (const c of conversations) if ((await work(c))?.parked !== true) return false;
        return true;
      }, 'both parked');
      expect((await claimCandidates(10, []).execute(t.db)).rows.map((r) => r.id)).not.toEqual(expect.arrayContaining(conversations));
      for (const c of conversations) expect(await items(c)).toHaveLength(1);
      await records().update(actor(), 'AiAgent', agentId, { published: true });
      await waitFor(
        async () => {
          for (const c of conversations) if ((await items(c)).length !== 2) return false;
          return true;
        },
        'answers after the publish',
        10_000,
      );
    });
    for (const c of conversations) expectOneReplyEach(await items(c));
  });

  it('a conversation that gets an agent later is queued, and its unanswered user item is answered', async () => {
    const agentId = await newAgent();
    const created = await owner.post('/api/conversations', resourceDocument('Conversation', {}));
    const conversationId = created.body.data.id;
    await say(conversationId, 'is anybody there?');
    expect(await work(conversationId)).toBeUndefined();
    await withListeningRuntime(async () => {
      await records().update(actor(), 'Conversation', conversationId, { ai_agent_id: agentId });
      await waitFor(async () => (await items(conversationId)).length === 2, 'the reply', 10_000);
    });
    expectOneReplyEach(await items(conversationId));
  });

  it('a take-over ended by hand_back: the item during the take-over stays unanswered, the next one is answered on notification', async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    await withListeningRuntime(async () => {
      await settle(100);
      await records().perform(actor(), 'Conversation', 'take_over', conversationId, {});
      await say(conversationId, 'for the human');
      // The runtime looks (the item queued the conversation), passes the item and empties the queue: nothing waits.
      await waitFor(async () => (await work(conversationId)) === undefined, 'the queue emptied during the take-over', 10_000);
      expect(await items(conversationId)).toHaveLength(1);
      await records().perform(actor(), 'Conversation', 'hand_back', conversationId, {});
      await say(conversationId, 'for the agent');
      await waitFor(async () => (await items(conversationId)).length === 3, 'the reply after hand_back', 10_000);
      await waitFor(async () => (await work(conversationId)) === undefined, 'the queue emptied', 5_000);
    });
    expect((await items(conversationId)).map((i) => [i.role, i.content])).toEqual([
      ['user', 'for the human'],
      ['user', 'for the agent'],
      ['assistant', 'You said: for the agent'],
    ]);
  });

  it('a lease that ran out: the conversation stays queued, is not offered while leased, and is claimed once the lease is over', async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    await say(conversationId, 'are you there?');
    // As a worker that claimed the conversation and died leaves it: leased for a while, the item unanswered.
    await sql`INSERT INTO agent_turns (conversation_id, organisation_id, last_handled_index, lease_until, lease_token, attempts)
      VALUES (${conversationId}, ${tenant.organisationId}, -1, now() + interval '1500 milliseconds', ${crypto.randomUUID()}, 1)`.execute(
      t.db,
    );
    expect(await work(conversationId)).toEqual({ parked: false });
    expect((await claimCandidates(100, []).execute(t.db)).rows.map((r) => r.id)).not.toContain(conversationId);
    // The lease's end announces nothing: the safety-net poll (short here) finds the row once it is over.
    const runtime = new AgentRuntime({ db: t.db, services: t.services, config: config({ agentPollMs: 300 }), listen: t.database.listen });
    runtime.start();
    try {
      await settle(500);
      expect(await items(conversationId)).toHaveLength(1);
      await waitFor(async () => (await items(conversationId)).length === 2, 'the reply after the lease ran out', 10_000);
      await waitFor(async () => (await work(conversationId)) === undefined, 'the queue emptied', 5_000);
    } finally {
      await runtime.stop();
    }
    expectOneReplyEach(await items(conversationId));
  });

  it.skipIf(!process.env.DATABASE_URL)('the claim reads the queue, never the conversations (its plan on PostgreSQL)', async () => {
    const agentId = await newAgent();
    // Many conversations bound to the agent, all caught up: a claim that looked at conversations would scan them.
    // The bulk load is not what is measured: no statement timeout for it (a loaded machine took over 5 s).
    await t.db.transaction().execute(async (trx) => {
      await sql`SET LOCAL statement_timeout = 0`.execute(trx);
      await sql`INSERT INTO conversations (id, organisation_id, channel, mode, status, public_id, ai_agent_id, next_content_index)
        SELECT gen_random_uuid(), ${tenant.organisationId}, 'chat', 'text', 'active', 'plan-' || g, ${agentId}, 1
        FROM generate_series(1, 20000) g`.execute(trx);
    });
    await sql`ANALYZE conversations`.execute(t.db);
    await sql`ANALYZE agent_work`.execute(t.db);
    const explained = await sql<{
      'QUERY PLAN': { Plan: Record<string, unknown> }[];
    }>`EXPLAIN (FORMAT JSON) ${claimCandidates(8, [crypto.randomUUID()])}`.execute(t.db);
    const plan = explained.rows[0]['QUERY PLAN'];
    const relations = new Set<string>();
    const visit = (node: Record<string, unknown>) => {
      if (typeof node['Relation Name'] === 'string') relations.add(node['Relation Name']);
      for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) visit(child);
    };
    visit(plan[0].Plan);
    expect([...relations].sort()).toEqual(['agent_turns', 'agent_work']);
  });
});

describe('inside serve', () => {
  it.skipIf(!!process.env.DATABASE_URL)(
    'the demo agent answers over HTTP with no model (the README walk-through)',
    async () => {
      const { startApp } = await import('../src/app.js');
      const { loadConfig } = await import('../src/config/index.js');
      const running = await startApp(
        loadConfig({ DATA_DIR: 'memory://', PORT: '0', HOST: '127.0.0.1', LOG_LEVEL: 'silent' } as NodeJS.ProcessEnv),
      );
      try {
        const api = async (method: string, path: string, token: string, body?: unknown) => {
          const response = await fetch(`${running.url}${path}`, {
            method,
            headers: { authorization: `Bearer ${token}`, 'content-type': 'application/vnd.api+json' },
            body: body === undefined ? undefined : JSON.stringify(body),
          });
          // eslint-disable-next-line @typescript-eslint/no-explicit-any
          return { status: response.status, body: (await response.json()) as any };
        };
        const user = running.demo!.users[0];
        const login = await api(
          'POST',
          '/api/users/login',
          running.demo!.publishable_key,
          resourceDocument('User', { email: user.email, password: user.password }),
        );
        const token = login.body.meta.token;
        const listed = await api('GET', '/api/conversations?filter%5Bstatus%5D=active', token);
        const agentId = listed.body.data[0].attributes.ai_agent_id;
        const created = await api('POST', '/api/conversations', token, resourceDocument('Conversation', { ai_agent_id: agentId }));
        const id = created.body.data.id;
        await api(
          'POST',
          '/api/conversation_items',
          token,
          resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content: 'Hello' }),
        );
        const replied = await waitFor(async () => {
          const page = await api('GET', `/api/conversations?filter%5Bid%5D=${id}&include=conversation_items`, token);
          return page.body.included.length === 2 && page.body;
        }, 'the demo agent reply');
        expectJsonApi(replied);
        expect(replied.included[1].attributes).toMatchObject({
          role: 'assistant',
          content: `${DEMO_WORKFLOW.steps[0].text}\n\n${DEMO_WORKFLOW.steps[1].text}`,
        });
      } finally {
        await running.close();
      }
    },
    120_000,
  );
});
