/** Kamailio (through the SIP edge) and SIPp for end-to-end SIP tests on PostgreSQL. */
import { execFile } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadSipSettings } from '../../src/sip/config.js';
import { startSipEdge, type SipEdge } from '../../src/sip/edge.js';
import { haveProgram } from '../../src/sip/kamailio.js';
import type { TestApp } from '../support/app.js';

export const SCENARIOS = path.join(path.dirname(fileURLToPath(import.meta.url)), 'scenarios');
export const DOMAIN = 'parley.test';

/** Why the end-to-end SIP tests cannot run here (they are skipped with this reason), or undefined. */
export function sipSkipReason(): string | undefined {
  const missing = ['kamailio', 'kamcmd', 'sipp', 'rtpengine'].filter((p) => !haveProgram(p));
  if (missing.length)
    return `${missing.join(', ')} not installed (Debian: kamailio kamailio-postgres-modules kamailio-extra-modules kamailio-utils-modules sip-tester rtpengine-daemon)`;
  if (!process.env.DATABASE_URL?.startsWith('postgres')) return 'the SIP edge needs PostgreSQL: DATABASE_URL is not a postgres:// URL';
  return undefined;
}

/**
 * Why the SIP-over-TLS tests cannot run here, or undefined: Kamailio's tls module is a package of its own
 * (Debian: kamailio-tls-modules), and openssl makes the test certificate.
 */
export function tlsSkipReason(): string | undefined {
  const sip = sipSkipReason();
  if (sip) return sip;
  if (!haveProgram('openssl')) return 'openssl not installed (it makes the test certificate)';
  const dirs = ['/usr/lib', '/usr/lib64', '/usr/local/lib', '/usr/local/lib64'].flatMap((lib) => [
    path.join(lib, 'kamailio/modules'),
    ...(fs.existsSync(lib) ? fs.readdirSync(lib).map((arch) => path.join(lib, arch, 'kamailio/modules')) : []),
  ]);
  if (!dirs.some((dir) => fs.existsSync(path.join(dir, 'tls.so'))))
    return "Kamailio's tls module (tls.so) is not installed (Debian: kamailio-tls-modules)";
  return undefined;
}

/** A free UDP port on 127.0.0.1 (the kernel's choice, released just before use). */
export async function freeUdpPort(): Promise<number> {
  const socket = dgram.createSocket('udp4');
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  const { port } = socket.address();
  await new Promise<void>((resolve) => socket.close(() => resolve()));
  return port;
}

/** A port free for both UDP and TCP on 127.0.0.1 (a SIP edge listening on both with one number). */
export async function freeUdpTcpPort(): Promise<number> {
  for (;;) {
    const port = await freeUdpPort();
    const server = net.createServer();
    const free = await new Promise<boolean>((resolve) => {
      server.once('error', () => resolve(false));
      server.listen(port, '127.0.0.1', () => resolve(true));
    });
    if (free) {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      return port;
    }
  }
}

export interface SipStack {
  edge: SipEdge;
  port: number;
  kamailioLog: string[];
  rtpengineLog: string[];
  stop(): Promise<void>;
}

