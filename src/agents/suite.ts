/**
 * Agent test suites (docs/agents.md, "Test suites"): scripted conversations run against an agent and the
 * configured model as a dry run. A case's conversation exists only in memory: its turns go through the runtime's
 * own `turn` with the case's history instead of stored items, so nothing is written. A suite's problems are
 * reported with their line and column before anything runs.
 */
import { randomUUID } from 'node:crypto';
import { Ajv, type ValidateFunction } from 'ajv';
import { escapeUTF8 } from 'entities';
import { LineCounter, parseDocument } from 'yaml';
import type { Db } from '../db/schema.js';
import { ApiError, type AppServices, errorObject } from '../jsonapi/index.js';
import { UUID_PATTERN } from '../jsonapi/validate.js';
import { compileParameters } from '../resources/ai-agent-workflow.js';
import { type Agent, AgentRuntime, type Conversation, type Item } from './runtime.js';
import { compileRegExp } from './guardrails.js';
import { mockTools, strictObject } from './tools.js';
import type { WorkflowState } from './workflow.js';

/** Largest suite file or body, in bytes. */
export const SUITE_MAX_BYTES = 256 * 1024;

/** A suite as SUITE_SCHEMA accepts it; each field is described in docs/agents.md, "Test suites". */
export interface TurnExpectation {
  reply_matches?: string;
  reply_not_matches?: string;
  /** `arguments`: a JSON Schema the call's arguments must satisfy. */
  tool_called?: { name: string; arguments?: Record<string, unknown> };
  tool_not_called?: string;
  handoff?: boolean;
  closed?: boolean;
  answers?: Record<string, string>;
}

export interface SuiteCase {
  name: string;
  channel?: 'chat' | 'voice';
  metadata?: Record<string, string>;
  turns: { user: string; expect?: TurnExpectation }[];
  analysis?: Record<string, unknown>;
}

export interface Suite {
  name?: string;
  mock_tools?: Record<string, unknown>;
  cases: SuiteCase[];
}

export class SuiteError extends Error {
  constructor(readonly problems: { line?: number; column?: number; path: string; message: string }[]) {
    super(
      problems
        .map((p) => `${p.line !== undefined ? `line ${p.line}, column ${p.column}: ` : ''}${p.path ? `${p.path}: ` : ''}${p.message}`)
        .join('\n'),
    );
  }
}

const regex = { type: 'string', minLength: 1, maxLength: 1000 };
const toolName = { type: 'string', minLength: 1, maxLength: 64 };
/** Objects of these fields and no others: a misspelt expectation is an error, not one that always passes. */
const SUITE_SCHEMA = strictObject(
  {
    name: { type: 'string', maxLength: 200 },
    mock_tools: { type: 'object' },
    cases: {
      type: 'array',
      minItems: 1,
      maxItems: 100,
      items: strictObject(
        {
          name: { type: 'string', minLength: 1, maxLength: 200 },
          channel: { enum: ['chat', 'voice'] },
          metadata: { type: 'object', additionalProperties: { type: 'string', maxLength: 2000 } },
          analysis: { type: 'object' },
          turns: {
            type: 'array',
            minItems: 1,
            maxItems: 50,
            items: strictObject(
              {
                user: { type: 'string', minLength: 1, maxLength: 8000 },
                expect: strictObject({
                  reply_matches: regex,
                  reply_not_matches: regex,
                  tool_called: strictObject({ name: toolName, arguments: { type: 'object' } }, ['name']),
                  tool_not_called: toolName,
                  handoff: { type: 'boolean' },
                  closed: { type: 'boolean' },
                  answers: { type: 'object', additionalProperties: { type: 'string' } },
                }),
              },
              ['user'],
            ),
          },
        },
        ['name', 'turns'],
      ),
    },
  },
  ['cases'],
);
/** Compiled on first use, not when the module loads (the server loads it; few processes check a suite). */
let compiledSuite: ValidateFunction | undefined;
const suiteValidator = (): ValidateFunction => (compiledSuite ??= new Ajv({ allErrors: true, strict: false }).compile(SUITE_SCHEMA));

