/**
 * Agent turns a visitor can make unstorable (third review, "cost and amplification"): a pre-posted reply
 * item_id, an answer over the item's 32 KiB, a question answered with more than the metadata's 16 KiB. Each
 * used to fail the turn's write, and every lease the model was called again, for ever. Each test counts the
 * model calls over several leases.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentRuntime } from '../src/agents/runtime.js';
import type { Config } from '../src/config/index.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, resourceDocument } from './helpers/http.js';
import { startModelServer, type ModelServer } from './helpers/model-server.js';

let t: TestApp;
let tenant: Tenant;
let model: ModelServer;

/** Short leases, so that a failing turn would be retried several times within a test. */
const LEASE_MS = 200;

beforeAll(async () => {
  t = await startTestApp({ VISITOR_SESSIONS_PER_HOUR: '100', VISITOR_RATE_LIMIT_PER_MINUTE: '1000' });
  tenant = await seedTenant(t, 'Budget');
  model = await startModelServer();
});
afterAll(async () => {
  await model?.close();
  await t?.close();
});

function config(overrides: Partial<Config> = {}): Config {
  return {
    ...t.config,
    agentPollMs: 20,
    agentLeaseMs: LEASE_MS,
    agentConcurrency: 4,
    agentMaxAttempts: 3,
    llmBaseUrl: model.url,
    llmApiKey: 'test-key',
    llmModel: 'test-model',
    llmMaxRetries: 0,
    llmTimeoutMs: 5000,
    ...overrides,
  };
}

async function newAgent(attributes: Record<string, unknown> = {}): Promise<string> {
  const created = await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'AiAgent', {
    name: 'Ava',
    published: true,
    languages: ['en'],
    ...attributes,
  });
  return created.id;
}

/** A website visitor's conversation with the agent: its id and the visitor's client. */
async function visitorConversation(agentId: string) {
  const opened = await client(t.app, tenant.publishableKey).post(
    '/api/visitor_sessions',
    resourceDocument('Conversation', { ai_agent_id: agentId }),
  );
  expect(opened.status).toBe(201);
  return { id: opened.body.data.id as string, visitor: client(t.app, opened.body.meta.token) };
}

/** Model calls made for one conversation (its id is not in the prompt: its messages are). */
const callsFor = (marker: string) =>
  model.requests.filter((r) => r.body.messages.some((m) => typeof m.content === 'string' && m.content.includes(marker))).length;

async function items(conversationId: string) {
  const { rows } = await sql<{ role: string; item_id: string; content: string; metadata: Record<string, any> }>`
    SELECT role, item_id, content, metadata FROM conversation_items WHERE conversation_id = ${conversationId}
    ORDER BY content_index`.execute(t.db);
  return rows;
}

/** Runs a runtime for `ms` (many leases long), then stops it. */
async function runFor(ms: number, cfg = config()) {
  const runtime = new AgentRuntime({ db: t.db, services: t.services, config: cfg });
  runtime.start();
  await new Promise((r) => setTimeout(r, ms));
  await runtime.stop();
}

