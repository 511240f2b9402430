import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { loadConfig } from '../src/config/index.js';
import { openDatabase } from '../src/db/connection.js';
import { freshPostgresDatabase } from './support/app.js';

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
}, 60_000);
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
    const user = await parley('user', 'create', '--org', org.id, '--email', 'cli@example.com', '--password', 'cli-password', '--full-name', 'Cli User', '--role', 'admin');
    expect(user).toMatchObject({ email: 'cli@example.com', role: 'admin', organisation_id: org.id });
    const key = await parley('key', 'create', '--org', org.id, '--user', user.id, '--type', 'secret', '--name', 'ci', '--expires-at', '2099-01-01T00:00:00Z');
    expect(key).toMatchObject({ key_type: 'secret', name: 'ci', expires_at: '2099-01-01T00:00:00.000Z' });
    expect(key.token.split('.')).toHaveLength(3);
    const publishable = await parley('key', 'create', '--org', org.id, '--user', user.id, '--type', 'publishable', '--name', 'widget');
    expect(publishable.key_type).toBe('publishable');
    const agent = await parley('agent', 'create', '--org', org.id, '--name', 'Cli Agent');
    expect(agent).toMatchObject({ name: 'Cli Agent', organisation_id: org.id });
    expect(await parley('key', 'revoke', '--id', key.id)).toEqual({ id: key.id, revoked: true });
    expect(await parley('user', 'revoke-tokens', '--user', user.id)).toMatchObject({ id: user.id });
  }, 60_000);

  it('seeds the demo organisation', async () => {
    const demo = await parley('demo');
    expect(demo.organisation_id).toBe(demo.id);
    expect(demo.publishable_key.split('.')).toHaveLength(3);
    expect(demo.secret_key.split('.')).toHaveLength(3);
    expect(demo.users.map((u: { role: string }) => u.role).sort()).toEqual(['admin', 'operator', 'operator', 'owner']);
  }, 60_000);

  it('a second demo fails whole: no second organisation is left behind', async () => {
    const failed = await failing(['demo', '--json']);
    expect(failed.code).toBe(1);
    expect(JSON.parse(failed.stdout)).toEqual({ error: 'a user with e-mail owner@demo.parley.dev exists already' });
    const database = await openDatabase(loadConfig(env));
    try {
      const { rows } = await sql<{ n: number }>`SELECT count(*)::int AS n FROM organisations WHERE name = 'Demo'`.execute(database.db);
      expect(rows[0].n).toBe(1);
    } finally {
      await database.close();
    }
  }, 60_000);

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
    expect(JSON.parse((await run(process.execPath, ['--import', 'tsx', cli, 'org', 'create', '--name', 'Second', '--json'], { env: holderEnv })).stdout).id).toBeDefined();
    fs.rmSync(dir, { recursive: true, force: true });
  }, 60_000);

  it('prints usage errors as one JSON object with --json', async () => {
    for (const args of [['org', 'create'], ['frobnicate']]) {
      const failed = await failing([...args, '--json']);
      expect(failed.code, args.join(' ')).toBe(1);
      expect(Object.keys(JSON.parse(failed.stdout))).toEqual(['error']);
    }
  }, 60_000);

  it('refuses bad input with a message and a non-zero exit', async () => {
    expect(await fails('user', 'create', '--org', '00000000-0000-7000-8000-000000000000', '--email', 'x@y.z', '--password', 'long-enough', '--full-name', 'X', '--role', 'admin')).toMatch(/no organisation/);
    expect(await fails('user', 'create', '--org', 'x', '--email', 'x@y.z', '--password', 'p', '--full-name', 'X', '--role', 'king')).toMatch(/role/);
    expect(await fails('org', 'create')).toMatch(/--name/);
  }, 60_000);
});