/** The problems of a suite's value, each at its path (`cases.0.turns.1.expect.handoff`). */
function suiteProblems(value: unknown): { path: string[]; message: string }[] {
  const found: { path: string[]; message: string }[] = [];
  const validateSuite = suiteValidator();
  if (!validateSuite(value)) {
    for (const e of validateSuite.errors ?? []) {
      const path = e.instancePath.split('/').slice(1);
      if (e.keyword === 'additionalProperties') {
        const extra = (e.params as { additionalProperty: string }).additionalProperty;
        found.push({ path: [...path, extra], message: `${extra} is not a field here` });
      } else if (e.keyword === 'required')
        found.push({ path, message: `${(e.params as { missingProperty: string }).missingProperty} is required` });
      else found.push({ path, message: e.message ?? 'is invalid' });
    }
    return found;
  }
  for (const [ci, c] of (value as unknown as Suite).cases.entries())
    for (const [ti, turn] of c.turns.entries()) {
      const at = ['cases', String(ci), 'turns', String(ti), 'expect'];
      for (const key of ['reply_matches', 'reply_not_matches'] as const) {
        const pattern = turn.expect?.[key];
        if (pattern !== undefined && !compileRegExp(pattern, 'i'))
          found.push({ path: [...at, key], message: 'is not a valid regular expression' });
      }
      const schema = turn.expect?.tool_called?.arguments;
      if (schema) {
        const compiled = compileParameters({ type: 'object', ...schema });
        if (typeof compiled === 'string') found.push({ path: [...at, 'tool_called', 'arguments'], message: compiled });
      }
    }
  return found;
}

/** Reads a suite from YAML (JSON is YAML too), or throws a SuiteError whose problems carry line numbers. */
export function parseSuite(text: string): Suite {
  if (Buffer.byteLength(text) > SUITE_MAX_BYTES)
    throw new SuiteError([{ path: '', message: `The suite is larger than ${SUITE_MAX_BYTES} bytes.` }]);
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, prettyErrors: false, uniqueKeys: true });
  if (doc.errors.length > 0) {
    throw new SuiteError(
      doc.errors.map((e) => {
        const at = e.linePos?.[0] ?? lines.linePos(e.pos[0]);
        return { line: at.line, column: at.col, path: '', message: e.message.split('\n')[0].replace(/ at line \d+, column \d+:?$/, '') };
      }),
    );
  }
  const value = doc.toJS({ maxAliasCount: 100 }) as unknown;
  const problems = suiteProblems(value);
  if (problems.length > 0) {
    throw new SuiteError(
      problems.map((p) => {
        // The nearest node that exists: a missing field is reported where its parent is.
        let path = p.path;
        let node = doc.getIn(path, true) as { range?: [number, number, number] } | undefined;
        while (!node?.range && path.length > 0) {
          path = path.slice(0, -1);
          node = (path.length > 0 ? doc.getIn(path, true) : doc.contents) as typeof node;
        }
        const at = node?.range ? lines.linePos(node.range[0]) : undefined;
        return { ...(at ? { line: at.line, column: at.col } : {}), path: p.path.join('.'), message: p.message };
      }),
    );
  }
  return value as unknown as Suite;
}

export interface TurnReport {
  user: string;
  reply: string | null;
  tools: { name: string; arguments: Record<string, unknown>; ok: boolean }[];
  handoff: string | null;
  closed: boolean;
}

export interface CaseReport {
  name: string;
  passed: boolean;
  duration_ms: number;
  failures: { turn?: number; expectation: string; message: string }[];
  turns: TurnReport[];
}

export interface SuiteReport {
  name: string;
  agent_id: string;
  passed: number;
  failed: number;
  duration_ms: number;
  cases: CaseReport[];
}

export interface SuiteOptions {
  runtime: AgentRuntime;
  agent: Agent & { organisation_id: string };
}

/** Runs every case, one after the other (a model endpoint is usually rate-limited), and reports each. */
export async function runSuite(suite: Suite, options: SuiteOptions): Promise<SuiteReport> {
  const started = performance.now();
  const cases: CaseReport[] = [];
  for (const c of suite.cases) cases.push(await runCase(suite, c, options));
  const failed = cases.filter((c) => !c.passed).length;
  return {
    name: suite.name ?? 'agent test suite',
    agent_id: options.agent.id,
    passed: cases.length - failed,
    failed,
    duration_ms: Math.round(performance.now() - started),
    cases,
  };
}

