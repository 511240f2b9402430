/**
 * Agents' tools (CONTRACT section 16, docs/agents.md "Tools") against the fake model server and a fake tool
 * receiver that checks the Standard Webhooks signature: declared tools called with valid arguments and their
 * results fed back; arguments that fail the schema, unknown tools and private targets refused before any
 * request; a 5 MB answer bounded; a failing tool reported once; the tool loop cut; the built-in tools
 * (end_conversation, store_answer, transfer_call on a chat); tool items hidden from visitors.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentRuntime } from '../src/agents/runtime.js';
import { BUILT_IN_TOOLS } from '../src/agents/tools.js';
import type { Config } from '../src/config/index.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { BUILT_IN_TOOL_NAMES, workflowProblems } from '../src/resources/ai-agent-workflow.js';
import conversationItem from '../src/resources/conversation-item.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, pointers, resourceDocument, type Client } from './helpers/http.js';
import { startModelServer, type ModelServer } from './helpers/model-server.js';

interface Received {
  body: string;
  headers: http.IncomingHttpHeaders;
  verified: boolean;
}

/** A tool endpoint: checks each request's signature with the organisation's tool secret, answers as scripted. */
async function startReceiver(secret: () => string) {
  const received: Received[] = [];
  let answer: (req: Received, res: http.ServerResponse) => void = (_req, res) =>
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ status: 'shipped', eta: '2 days' }));
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      let verified = false;
      try {
        new Webhook(secret()).verify(body, req.headers as Record<string, string>);
        verified = true;
      } catch {
        verified = false;
      }
      const entry = { body, headers: req.headers, verified };
      received.push(entry);
      answer(entry, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    port,
    url: `http://127.0.0.1:${port}/tools/lookup`,
    received,
    answer: (fn: typeof answer) => (answer = fn),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

let t: TestApp;
let tenant: Tenant;
let owner: Client;
let model: ModelServer;
let receiver: Awaited<ReturnType<typeof startReceiver>>;
let secret = '';

beforeAll(async () => {
  t = await startTestApp({ WEBHOOK_ALLOW_PRIVATE_URLS: 'true' });
  tenant = await seedTenant(t, 'Tools');
  owner = client(t.app, tenant.owner.token);
  model = await startModelServer();
  receiver = await startReceiver(() => secret);
  // The organisation's tool secret, made and shown once by the API.
  const made = await owner.post('/api/organisations/tool_secret', { data: { type: 'Organisation', attributes: {} } });
  expect(made.status).toBe(200);
  secret = made.body.meta.tool_secret;
  expect(secret).toMatch(/^whsec_/);
});
afterAll(async () => {
  await receiver?.close();
  await model?.close();
  await t?.close();
});

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
    agentMaxToolCalls: 4,
    ...overrides,
  };
}

async function withRuntime<T>(cfg: Config, work: () => Promise<T>): Promise<T> {
  const runtime = new AgentRuntime({ db: t.db, services: t.services, config: cfg });
  runtime.start();
  try {
    return await work();
  } finally {
    await runtime.stop();
  }
}

const lookupTool = (overrides: Record<string, unknown> = {}) => ({
  name: 'lookup_order',
  description: 'Look up an order by its number.',
  parameters: {
    type: 'object',
    properties: { order: { type: 'string', pattern: '^[0-9]{1,10}$' } },
    required: ['order'],
    additionalProperties: false,
  },
  url: receiver.url,
  timeout_ms: 2000,
  ...overrides,
});

async function newAgent(tools: unknown[] = [lookupTool()]): Promise<string> {
  const created = await owner.post('/api/ai_agents', resourceDocument('AiAgent', { name: 'Ava', published: true, workflow: { tools } }));
  expect(created.status).toBe(201);
  return created.body.data.id;
}

async function newConversation(agentId: string): Promise<string> {
  const response = await owner.post('/api/conversations', resourceDocument('Conversation', { ai_agent_id: agentId }));
  expect(response.status).toBe(201);
  return response.body.data.id;
}

