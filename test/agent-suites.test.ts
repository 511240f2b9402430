/**
 * Agent test suites (CONTRACT section 16, docs/agents.md "Test suites"): YAML problems reported with line
 * numbers; `POST /api/ai_agents/test` running a suite against the fake model server without storing anything;
 * `parley agent test` exiting 0 when every case passes and 1 otherwise, with a table and a JUnit report.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseSuite, SuiteError } from '../src/agents/suite.js';
import { freshPostgresDatabase, startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, pointers, resourceDocument, type Client } from './helpers/http.js';
import { startModelServer, type ModelServer } from './helpers/model-server.js';

let model: ModelServer;
beforeAll(async () => {
  model = await startModelServer();
});
afterAll(async () => model?.close());

function suiteErrors(text: string): SuiteError {
  try {
    parseSuite(text);
  } catch (error) {
    if (error instanceof SuiteError) return error;
    throw error;
  }
  throw new Error('the suite was accepted');
}

describe('reading a suite', () => {
  it('a YAML syntax error names its line', () => {
    const error = suiteErrors('name: broken\ncases:\n  - name: one\n    turns: [ { user: "hi" }\n  - name: two\n');
    expect(error.problems[0].line).toBeGreaterThanOrEqual(4);
    expect(error.message).toMatch(/^line \d+, column \d+: /);
  });

  it('a suite that is YAML but not a suite names the line of each problem', () => {
    const text = [
      'name: orders', // 1
      'cases:', // 2
      '  - name: greeting', // 3
      '    turns:', // 4
      '      - user: hello', // 5
      '        expect:', // 6
      '          handoff: maybe', // 7
      '          reply_matches: "([unclosed"', // 8
      '      - expect: {}', // 9
      '    colour: red', // 10
    ].join('\n');
    const { problems } = suiteErrors(text);
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ line: 7, path: 'cases.0.turns.0.expect.handoff', message: 'must be boolean' }),
        expect.objectContaining({ line: 9, path: 'cases.0.turns.1', message: 'user is required' }),
        expect.objectContaining({ line: 10, path: 'cases.0.colour', message: 'colour is not a field here' }),
      ]),
    );
    // The regex is checked once the structure is right.
    const regex = suiteErrors(
      'cases:\n  - name: x\n    turns:\n      - user: hi\n        expect:\n          reply_matches: "([unclosed"\n',
    );
    expect(regex.problems).toEqual([expect.objectContaining({ line: 6, message: 'is not a valid regular expression' })]);
  });

  it('a duplicated key is an error, not a silent overwrite', () => {
    const { problems } = suiteErrors('cases:\n  - name: a\n    name: b\n    turns:\n      - user: hi\n');
    expect(problems[0].line).toBe(3);
  });
});

describe('POST /api/ai_agents/test', () => {
  let t: TestApp;
  let tenant: Tenant;
  let admin: Client;
  beforeAll(async () => {
    t = await startTestApp({ LLM_BASE_URL: model.url, LLM_API_KEY: 'k', LLM_MAX_RETRIES: '0', WEBHOOK_ALLOW_PRIVATE_URLS: 'true' });
    tenant = await seedTenant(t, 'Suites');
    admin = client(t.app, tenant.admin.token);
  });
  afterAll(async () => t?.close());

  const counts = async () =>
    (
      await sql<{ conversations: string; items: string; turns: string }>`SELECT
        (SELECT count(*) FROM conversations) AS conversations, (SELECT count(*) FROM conversation_items) AS items,
        (SELECT count(*) FROM agent_turns) AS turns`.execute(t.db)
    ).rows[0];

  it('runs the cases against the model, with mocked tools, and stores nothing', async () => {
    const created = await admin.post(
      '/api/ai_agents',
      resourceDocument('AiAgent', {
        name: 'Orders',
        // Unpublished: suites test an agent before it goes live.
        published: false,
        workflow: {
          tools: [
            {
              name: 'lookup_order',
              description: 'Look up an order.',
              parameters: { type: 'object', properties: { order: { type: 'string' } }, required: ['order'] },
              url: 'https://orders.invalid/lookup',
            },
          ],
        },
      }),
    );
    expect(created.status).toBe(201);
    const agentId = created.body.data.id;
    const before = await counts();
    const seen = model.requests.length;
    model.script(
      { text: '', toolCalls: [{ name: 'lookup_order', arguments: { order: '42' } }] },
      { text: 'Order 42 has shipped.' },
      { text: 'Goodbye!', toolCalls: [{ name: 'end_conversation', arguments: {} }] },
      { text: 'I will get a colleague.', toolCalls: [{ name: 'handoff_to_operator', arguments: { reason: 'Refund.' } }] },
    );
    const suite = {
      name: 'orders',
      mock_tools: { lookup_order: { status: 'shipped' } },
      cases: [
        {
          name: 'looks up an order',
          turns: [
            {
              user: 'Where is order 42?',
              expect: {
                reply_matches: 'shipped',
                tool_called: { name: 'lookup_order', arguments: { properties: { order: { const: '42' } }, required: ['order'] } },
                handoff: false,
              },
            },
            { user: 'Thanks, bye', expect: { closed: true, tool_called: { name: 'end_conversation' } } },
          ],
        },
        { name: 'refund goes to a human', turns: [{ user: 'I want a refund', expect: { handoff: true, reply_matches: 'colleague' } }] },
      ],
    };
    const response = await admin.post('/api/ai_agents/test', resourceDocument('AiAgent', { ai_agent_id: agentId, suite }));
    expect(response.status).toBe(200);
    expect(response.body.data.id).toBe(agentId);
    const report = response.body.meta.report;
    expect(report).toMatchObject({ name: 'orders', passed: 2, failed: 0 });
    expect(report.cases[0].turns[0]).toMatchObject({ reply: 'Order 42 has shipped.', tools: [{ name: 'lookup_order', ok: true }] });
    // The mock answered the model; the tool's URL was never called (it does not resolve).
    expect(model.requests[seen + 1].body.messages.find((m) => m.role === 'tool')?.content).toBe('{"status":"shipped"}');
    // The second turn's prompt carries the first turn's exchange: the case is one conversation.
    expect(model.requests[seen + 2].body.messages.map((m) => m.content)).toEqual(
      expect.arrayContaining(['Where is order 42?', 'Order 42 has shipped.', 'Thanks, bye']),
    );
    expect(await counts()).toEqual(before);
  });

  it('a failing expectation is reported per case and turn; a bad suite is a 422 at its pointer; operators may not run suites', async () => {
    const agent = await admin.post('/api/ai_agents', resourceDocument('AiAgent', { name: 'Echo' }));
    const agentId = agent.body.data.id;
    const suite = {
      cases: [
        {
          name: 'expects a goodbye',
          turns: [{ user: 'hello', expect: { reply_matches: '^goodbye', tool_called: { name: 'store_answer' } } }],
        },
      ],
    };
    const response = await admin.post('/api/ai_agents/test', resourceDocument('AiAgent', { ai_agent_id: agentId, suite }));
    expect(response.status).toBe(200);
    const report = response.body.meta.report;
    expect(report).toMatchObject({ passed: 0, failed: 1 });
    expect(report.cases[0].failures).toEqual([
      { turn: 1, expectation: 'reply_matches', message: 'the reply "You said: hello" does not match /^goodbye/i' },
      { turn: 1, expectation: 'tool_called', message: 'store_answer was not called (called: nothing)' },
    ]);

    const bad = await admin.post(
      '/api/ai_agents/test',
      resourceDocument('AiAgent', { ai_agent_id: agentId, suite: { cases: [{ name: 'x', turns: [{ expect: { handoff: 'yes' } }] }] } }),
    );
    expect(bad.status).toBe(422);
    expect(pointers(bad)).toEqual(
      expect.arrayContaining(['/data/attributes/suite/cases/0/turns/0', '/data/attributes/suite/cases/0/turns/0/expect/handoff']),
    );
    const other = await admin.post(
      '/api/ai_agents/test',
      resourceDocument('AiAgent', { ai_agent_id: '00000000-0000-4000-8000-000000000000', suite }),
    );
    expect(other.status).toBe(422);
    expect(pointers(other)).toEqual(['/data/attributes/ai_agent_id']);
    const operator = await client(t.app, tenant.operator.token).post(
      '/api/ai_agents/test',
      resourceDocument('AiAgent', { ai_agent_id: agentId, suite }),
    );
    expect(operator.status).toBe(403);
  });
});

describe('parley agent test', () => {
  const run = promisify(execFile);
  const cli = path.resolve('src/cli/main.ts');
  let env: NodeJS.ProcessEnv;
  let dir: string;
  let cleanup: () => Promise<void>;
  let agentId: string;

  beforeAll(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-suite-'));
    const base = {
      ...process.env,
      PASSWORD_HASH_COST_LOG2: '10',
      LOG_LEVEL: 'silent',
      LLM_BASE_URL: model.url,
      LLM_API_KEY: 'k',
      LLM_MAX_RETRIES: '0',
    };
    if (process.env.DATABASE_URL) {
      const fresh = await freshPostgresDatabase(process.env.DATABASE_URL);
      env = { ...base, DATABASE_URL: fresh.url };
      cleanup = fresh.drop;
    } else {
      env = { ...base, DATABASE_URL: '', DATA_DIR: path.join(dir, 'data') };
      cleanup = async () => {};
    }
    const org = JSON.parse(
      (await run(process.execPath, ['--import', 'tsx', cli, 'org', 'create', '--name', 'Suite Org', '--json'], { env })).stdout,
    );
    const agent = JSON.parse(
      (await run(process.execPath, ['--import', 'tsx', cli, 'agent', 'create', '--org', org.id, '--name', 'Echo', '--json'], { env }))
        .stdout,
    );
    agentId = agent.id;
  }, 180_000);
  afterAll(async () => {
    await cleanup?.();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  async function parley(args: string[]): Promise<{ stdout: string; stderr: string; code: number }> {
    try {
      const { stdout, stderr } = await run(process.execPath, ['--import', 'tsx', cli, ...args], { env });
      return { stdout, stderr, code: 0 };
    } catch (error) {
      const { stdout, stderr, code } = error as { stdout: string; stderr: string; code: number };
      return { stdout, stderr, code };
    }
  }

  const write = (name: string, text: string) => {
    const file = path.join(dir, name);
    fs.writeFileSync(file, text);
    return file;
  };

  it('a suite that passes: a table, exit status 0', async () => {
    const file = write(
      'pass.yaml',
      'name: echo\ncases:\n  - name: echoes\n    turns:\n      - user: hello\n        expect:\n          reply_matches: "you said: hello"\n          handoff: false\n',
    );
    const out = await parley(['agent', 'test', '--agent', agentId, '--file', file]);
    expect(out.code, out.stderr).toBe(0);
    expect(out.stdout).toMatch(/^RESULT\s+CASE\s+TURNS\s+TIME\nPASS\s+echoes\s+1\s+\d+ ms/);
    expect(out.stdout).toContain('1 passed, 0 failed');
  }, 120_000);

  it('a suite that fails: exit status 1, the failure explained, a JUnit file', async () => {
    const file = write(
      'fail.yaml',
      'name: echo\ncases:\n  - name: echoes\n    turns:\n      - user: hi\n  - name: says goodbye\n    turns:\n      - user: hello\n        expect:\n          reply_matches: "^goodbye"\n',
    );
    const junit = path.join(dir, 'report.xml');
    const out = await parley(['agent', 'test', '--agent', agentId, '--file', file, '--junit', junit]);
    expect(out.code).toBe(1);
    expect(out.stdout).toMatch(/PASS\s+echoes/);
    expect(out.stdout).toMatch(/FAIL\s+says goodbye/);
    expect(out.stdout).toContain('turn 1, reply_matches: the reply "You said: hello" does not match /^goodbye/i');
    expect(out.stdout).toContain('1 passed, 1 failed');
    const xml = fs.readFileSync(junit, 'utf8');
    expect(xml).toMatch(/<testsuite name="echo" tests="2" failures="1"/);
    expect(xml).toMatch(/<testcase classname="echo" name="echoes" time="[\d.]+"\/>/);
    expect(xml).toContain('<failure message="the reply &quot;You said: hello&quot; does not match /^goodbye/i" type="expectation">');
    expect(xml).toContain('user: hello');
  }, 120_000);

  it('a suite file with a YAML error: exit status 1 and the line', async () => {
    const file = write('broken.yaml', 'cases:\n  - name: x\n    turns:\n      - user: "unterminated\n');
    const out = await parley(['agent', 'test', '--agent', agentId, '--file', file]);
    expect(out.code).toBe(1);
    expect(out.stderr).toMatch(/broken\.yaml: line \d+, column \d+: /);
  }, 60_000);
});
