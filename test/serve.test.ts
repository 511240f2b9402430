/**
 * `parley serve` (what `npm start` runs) as a real process on the embedded
 * database: first start on an empty data directory (migrations, the demo
 * organisation once, the printed login, /healthz; the time it takes is printed
 * here and measured against its 10 s target by `npm run bench`), the printed
 * login performed as printed, graceful shutdown on SIGTERM that finishes the
 * requests in flight, and a restart on the same data directory.
 *
 * Always the embedded database, even when the suite runs on PostgreSQL: the
 * embedded default is what `npm start` uses.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectJsonApi } from './support/conformance.js';
import { freePort } from './helpers/ports.js';

const cli = path.resolve('src/cli/main.ts');
/** How long the test waits at most before giving up (so that a slow start reports its figure instead of timing out). */
const GIVE_UP_MS = 90_000;
const JSON_API = 'application/vnd.api+json';

interface Served {
  child: ChildProcess;
  port: number;
  stdout(): string;
  stderr(): string;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  exited(): boolean;
}

const children: ChildProcess[] = [];
let dataDir: string;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function serve(port: number): Served {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: '',
    DATA_DIR: dataDir,
    PORT: String(port),
    HOST: '127.0.0.1',
    PASSWORD_HASH_COST_LOG2: '10',
    LOG_LEVEL: 'warn',
  };
  delete env.PUBLIC_URL;
  delete env.REDIS_URL;
  delete env.SIGNING_SECRET;
  delete env.DEMO_ON_FIRST_START;
  const child = spawn(process.execPath, ['--import', 'tsx', cli, 'serve'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let out = '';
  let err = '';
  let done = false;
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => (out += chunk));
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (err += chunk));
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => {
      done = true;
      resolve({ code, signal });
    }),
  );
  return { child, port, stdout: () => out, stderr: () => err, exit, exited: () => done };
}

/** Polls GET /healthz until it answers 200; returns the milliseconds since `since`. */
async function waitHealthy(served: Served, since: number): Promise<number> {
  while (performance.now() - since < GIVE_UP_MS) {
    if (served.exited()) throw new Error(`serve exited before it was healthy\nstdout:\n${served.stdout()}\nstderr:\n${served.stderr()}`);
    try {
      const response = await fetch(`http://127.0.0.1:${served.port}/healthz`, { signal: AbortSignal.timeout(2000) });
      if (response.status === 200) return Math.round(performance.now() - since);
    } catch {
      // not listening yet
    }
    await sleep(25);
  }
  throw new Error(`serve not healthy after ${GIVE_UP_MS} ms\nstdout:\n${served.stdout()}\nstderr:\n${served.stderr()}`);
}

/** Waits until stdout matches `pattern` (the process writes its banner right after listening). */
async function waitForOutput(served: Served, pattern: RegExp): Promise<string> {
  const deadline = performance.now() + 10_000;
  while (!pattern.test(served.stdout())) {
    if (performance.now() > deadline || served.exited())
      throw new Error(`no ${pattern} in stdout:\n${served.stdout()}\nstderr:\n${served.stderr()}`);
    await sleep(20);
  }
  return served.stdout();
}

/** CPU time (user + system) the process has used so far, from /proc (Linux), for context in the printed figures. */
function cpuMs(pid: number | undefined): number | undefined {
  try {
    const fields = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return Math.round(((Number(fields[11]) + Number(fields[12])) * 1000) / 100);
  } catch {
    return undefined;
  }
}

/** Pino JSON lines at error level or above (LOG_LEVEL=warn lets warnings and errors through). */
function loggedErrors(stdout: string): string[] {
  return stdout
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .filter((line) => {
      try {
        return (JSON.parse(line) as { level?: number }).level! >= 50;
      } catch {
        return false;
      }
    });
}

/** The parsed body of a fetch response (a JSON:API document, checked by the caller). */
async function readJson(response: globalThis.Response): Promise<any> {
  return response.json();
}

interface Answer {
  status: number;
  body: string;
}

/**
 * A request that is provably in flight: it is sent with `Expect: 100-continue`,
 * and the server's `100 Continue` (written when Node has parsed the request and
 * handed it to Fastify) resolves `received`. The body is sent only when
 * `sendBody` is called, so the request cannot finish before that.
 */
