#!/usr/bin/env -S node --max-semi-space-size=32
/**
 * The `parley` command: serve, migrate, and the administration commands of the contract.
 *
 * The first line's Node flags are the server's runtime settings (`npm start` passes the same; a test checks
 * they agree, and the benchmark starts the server with them). `--max-semi-space-size=32`: V8's young
 * generation may grow to semi-spaces of 32 MB instead of 16 MB. A request allocates short-lived objects (rows,
 * strings, the document); with 32 requests in flight, small semi-spaces are scavenged so often that objects
 * still in use are copied, and promoted to the old generation, before they die. 64 MB saved more CPU but
 * took the server's RSS under load past its 300 MB target (docs/benchmarks.md, "Node's young generation").
 */
import { readFile, writeFile } from 'node:fs/promises';
import { Command, Option } from 'commander';
import { sql } from 'kysely';
import { createOrganisation, createUserInOrganisation } from '../auth/accounts.js';
import { createApiKey, revokeApiKey } from '../auth/api-keys.js';
import { revokeUserTokens } from '../auth/user-tokens.js';
import { AgentRuntime } from '../agents/runtime.js';
import { loadAgent, parseSuite, runSuite, type Suite, SuiteError, suiteJUnit, suiteTable } from '../agents/suite.js';
import { BUILT_IN_TOOLS } from '../agents/tools.js';
import { consoleLink, createServices, loginHint, startApp } from '../app.js';
import { createLogger } from '../http/logger.js';
import { loadConfig, publicBaseUrl } from '../config/index.js';
import { openDatabase } from '../db/connection.js';
import type { Db } from '../db/schema.js';
import { migrate } from '../db/migrate.js';
import { seedDemo } from '../demo/demo.js';
import { systemActor } from '../jsonapi/actor.js';
import { ApiError } from '../jsonapi/errors.js';
import { ROLES, type Role } from '../jsonapi/principal.js';
import type { Records } from '../jsonapi/records.js';
import { addSipCommands } from './sip.js';

type Output = Record<string, unknown>;

/** Opens the configured database (migrated), runs `work`, prints its result, closes. */
async function withDatabase(json: boolean, work: (db: Db, records: Records) => Promise<{ result: Output; text: string }>) {
  const config = loadConfig();
  const database = await openDatabase(config);
  try {
    await migrate(database.db);
    const services = await createServices(database, config);
    const { result, text } = await work(database.db, services.records!);
    console.log(json ? JSON.stringify(result) : text);
  } finally {
    await database.close();
  }
}

