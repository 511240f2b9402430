/**
 * rtpengine under `sip serve`: the media plane (docs/sip.md, "Media plane"). Debian's `rtpengine-daemon`
 * runs in the foreground, userspace only (`--table=-1`: no kernel module, nothing to load as root), under the
 * same supervisor as Kamailio (src/sip/kamailio.ts, `supervise`): its own process group, killed when `sip serve`
 * goes, even by SIGKILL. Kamailio's rtpengine module talks to it over the ng control protocol (bencoded
 * dictionaries over UDP; the `bencode` package encodes and decodes) on a loopback port chosen free at start;
 * `sip serve` uses the same protocol to wait until it is ready and to ask about sessions.
 */
import crypto from 'node:crypto';
import dgram from 'node:dgram';
import path from 'node:path';
import bencode from 'bencode';
import { type Supervised, supervise, waitReady } from './kamailio.js';

/** What the ng protocol carries (bencode): integers, byte strings (as UTF-8 text), lists, dictionaries. */
export type Bencoded = number | string | Bencoded[] | { [key: string]: Bencoded };

// The ng control protocol: `<cookie> <bencoded dictionary>` over UDP, answered with the same cookie.

export type NgAnswer = Record<string, Bencoded>;

/**
 * Byte strings as UTF-8 text (SDP and the ng protocol's words are text): `decode`'s encoding argument throws on a
 * dictionary. `decode` gives null for nothing at all, which is not a dictionary either.
 */
const utf8 = (value: unknown): Bencoded =>
  value instanceof Uint8Array
    ? Buffer.from(value).toString('utf8')
    : Array.isArray(value)
      ? value.map(utf8)
      : value && typeof value === 'object'
        ? Object.fromEntries(Object.entries(value).map(([key, v]) => [key, utf8(v)]))
        : (value as Bencoded);

/** One ng request to rtpengine at `host:port`; rejects on timeout or an undecodable answer. */
export async function ngRequest(host: string, port: number, command: Record<string, Bencoded>, timeoutMs = 2000): Promise<NgAnswer> {
  const cookie = crypto.randomBytes(8).toString('hex');
  const socket = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');
  try {
    return await new Promise<NgAnswer>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`rtpengine did not answer ${String(command.command)} within ${timeoutMs} ms`)),
        timeoutMs,
      );
      socket.on('error', (error) => {
        clearTimeout(timer);
        reject(error);
      });
      socket.on('message', (message) => {
        const space = message.indexOf(0x20);
        if (space < 0 || message.toString('latin1', 0, space) !== cookie) return;
        clearTimeout(timer);
        try {
          const answer = utf8(bencode.decode(message.subarray(space + 1)));
          if (!answer || typeof answer !== 'object' || Array.isArray(answer)) throw new Error('the answer is not a dictionary');
          resolve(answer);
        } catch (error) {
          reject(error);
        }
      });
      socket.send(Buffer.concat([Buffer.from(`${cookie} `), bencode.encode(command)]), port, host);
    });
  } finally {
    socket.close();
  }
}

// The RTP port range: rtpengine binds ports lazily, one pair per stream, so a range another process holds
// only shows when calls fail. It is checked at start instead.

/** Binds (without SO_REUSEADDR) every UDP port of `min..max` on `address`, a few hundred at a time; what is free. */
export async function probePortRange(address: string, min: number, max: number) {
  const taken: number[] = [];
  const type = address.includes(':') ? 'udp6' : 'udp4';
  const probe = (port: number) =>
    new Promise<void>((resolve) => {
      const socket = dgram.createSocket({ type, reuseAddr: false });
      socket.once('error', (error: NodeJS.ErrnoException) => {
        // Only a port in use counts as taken; another failure (no such address) is reported by rtpengine itself.
        if (error.code === 'EADDRINUSE' || error.code === 'EACCES') taken.push(port);
        try {
          socket.close();
        } catch {}
        resolve();
      });
      socket.bind(port, address, () => socket.close(() => resolve()));
    });
  for (let start = min; start <= max; start += 256) {
    const batch: Promise<void>[] = [];
    for (let port = start; port <= Math.min(max, start + 255); port++) batch.push(probe(port));
    await Promise.all(batch);
  }
  taken.sort((a, b) => a - b);
  return { total: max - min + 1, free: max - min + 1 - taken.length, taken };
}

/**
 * Refuses to start on an RTP range that is taken: fewer than two free RTP/RTCP pairs (even port and the odd one
 * above it, RFC 3550 section 11) means no call could get media. A partly taken range is returned for a warning.
 */