async function say(conversationId: string, content: string) {
  const response = await owner.post(
    '/api/conversation_items',
    resourceDocument('ConversationItem', { conversation_id: conversationId, content, role: 'user' }),
  );
  expect(response.status).toBe(201);
}

interface StoredItem {
  id: string;
  role: string;
  content: string;
  item_id: string;
  metadata: Record<string, any>;
}
async function items(conversationId: string): Promise<StoredItem[]> {
  const { rows } = await sql<StoredItem>`SELECT id, role, content, item_id, metadata FROM conversation_items
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
async function waitFor<T>(check: () => Promise<T | undefined | false>, what: string, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}
/** The run of one user message to its reply (or handoff): the conversation's items once the turn committed. */
async function turn(cfg: Config, conversationId: string, message: string, done: (list: StoredItem[]) => boolean) {
  return withRuntime(cfg, async () => {
    await say(conversationId, message);
    return waitFor(async () => {
      const list = await items(conversationId);
      return done(list) ? list : undefined;
    }, 'the turn');
  });
}
const hasReply = (list: StoredItem[]) => list.some((i) => i.role === 'assistant');
/** The tool messages the model was sent in request `index` (its results of the round before). */
const toolMessages = (index: number) => model.requests[index].body.messages.filter((m) => m.role === 'tool');

describe('declaring tools', () => {
  it('the built-in names agree between the workflow schema and the registry', () => {
    for (const name of Object.keys(BUILT_IN_TOOLS)) expect(BUILT_IN_TOOL_NAMES).toContain(name);
  });

  it('a bad declaration is a 422 at its exact pointer', async () => {
    const response = await owner.post(
      '/api/ai_agents',
      resourceDocument('AiAgent', {
        name: 'Bad',
        workflow: {
          tools: [
            lookupTool({ name: 'end_conversation' }),
            lookupTool({ parameters: { type: 'object', properties: { a: { type: 'nope' } } } }),
            lookupTool({ name: 'x', timeout_ms: 60_000, colour: 'red' }),
            lookupTool({ name: 'y', url: 'ftp://example.com/x' }),
            lookupTool({ name: 'y' }),
            lookupTool({ name: 'z', parameters: { type: 'string' } }),
          ],
        },
      }),
    );
    expect(response.status).toBe(422);
    expect(pointers(response)).toEqual(
      expect.arrayContaining([
        '/data/attributes/workflow/tools/0/name',
        '/data/attributes/workflow/tools/1/parameters',
        '/data/attributes/workflow/tools/2/timeout_ms',
        '/data/attributes/workflow/tools/2/colour',
        '/data/attributes/workflow/tools/3/url',
        '/data/attributes/workflow/tools/4/name',
        '/data/attributes/workflow/tools/5/parameters',
      ]),
    );
  });

  it('without WEBHOOK_ALLOW_PRIVATE_URLS a tool URL must be https', () => {
    const http = workflowProblems({ tools: [lookupTool({ url: 'http://example.com/x' })] }, { allowPrivateUrls: false });
    expect(http).toEqual([{ pointer: '/tools/0/url', detail: 'must be an https URL' }]);
    expect(workflowProblems({ tools: [lookupTool({ url: 'https://example.com/x' })] }, { allowPrivateUrls: false })).toEqual([]);
  });
});

describe('calling a declared tool', () => {
  it('valid arguments: a signed POST of the arguments, its answer fed back, the call recorded for operators only', async () => {
    const agentId = await newAgent();
    const opened = await client(t.app, tenant.publishableKey).post(
      '/api/visitor_sessions',
      resourceDocument('Conversation', { ai_agent_id: agentId }),
    );
    expect(opened.status).toBe(201);
    const conversationId = opened.body.data.id as string;
    const before = receiver.received.length;
    const seen = model.requests.length;
    model.script(
      { text: 'Let me check.', toolCalls: [{ name: 'lookup_order', arguments: { order: '42' } }] },
      { text: 'Order 42 has shipped and arrives in 2 days.' },
    );
    const list = await turn(config(), conversationId, 'Where is order 42?', hasReply);
    // The receiver got one signed request whose body is the arguments.
    expect(receiver.received.length).toBe(before + 1);
    const call = receiver.received[before];
    expect(call.verified).toBe(true);
    expect(JSON.parse(call.body)).toEqual({ order: '42' });
    expect(call.headers['parley-conversation-id']).toBe(conversationId);
    expect(call.headers['parley-tool']).toBe('lookup_order');
    // Derived from the user item and the call's place in the turn: a turn run again sends the same id.
    expect(call.headers['webhook-id']).toBe(`tool_${list[0].id.replaceAll('-', '')}_0`);
    // The model was offered the tool (with the built-in ones), then given its answer.
    const offered = model.requests[seen].body.tools!.map((x) => x.function.name);
    expect(offered).toEqual(
      expect.arrayContaining(['lookup_order', 'handoff_to_operator', 'end_conversation', 'transfer_call', 'store_answer']),
    );
    const second = model.requests[seen + 1].body.messages;
    expect(second.find((m) => m.role === 'assistant' && m.tool_calls)?.tool_calls?.[0].function.name).toBe('lookup_order');
    expect(toolMessages(seen + 1)).toEqual([
      { role: 'tool', tool_call_id: 'call_0', content: JSON.stringify({ status: 'shipped', eta: '2 days' }) },
    ]);
    // The conversation: the user item, the tool item (the call and its answer), the reply.
    expect(list.map((i) => i.role)).toEqual(['user', 'tool', 'assistant']);
    expect(list[1].content).toContain('lookup_order({"order":"42"})');
    expect(list[1].content).toContain('shipped');
    expect(list[1].metadata.tool).toMatchObject({ name: 'lookup_order', ok: true, status: 200 });
    expect(list[2].content).toBe('Order 42 has shipped and arrives in 2 days.');
    expect(list[2].metadata.tool_calls).toBe(1);
    // The visitor reads its conversation without the tool item; the owner reads it all.
    const visitor = client(t.app, opened.body.meta.token);
    const publicId = opened.body.data.attributes.public_id;
    const asVisitor = await visitor.get(`/api/conversations?filter[public_id]=${publicId}&include=conversation_items`);
    expect(asVisitor.body.included.map((i: any) => i.attributes.role).sort()).toEqual(['assistant', 'user']);
    const asOwner = await owner.get(`/api/conversations/${conversationId}?include=conversation_items`);
    expect(asOwner.body.included.map((i: any) => i.attributes.role).sort()).toEqual(['assistant', 'tool', 'user']);
    // Nor by its id, nor in its event stream (the stream judges each event's record by the same rule).
    const toolItem = asOwner.body.included.find((i: any) => i.attributes.role === 'tool');
    expect((await visitor.get(`/api/conversation_items/${toolItem.id}`)).status).toBe(404);
    const visitorPrincipal = {
      organisationId: tenant.organisationId,
      userId: 'v',
      role: 'visitor' as const,
      credential: 'visitor' as const,
      credentialId: 'v',
      conversationId,
    };
    const onColumns = conversationItem.access.visible!.onColumns!;
    expect(onColumns(visitorPrincipal, { conversation_id: conversationId, role: 'tool' })).toBe(false);
    expect(onColumns(visitorPrincipal, { conversation_id: conversationId, role: 'assistant' })).toBe(true);
  });

  it('arguments that fail the schema, or a tool that does not exist, are refused before any request; the model is told', async () => {
    const conversationId = await newConversation(await newAgent());
    const before = receiver.received.length;
    const seen = model.requests.length;
    model.script(
      {
        text: '',
        toolCalls: [
          { name: 'lookup_order', arguments: { order: 'forty-two' } },
          { name: 'delete_everything', arguments: {} },
          // A name that Object.prototype has is no tool either.
          { name: 'constructor', arguments: {} },
        ],
      },
      { text: 'Which order number is it, in digits?' },
    );
    const list = await turn(config(), conversationId, 'Where is my order forty-two?', hasReply);
    expect(receiver.received.length).toBe(before);
    const results = toolMessages(seen + 1).map((m) => m.content);
    expect(results[0]).toMatch(/arguments of lookup_order are not valid: \/order must match pattern/);
    expect(results[1]).toBe('There is no tool named delete_everything. Use only the tools you were given.');
    expect(results[2]).toBe('There is no tool named constructor. Use only the tools you were given.');
    expect(list.filter((i) => i.role === 'tool').map((i) => i.metadata.tool)).toEqual([
      expect.objectContaining({ name: 'lookup_order', ok: false, refused: true }),
      expect.objectContaining({ name: 'delete_everything', ok: false, refused: true }),
      expect.objectContaining({ name: 'constructor', ok: false, refused: true }),
    ]);
    expect(list.at(-1)!.content).toBe('Which order number is it, in digits?');
  });

  it('without WEBHOOK_ALLOW_PRIVATE_URLS a loopback target is refused at call time, by address and by name', async () => {
    const conversationId = await newConversation(
      await newAgent([
        lookupTool({ url: `https://127.0.0.1:${receiver.port}/tools/lookup` }),
        lookupTool({ name: 'by_name', url: `https://localhost:${receiver.port}/tools/lookup` }),
      ]),
    );
    const before = receiver.received.length;
    const seen = model.requests.length;
    model.script(
      {
        text: '',
        toolCalls: [
          { name: 'lookup_order', arguments: { order: '1' } },
          { name: 'by_name', arguments: { order: '1' } },
        ],
      },
      { text: 'Sorry, I cannot look that up right now.' },
    );
    const strict = config({ events: { ...t.config.events, webhookAllowPrivateUrls: false } });
    await turn(strict, conversationId, 'order 1?', hasReply);
    expect(receiver.received.length).toBe(before);
    const [byAddress, byName] = toolMessages(seen + 1).map((m) => m.content);
    expect(byAddress).toContain('127.0.0.1 is not a public address');
    expect(byName).toMatch(/localhost resolves to .*not a public address/);
  });

  it('a 5 MB answer is not read past the bound, a 500 and a timeout fail, and a failed tool is not called again in the turn', async () => {
    const conversationId = await newConversation(
      await newAgent([lookupTool(), lookupTool({ name: 'slow', timeout_ms: 300 }), lookupTool({ name: 'broken' })]),
    );
    receiver.answer((req, res) => {
      const tool = req.headers['parley-tool'];
      if (tool === 'slow') return; // never answers
      if (tool === 'broken') return void res.writeHead(500).end('oops');
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(`{"data":"${'x'.repeat(5 * 1024 * 1024)}"}`);
    });
    const before = receiver.received.length;
    const seen = model.requests.length;
    model.script(
      {
        text: '',
        toolCalls: [
          { name: 'lookup_order', arguments: { order: '7' } },
          { name: 'slow', arguments: { order: '7' } },
          { name: 'broken', arguments: { order: '7' } },
        ],
      },
      { text: '', toolCalls: [{ name: 'lookup_order', arguments: { order: '7' } }] },
      { text: 'Our systems are slow today, sorry.' },
    );
    try {
      const list = await turn(config(), conversationId, 'order 7?', hasReply);
      // One request each; the repeated call of the failed tool was not sent.
      expect(receiver.received.length).toBe(before + 3);
      const [big, slow, broken] = toolMessages(seen + 1).map((m) => m.content);
      expect(big).toMatch(/larger than 65536 bytes/);
      expect(slow).toMatch(/No answer within 300 ms/);
      expect(broken).toMatch(/Answered 500/);
      expect(toolMessages(seen + 2).at(-1)!.content).toMatch(/failed earlier in this turn and is not called again/);
      const recorded = list.filter((i) => i.role === 'tool');
      expect(recorded).toHaveLength(4);
      expect(recorded.every((i) => i.metadata.tool.ok === false)).toBe(true);
      expect(recorded.every((i) => Buffer.byteLength(i.content) <= 32 * 1024)).toBe(true);
      expect(list.at(-1)!.content).toBe('Our systems are slow today, sorry.');
    } finally {
      receiver.answer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"status":"shipped"}'));
    }
  });

  it('an answer that is not JSON is a failed call', async () => {
    const conversationId = await newConversation(await newAgent());
    receiver.answer((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html>garbage</html>'));
    const seen = model.requests.length;
    model.script({ text: '', toolCalls: [{ name: 'lookup_order', arguments: { order: '8' } }] }, { text: 'Sorry.' });
    try {
      await turn(config(), conversationId, 'order 8?', hasReply);
      expect(toolMessages(seen + 1)[0].content).toMatch(/its answer is not JSON/);
    } finally {
      receiver.answer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"status":"shipped"}'));
    }
  });

  it('a loop of tool calls is cut after AGENT_MAX_TOOL_CALLS: no reply, a handoff that says why', async () => {
    const conversationId = await newConversation(await newAgent());
    const before = receiver.received.length;
    model.always(() => ({
      text: '',
      toolCalls: [
        { name: 'lookup_order', arguments: { order: '9' } },
        { name: 'store_answer', arguments: { key: 'k', value: 'v' } },
      ],
    }));
    try {
      const list = await turn(config({ agentMaxToolCalls: 3 }), conversationId, 'order 9?', (l) => l.some((i) => i.role === 'system'));
      expect(list.map((i) => i.role)).toEqual(['user', 'tool', 'tool', 'system']);
      expect(list.at(-1)!.metadata.handoff).toMatchObject({ rule: 'tool_loop', tool_calls: 2 });
      expect((await conversationRow(conversationId)).status).toBe('pending');
      // The first round ran (2 calls); the second would have passed 3: not run.
      expect(receiver.received.length).toBe(before + 1);
    } finally {
      model.always(undefined);
    }
  });
});