function inFlight(port: number, agent: http.Agent, method: string, url: string, headers: Record<string, string>, body?: string) {
  let receivedResolve!: () => void;
  const received = new Promise<void>((resolve) => (receivedResolve = resolve));
  const request = http.request({
    host: '127.0.0.1',
    port,
    method,
    path: url,
    agent,
    headers: { ...headers, Expect: '100-continue', ...(body !== undefined ? { 'Content-Length': String(Buffer.byteLength(body)) } : {}) },
  });
  const answer = new Promise<Answer>((resolve, reject) => {
    request.on('response', (response) => {
      let text = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => (text += chunk));
      response.on('end', () => resolve({ status: response.statusCode!, body: text }));
      response.on('error', reject);
    });
    request.on('error', reject);
  });
  request.on('continue', receivedResolve);
  request.flushHeaders();
  if (body === undefined) request.end();
  return {
    received,
    answer,
    sendBody() {
      if (body !== undefined) request.end(body);
    },
  };
}

/** Resolves with the error code of a TCP connection attempt (or 'connected'). */
function connect(port: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.destroy();
      resolve('connected');
    });
    socket.once('error', (error: NodeJS.ErrnoException) => resolve(error.code ?? error.message));
  });
}

interface PrintedLogin {
  url: string;
  publishableKey: string;
  contentType: string;
  body: string;
  email: string;
  password: string;
}

/** The curl line `serve` prints, taken apart. */
function parseLoginHint(stdout: string): PrintedLogin {
  const match =
    /curl -s -X POST (\S+) \\\n\s+-H 'Authorization: Bearer ([^']+)' \\\n\s+-H 'Content-Type: ([^']+)' \\\n\s+-d '([^']+)'/.exec(stdout);
  expect(match, `no curl login line in:\n${stdout}`).not.toBeNull();
  const [, url, publishableKey, contentType, body] = match!;
  const { email, password } = JSON.parse(body).data.attributes;
  return { url, publishableKey, contentType, body, email, password };
}

