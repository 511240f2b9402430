/** `parley agent`: create an AI agent, dry-run its next reply, run a test suite against it. */
import { readFile, writeFile } from 'node:fs/promises';
import { AgentRuntime } from '../agents/runtime.js';
import { BUILT_IN_TOOLS } from '../agents/tools.js';
import { loadAgent, parseSuite, runSuite, type Suite, SuiteError, suiteJUnit, suiteTable } from '../agents/suite.js';
import { systemActor } from '../jsonapi/actor.js';
import { UUID_PATTERN } from '../jsonapi/validate.js';
import type { Output } from './command.js';
import { withDatabase } from './database.js';

export async function agentRun(o: { conversation: string; mockTools?: string; json?: boolean }): Promise<void> {
  // Declared tools are called for real unless mocked (docs/agents.md, "Command line"): the reply printed is the
  // one their real answers lead to.
  let mocks: Record<string, unknown> = {};
  if (o.mockTools) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(await readFile(o.mockTools, 'utf8'));
    } catch (error) {
      throw new Error(`cannot read ${o.mockTools} as JSON: ${(error as Error).message}`);
    }
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed))
      throw new Error(`${o.mockTools} must hold a JSON object: tool name -> its answer`);
    mocks = parsed as Record<string, unknown>;
  }
  return withDatabase(!!o.json, async (db, records, config) => {
    const runtime = new AgentRuntime({ db, services: { config, signingKey: new Uint8Array(), records }, config });
    const result = await runtime.dryRun(o.conversation, mocks);
    const isMocked = (name: string) => Object.hasOwn(mocks, name) && !Object.hasOwn(BUILT_IN_TOOLS, name);
    if ('nothing' in result)
      return { result: { conversation_id: o.conversation, reply: null, note: result.nothing }, text: result.nothing };
    const out = {
      conversation_id: o.conversation,
      in_reply_to: result.userItem.item_id,
      reply: result.reply ?? null,
      handoff: result.handoff ?? null,
      answers: result.answers,
      workflow_state: result.state,
      tool_calls: (result.tools ?? []).map((call) => ({
        name: call.name,
        arguments: call.arguments,
        ok: call.ok,
        result: call.result,
        mocked: isMocked(call.name),
      })),
    };
    const lines = (result.tools ?? []).map(
      (call) =>
        `[tool] ${call.name}(${JSON.stringify(call.arguments)}) ${isMocked(call.name) ? 'mocked' : call.ok ? 'ok' : 'failed'}: ${call.result.slice(0, 200)}`,
    );
    lines.push(result.reply ? result.reply.content : '(no reply)');
    if (result.handoff) lines.push(`[handoff] ${result.handoff.reason}${result.handoff.detail ? ` (${result.handoff.detail})` : ''}`);
    return { result: out, text: lines.join('\n') };
  });
}

export async function agentTest(o: { agent: string; file: string; junit?: string; json?: boolean }): Promise<void> {
  // The suite is read and checked before the database is opened: its errors come first, with line numbers.
  let text: string;
  try {
    text = await readFile(o.file, 'utf8');
  } catch (error) {
    throw new Error(`cannot read ${o.file}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`);
  }
  let suite: Suite;
  try {
    suite = parseSuite(text);
  } catch (error) {
    if (error instanceof SuiteError) throw new Error(`${o.file} is not a valid suite:\n${error.message.replace(/^/gm, `${o.file}: `)}`);
    throw error;
  }
  await withDatabase(!!o.json, async (db, records, config) => {
    const found = await db
      .selectFrom('ai_agents')
      .select('organisation_id')
      .where('id', '=', UUID_PATTERN.test(o.agent) ? o.agent : '00000000-0000-0000-0000-000000000000')
      .executeTakeFirst();
    const target = found && (await loadAgent(db, found.organisation_id, o.agent));
    if (!target) throw new Error(`no agent ${o.agent}`);
    const runtime = new AgentRuntime({ db, services: { config, signingKey: new Uint8Array(), records }, config });
    const report = await runSuite(suite, { runtime, agent: target });
    if (o.junit) await writeFile(o.junit, suiteJUnit(report));
    if (report.failed > 0) process.exitCode = 1;
    return { result: report as unknown as Output, text: suiteTable(report) };
  });
}

export const agentCreate = (o: { org: string; name: string; json?: boolean }) =>
  withDatabase(!!o.json, async (_db, records) => {
    const { id, record } = await records.create(systemActor(o.org, 'cli'), 'AiAgent', { name: o.name });
    const created = { id, ...record.attributes, organisation_id: o.org };
    return { result: created, text: `agent ${id} (${o.name})` };
  });