describe('agent run (the dry run)', () => {
  it('calls declared tools for real, unless their answers are given (--mock-tools); stores nothing either way', async () => {
    const agentId = await newAgent();
    const conversationId = await newConversation(agentId);
    await say(conversationId, 'Where is order 42?');
    const runtime = new AgentRuntime({ db: t.db, services: t.services, config: config() });
    receiver.answer((_req, res) =>
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ status: 'shipped', eta: '2 days' })),
    );
    const before = receiver.received.length;
    model.script({ text: '', toolCalls: [{ name: 'lookup_order', arguments: { order: '42' } }] }, { text: 'It has shipped.' });
    const real = await runtime.dryRun(conversationId);
    expect(receiver.received.length).toBe(before + 1);
    expect('tools' in real && real.tools?.[0]).toMatchObject({
      name: 'lookup_order',
      ok: true,
      result: '{"status":"shipped","eta":"2 days"}',
    });

    model.script({ text: '', toolCalls: [{ name: 'lookup_order', arguments: { order: '42' } }] }, { text: 'It is on its way.' });
    const mocked = await runtime.dryRun(conversationId, { lookup_order: { status: 'packed' } });
    expect(receiver.received.length).toBe(before + 1);
    expect('tools' in mocked && mocked.tools?.[0]).toMatchObject({ name: 'lookup_order', ok: true, result: '{"status":"packed"}' });
    expect((await items(conversationId)).map((i) => i.role)).toEqual(['user']);
    // The user item stays unanswered: unpublished, the agent leaves it to no later test's runtime.
    await t.services.records!.update(systemActor(tenant.organisationId, 'test'), 'AiAgent', agentId, { published: false });
  });
});

