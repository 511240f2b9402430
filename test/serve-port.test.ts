/**
 * A first `parley serve` on a port something else holds: it says which port and what to do, and creates
 * nothing, so that the next start on a free port is still the first one and prints the demo login. (It used
 * to seed the demo, then fail with a raw EADDRINUSE, and the next start printed no login.)
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, expect, it } from 'vitest';
import { freePort } from './helpers/ports.js';

const cli = path.resolve('src/cli/main.ts');
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-port-'));
afterAll(() => fs.rmSync(dataDir, { recursive: true, force: true }));

function serve(port: number, until: RegExp | 'exit'): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: '',
    DATA_DIR: dataDir,
    PORT: String(port),
    HOST: '127.0.0.1',
    PASSWORD_HASH_COST_LOG2: '10',
    LOG_LEVEL: 'warn',
    AGENT_RUNTIME: 'false',
    WEBHOOK_WORKER: 'false',
  };
  for (const name of ['PUBLIC_URL', 'REDIS_URL', 'SIGNING_SECRET', 'DEMO_ON_FIRST_START']) delete env[name];
  const child = spawn(process.execPath, ['--import', 'tsx', cli, 'serve'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`serve: no answer in time\n${stdout}\n${stderr}`));
    }, 90_000);
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      stdout += chunk;
      if (until !== 'exit' && until.test(stdout)) child.kill('SIGTERM');
    });
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

it('refuses a port in use before creating anything, naming the port; the next start prints the demo login', async () => {
  const port = await freePort();
  const holder = net.createServer();
  await new Promise<void>((resolve) => holder.listen({ port, host: '127.0.0.1' }, resolve));
  let refused: Awaited<ReturnType<typeof serve>>;
  try {
    refused = await serve(port, 'exit');
  } finally {
    await new Promise((resolve) => holder.close(resolve));
  }
  expect(refused.code).toBe(1);
  expect(refused.stderr).toContain(`port ${port} on 127.0.0.1 is in use`);
  expect(refused.stderr).toContain('parley demo');
  expect(refused.stderr).not.toMatch(/EADDRINUSE/);
  expect(refused.stdout).not.toContain('/console#key=');

  const first = await serve(port, /Secret key.*\n/);
  expect(first.stdout).toContain(`http://127.0.0.1:${port}/console#key=`);
}, 180_000);