export async function assertRtpRangeFree(address: string, min: number, max: number) {
  const report = await probePortRange(address, min, max);
  const taken = new Set(report.taken);
  let pairs = 0;
  for (let port = min + (min % 2); port < max; port += 2) if (!taken.has(port) && !taken.has(port + 1)) pairs++;
  if (pairs < 2) {
    const sample = report.taken.slice(0, 5).join(', ');
    throw new Error(
      `the RTP port range ${address}:${min}-${max} (RTP_PORT_MIN..RTP_PORT_MAX) is taken: ${report.taken.length} of ${report.total} ports are in use by other processes (${sample}${report.taken.length > 5 ? ', ...' : ''}), ${pairs} RTP/RTCP pair(s) free. Stop what holds them (another rtpengine or media server), or set RTP_PORT_MIN/RTP_PORT_MAX to a free range`,
    );
  }
  return report;
}

/** A UDP port on 127.0.0.1 that is free now (the kernel's choice), for the ng control socket. */
async function freeLoopbackUdpPort(): Promise<number> {
  const socket = dgram.createSocket('udp4');
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  const { port } = socket.address();
  await new Promise<void>((resolve) => socket.close(() => resolve()));
  return port;
}

// The process.

export interface RtpengineOptions {
  binary: string;
  runDir: string;
  /** Local address RTP is bound on. */
  listenAddress: string;
  /** Address written into SDP, when it differs from `listenAddress`. */
  advertisedAddress?: string;
  portMin: number;
  portMax: number;
  timeoutSeconds: number;
  logLevel: number;
  onLog?: (line: string) => void;
}

export interface RtpengineProcess extends Supervised {
  /** `udp:127.0.0.1:<port>`, as Kamailio's rtpengine module names it (`rtpengine_sock`). */
  ngSocket: string;
  /** Where RTP is bound (`address`, ports `min..max`) and the address SDP names. */
  media: { address: string; advertised: string; min: number; max: number };
  /** One ng command (`ping`, `query`, `list`, `statistics`...), with `command` filled in. */
  ng(command: string, args?: Record<string, Bencoded>): Promise<NgAnswer>;
}

/** The command line: every setting explicit, and Debian's /etc/rtpengine/rtpengine.conf (kernel table 0) not read. */
export function rtpengineArguments(options: RtpengineOptions & { ngPort: number }): string[] {
  const advertised =
    options.advertisedAddress && options.advertisedAddress !== options.listenAddress ? `!${options.advertisedAddress}` : '';
  return [
    '--config-file=none',
    // Userspace forwarding only: no kernel module, no iptables rule, no root needed.
    '--table=-1',
    `--interface=${options.listenAddress}${advertised}`,
    `--listen-ng=127.0.0.1:${options.ngPort}`,
    `--port-min=${options.portMin}`,
    `--port-max=${options.portMax}`,
    // A session whose BYE was never seen (both phones gone) is ended after this long without RTP.
    `--timeout=${options.timeoutSeconds}`,
    // A deleted session is gone at once (no 30 s of lingering ports): `query` after BYE answers "not found".
    '--delete-delay=0',
    // Symmetric RTP (RFC 4961) behind NAT: the address media really comes from is learnt from the first packets
    // (3 s, during which packets from the SDP address are taken too) rather than trusted from the SDP.
    '--endpoint-learning=heuristic',
    '--foreground',
    '--log-stderr',
    '--no-log-timestamps',
    `--log-level=${options.logLevel}`,
  ];
}

export async function startRtpengine(options: RtpengineOptions): Promise<RtpengineProcess> {
  const ngPort = await freeLoopbackUdpPort();
  const recent: string[] = [];
  const supervised = supervise(
    'parley-media-supervisor',
    path.join(options.runDir, 'rtpengine.pid'),
    [options.binary, ...rtpengineArguments({ ...options, ngPort })],
    (line) => {
      recent.push(line);
      if (recent.length > 20) recent.shift();
      options.onLog?.(line);
    },
  );
  // Ready when the ng socket answers a ping.
  await waitReady(
    supervised,
    async () => (await ngRequest('127.0.0.1', ngPort, { command: 'ping' }, 300)).result === 'pong',
    10_000,
    (code) => {
      const log = recent.join('\n');
      if (/address already in use/i.test(log))
        return new Error(`rtpengine could not bind its control port 127.0.0.1:${ngPort} (in use by another process); its log:\n${log}`);
      return new Error(`rtpengine exited during start-up (${code}); its log:\n${log}`);
    },
    'rtpengine did not answer on its control socket in time',
  );
  return {
    ...supervised,
    ngSocket: `udp:127.0.0.1:${ngPort}`,
    media: {
      address: options.listenAddress,
      advertised: options.advertisedAddress ?? options.listenAddress,
      min: options.portMin,
      max: options.portMax,
    },
    ng: (command, args = {}) => ngRequest('127.0.0.1', ngPort, { ...args, command }),
  };
}