describe('parley serve on an empty embedded database', () => {
  let port: number;
  let first: Served;
  let login: PrintedLogin;
  let token: string;
  let conversationIds: string[];

  beforeAll(() => {
    dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-serve-'));
  });

  afterAll(async () => {
    for (const child of children) {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await new Promise((resolve) => child.once('exit', resolve));
      }
    }
    if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
  });

  it(
    'migrates, creates the demo organisation, prints the login and answers /healthz',
    async () => {
      port = await freePort();
      const started = performance.now();
      first = serve(port);
      const healthyMs = await waitHealthy(first, started);
      const cpu = cpuMs(first.child.pid);
      console.log(
        `serve: first start on an empty embedded database healthy after ${healthyMs} ms (child CPU ${cpu ?? '?'} ms, load average ${os.loadavg()[0].toFixed(2)})`,
      );
      const stdout = await waitForOutput(first, /Secret key \(server-to-server, shown once\): \S+/);
      expect(stdout).toContain(`Parley listening on http://127.0.0.1:${port} (pglite database)`);
      expect(stdout.match(/Demo organisation created/g)).toHaveLength(1);
      login = parseLoginHint(stdout);
      expect(login.url).toBe(`http://127.0.0.1:${port}/api/users/login`);
      expect(login.contentType).toBe(JSON_API);
      expect(login.publishableKey.split('.')).toHaveLength(3);
      expect(login.email).toBe('owner@demo.parley.dev');
      expect(login.password.length).toBeGreaterThanOrEqual(8);
      // The operator console's link, with the organisation's publishable key in the fragment.
      expect(stdout).toContain(
        `Operator console (sign in as ana@demo.parley.dev):\n  http://127.0.0.1:${port}/console#key=${login.publishableKey}\n`,
      );
      // Every demo user is listed with its password.
      expect(stdout).toMatch(new RegExp(`owner +owner@demo\\.parley\\.dev +${login.password.replace(/[-]/g, '\\-')}`));
    },
    GIVE_UP_MS + 30_000,
  );

  it('the printed curl login works as printed, and its token reads the demo data', async () => {
    expect(login, 'the first start failed').toBeDefined();
    const response = await fetch(login.url, {
      method: 'POST',
      headers: { Authorization: `Bearer ${login.publishableKey}`, 'Content-Type': login.contentType },
      body: login.body,
    });
    const document = await readJson(response);
    expect(response.status, JSON.stringify(document)).toBe(200);
    expect(response.headers.get('content-type')).toContain(JSON_API);
    expectJsonApi(document);
    expect(document.data.type).toBe('User');
    expect(document.data.attributes.email).toBe(login.email);
    expect(typeof document.meta.token).toBe('string');
    expect(document.meta.token.split('.')).toHaveLength(3);
    token = document.meta.token;

    const list = await fetch(`http://127.0.0.1:${port}/api/conversations?include=conversation_items`, {
      headers: { Authorization: `Bearer ${token}` },
    });
    const conversations = await readJson(list);
    expect(list.status, JSON.stringify(conversations)).toBe(200);
    expectJsonApi(conversations);
    expect(conversations.data.length).toBeGreaterThan(0);
    expect(conversations.included?.length ?? 0).toBeGreaterThan(0);
    conversationIds = conversations.data.map((c: { id: string }) => c.id).sort();

    // The publishable key may only sign in.
    const refused = await fetch(`http://127.0.0.1:${port}/api/conversations`, {
      headers: { Authorization: `Bearer ${login.publishableKey}` },
    });
    expect(refused.status).toBe(403);
    await refused.body?.cancel();
  });

  /** Set by the SIGTERM step, checked by the exit step. */
  let shutdown: { signalled: number; agent: http.Agent } | undefined;

  it('on SIGTERM finishes every request in flight with its normal answer', async () => {
    expect(token, 'the login failed').toBeDefined();
    // Keep-alive connections, as real clients (browsers, fetch, proxies) hold them.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 32 });
    // An idle keep-alive connection, left open on purpose.
    const idle = inFlight(port, agent, 'GET', '/healthz', {});
    expect((await idle.answer).status).toBe(200);

    const json = { 'Content-Type': JSON_API };
    const logins = Array.from({ length: 3 }, () =>
      inFlight(port, agent, 'POST', '/api/users/login', { ...json, Authorization: `Bearer ${login.publishableKey}` }, login.body),
    );
    const creates = Array.from({ length: 3 }, (_, i) =>
      inFlight(
        port,
        agent,
        'POST',
        '/api/conversations',
        { ...json, Authorization: `Bearer ${token}` },
        JSON.stringify({ data: { type: 'Conversation', attributes: { channel: 'chat', metadata: { shutdown: i } } } }),
      ),
    );
    const reads = Array.from({ length: 4 }, () =>
      inFlight(port, agent, 'GET', '/api/conversations?include=conversation_items', { Authorization: `Bearer ${token}` }),
    );
    const all = [...logins, ...creates, ...reads];
    // Every request has reached the server (it answered 100 Continue) before the signal.
    await Promise.all(all.map((r) => r.received));

    const signalled = performance.now();
    shutdown = { signalled, agent };
    expect(first.child.kill('SIGTERM')).toBe(true);
    // Give the server time to begin shutting down, then let the bodies of the writes and logins arrive.
    await sleep(300);
    for (const request of all) request.sendBody();

    const answers = await Promise.all(all.map((r) => r.answer));
    console.log(
      `serve: SIGTERM with ${all.length} requests in flight: answered ${answers.map((a) => a.status).join(', ')} ` +
        `within ${Math.round(performance.now() - signalled)} ms of the signal`,
    );
    for (const [i, answer] of answers.slice(0, 3).entries()) {
      expect(answer.status, `login #${i}: ${answer.body}`).toBe(200);
      const document = JSON.parse(answer.body);
      expectJsonApi(document);
      expect(typeof document.meta.token).toBe('string');
    }
    for (const [i, answer] of answers.slice(3, 6).entries()) {
      expect(answer.status, `create #${i}: ${answer.body}`).toBe(201);
      const document = JSON.parse(answer.body);
      expectJsonApi(document);
      expect(document.data.attributes.metadata).toEqual({ shutdown: i });
      conversationIds.push(document.data.id);
    }
    conversationIds.sort();
    for (const [i, answer] of answers.slice(6).entries()) {
      expect(answer.status, `read #${i}: ${answer.body}`).toBe(200);
      expectJsonApi(JSON.parse(answer.body));
    }
  }, 60_000);

  it('after SIGTERM exits with code 0 within 5 s, even with clients holding keep-alive connections, and then refuses connections', async () => {
    expect(shutdown, 'the SIGTERM step failed').toBeDefined();
    const { signalled, agent } = shutdown!;
    // The test's client keeps its keep-alive connections open (as a browser or proxy would) until the process is gone.
    const exit = await Promise.race([first.exit, sleep(Math.max(0, signalled + 10_000 - performance.now())).then(() => undefined)]);
    const exitMs = Math.round(performance.now() - signalled);
    // Diagnosis when it did not exit: does it once the client closes its idle keep-alive connections?
    let diagnosis = '';
    if (!exit) {
      agent.destroy();
      const late = await Promise.race([first.exit, sleep(5_000).then(() => undefined)]);
      diagnosis = late
        ? `; it exited (code ${late.code}) only ${Math.round(performance.now() - signalled)} ms after the signal, once the client closed its keep-alive connections`
        : '; it did not exit even after the client closed its connections';
    }
    agent.destroy();
    console.log(
      `serve: after SIGTERM the process ${exit ? `exited with code ${exit.code} ${exitMs} ms after the signal` : `had NOT exited ${exitMs} ms after the signal`}${diagnosis}`,
    );
    expect(exit, `serve did not exit within 10 s of SIGTERM${diagnosis}\nstderr:\n${first.stderr()}`).toBeDefined();
    expect(exit).toEqual({ code: 0, signal: null });
    expect(exitMs).toBeLessThan(5000);
    expect(await connect(port)).toBe('ECONNREFUSED');
    expect(loggedErrors(first.stdout())).toEqual([]);
  }, 30_000);

  it(
    'restarts on the same data directory without a second demo organisation; the data and the token survive',
    async () => {
      expect(conversationIds, 'the earlier steps failed').toBeDefined();
      // Never two processes on one data directory: if the shutdown step left the first one running, end it.
      if (!first.exited()) {
        first.child.kill('SIGKILL');
        await first.exit;
      }
      const restartPort = await freePort();
      const started = performance.now();
      const second = serve(restartPort);
      const healthyMs = await waitHealthy(second, started);
      console.log(`serve: restart on the existing embedded database healthy after ${healthyMs} ms`);
      const stdout = await waitForOutput(second, /Parley listening on /);
      expect(stdout).toContain(`Parley listening on http://127.0.0.1:${restartPort} (pglite database)`);
      // Give a late banner a moment to appear; nothing about a demo organisation may be printed.
      await sleep(500);
      expect(second.stdout()).not.toMatch(/Demo organisation created|curl -s|shown once/);

      // The token issued before the restart still works and sees the same data (demo plus the writes finished during shutdown).
      const list = await fetch(`http://127.0.0.1:${restartPort}/api/conversations`, { headers: { Authorization: `Bearer ${token}` } });
      const conversations = await readJson(list);
      expect(list.status, JSON.stringify(conversations)).toBe(200);
      expect(conversations.data.map((c: { id: string }) => c.id).sort()).toEqual(conversationIds);
      // The printed publishable key and password still sign in.
      const again = await fetch(`http://127.0.0.1:${restartPort}/api/users/login`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${login.publishableKey}`, 'Content-Type': JSON_API },
        body: login.body,
      });
      expect(again.status).toBe(200);
      await again.body?.cancel();

      second.child.kill('SIGTERM');
      const exit = await Promise.race([second.exit, sleep(15_000).then(() => undefined)]);
      expect(exit).toEqual({ code: 0, signal: null });

      // Directly in the database: exactly one demo organisation.
      const { PGlite } = await import('@electric-sql/pglite');
      const pglite = await PGlite.create(dataDir);
      try {
        const { rows } = await pglite.query<{ name: string }>('SELECT name FROM organisations');
        expect(rows.map((r) => r.name)).toEqual(['Demo']);
      } finally {
        await pglite.close();
      }
    },
    GIVE_UP_MS + 30_000,
  );
});
