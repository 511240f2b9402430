import { execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { loadConfig } from '../src/config/index.js';
import { openDatabase } from '../src/db/connection.js';
import { freshPostgresDatabase } from './support/app.js';
import { expectJsonApi } from './support/conformance.js';

const run = promisify(execFile);
const cli = path.resolve('src/cli/main.ts');
let env: NodeJS.ProcessEnv;
let cleanup: () => Promise<void>;

beforeAll(async () => {
  const base = { ...process.env, PASSWORD_HASH_COST_LOG2: '10', LOG_LEVEL: 'silent' };
  if (process.env.DATABASE_URL) {
    const fresh = await freshPostgresDatabase(process.env.DATABASE_URL);
    env = { ...base, DATABASE_URL: fresh.url };
    cleanup = fresh.drop;
  } else {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-cli-'));
    env = { ...base, DATABASE_URL: '', DATA_DIR: dir };
    cleanup = async () => fs.rmSync(dir, { recursive: true, force: true });
  }
}, 180_000);
afterAll(async () => cleanup?.());

/** Runs `parley ...args --json` and returns the one JSON object it prints. */
async function parley(...args: string[]): Promise<Record<string, any>> {
  const { stdout } = await run(process.execPath, ['--import', 'tsx', cli, ...args, '--json'], { env });
  const lines = stdout.trim().split('\n');
  expect(lines).toHaveLength(1);
  return JSON.parse(lines[0]);
}

async function fails(...args: string[]): Promise<string> {
  try {
    await run(process.execPath, ['--import', 'tsx', cli, ...args], { env });
  } catch (error) {
    return String((error as { stderr: string }).stderr);
  }
  throw new Error(`parley ${args.join(' ')} succeeded`);
}

/** Runs a command that must fail; returns its stdout and exit code. */
async function failing(args: string[], environment: NodeJS.ProcessEnv = env): Promise<{ stdout: string; code: number }> {
  try {
    await run(process.execPath, ['--import', 'tsx', cli, ...args], { env: environment });
  } catch (error) {
    const { stdout, code } = error as { stdout: string; code: number };
    return { stdout, code };
  }
  throw new Error(`parley ${args.join(' ')} succeeded`);
}

describe('parley command line', () => {
  it('migrates, creates an organisation, a user, keys and an agent', async () => {
    expect(await parley('migrate')).toHaveProperty('applied');
    const org = await parley('org', 'create', '--name', 'Cli Org');
    expect(org).toMatchObject({ name: 'Cli Org' });
    expect(org.id).toMatch(/^[0-9a-f-]{36}$/);
    const user = await parley(
      'user',
      'create',
      '--org',
      org.id,
      '--email',
      'cli@example.com',
      '--password',
      'cli-password',
      '--full-name',
      'Cli User',
      '--role',
      'admin',
    );
    expect(user).toMatchObject({ email: 'cli@example.com', role: 'admin', organisation_id: org.id });
    const key = await parley(
      'key',
      'create',
      '--org',
      org.id,
      '--user',
      user.id,
      '--type',
      'secret',
      '--name',
      'ci',
      '--expires-at',
      '2099-01-01T00:00:00Z',
    );
    expect(key).toMatchObject({ key_type: 'secret', name: 'ci', expires_at: '2099-01-01T00:00:00.000Z' });
    expect(key.token.split('.')).toHaveLength(3);
    const publishable = await parley('key', 'create', '--org', org.id, '--user', user.id, '--type', 'publishable', '--name', 'widget');
    expect(publishable.key_type).toBe('publishable');
    expect(publishable.console_url).toMatch(new RegExp(`/console#key=${publishable.token.replaceAll('.', '\\.')}$`));
    const agent = await parley('agent', 'create', '--org', org.id, '--name', 'Cli Agent');
    expect(agent).toMatchObject({ name: 'Cli Agent', organisation_id: org.id });
    expect(await parley('key', 'revoke', '--id', key.id)).toEqual({ id: key.id, revoked: true });
    expect(await parley('user', 'revoke-tokens', '--user', user.id)).toMatchObject({ id: user.id });

    // The matching lists: organisations, members with roles, keys (never a token), the revoked one shown so.
    const { organisations } = await parley('org', 'list');
    expect(organisations).toContainEqual({ id: org.id, name: 'Cli Org', created_at: expect.stringMatching(/Z$/) });
    const { users } = await parley('user', 'list', '--org', org.id);
    expect(users).toEqual([
      { id: user.id, email: 'cli@example.com', full_name: 'Cli User', role: 'admin', member_since: expect.stringMatching(/Z$/) },
    ]);
    const listed = await parley('key', 'list', '--org', org.id);
    expect(listed.keys.map((k: { id: string }) => k.id)).toEqual([key.id, publishable.id]);
    expect(listed.keys[0]).toMatchObject({ name: 'ci', key_type: 'secret', user_id: user.id, revoked_at: expect.stringMatching(/Z$/) });
    expect(listed.keys[1].revoked_at).toBeNull();
    expect(JSON.stringify(listed)).not.toContain(publishable.token);
    expect((await parley('key', 'list', '--org', org.id, '--user', '00000000-0000-7000-8000-000000000000')).keys).toEqual([]);
    const { stdout: text } = await run(process.execPath, ['--import', 'tsx', cli, 'user', 'list', '--org', org.id], { env });
    expect(text).toMatch(/cli@example\.com\s+admin\s+Cli User/);
    expect(await fails('key', 'list', '--org', '00000000-0000-7000-8000-000000000000')).toMatch(/no organisation/);
    expect(await fails('key', 'revoke', '--id', key.id)).toMatch(/no active key/);
  }, 240_000);

  it('creates webhook endpoints (the secret printed once) and lists them', async () => {
    const org = await parley('org', 'create', '--name', 'Hook Org');
    const created = await parley(
      'webhook',
      'create',
      '--org',
      org.id,
      '--url',
      'https://1.1.1.1/hooks',
      '--event-types',
      'Conversation.created,ConversationItem.created',
    );
    expect(created).toMatchObject({
      url: 'https://1.1.1.1/hooks',
      event_types: ['Conversation.created', 'ConversationItem.created'],
      enabled: true,
      organisation_id: org.id,
    });
    expect(created.secret).toMatch(/^whsec_/);
    const listed = await parley('webhook', 'list', '--org', org.id);
    expect(listed.webhook_endpoints).toHaveLength(1);
    expect(listed.webhook_endpoints[0]).toMatchObject({
      id: created.id,
      url: 'https://1.1.1.1/hooks',
      enabled: true,
      pending: 0,
      failed: 0,
    });
    expect(JSON.stringify(listed)).not.toContain(created.secret);
    expect(await fails('webhook', 'create', '--org', org.id, '--url', 'http://127.0.0.1/hooks')).toContain(
      'url: `url` must be an https URL',
    );
    expect(await fails('webhook', 'create', '--org', org.id, '--url', 'https://10.0.0.1/hooks')).toContain('not a public address');
    expect(await fails('webhook', 'create', '--org', org.id, '--url', 'https://1.1.1.1/x', '--event-types', 'Nope.created')).toContain(
      'Nope.created',
    );
    const text = await run(process.execPath, ['--import', 'tsx', cli, 'webhook', 'list', '--org', org.id], { env });
    expect(text.stdout).toContain('https://1.1.1.1/hooks');
  }, 180_000);

  it('seeds the demo organisation', async () => {
    const demo = await parley('demo');
    expect(demo.organisation_id).toBe(demo.id);
    expect(demo.publishable_key.split('.')).toHaveLength(3);
    expect(demo.secret_key.split('.')).toHaveLength(3);
    expect(demo.users.map((u: { role: string }) => u.role).sort()).toEqual(['admin', 'operator', 'operator', 'owner']);
    // A softphone can call the demo agent: a SIP user to register as, and what to dial.
    expect(demo.phone).toMatchObject({ sip_username: 'demo-phone', number: '+442079460100' });
    expect(demo.phone.sip_password.length).toBeGreaterThanOrEqual(12);
    expect(demo.phone.domain).toMatch(/^demo\./);
    const database = await openDatabase(loadConfig(env));
    try {
      const agent = await sql<{ id: string; published: boolean }>`
        SELECT id, published FROM ai_agents WHERE organisation_id = ${demo.organisation_id} AND name = 'Ava'`.execute(database.db);
      expect(demo.phone.agent_user).toBe(`agent-${agent.rows[0].id}`);
      expect(agent.rows[0].published).toBe(true);
      const routed = await sql<{ ai_agent_id: string }>`SELECT ai_agent_id FROM phone_numbers WHERE number = '+442079460100'`.execute(
        database.db,
      );
      expect(routed.rows[0].ai_agent_id).toBe(agent.rows[0].id);
    } finally {
      await database.close();
    }
  }, 180_000);

  it('a second demo renews the demo credentials: new passwords and keys, the old keys revoked, no second organisation', async () => {
    const first = await parley('demo');
    const second = await parley('demo');
    expect(second.reset).toBe(true);
    expect(second.organisation_id).toBe(first.organisation_id);
    expect(second.publishable_key).not.toBe(first.publishable_key);
    expect(second.users.map((u: { password: string }) => u.password)).not.toEqual(first.users.map((u: { password: string }) => u.password));
    expect(second.phone.sip_username).toBe('demo-phone');
    expect(second.phone.sip_password).not.toBe(first.phone.sip_password);
    const database = await openDatabase(loadConfig(env));
    try {
      const { rows } = await sql<{ n: number }>`SELECT count(*)::int AS n FROM organisations WHERE name = 'Demo'`.execute(database.db);
      expect(rows[0].n).toBe(1);
      const keys = await sql<{ active: number; revoked: number }>`
        SELECT count(*) FILTER (WHERE revoked_at IS NULL)::int AS active, count(*) FILTER (WHERE revoked_at IS NOT NULL)::int AS revoked
        FROM api_keys WHERE organisation_id = ${second.organisation_id}`.execute(database.db);
      expect(keys.rows[0]).toEqual({ active: 2, revoked: 4 });
    } finally {
      await database.close();
    }
  }, 180_000);

  it('refuses to open the embedded database that another process holds', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-lock-'));
    const holderEnv = { ...env, DATABASE_URL: '', DATA_DIR: dir };
    const holder = await openDatabase(loadConfig(holderEnv));
    try {
      const failed = await failing(['org', 'create', '--name', 'Second', '--json'], holderEnv);
      expect(failed.code).toBe(1);
      expect(JSON.parse(failed.stdout).error).toMatch(new RegExp(`in use by process ${process.pid}`));
    } finally {
      await holder.close();
    }
    // Released on close: the command works now.
    expect(
      JSON.parse(
        (await run(process.execPath, ['--import', 'tsx', cli, 'org', 'create', '--name', 'Second', '--json'], { env: holderEnv })).stdout,
      ).id,
    ).toBeDefined();
    fs.rmSync(dir, { recursive: true, force: true });
  }, 180_000);

  it.skipIf(Boolean(process.env.DATABASE_URL))(
    'works while `serve` runs on the same embedded database, through its socket',
    async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-shared-'));
      const sharedEnv = { ...env, DATABASE_URL: '', DATA_DIR: dir, PORT: '0', HOST: '127.0.0.1', DEMO_ON_FIRST_START: 'false' };
      const server = spawn(process.execPath, ['--import', 'tsx', cli, 'serve', '--json'], {
        env: sharedEnv,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      let stderr = '';
      server.stdout.on('data', (chunk) => (stdout += chunk));
      server.stderr.on('data', (chunk) => (stderr += chunk));
      const exited = new Promise((resolve) => server.once('exit', resolve));
      try {
        const deadline = Date.now() + 120_000;
        while (!stdout.includes('\n')) {
          if (Date.now() > deadline || server.exitCode !== null) throw new Error(`serve did not start\n${stdout}\n${stderr}`);
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        const { url } = JSON.parse(stdout.split('\n')[0]) as { url: string };
        const command = async (...args: string[]) => {
          const { stdout: out } = await run(process.execPath, ['--import', 'tsx', cli, ...args, '--json'], { env: sharedEnv });
          return JSON.parse(out) as Record<string, any>;
        };
        const org = await command('org', 'create', '--name', 'Beside Serve');
        const user = await command(
          'user',
          'create',
          '--org',
          org.id,
          '--email',
          'beside@example.com',
          '--password',
          'beside-password',
          '--full-name',
          'B',
          '--role',
          'admin',
        );
        const key = await command('key', 'create', '--org', org.id, '--user', user.id, '--type', 'secret', '--name', 'beside');
        // The running server sees what the commands wrote: it authenticates the new key, and lists for the new organisation.
        const response = await fetch(`${url}/api/conversations`, {
          headers: { authorization: `Bearer ${key.token}`, accept: 'application/vnd.api+json' },
        });
        expect(response.status).toBe(200);
        const document = (await response.json()) as { data: unknown[] };
        expectJsonApi(document);
        expect(document.data).toEqual([]);
        // The server's own writes go on after the commands.
        const created = await fetch(`${url}/api/conversations`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key.token}`, 'content-type': 'application/vnd.api+json', accept: 'application/vnd.api+json' },
          body: JSON.stringify({ data: { type: 'Conversation', attributes: {} } }),
        });
        expect(created.status).toBe(201);
        expectJsonApi(await created.json());
      } finally {
        server.kill('SIGTERM');
        await exited;
      }
      // Stopped: the socket and the lock are gone, and commands open the database themselves again.
      expect(fs.existsSync(path.join(dir, '.s.PGSQL.5432'))).toBe(false);
      expect(fs.existsSync(path.join(dir, 'parley.lock'))).toBe(false);
      const { stdout: orgs } = await run(process.execPath, ['--import', 'tsx', cli, 'org', 'create', '--name', 'After', '--json'], {
        env: sharedEnv,
      });
      expect(JSON.parse(orgs).name).toBe('After');
      fs.rmSync(dir, { recursive: true, force: true });
    },
    240_000,
  );

  it('prints usage errors as one JSON object with --json', async () => {
    for (const args of [['org', 'create'], ['frobnicate']]) {
      const failed = await failing([...args, '--json']);
      expect(failed.code, args.join(' ')).toBe(1);
      expect(Object.keys(JSON.parse(failed.stdout))).toEqual(['error']);
    }
  }, 180_000);

  it('refuses bad input with a message and a non-zero exit', async () => {
    expect(
      await fails(
        'user',
        'create',
        '--org',
        '00000000-0000-7000-8000-000000000000',
        '--email',
        'x@y.z',
        '--password',
        'long-enough',
        '--full-name',
        'X',
        '--role',
        'admin',
      ),
    ).toMatch(/no organisation/);
    expect(
      await fails('user', 'create', '--org', 'x', '--email', 'x@y.z', '--password', 'p', '--full-name', 'X', '--role', 'king'),
    ).toMatch(/role/);
    expect(await fails('org', 'create')).toMatch(/--name/);
  }, 180_000);
});