/** Kamailio (through the SIP edge) on `port` (a free one when absent: UDP and TCP when SIP_LISTEN names tcp:). */
export async function startSipStack(t: TestApp, env: Record<string, string> = {}, port?: number): Promise<SipStack> {
  port ??= env.SIP_LISTEN?.includes('tcp:') ? await freeUdpTcpPort() : await freeUdpPort();
  const kamailioLog: string[] = [];
  const rtpengineLog: string[] = [];
  // RTP ports: 200 of 20000-29999 at random (even), so that stacks of parallel suites seldom share ports.
  const rtpMin = 20000 + 2 * Math.floor(Math.random() * 4900);
  const settings = loadSipSettings({
    RTP_PORT_MIN: String(rtpMin),
    RTP_PORT_MAX: String(rtpMin + 199),
    // `PORT` in a given SIP_LISTEN is the port chosen here (`udp:127.0.0.1:PORT,tcp:127.0.0.1:PORT`).
    SIP_LISTEN: env.SIP_LISTEN?.replaceAll('PORT', String(port)) ?? `udp:127.0.0.1:${port}`,
    SIP_DOMAIN: DOMAIN,
    SIP_RING_TIMEOUT_SECONDS: '2',
    SIP_RELOAD_INTERVAL_MS: '300',
    SIP_RECONCILE_INTERVAL_MS: '600000',
    SIP_CHILDREN: '2',
    SIP_KAMAILIO_DEBUG: '2',
    // Calls to agents go to a port of this test's own (nothing listens there unless the test starts a voice
    // runtime on it), never to the default 5070, where another run's runtime may listen.
    VOICE_SIP_PORT: String(await freeUdpPort()),
    ...env,
    ...(env.SIP_LISTEN ? { SIP_LISTEN: env.SIP_LISTEN.replaceAll('PORT', String(port)) } : {}),
  });
  const edge = await startSipEdge({
    settings,
    databaseUrl: t.config.databaseUrl,
    db: t.db,
    records: t.services.records!,
    listen: (channel, onNotify, onResumed) => t.database.listen(channel, onNotify, onResumed),
    onKamailioLog: (line) => kamailioLog.push(line),
    onRtpengineLog: (line) => rtpengineLog.push(line),
  });
  return {
    edge,
    port,
    kamailioLog,
    rtpengineLog,
    async stop() {
      await edge.stop();
      fs.rmSync(edge.runDir, { recursive: true, force: true });
    },
  };
}

export interface SippResult {
  code: number;
  /** The scenario's `log` actions and errors (trace files). */
  logs: string;
  errors: string;
}

export interface SippOptions {
  /** SIPp's own SIP port. */
  localPort: number;
  /** Address SIPp binds (127.0.0.x). */
  localIp?: string;
  keys?: Record<string, string>;
  args?: string[];
  /** Server (UAS) scenario: waits for its first request instead of placing a call. */
  timeoutSeconds?: number;
}

/** Runs one SIPp scenario against Kamailio on `remotePort` (or as UAS when `remotePort` is undefined). */
export function sipp(scenario: string, remotePort: number | undefined, options: SippOptions): Promise<SippResult> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-sipp-'));
  const args = [
    ...(remotePort === undefined ? [] : [`127.0.0.1:${remotePort}`]),
    '-sf',
    path.join(SCENARIOS, `${scenario}.xml`),
    '-i',
    options.localIp ?? '127.0.0.1',
    '-p',
    String(options.localPort),
    '-m',
    '1',
    '-nostdin',
    '-timeout',
    `${options.timeoutSeconds ?? 15}s`,
    '-timeout_error',
    '-trace_err',
    '-trace_logs',
    '-key',
    'domain',
    options.keys?.domain ?? DOMAIN,
    ...Object.entries(options.keys ?? {})
      .filter(([k]) => k !== 'domain')
      .flatMap(([k, v]) => ['-key', k, v]),
    ...(options.args ?? []),
  ];
  return new Promise((resolve) => {
    execFile('sipp', args, { cwd: dir, timeout: ((options.timeoutSeconds ?? 15) + 10) * 1000 }, (error) => {
      const read = (suffix: string) =>
        fs
          .readdirSync(dir)
          .filter((f) => f.endsWith(suffix))
          .map((f) => fs.readFileSync(path.join(dir, f), 'utf8'))
          .join('\n');
      const result = {
        code: error ? (typeof error.code === 'number' ? error.code : 1) : 0,
        logs: read('_logs.log'),
        errors: read('_errors.log'),
      };
      fs.rmSync(dir, { recursive: true, force: true });
      resolve(result);
    });
  });
}

/** REGISTERs `user` (in `domain`, SIP_DOMAIN by default) with `password` from `localPort`; the SIPp exit code (0: 200 OK). */
export async function register(stack: SipStack, user: string, password: string, localPort: number, localIp?: string, domain?: string) {
  return sipp('register', stack.port, {
    localPort,
    localIp,
    keys: domain ? { domain } : {},
    args: ['-s', user, '-au', user, '-ap', password],
  });
}

export async function until<T>(probe: () => Promise<T | undefined>, what: string, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
