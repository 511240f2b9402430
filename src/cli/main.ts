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
import { Command, Option } from 'commander';
import { ROLES } from '../jsonapi/principal.js';
import { action } from './command.js';

// Each command's work is in a module of its own (serve.ts, accounts.ts, agent.ts, webhook.ts, demo.ts,
// sip-serve.ts), imported when the command runs: a process loads only what its command needs, and `--help` or
// a usage error loads none of them.

const program = new Command('parley').description('Parley: conversations, AI agents, operators and SIP telephony');
// With --json, usage errors too are one JSON object on stdout; otherwise commander's text and the help.
if (process.argv.includes('--json')) {
  program.configureOutput({ writeErr: (text) => console.log(JSON.stringify({ error: text.replace(/^error: /, '').trim() })) });
} else {
  program.showHelpAfterError();
}
const json = () => new Option('--json', 'print one JSON object on stdout');

program
  .command('serve')
  .description('run the HTTP server (migrates first; seeds the demo organisation on a new embedded database)')
  .addOption(new Option('--json', 'print one JSON object (url, database, and the demo credentials on first start) before the logs'))
  .action(action(async () => (await import('./serve.js')).serve));

program
  .command('worker')
  .description('run the agent runtime only (answers conversations; scale it apart from the API)')
  .action(action(async () => (await import('./serve.js')).worker));

program
  .command('migrate')
  .description('apply pending database migrations')
  .addOption(json())
  .action(action(async () => (await import('./accounts.js')).migrate));

const org = program.command('org').description('organisations');
org
  .command('create')
  .requiredOption('--name <name>')
  .addOption(json())
  .action(action(async () => (await import('./accounts.js')).orgCreate));
org
  .command('list')
  .description('every organisation of this installation')
  .addOption(json())
  .action(action(async () => (await import('./accounts.js')).orgList));

const user = program.command('user').description('users');
user
  .command('list')
  .description('the members of an organisation')
  .requiredOption('--org <id>')
  .addOption(json())
  .action(action(async () => (await import('./accounts.js')).userList));
user
  .command('create')
  .requiredOption('--org <id>')
  .requiredOption('--email <email>')
  .requiredOption('--password <password>')
  .requiredOption('--full-name <name>')
  .addOption(new Option('--role <role>').choices(ROLES as string[]).makeOptionMandatory())
  .addOption(json())
  .action(action(async () => (await import('./accounts.js')).userCreate));
user
  .command('revoke-tokens')
  .description('revoke every access token of a user')
  .requiredOption('--user <id>')
  .option('--org <id>')
  .addOption(json())
  .action(action(async () => (await import('./accounts.js')).userRevokeTokens));

const key = program.command('key').description('API keys');
key
  .command('create')
  .requiredOption('--org <id>')
  .requiredOption('--user <id>')
  .addOption(new Option('--type <type>').choices(['publishable', 'secret']).makeOptionMandatory())
  .requiredOption('--name <name>')
  .option('--expires-at <time>', 'RFC 3339 date-time')
  .addOption(json())
  .action(action(async () => (await import('./accounts.js')).keyCreate));
key
  .command('list')
  .description('the API keys of an organisation (never their tokens)')
  .requiredOption('--org <id>')
  .option('--user <id>', "only this user's keys")
  .addOption(json())
  .action(action(async () => (await import('./accounts.js')).keyList));
key
  .command('revoke')
  .requiredOption('--id <id>')
  .addOption(json())
  .action(action(async () => (await import('./accounts.js')).keyRevoke));

const agent = program.command('agent').description('AI agents');
agent
  .command('run')
  .description('print the reply the next unanswered user item of a conversation would get, without storing it (dry run)')
  .requiredOption('--conversation <id>')
  .option('--mock-tools <file.json>', "answers of the agent's declared tools by name (a JSON object): those tools are not called")
  .addOption(json())
  .action(action(async () => (await import('./agent.js')).agentRun));
agent
  .command('test')
  .description(
    'run an agent test suite (YAML: cases of user turns and expectations) against the agent and the configured model, storing nothing; exit status 0 only when every case passes',
  )
  .requiredOption('--agent <id>')
  .requiredOption('--file <suite.yaml>')
  .option('--junit <file>', 'also write the report as JUnit XML to this file')
  .addOption(json())
  .action(action(async () => (await import('./agent.js')).agentTest));
agent
  .command('create')
  .requiredOption('--org <id>')
  .requiredOption('--name <name>')
  .addOption(json())
  .action(action(async () => (await import('./agent.js')).agentCreate));

const webhook = program.command('webhook').description('webhook endpoints (docs/events.md)');
webhook
  .command('create')
  .requiredOption('--org <id>')
  .requiredOption('--url <url>', 'https URL the events are POSTed to')
  .option('--event-types <types>', 'comma-separated event types (e.g. ConversationItem.created); all when omitted')
  .option('--description <text>')
  .addOption(json())
  .action(action(async () => (await import('./webhook.js')).webhookCreate));
webhook
  .command('list')
  .requiredOption('--org <id>')
  .addOption(json())
  .action(action(async () => (await import('./webhook.js')).webhookList));

program
  .command('demo')
  .description('seed a demo organisation and print how to sign in')
  .addOption(json())
  .action(action(async () => (await import('./demo.js')).demo));

program
  .command('sip')
  .description('the SIP edge (Kamailio; needs PostgreSQL)')
  .command('serve')
  .description('render the Kamailio configuration from SIP_LISTEN, SIP_DOMAIN and DATABASE_URL and run Kamailio in the foreground')
  .action(action(async () => (await import('./sip-serve.js')).sipServe));

await program.parseAsync(process.argv);