async function runCase(suite: Suite, spec: SuiteCase, options: SuiteOptions): Promise<CaseReport> {
  const started = performance.now();
  const voice = spec.channel === 'voice';
  const conversation: Conversation = {
    id: randomUUID(),
    organisation_id: options.agent.organisation_id,
    status: 'active',
    channel: voice ? 'voice' : 'chat',
    mode: voice ? 'voice' : 'text',
    metadata: { ...spec.metadata },
    ai_agent_id: options.agent.id,
  };
  let state: WorkflowState = {};
  const history: Item[] = [];
  /** An item of the case's conversation, added to its history. */
  const say = (role: string, content: string, item_id: string) => {
    const said = { id: randomUUID(), item_id, role, modality: voice ? 'audio' : 'text', content, content_index: history.length };
    history.push(said);
    return said;
  };
  const failures: CaseReport['failures'] = [];
  const turns: TurnReport[] = [];
  const callDeclared = mockTools(suite.mock_tools ?? {});

  for (const [index, turnSpec] of spec.turns.entries()) {
    const number = index + 1;
    if (conversation.status !== 'active') {
      failures.push({
        turn: number,
        expectation: 'answered',
        message: `The conversation is ${conversation.status} after turn ${index}: this turn would not be answered by the agent.`,
      });
      break;
    }
    const item = say('user', turnSpec.user, `test_${number}`);
    let result: Awaited<ReturnType<AgentRuntime['turn']>>;
    try {
      result = await options.runtime.turn(conversation, options.agent, state, item, { history, callDeclared });
    } catch (error) {
      failures.push({ turn: number, expectation: 'turn', message: `The turn failed: ${(error as Error).message}` });
      break;
    }
    state = result.state;
    Object.assign(conversation.metadata, result.answers);
    if (result.reply) say('assistant', result.reply.content, `reply_${number}`);
    if (result.handoff) conversation.status = 'pending';
    else if (result.close) conversation.status = 'closed';
    const report: TurnReport = {
      user: turnSpec.user,
      reply: result.reply?.content ?? null,
      tools: (result.tools ?? []).map((t) => ({ name: t.name, arguments: t.arguments, ok: t.ok })),
      handoff: result.handoff ? `${result.handoff.reason}${result.handoff.detail ? ` (${result.handoff.detail})` : ''}` : null,
      closed: result.close,
    };
    turns.push(report);
    for (const failure of checkTurn(turnSpec.expect ?? {}, report, conversation.metadata)) failures.push({ turn: number, ...failure });
  }

  // A suite's conversation is never closed and stored, so the analyst never sees it.
  if (spec.analysis && failures.length === 0)
    failures.push({
      expectation: 'analysis',
      message: 'This server does not analyse conversations: analysis expectations cannot be checked.',
    });
  return { name: spec.name, passed: failures.length === 0, duration_ms: Math.round(performance.now() - started), failures, turns };
}

function checkTurn(expect: TurnExpectation, turn: TurnReport, metadata: Record<string, unknown>) {
  const failures: { expectation: string; message: string }[] = [];
  const fail = (expectation: string, message: string) => failures.push({ expectation, message });
  const reply = turn.reply ?? '';
  for (const [key, wanted] of [
    ['reply_matches', true],
    ['reply_not_matches', false],
  ] as const) {
    const pattern = expect[key];
    if (pattern !== undefined && new RegExp(pattern, 'i').test(reply) !== wanted)
      fail(key, `the reply ${JSON.stringify(reply.slice(0, 300))} ${wanted ? 'does not match' : 'matches'} /${pattern}/i`);
  }
  if (expect.tool_called) {
    const { name, arguments: schema } = expect.tool_called;
    const calls = turn.tools.filter((t) => t.name === name);
    if (calls.length === 0)
      fail('tool_called', `${name} was not called (called: ${turn.tools.map((t) => t.name).join(', ') || 'nothing'})`);
    else if (schema) {
      const validate = compileParameters({ type: 'object', ...schema });
      if (typeof validate !== 'string' && !calls.some((c) => validate(c.arguments)))
        fail(
          'tool_called.arguments',
          `${name} was called with ${calls.map((c) => JSON.stringify(c.arguments)).join(', ')}, which ${calls.length > 1 ? 'do' : 'does'} not match: ${(validate.errors ?? []).map((e) => `${e.instancePath || '(arguments)'} ${e.message}`).join('; ')}`,
        );
    }
  }
  if (expect.tool_not_called !== undefined && turn.tools.some((t) => t.name === expect.tool_not_called))
    fail('tool_not_called', `${expect.tool_not_called} was called`);
  if (expect.handoff !== undefined && (turn.handoff !== null) !== expect.handoff)
    fail('handoff', expect.handoff ? 'the turn did not hand off' : `the turn handed off: ${turn.handoff}`);
  if (expect.closed !== undefined && turn.closed !== expect.closed)
    fail('closed', expect.closed ? 'the conversation was not closed' : 'the conversation was closed');
  for (const [key, wanted] of Object.entries(expect.answers ?? {}))
    if (metadata[key] !== wanted)
      fail(`answers.${key}`, `expected ${JSON.stringify(wanted)}, got ${JSON.stringify(metadata[key] ?? null)}`);
  return failures;
}