function fail(error: unknown, json: boolean): never {
  // A refused write names each problem with the attribute it concerns, as the API would.
  const message =
    error instanceof ApiError
      ? error.errors
          .map((e) => {
            const pointer = e.source && 'pointer' in e.source ? e.source.pointer : '';
            return `${pointer.startsWith('/data/attributes/') ? `${pointer.slice(17)}: ` : ''}${e.detail ?? e.title}`;
          })
          .join('; ')
      : error instanceof Error
        ? error.message
        : String(error);
  if (json) console.log(JSON.stringify({ error: message }));
  else console.error(`parley: ${message}`);
  process.exit(1);
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** A listed organisation must exist: an unknown (or malformed) id is an error, not an empty list. */
async function requireOrganisation(db: Db, id: string): Promise<void> {
  const found = UUID.test(id) && (await db.selectFrom('organisations').select('id').where('id', '=', id).executeTakeFirst());
  if (!found) throw new Error(`no organisation ${id}`);
}

const iso = (value: unknown): string | null => (value instanceof Date ? value.toISOString() : value == null ? null : String(value));

/** Rows as aligned text columns, for people; --json gives the same rows to programs. */
function table(rows: Record<string, unknown>[], columns: string[]): string {
  if (rows.length === 0) return '(none)';
  const cells = [columns, ...rows.map((r) => columns.map((c) => String(r[c] ?? '-')))];
  const widths = columns.map((_, i) => Math.max(...cells.map((row) => row[i].length)));
  return cells
    .map((row) =>
      row
        .map((cell, i) => cell.padEnd(widths[i]))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

const jsonRequested = process.argv.includes('--json');
const program = new Command('parley').description('Parley: conversations, AI agents, operators and SIP telephony');
// With --json, usage errors too are one JSON object on stdout; otherwise commander's text and the help.
if (jsonRequested) {
  program.configureOutput({ writeErr: (text) => console.log(JSON.stringify({ error: text.replace(/^error: /, '').trim() })) });
} else {
  program.showHelpAfterError();
}
const json = () => new Option('--json', 'print one JSON object on stdout');

/** How long a stopping server waits for in-flight requests before cutting the connections left. */
const SHUTDOWN_GRACE_MS = 10_000;

function action<T extends { json?: boolean }>(run: (options: T) => Promise<void>) {
  return async (options: T) => {
    try {
      await run(options);
    } catch (error) {
      fail(error, options.json ?? false);
    }
  };
}

program
  .command('serve')
  .description('run the HTTP server (migrates first; seeds the demo organisation on a new embedded database)')
  .addOption(new Option('--json', 'print one JSON object (url, database, and the demo credentials on first start) before the logs'))
  .action(async (o: { json?: boolean }) => {
    const running = await startApp(loadConfig()).catch((error: unknown) => fail(error, !!o.json));
    running.app.log.info({ url: running.url, database: running.database.kind }, 'Parley is listening');
    if (o.json) {
      console.log(JSON.stringify({ url: running.url, database: running.database.kind, demo: running.demo ?? null }));
    } else {
      console.log(`Parley listening on ${running.url} (${running.database.kind} database)`);
      if (running.demo) console.log(loginHint(running.url, running.demo));
      else if (running.database.kind === 'pglite')
        console.log(
          'The demo login is printed by the first start only; `parley demo` creates another demo organisation and prints its login.',
        );
    }
    let stopping = false;
    const stop = async (signal: string) => {
      if (stopping) return;
      stopping = true;
      running.app.log.info({ signal }, 'shutting down: finishing in-flight requests');
      // In-flight requests get this long; then whatever connections remain are cut.
      setTimeout(() => running.app.server.closeAllConnections(), SHUTDOWN_GRACE_MS).unref();
      await running.close();
      process.exit(0);
    };
    process.on('SIGTERM', () => void stop('SIGTERM'));
    process.on('SIGINT', () => void stop('SIGINT'));
  });

program
  .command('worker')
  .description('run the agent runtime only (answers conversations; scale it apart from the API)')
  .action(async () => {
    const config = loadConfig();
    const logger = createLogger(config);
    const database = await openDatabase(config).catch((error: unknown) => fail(error, false));
    await migrate(database.db);
    const services = await createServices(database, config);
    const runtime = new AgentRuntime({ db: database.db, services, config, logger, listen: database.listen });
    runtime.start();
    logger.info({ database: database.kind, pollMs: config.agentPollMs }, 'agent worker running');
    let stopping = false;
    const stop = async (signal: string) => {
      if (stopping) return;
      stopping = true;
      logger.info({ signal }, 'agent worker: finishing the turns in flight');
      await runtime.stop();
      await database.close();
      process.exit(0);
    };
    process.on('SIGTERM', () => void stop('SIGTERM'));
    process.on('SIGINT', () => void stop('SIGINT'));
  });

program
  .command('migrate')
  .description('apply pending database migrations')
  .addOption(json())
  .action(
    action(async (o: { json?: boolean }) => {
      const config = loadConfig();
      const database = await openDatabase(config);
      try {
        const applied = await migrate(database.db);
        console.log(o.json ? JSON.stringify({ applied }) : applied.length ? `applied ${applied.join(', ')}` : 'up to date');
      } finally {
        await database.close();
      }
    }),
  );

const org = program.command('org').description('organisations');
org
  .command('create')
  .requiredOption('--name <name>')
  .addOption(json())
  .action(
    action(async (o: { name: string; json?: boolean }) =>
      withDatabase(!!o.json, async (_db, records) => {
        const created = await createOrganisation(records, { name: o.name });
        return { result: created, text: `organisation ${created.id} (${created.name})` };
      }),
    ),
  );

org
  .command('list')
  .description('every organisation of this installation')
  .addOption(json())
  .action(
    action(async (o: { json?: boolean }) =>
      withDatabase(!!o.json, async (db) => {
        const organisations = (
          await db.selectFrom('organisations').select(['id', 'name', 'created_at']).orderBy('created_at').orderBy('id').execute()
        ).map((r) => ({ id: r.id, name: r.name, created_at: iso(r.created_at) }));
        return { result: { organisations }, text: table(organisations, ['id', 'name', 'created_at']) };
      }),
    ),
  );

const user = program.command('user').description('users');
user
  .command('list')
  .description('the members of an organisation')
  .requiredOption('--org <id>')
  .addOption(json())
  .action(
    action(async (o: { org: string; json?: boolean }) =>
      withDatabase(!!o.json, async (db) => {
        await requireOrganisation(db, o.org);
        const rows = await db
          .selectFrom('memberships as m')
          .innerJoin('users as u', 'u.id', 'm.user_id')
          .select(['u.id', 'u.email', 'u.full_name', 'm.role', 'm.created_at'])
          .where('m.organisation_id', '=', o.org)
          .orderBy('m.created_at')
          .orderBy('u.id')
          .execute();
        const users = rows.map((r) => ({
          id: r.id,
          email: r.email,
          full_name: r.full_name,
          role: r.role,
          member_since: iso(r.created_at),
        }));
        return { result: { organisation_id: o.org, users }, text: table(users, ['id', 'email', 'role', 'full_name']) };
      }),
    ),
  );
user
  .command('create')
  .requiredOption('--org <id>')
  .requiredOption('--email <email>')
  .requiredOption('--password <password>')
  .requiredOption('--full-name <name>')
  .addOption(new Option('--role <role>').choices(ROLES as string[]).makeOptionMandatory())
  .addOption(json())
  .action(
    action(async (o: { org: string; email: string; password: string; fullName: string; role: Role; json?: boolean }) =>
      withDatabase(!!o.json, async (_db, records) => {
        const created = await createUserInOrganisation(records, {
          organisationId: o.org,
          email: o.email,
          password: o.password,
          fullName: o.fullName,
          role: o.role,
        });
        return { result: created, text: `user ${created.id} (${created.email}, ${created.role})` };
      }),
    ),
  );
user
  .command('revoke-tokens')
  .description('revoke every access token of a user')
  .requiredOption('--user <id>')
  .option('--org <id>')
  .addOption(json())
  .action(
    action(async (o: { user: string; org?: string; json?: boolean }) =>
      withDatabase(!!o.json, async (db) => {
        const revoked = await revokeUserTokens(db, { userId: o.user, organisationId: o.org });
        return { result: { id: o.user, revoked }, text: `revoked ${revoked} token(s)` };
      }),
    ),
  );

const key = program.command('key').description('API keys');
key
  .command('create')
  .requiredOption('--org <id>')
  .requiredOption('--user <id>')
  .addOption(new Option('--type <type>').choices(['publishable', 'secret']).makeOptionMandatory())
  .requiredOption('--name <name>')
  .option('--expires-at <time>', 'RFC 3339 date-time')
  .addOption(json())
  .action(
    action(async (o: { org: string; user: string; type: 'publishable' | 'secret'; name: string; expiresAt?: string; json?: boolean }) =>
      withDatabase(!!o.json, async (_db, records) => {
        const expiresAt = o.expiresAt ? new Date(o.expiresAt) : undefined;
        const created = await createApiKey(records, { organisationId: o.org, userId: o.user, keyType: o.type, name: o.name, expiresAt });
        const text = `key ${created.id} (${created.key_type}); token, shown once:\n${created.token}`;
        if (created.key_type !== 'publishable') return { result: created, text };
        // A publishable key signs the organisation's users in to the console: print its link.
        const url = publicBaseUrl(loadConfig());
        const link = consoleLink(url, created.token);
        return { result: { ...created, console_url: link }, text: `${text}\noperator console:\n${link}` };
      }),
    ),
  );
key
  .command('list')
  .description('the API keys of an organisation (never their tokens)')
  .requiredOption('--org <id>')
  .option('--user <id>', "only this user's keys")
  .addOption(json())
  .action(
    action(async (o: { org: string; user?: string; json?: boolean }) =>
      withDatabase(!!o.json, async (db) => {
        await requireOrganisation(db, o.org);
        let query = db
          .selectFrom('api_keys')
          .select(['id', 'name', 'key_type', 'user_id', 'expires_at', 'revoked_at', 'created_at'])
          .where('organisation_id', '=', o.org);
        if (o.user) query = query.where('user_id', '=', o.user);
        const rows = await query.orderBy('created_at').orderBy('id').execute();
        const keys = rows.map((r) => ({
          id: r.id,
          name: r.name,
          key_type: r.key_type,
          user_id: r.user_id,
          expires_at: iso(r.expires_at),
          revoked_at: iso(r.revoked_at),
          created_at: iso(r.created_at),
        }));
        return { result: { organisation_id: o.org, keys }, text: table(keys, ['id', 'name', 'key_type', 'user_id', 'revoked_at']) };
      }),
    ),
  );
key
  .command('revoke')
  .requiredOption('--id <id>')
  .addOption(json())
  .action(
    action(async (o: { id: string; json?: boolean }) =>
      withDatabase(!!o.json, async (db, records) => {
        if (!UUID.test(o.id) || !(await revokeApiKey(db, records, o.id))) throw new Error(`no active key ${o.id}`);
        return { result: { id: o.id, revoked: true }, text: `key ${o.id} revoked` };
      }),
    ),
  );

const agent = program.command('agent').description('AI agents');
agent
  .command('run')
  .description('print the reply the next unanswered user item of a conversation would get, without storing it (dry run)')
  .requiredOption('--conversation <id>')
  .option('--mock-tools <file.json>', "answers of the agent's declared tools by name (a JSON object): those tools are not called")
  .addOption(json())
  .action(
    action(async (o: { conversation: string; mockTools?: string; json?: boolean }) => {
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
      return withDatabase(!!o.json, async (db, records) => {
        const config = loadConfig();
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
    }),
  );
agent
  .command('test')
  .description(
    'run an agent test suite (YAML: cases of user turns and expectations) against the agent and the configured model, storing nothing; exit status 0 only when every case passes',
  )
  .requiredOption('--agent <id>')
  .requiredOption('--file <suite.yaml>')
  .option('--junit <file>', 'also write the report as JUnit XML to this file')
  .addOption(json())
  .action(
    action(async (o: { agent: string; file: string; junit?: string; json?: boolean }) => {
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
      await withDatabase(!!o.json, async (db, records) => {
        const config = loadConfig();
        const found = await db
          .selectFrom('ai_agents')
          .select('organisation_id')
          .where('id', '=', UUID.test(o.agent) ? o.agent : '00000000-0000-0000-0000-000000000000')
          .executeTakeFirst();
        const target = found && (await loadAgent(db, found.organisation_id, o.agent));
        if (!target) throw new Error(`no agent ${o.agent}`);
        const runtime = new AgentRuntime({ db, services: { config, signingKey: new Uint8Array(), records }, config });
        const report = await runSuite(suite, { runtime, agent: target });
        if (o.junit) await writeFile(o.junit, suiteJUnit(report));
        if (report.failed > 0) process.exitCode = 1;
        return { result: report as unknown as Output, text: suiteTable(report) };
      });
    }),
  );
agent
  .command('create')
  .requiredOption('--org <id>')
  .requiredOption('--name <name>')
  .addOption(json())
  .action(
    action(async (o: { org: string; name: string; json?: boolean }) =>
      withDatabase(!!o.json, async (_db, records) => {
        const { id, record } = await records.create(systemActor(o.org, 'cli'), 'AiAgent', { name: o.name });
        const created = { id, ...(record.attributes as Record<string, unknown>), organisation_id: o.org };
        return { result: created, text: `agent ${id} (${o.name})` };
      }),
    ),
  );

const webhook = program.command('webhook').description('webhook endpoints (docs/events.md)');
webhook
  .command('create')
  .requiredOption('--org <id>')
  .requiredOption('--url <url>', 'https URL the events are POSTed to')
  .option('--event-types <types>', 'comma-separated event types (e.g. ConversationItem.created); all when omitted')
  .option('--description <text>')
  .addOption(json())
  .action(
    action(async (o: { org: string; url: string; eventTypes?: string; description?: string; json?: boolean }) =>
      withDatabase(!!o.json, async (_db, records) => {
        const values: Record<string, unknown> = { url: o.url };
        if (o.eventTypes !== undefined)
          values.event_types = o.eventTypes
            .split(',')
            .map((t) => t.trim())
            .filter(Boolean);
        if (o.description !== undefined) values.description = o.description;
        const { id, record } = await records.create(systemActor(o.org, 'cli'), 'WebhookEndpoint', values);
        const attributes = record.attributes as Record<string, unknown>;
        const created = { id, ...attributes, organisation_id: o.org };
        const types = (attributes.event_types as string[]).join(', ') || 'every type';
        return {
          result: created,
          text: `webhook endpoint ${id} -> ${o.url} (${types}); signing secret, shown once:\n${attributes.secret}`,
        };
      }),
    ),
  );
webhook
  .command('list')
  .requiredOption('--org <id>')
  .addOption(json())
  .action(
    action(async (o: { org: string; json?: boolean }) =>
      withDatabase(!!o.json, async (db) => {
        const { rows } = await sql<{
          id: string;
          url: string;
          event_types: string[];
          enabled: boolean;
          description: string | null;
          consecutive_failures: number;
          disabled_reason: string | null;
          pending: number;
          failed: number;
          succeeded: number;
        }>`
          SELECT w.id, w.url, w.event_types, w.enabled, w.description, w.consecutive_failures, w.disabled_reason,
            (SELECT count(*)::int FROM webhook_deliveries d WHERE d.webhook_endpoint_id = w.id AND d.status = 'pending') AS pending,
            (SELECT count(*)::int FROM webhook_deliveries d WHERE d.webhook_endpoint_id = w.id AND d.status = 'failed') AS failed,
            (SELECT count(*)::int FROM webhook_deliveries d WHERE d.webhook_endpoint_id = w.id AND d.status = 'succeeded') AS succeeded
          FROM webhook_endpoints w WHERE w.organisation_id = ${o.org} ORDER BY w.id`.execute(db);
        const lines = rows.map((w) => {
          const state = w.enabled ? 'enabled' : `DISABLED${w.disabled_reason ? ` (${w.disabled_reason})` : ''}`;
          const types = w.event_types.join(',') || '*';
          return `${w.id}  ${w.url}  ${types}  ${state}  deliveries: ${w.succeeded} succeeded, ${w.pending} pending, ${w.failed} failed`;
        });
        return {
          result: { organisation_id: o.org, webhook_endpoints: rows },
          text: lines.length ? lines.join('\n') : 'no webhook endpoints',
        };
      }),
    ),
  );

program
  .command('demo')
  .description('seed a demo organisation and print how to sign in')
  .addOption(json())
  .action(
    action(async (o: { json?: boolean }) =>
      withDatabase(!!o.json, async (db, records) => {
        const demo = await seedDemo(db, records);
        return {
          result: { id: demo.organisation_id, ...demo },
          text: loginHint(publicBaseUrl(loadConfig()), demo),
        };
      }),
    ),
  );

addSipCommands(program, fail);

await program.parseAsync(process.argv);