describe('built-in tools', () => {
  it('end_conversation closes the conversation after the reply', async () => {
    const conversationId = await newConversation(await newAgent([]));
    model.script({ text: 'Glad I could help. Goodbye!', toolCalls: [{ name: 'end_conversation', arguments: { reason: 'done' } }] });
    const list = await turn(config(), conversationId, "That's all, thanks", hasReply);
    expect(list.map((i) => i.role)).toEqual(['user', 'tool', 'assistant']);
    expect(list[2].content).toBe('Glad I could help. Goodbye!');
    await waitFor(async () => (await conversationRow(conversationId)).status === 'closed', 'the close');
  });

  it("store_answer stores into the conversation's answers and the model goes on", async () => {
    const conversationId = await newConversation(await newAgent([]));
    model.script(
      { text: '', toolCalls: [{ name: 'store_answer', arguments: { key: 'order_number', value: '1234' } }] },
      { text: 'Noted: order 1234.' },
    );
    const list = await turn(config(), conversationId, 'My order is 1234', hasReply);
    expect(list.at(-1)!.content).toBe('Noted: order 1234.');
    const row = await conversationRow(conversationId);
    expect(row.metadata.order_number).toBe('1234');
    expect(row.status).toBe('active');
  });

  it('store_answer with a reserved key or a bad key is refused', async () => {
    const conversationId = await newConversation(await newAgent([]));
    const seen = model.requests.length;
    model.script(
      {
        text: '',
        toolCalls: [
          { name: 'store_answer', arguments: { key: 'agent_paused', value: 'true' } },
          { name: 'store_answer', arguments: { key: 'has space', value: 'x' } },
        ],
      },
      { text: 'OK.' },
    );
    await turn(config(), conversationId, 'hi', hasReply);
    const [reserved, bad] = toolMessages(seen + 1).map((m) => m.content);
    expect(reserved).toMatch(/agent_paused is reserved/);
    expect(bad).toMatch(/\/key must match pattern/);
    expect((await conversationRow(conversationId)).metadata.agent_paused).toBeUndefined();
  });

  it('transfer_call on a chat is refused with a message to the model; on a call it names its target for the voice runtime', async () => {
    const agentId = await newAgent([]);
    const chat = await newConversation(agentId);
    const seen = model.requests.length;
    model.script(
      { text: '', toolCalls: [{ name: 'transfer_call', arguments: { to: '+442071234567' } }] },
      { text: 'I can get you a colleague here instead.' },
    );
    const chatItems = await turn(config(), chat, 'put me through to sales', hasReply);
    expect(toolMessages(seen + 1)[0].content).toMatch(/phone calls only/);
    expect(chatItems.find((i) => i.role === 'tool')!.metadata.tool).toMatchObject({ name: 'transfer_call', ok: false, refused: true });
    expect((await conversationRow(chat)).status).toBe('active');

    const voice = await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'Conversation', {
      ai_agent_id: agentId,
      channel: 'voice',
      mode: 'voice',
    });
    model.script({ text: '', toolCalls: [{ name: 'transfer_call', arguments: { to: '+442071234567', reason: 'Sales question.' } }] });
    const list = await turn(config(), voice.id, 'put me through to sales', hasReply);
    expect(list.find((i) => i.role === 'assistant')!.content).toBe('I am transferring you now. Please hold.');
    // The target is on the tool item, where the voice runtime reads it (src/voice/runtime.ts: a REFER once the
    // reply is spoken); the conversation is not queued for an operator.
    expect(list.find((i) => i.role === 'tool')!.metadata.tool).toMatchObject({
      name: 'transfer_call',
      ok: true,
      transfer: { kind: 'number', to: '+442071234567', reason: 'Sales question.' },
    });
    expect(list.some((i) => i.role === 'system')).toBe(false);
    expect((await conversationRow(voice.id)).status).toBe('active');

    // A name that is neither a number nor one of the organisation's SIP users: the model is told so.
    const before = model.requests.length;
    model.script(
      { text: '', toolCalls: [{ name: 'transfer_call', arguments: { to: 'nobody-here' } }] },
      { text: 'I cannot find that person.' },
    );
    await turn(config(), voice.id, 'put me through to nobody', (l) => l.filter((i) => i.role === 'assistant').length === 2);
    expect(toolMessages(before + 1)[0].content).toMatch(/neither an E.164 number nor a SIP user/);
  });
});