/** The report as aligned text: one line per case, then each failure under its case. */
export function suiteTable(report: SuiteReport): string {
  const rows = report.cases.map((c) => [c.passed ? 'PASS' : 'FAIL', c.name, `${c.turns.length}`, `${c.duration_ms} ms`]);
  const header = ['RESULT', 'CASE', 'TURNS', 'TIME'];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) =>
    cells
      .map((cell, i) => cell.padEnd(widths[i]))
      .join('  ')
      .trimEnd();
  const out = [line(header), ...rows.map(line)];
  for (const c of report.cases.filter((x) => !x.passed)) {
    out.push('', `FAIL ${c.name}`);
    for (const f of c.failures) out.push(`  ${f.turn !== undefined ? `turn ${f.turn}, ` : ''}${f.expectation}: ${f.message}`);
  }
  out.push('', `${report.passed} passed, ${report.failed} failed (${report.cases.length} cases, ${report.duration_ms} ms)`);
  return out.join('\n');
}

/** Text and attribute values escaped by `entities` (`&`, `<`, `>`, `"`, `'`); characters XML 1.0 cannot carry at all (section 2.2) dropped. */
const xml = (text: string) => escapeUTF8(text.replace(/[^\t\n\r\x20-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]/gu, ''));

/** The report as JUnit XML (the schema CI servers read: testsuites/testsuite/testcase/failure). */
export function suiteJUnit(report: SuiteReport): string {
  const cases = report.cases.map((c) => {
    const head = `    <testcase classname="${xml(report.name)}" name="${xml(c.name)}" time="${(c.duration_ms / 1000).toFixed(3)}"`;
    if (c.passed) return `${head}/>`;
    const message = c.failures.map((f) => `${f.turn !== undefined ? `turn ${f.turn}, ` : ''}${f.expectation}: ${f.message}`).join('\n');
    const transcript = c.turns
      .map(
        (t, i) =>
          `turn ${i + 1}\n  user: ${t.user}\n  agent: ${t.reply ?? '(no reply)'}${t.tools.length ? `\n  tools: ${t.tools.map((x) => `${x.name}(${JSON.stringify(x.arguments)})`).join(', ')}` : ''}${t.handoff ? `\n  handoff: ${t.handoff}` : ''}`,
      )
      .join('\n');
    return `${head}>\n      <failure message="${xml(c.failures[0]?.message ?? 'failed')}" type="expectation">${xml(message)}</failure>\n      <system-out>${xml(transcript)}</system-out>\n    </testcase>`;
  });
  return [
    '<?xml version="1.0" encoding="UTF-8"?>',
    `<testsuites name="${xml(report.name)}" tests="${report.cases.length}" failures="${report.failed}" time="${(report.duration_ms / 1000).toFixed(3)}">`,
    `  <testsuite name="${xml(report.name)}" tests="${report.cases.length}" failures="${report.failed}" errors="0" time="${(report.duration_ms / 1000).toFixed(3)}">`,
    ...cases,
    '  </testsuite>',
    '</testsuites>',
    '',
  ].join('\n');
}

/** The agent as the runtime reads it, if it is the organisation's (published or not: suites test agents before they go live). */
export async function loadAgent(db: Db, organisationId: string, agentId: string): Promise<SuiteOptions['agent'] | undefined> {
  if (!UUID_PATTERN.test(agentId)) return undefined;
  const row = await db
    .selectFrom('ai_agents')
    .select(['id', 'organisation_id', 'published', 'name', 'tone', 'languages', 'workflow', 'system_prompt', 'safety_guardrails'])
    .where('id', '=', agentId)
    .where('organisation_id', '=', organisationId)
    .executeTakeFirst();
  return row ? ({ ...row, workflow: (row.workflow ?? {}) as Agent['workflow'] } as SuiteOptions['agent']) : undefined;
}

/**
 * `POST /api/ai_agents/test`: runs a suite given as JSON against one of the caller's agents (AppServices.agentTests).
 * An unknown agent or a bad suite is a 422 at its pointer.
 */
export function agentTestsService(db: Db, services: AppServices): NonNullable<AppServices['agentTests']> {
  return async (organisationId, agentId, value) => {
    const agent = await loadAgent(db, organisationId, agentId);
    if (!agent) throw ApiError.of('invalid_attribute', 'No such AI agent.', { pointer: '/data/attributes/ai_agent_id' });
    // Each problem of the suite given as JSON at its path (`suite.cases.0.name`).
    const problems = suiteProblems(value).map((p) => ({ at: ['suite', ...p.path].join('.'), message: p.message }));
    if (problems.length > 0)
      throw new ApiError(
        problems.map(({ at, message }) =>
          errorObject('invalid_attribute', `\`${at}\` ${message}.`, { pointer: `/data/attributes/${at.replaceAll('.', '/')}` }),
        ),
      );
    return runSuite(value as Suite, { runtime: new AgentRuntime({ db, services, config: services.config }), agent });
  };
}