describe('turns a visitor makes unstorable', () => {
  it('a visitor cannot pre-post the reply item_id of its own item; the reply is stored after one model call', async () => {
    const agentId = await newAgent();
    const { id, visitor } = await visitorConversation(agentId);
    const posted = await visitor.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content: 'marker-prepost hello' }),
    );
    expect(posted.status).toBe(201);
    const key = posted.body.data.id.replaceAll('-', '');
    for (const itemId of [`reply_${key}`, `handoff_${key}`]) {
      const squat = await visitor.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content: 'squat', item_id: itemId }),
      );
      expect(squat.status).toBe(422);
      expect(squat.body.errors[0].source.pointer).toBe('/data/attributes/item_id');
    }
    // Operators cannot take them either; other item ids stay the client's.
    const operator = client(t.app, tenant.operator.token);
    expect(
      (
        await operator.post(
          '/api/conversation_items',
          resourceDocument('ConversationItem', { conversation_id: id, role: 'operator', content: 'x', item_id: `reply_${key}` }),
        )
      ).status,
    ).toBe(422);

    await runFor(8 * LEASE_MS);
    expect(callsFor('marker-prepost')).toBe(1);
    const stored = await items(id);
    expect(stored.find((i) => i.item_id === `reply_${key}`)?.role).toBe('assistant');
  });

  it('an answer over 32 KiB is cut to fit and stored once, marked truncated', async () => {
    const agentId = await newAgent();
    const { id, visitor } = await visitorConversation(agentId);
    model.always((req) =>
      req.body.messages.some((m) => m.content.includes('marker-long')) ? { text: `${'é'.repeat(20_000)} end` } : { text: 'ok' },
    );
    try {
      const posted = await visitor.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content: 'marker-long: write me 40 KB' }),
      );
      expect(posted.status).toBe(201);
      await runFor(8 * LEASE_MS);
    } finally {
      model.always(undefined);
    }
    expect(callsFor('marker-long')).toBe(1);
    const reply = (await items(id)).find((i) => i.role === 'assistant');
    expect(reply).toBeDefined();
    expect(Buffer.byteLength(reply!.content)).toBeLessThanOrEqual(32 * 1024);
    expect(reply!.content).toMatch(/^é+$/); // cut at a character boundary
    expect(reply!.metadata.truncated).toBe(true);
  });

  it("a question answered with more than 16 KiB is cut to the metadata's room before the model sees it", async () => {
    const agentId = await newAgent({
      workflow: {
        steps: [
          { type: 'question', text: 'What is your name?', store_as: 'visitor_name' },
          { type: 'model', instructions: 'marker-question' },
        ],
      },
    });
    const { id, visitor } = await visitorConversation(agentId);
    const say = async (content: string) => {
      const response = await visitor.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content }),
      );
      expect(response.status).toBe(201);
    };
    await say('hello');
    await runFor(4 * LEASE_MS); // the question (scripted: no model call)
    await say('n'.repeat(30_000));
    await runFor(8 * LEASE_MS);
    expect(callsFor('marker-question')).toBe(1);
    const { rows } = await sql<{ metadata: Record<string, string> }>`SELECT metadata FROM conversations WHERE id = ${id}`.execute(t.db);
    expect(rows[0].metadata.visitor_name).toMatch(/^n+$/);
    expect(Buffer.byteLength(JSON.stringify(rows[0].metadata))).toBeLessThanOrEqual(16 * 1024);
    // What the model was told is what was stored.
    const prompt = model.requests.find((r) => r.body.messages[0].content.includes('marker-question'))!.body.messages[0].content;
    expect(prompt).toContain(`visitor_name: ${rows[0].metadata.visitor_name}\n`);
    expect((await items(id)).filter((i) => i.role === 'assistant')).toHaveLength(2);
  });

  it('a turn that can never be stored is attempted AGENT_MAX_ATTEMPTS times, then handed off with a reason', async () => {
    const agentId = await newAgent();
    const { id, visitor } = await visitorConversation(agentId);
    // Whatever the cause, the database refuses this conversation's assistant items.
    await sql
      .raw(`CREATE FUNCTION refuse_replies_${id.replaceAll('-', '')}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'replies refused'; END $$`)
      .execute(t.db);
    await sql
      .raw(`CREATE TRIGGER refuse_replies BEFORE INSERT ON conversation_items FOR EACH ROW
        WHEN (NEW.role = 'assistant' AND NEW.conversation_id = '${id}')
        EXECUTE FUNCTION refuse_replies_${id.replaceAll('-', '')}()`)
      .execute(t.db);
    try {
      const posted = await visitor.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content: 'marker-refused hi' }),
      );
      expect(posted.status).toBe(201);
      await runFor(12 * LEASE_MS);
    } finally {
      await sql`DROP TRIGGER refuse_replies ON conversation_items`.execute(t.db);
    }
    expect(callsFor('marker-refused')).toBe(3);
    const stored = await items(id);
    expect(stored.filter((i) => i.role === 'assistant')).toHaveLength(0);
    const handoff = stored.find((i) => i.role === 'system');
    expect(handoff?.metadata.handoff).toMatchObject({ rule: 'turn_failed', attempts: 3 });
    const { rows } = await sql<{ status: string }>`SELECT status FROM conversations WHERE id = ${id}`.execute(t.db);
    expect(rows[0].status).toBe('pending');
    // Nothing is retried afterwards.
    await runFor(4 * LEASE_MS);
    expect(callsFor('marker-refused')).toBe(3);
  });
});
