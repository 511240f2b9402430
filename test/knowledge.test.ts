/**
 * The knowledge base and the analysis of finished conversations (CONTRACT section 16, docs/agents.md):
 * KnowledgeDocument CRUD and roles, documents that are not text or too large, chunks deleted with their
 * document; retrieval by the search_knowledge tool and before each turn, with citations in metadata.sources;
 * analysis stored on close with the schema's fields and its event, skipped without a model, and a failing
 * model retried then bounded. Against the local OpenAI-compatible model server, on both databases.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { analyse } from '../src/agents/analysis.js';
import { searchKnowledge } from '../src/agents/knowledge.js';
import { createChatModel } from '../src/agents/llm.js';
import { AgentRuntime } from '../src/agents/runtime.js';
import type { Config } from '../src/config/index.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { chunkText, htmlToText, markdownToText } from '../src/resources/knowledge-text.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, pointers, resourceDocument, type Client } from './helpers/http.js';
import { startModelServer, type ModelServer } from './helpers/model-server.js';

let t: TestApp;
let tenant: Tenant;
let owner: Client;
let admin: Client;
let operator: Client;
let model: ModelServer;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Knowledge');
  owner = client(t.app, tenant.owner.token);
  admin = client(t.app, tenant.admin.token);
  operator = client(t.app, tenant.operator.token);
  model = await startModelServer();
});
afterAll(async () => {
  await model?.close();
  await t?.close();
});

const actor = () => systemActor(tenant.organisationId, 'test');

function config(overrides: Partial<Config> = {}): Config {
  return {
    ...t.config,
    agentPollMs: 20,
    agentLeaseMs: 5000,
    llmBaseUrl: model.url,
    llmApiKey: 'test-key',
    llmModel: 'test-model',
    llmMaxRetries: 0,
    llmTimeoutMs: 5000,
    analysisMaxAttempts: 3,
    analysisRetryMs: 50,
    ...overrides,
  };
}

async function withRuntime<T>(cfg: Config, work: (runtime: AgentRuntime) => Promise<T>): Promise<T> {
  const runtime = new AgentRuntime({ db: t.db, services: t.services, config: cfg });
  runtime.start();
  try {
    return await work(runtime);
  } finally {
    await runtime.stop();
  }
}

async function newAgent(attributes: Record<string, unknown> = {}): Promise<string> {
  const created = await t.services.records!.create(actor(), 'AiAgent', { name: 'Kit', published: true, languages: ['en'], ...attributes });
  return created.id;
}

async function waitFor<T>(check: () => Promise<T | undefined | false>, what: string, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

const chunkCount = async (documentId: string) =>
  Number((await sql<{ n: string }>`SELECT count(*) AS n FROM knowledge_chunks WHERE document_id = ${documentId}`.execute(t.db)).rows[0].n);

const FAQ_REFUNDS = 'Refunds are paid back to the original card within five working days of the return reaching our warehouse.';
const FAQ_SHIPPING = 'We ship to every country in the European Union. Standard delivery takes three days; express delivery takes one.';
const FAQ_ACCOUNT = 'To close your account, open Settings, choose Privacy and press the red button at the bottom of the page.';

describe('KnowledgeDocument', () => {
  let agentId: string;
  beforeAll(async () => {
    agentId = await newAgent();
  });

  it('owners and admins create and delete, members read; the document is chunked and its chunks go with it', async () => {
    const body = (attributes: Record<string, unknown>) =>
      resourceDocument('KnowledgeDocument', { ai_agent_id: agentId, title: 'FAQ', content: FAQ_REFUNDS, ...attributes });
    const refused = await operator.post('/api/knowledge_documents', body({}));
    expect(refused.status).toBe(403);

    const created = await admin.post('/api/knowledge_documents', body({ content_type: 'text/plain' }));
    expect(created.status).toBe(201);
    expect(created.body.data.attributes).toMatchObject({
      title: 'FAQ',
      content: FAQ_REFUNDS,
      content_type: 'text/plain',
      ai_agent_id: agentId,
    });
    const id = created.body.data.id;
    expect(await chunkCount(id)).toBe(1);

    const read = await operator.get(`/api/knowledge_documents/${id}`);
    expect(read.status).toBe(200);
    const list = await operator.get(`/api/knowledge_documents?filter[ai_agent_id]=${agentId}`);
    expect(list.body.data.map((d: { id: string }) => d.id)).toContain(id);

    // No update: documents are replaced, not changed.
    const patched = await owner.patch(`/api/knowledge_documents/${id}`, resourceDocument('KnowledgeDocument', { title: 'x' }, id));
    expect(patched.status).toBe(405);

    expect((await operator.delete(`/api/knowledge_documents/${id}`)).status).toBe(403);
    const deleted = await owner.delete(`/api/knowledge_documents/${id}`);
    expect(deleted.status).toBe(200);
    expect(deleted.body.meta.removed).toEqual({ KnowledgeDocument: 1 });
    expect(await chunkCount(id)).toBe(0);
    expect((await owner.get(`/api/knowledge_documents/${id}`)).status).toBe(404);
  });

  it('deleting the agent takes its documents and their chunks along', async () => {
    const doomed = await newAgent();
    const doc = await owner.post(
      '/api/knowledge_documents',
      resourceDocument('KnowledgeDocument', { ai_agent_id: doomed, title: 'FAQ', content: FAQ_SHIPPING }),
    );
    expect(doc.status).toBe(201);
    const deleted = await owner.delete(`/api/ai_agents/${doomed}`);
    expect(deleted.status).toBe(200);
    expect(deleted.body.meta.removed).toEqual({ AiAgent: 1, KnowledgeDocument: 1 });
    expect(await chunkCount(doc.body.data.id)).toBe(0);
  });

  it('an agent of another organisation, binary content, an unknown content type and an oversized document are 422s', async () => {
    const other = await seedTenant(t, 'Elsewhere');
    const foreign = await t.services.records!.create(systemActor(other.organisationId, 'test'), 'AiAgent', { name: 'Them' });
    const post = (attributes: Record<string, unknown>) =>
      owner.post(
        '/api/knowledge_documents',
        resourceDocument('KnowledgeDocument', { ai_agent_id: agentId, title: 'Doc', content: 'text', ...attributes }),
      );

    const foreignAgent = await post({ ai_agent_id: foreign.id });
    expect(foreignAgent.status).toBe(422);
    expect(pointers(foreignAgent)).toContain('/data/attributes/ai_agent_id');

    const binary = await post({ content: 'PK\u0003\u0004\u0014\u0000\u0006\u0000' });
    expect(binary.status).toBe(422);
    expect(pointers(binary)).toEqual(['/data/attributes/content']);
    const control = await post({ content: 'GIF89a\u0001\u0002 pixels' });
    expect(control.status).toBe(422);
    expect(control.body.errors[0].detail).toContain('not text');

    const pdf = await post({ content_type: 'application/pdf' });
    expect(pdf.status).toBe(422);
    expect(pointers(pdf)).toEqual(['/data/attributes/content_type']);

    const empty = await post({ content_type: 'text/html', content: '<script>alert(1)</script><p> </p>' });
    expect(empty.status).toBe(422);
    expect(empty.body.errors[0].detail).toContain('no text');

    const oversized = await post({ content: 'word '.repeat(Math.ceil(t.config.knowledgeMaxBytes / 5) + 1) });
    expect(oversized.status).toBe(422);
    expect(oversized.body.errors[0].detail).toContain('KNOWLEDGE_MAX_BYTES');
    const count = await sql<{ n: string }>`SELECT count(*) AS n FROM knowledge_documents WHERE ai_agent_id = ${agentId}`.execute(t.db);
    expect(Number(count.rows[0].n)).toBe(0);
  });

  it('HTML and Markdown are indexed as their text; long documents are cut into overlapping chunks', async () => {
    expect(
      htmlToText(
        '<html><head><title>x</title><style>p{color:red}</style></head><body><h1>Returns &amp; refunds</h1><p>Within <b>30</b>&nbsp;days.<!-- note --></p><script>var a = "<p>";</script><p>a < b</p></body></html>',
      ),
    ).toBe('Returns & refunds\n\nWithin 30 days.\n\na < b');
    expect(
      markdownToText(
        '# Returns\n\n> **Bold** and _soft_ [link](https://x.test) ![alt](i.png)\n\n- item `code`\n\n```\nkept code\n```\n| a | b |\n|---|---|\n| 1 | 2 |',
      ),
    ).toBe('Returns\n\nBold and soft link alt\n\nitem code\n\nkept code\na b\n\n1 2');
    // Unclosed constructs do not make the reducer search again and again (linear).
    const started = performance.now();
    htmlToText('<script'.repeat(50_000));
    htmlToText('<a href="'.repeat(50_000));
    expect(performance.now() - started).toBeLessThan(5000);

    const words = Array.from({ length: 450 }, (_, i) => `w${i}`).join(' ');
    const chunks = chunkText(words);
    expect(chunks.length).toBe(3);
    expect(chunks[0].split(' ')).toHaveLength(200);
    // Each chunk starts 40 words before the previous one ended.
    expect(chunks[1].split(' ')[0]).toBe('w160');
    expect(chunks[2].split(' ').at(-1)).toBe('w449');

    const html = await owner.post(
      '/api/knowledge_documents',
      resourceDocument('KnowledgeDocument', {
        ai_agent_id: agentId,
        title: 'Long',
        content_type: 'text/html',
        content: `<p>${words}</p>`,
      }),
    );
    expect(html.status).toBe(201);
    expect(await chunkCount(html.body.data.id)).toBe(3);
    const stored = await sql<{
      content: string;
    }>`SELECT content FROM knowledge_chunks WHERE document_id = ${html.body.data.id} ORDER BY chunk_index`.execute(t.db);
    expect(stored.rows[0].content.startsWith('w0 w1')).toBe(true);
    expect(stored.rows.every((r) => !r.content.includes('<'))).toBe(true);
  });
});

describe('retrieval', () => {
  let agentId: string;
  const documents: Record<string, string> = {};
  beforeAll(async () => {
    agentId = await newAgent({ workflow: {} });
    for (const [title, content] of [
      ['Refunds', FAQ_REFUNDS],
      ['Shipping', FAQ_SHIPPING],
      ['Accounts', FAQ_ACCOUNT],
    ]) {
      const created = await owner.post(
        '/api/knowledge_documents',
        resourceDocument('KnowledgeDocument', { ai_agent_id: agentId, title, content, content_type: 'text/markdown' }),
      );
      expect(created.status).toBe(201);
      documents[title] = created.body.data.id;
    }
  });

  it('returns the chunk that answers the question first (stemmed words, any of them), and nothing for nonsense', async () => {
    const hits = await searchKnowledge(t.db, tenant.organisationId, agentId, 'How long until my refund is paid?');
    expect(hits[0]).toMatchObject({ document_id: documents.Refunds, title: 'Refunds', chunk: 0 });
    const shipping = await searchKnowledge(t.db, tenant.organisationId, agentId, "Do you deliver to Italy? How many days's delivery?");
    expect(shipping[0].document_id).toBe(documents.Shipping);
    expect(await searchKnowledge(t.db, tenant.organisationId, agentId, 'zzqx ||| !!! \' " \\')).toEqual([]);
    // Another organisation's search finds nothing of these documents.
    const other = await seedTenant(t, 'Stranger');
    expect(await searchKnowledge(t.db, other.organisationId, agentId, 'refund')).toEqual([]);
  });

  it('the model calls search_knowledge; the result is fed back and the reply cites it in metadata.sources', async () => {
    const conversation = await owner.post('/api/conversations', resourceDocument('Conversation', { ai_agent_id: agentId }));
    const conversationId = conversation.body.data.id;
    const before = model.requests.length;
    model.script(
      { toolCalls: [{ name: 'search_knowledge', arguments: { query: 'refund paid days' } }] },
      { text: 'Refunds reach your card within five working days.' },
    );
    await withRuntime(config(), async () => {
      await owner.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: conversationId, role: 'user', content: 'When do I get my money back?' }),
      );
      const reply = await waitFor(async () => {
        const { rows } = await sql<{ content: string; metadata: Record<string, any> }>`
          SELECT content, metadata FROM conversation_items WHERE conversation_id = ${conversationId} AND role = 'assistant'`.execute(t.db);
        return rows[0];
      }, 'the reply');
      expect(reply.content).toBe('Refunds reach your card within five working days.');
      expect(reply.metadata.sources[0]).toEqual({ document_id: documents.Refunds, title: 'Refunds', chunk: 0 });
    });
    const [first, second] = model.requests.slice(before);
    // Among the built-in tools (docs/agents.md, "Tools"), search_knowledge is offered since the agent has documents.
    expect((first.body.tools as { function: { name: string } }[]).map((x) => x.function.name)).toEqual(
      expect.arrayContaining(['handoff_to_operator', 'search_knowledge']),
    );
    const messages = second.body.messages as { role: string; content: string; tool_call_id?: string }[];
    const toolMessage = messages.find((m) => m.role === 'tool');
    expect(toolMessage?.tool_call_id).toBe('call_0');
    expect(toolMessage?.content).toContain(documents.Refunds);
    expect(toolMessage?.content).toContain('five working days');
  });

  it('searches are bounded per turn: past the bound no search is offered, and a model that keeps calling is cut off and hands off', async () => {
    const conversation = await owner.post('/api/conversations', resourceDocument('Conversation', { ai_agent_id: agentId }));
    const conversationId = conversation.body.data.id;
    const before = model.requests.length;
    model.always(() => ({ toolCalls: [{ name: 'search_knowledge', arguments: { query: 'refund' } }] }));
    try {
      await withRuntime(config(), async () => {
        await owner.post(
          '/api/conversation_items',
          resourceDocument('ConversationItem', { conversation_id: conversationId, role: 'user', content: 'Refund?' }),
        );
        await waitFor(async () => {
          const { rows } = await sql<{ status: string }>`SELECT status FROM conversations WHERE id = ${conversationId}`.execute(t.db);
          return rows[0].status === 'pending';
        }, 'the handoff');
      });
    } finally {
      model.always(undefined);
    }
    // Three searches are offered and answered; then search_knowledge is no longer offered, a call to it anyway is
    // refused, and the turn's tool-call bound (AGENT_MAX_TOOL_CALLS, 5) cuts the loop: six model requests.
    const mine = model.requests.slice(before).filter((r) => JSON.stringify(r.body).includes('Refund?'));
    expect(mine).toHaveLength(6);
    const offered = mine.map((r) => (r.body.tools as { function: { name: string } }[]).map((x) => x.function.name));
    expect(offered.slice(0, 3).every((names) => names.includes('search_knowledge'))).toBe(true);
    expect(offered.slice(3).some((names) => names.includes('search_knowledge'))).toBe(false);
    const tool = mine[4].body.messages as { role: string; content: string }[];
    expect(tool.filter((m) => m.role === 'tool').at(-1)?.content).toContain('No more searches');
    const { rows } = await sql<{ role: string; metadata: Record<string, any> }>`
      SELECT role, metadata FROM conversation_items WHERE conversation_id = ${conversationId} ORDER BY content_index`.execute(t.db);
    expect(rows[0].role).toBe('user');
    expect(rows.at(-1)?.role).toBe('system');
    expect(rows.filter((r) => r.role === 'assistant')).toEqual([]);
  });

  it('retrieve mode puts the best passages into the prompt before the model turn and cites them', async () => {
    const retrieving = await newAgent({ workflow: { knowledge: { mode: 'retrieve', max_results: 1 } } });
    const doc = await owner.post(
      '/api/knowledge_documents',
      resourceDocument('KnowledgeDocument', {
        ai_agent_id: retrieving,
        title: 'Accounts',
        content: `<p>${FAQ_ACCOUNT}</p>`,
        content_type: 'text/html',
      }),
    );
    const conversation = await owner.post('/api/conversations', resourceDocument('Conversation', { ai_agent_id: retrieving }));
    const conversationId = conversation.body.data.id;
    const before = model.requests.length;
    model.script({ text: 'Open Settings, then Privacy.' });
    await withRuntime(config(), async () => {
      await owner.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: conversationId, role: 'user', content: 'How can I close my account?' }),
      );
      const reply = await waitFor(async () => {
        const { rows } = await sql<{ metadata: Record<string, any> }>`
          SELECT metadata FROM conversation_items WHERE conversation_id = ${conversationId} AND role = 'assistant'`.execute(t.db);
        return rows[0];
      }, 'the reply');
      expect(reply.metadata.sources).toEqual([{ document_id: doc.body.data.id, title: 'Accounts', chunk: 0 }]);
    });
    const request = model.requests[before];
    expect(request.body.messages[0].content).toContain('press the red button');
    const names = (request.body.tools as { function: { name: string } }[]).map((x) => x.function.name);
    expect(names).toContain('handoff_to_operator');
    expect(names).not.toContain('search_knowledge');
  });

  it('the knowledge mode is validated with the workflow', async () => {
    const bad = await owner.patch(
      `/api/ai_agents/${agentId}`,
      resourceDocument('AiAgent', { workflow: { knowledge: { mode: 'vector' }, analysis: { schema: { type: 'nonsense' } } } }, agentId),
    );
    expect(bad.status).toBe(422);
    expect(pointers(bad).sort()).toEqual(['/data/attributes/workflow/analysis/schema', '/data/attributes/workflow/knowledge/mode']);
  });
});

describe('analysis', () => {
  const SCHEMA = {
    type: 'object',
    properties: { topic: { type: 'string', enum: ['refund', 'shipping', 'other'] }, order_number: { type: 'string' } },
    required: ['topic'],
    additionalProperties: false,
  };

  async function closedConversation(agentId: string) {
    const conversation = await owner.post(
      '/api/conversations',
      resourceDocument('Conversation', { ai_agent_id: agentId, metadata: { agent_paused: true } }),
    );
    const id = conversation.body.data.id;
    await owner.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content: 'I want a refund for order 42' }),
    );
    await owner.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: id, role: 'operator', content: 'Done, refunded.' }),
    );
    const closed = await owner.patch(`/api/conversations/${id}`, resourceDocument('Conversation', { status: 'closed' }, id));
    expect(closed.status).toBe(200);
    // Closing queues the analysis; it is never done in the closing request.
    expect(closed.body.data.attributes.analysis).toBeNull();
    return id;
  }

  const analysisOf = async (id: string) =>
    (await sql<{ analysis: Record<string, any> | null }>`SELECT analysis FROM conversations WHERE id = ${id}`.execute(t.db)).rows[0]
      .analysis;

  it('is stored on close with the schema fields, read-only, with a Conversation.analysed event', async () => {
    const agentId = await newAgent({ workflow: { analysis: { schema: SCHEMA, success_criteria: 'The refund was made.' } } });
    const id = await closedConversation(agentId);
    const before = model.requests.length;
    model.script({
      toolCalls: [
        {
          name: 'record_analysis',
          arguments: {
            summary: 'The customer asked for a refund; it was made.',
            success: true,
            data: { topic: 'refund', order_number: '42' },
          },
        },
      ],
    });
    await withRuntime(config(), async () => {
      await waitFor(() => analysisOf(id), 'the analysis');
    });
    const read = await operator.get(`/api/conversations/${id}`);
    expect(read.body.data.attributes.analysis).toMatchObject({
      summary: 'The customer asked for a refund; it was made.',
      success: true,
      data: { topic: 'refund', order_number: '42' },
      model: 'test-model',
    });
    expect(Date.parse(read.body.data.attributes.analysis.analysed_at)).not.toBeNaN();
    const request = model.requests[before];
    expect(request.body.messages[0].content).toContain('The refund was made.');
    expect(request.body.messages[1].content).toContain('Customer: I want a refund for order 42');
    expect(request.body.messages[1].content).toContain('Human operator: Done, refunded.');
    const { rows } = await sql<{ type: string; data: { attributes: { analysis: unknown } } }>`
      SELECT type, data FROM events WHERE data->>'id' = ${id} AND type = 'Conversation.analysed'`.execute(t.db);
    expect(rows).toHaveLength(1);
    expect(rows[0].data.attributes.analysis).toMatchObject({ success: true });
    const queue = await sql`SELECT 1 FROM analysis_work WHERE conversation_id = ${id}`.execute(t.db);
    expect(queue.rows).toHaveLength(0);

    // Nobody writes it through the API.
    const patch = await owner.patch(`/api/conversations/${id}`, resourceDocument('Conversation', { analysis: { summary: 'forged' } }, id));
    expect(patch.status).toBeGreaterThanOrEqual(400);
    expect((await analysisOf(id))?.summary).toBe('The customer asked for a refund; it was made.');
  });

  it('an answer outside the schema is asked again, and after the last attempt stored with an error note', async () => {
    const agentId = await newAgent({ workflow: { analysis: { schema: SCHEMA } } });
    const fixed = await closedConversation(agentId);
    model.script(
      { toolCalls: [{ name: 'record_analysis', arguments: { summary: 'Refund.', success: true, data: { topic: 'money' } } }] },
      { text: '{"summary": "Refund.", "success": true, "data": {"topic": "refund"}}', analysis: true },
    );
    await withRuntime(config(), async () => {
      await waitFor(() => analysisOf(fixed), 'the analysis');
    });
    expect(await analysisOf(fixed)).toMatchObject({ summary: 'Refund.', data: { topic: 'refund' }, success: true });
    expect((await analysisOf(fixed))?.error).toBeUndefined();

    const invalid = await closedConversation(agentId);
    model.always(() => ({
      toolCalls: [{ name: 'record_analysis', arguments: { summary: 'Refund.', success: 'yes', data: { topic: 'money' } } }],
    }));
    try {
      await withRuntime(config({ analysisMaxAttempts: 2 }), async () => {
        await waitFor(() => analysisOf(invalid), 'the analysis');
      });
    } finally {
      model.always(undefined);
    }
    const stored = await analysisOf(invalid);
    expect(stored).toMatchObject({ summary: 'Refund.', data: null, success: null });
    expect(stored?.error).toContain('not valid after 2 attempts');
    expect(stored?.error).toContain('data.topic');
  });

  it('without a model it is skipped and says so', async () => {
    const agentId = await newAgent();
    const id = await closedConversation(agentId);
    await withRuntime(config({ llmBaseUrl: undefined, llmApiKey: undefined }), async () => {
      await waitFor(() => analysisOf(id), 'the skipped analysis');
    });
    expect(await analysisOf(id)).toMatchObject({ skipped: 'no model configured', summary: null, data: null, success: null });
  });

  it('a failing model is tried again later, a bounded number of times, then the failure is stored', async () => {
    const agentId = await newAgent();
    const id = await closedConversation(agentId);
    const before = model.requests.length;
    model.always(() => ({ status: 500 }));
    try {
      await withRuntime(config({ analysisMaxAttempts: 3, analysisRetryMs: 30 }), async () => {
        await waitFor(() => analysisOf(id), 'the failed analysis');
      });
    } finally {
      model.always(undefined);
    }
    expect(await analysisOf(id)).toMatchObject({ summary: null, error: 'The model did not answer after 3 attempts.' });
    expect(model.requests.length - before).toBe(3);
    const queue = await sql`SELECT 1 FROM analysis_work WHERE conversation_id = ${id}`.execute(t.db);
    expect(queue.rows).toHaveLength(0);
  });

  it('analyse() alone: the default schema accepts any object', async () => {
    const chat = createChatModel(config())!;
    model.script({ toolCalls: [{ name: 'record_analysis', arguments: { summary: 'Hi.', success: false, data: {} } }] });
    const result = await analyse(chat, 1, 'Kit', {}, 'Customer: hi');
    expect(result).toMatchObject({ summary: 'Hi.', success: false, data: {} });
  });
});
