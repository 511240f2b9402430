/**
 * npm run bench:softphone: the browser softphone against the SIP edge as `sip serve` runs it (Kamailio with its
 * WebSocket transport, rtpengine), the console in Debian's Chromium with a fake microphone, SIPp callers, on
 * PostgreSQL (DATABASE_URL). Figures, not assertions; docs/benchmarks.md keeps the latest.
 *
 *   1. INVITE to ringing: --calls calls (SIPp `caller_cancel`: INVITE, 180, CANCEL 300 ms later) to the operator's
 *      SIP user; for each, the time from the edge's receipt of the authenticated INVITE (the Call's `started_at`,
 *      Kamailio's clock) to the console's "Incoming call" panel appearing (a MutationObserver in the page,
 *      `performance.timeOrigin + performance.now()`; one host, one clock). Split at the INVITE's arrival on the
 *      page's WebSocket (a `message` listener added before JsSIP's): edge to page (Kamailio's lookup, rtpengine's
 *      offer, the WebSocket) and page to panel (JsSIP, the console's render).
 *   2. Mouth to ear, phone to browser: one answered call (SIPp `media_caller`, PCMU, its audio a UDP socket of
 *      this process). The socket sends 20 ms frames of silence and, every 500 ms, a loud 1 kHz frame (the
 *      "mouth" time is its send); in the page a Web Audio ScriptProcessor (256 samples, 5.3 ms at 48 kHz) on the
 *      call's remote track notes when that frame is heard. So the figure holds rtpengine's relay (ICE/DTLS-SRTP
 *      towards the browser) plus the browser's own receive path (jitter buffer, decoding, the audio graph): an
 *      upper bound of what rtpengine adds. Split two ways: (a) rtpengine's own added latency, from a capture of
 *      both its legs on the loopback (tcpdump, when installed and permitted; kernel timestamps): each RTP packet
 *      from the phone's socket matched by SSRC and sequence number (in the clear in SRTP, RFC 3711) to the one
 *      rtpengine sends on towards the browser; (b) the browser's receive path from getStats() over the same
 *      window: the jitter buffer's mean delay (inbound-rtp `jitterBufferDelay / jitterBufferEmittedCount`) and
 *      the playout delay (media-playout `totalPlayoutDelay / totalSamplesCount`).
 *   3. rtpengine's CPU per browser call: its process's CPU time (/proc/<pid>/stat) over --cpu-seconds with one
 *      browser call up (PCMU both ways, SRTP towards the browser), less the same interval idle; calls per core =
 *      1 / (CPU share per call). An estimate from one call, not a run to saturation.
 *
 *   npm run bench:softphone -- --calls 30
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { buildServer } from '../src/http/server.js';
import { freePort } from '../test/helpers/ports.js';
import { startTestApp } from '../test/support/app.js';
import { seedTenant } from '../test/support/seed.js';
import {
  audioSocket,
  browserSkipReason,
  launchConsoleBrowser,
  noteRings,
  signIn,
  toneFrame,
  trackPeerConnections,
  writeToneWav,
} from '../test/sip/browser.js';
import { freeUdpPort, sipp, sipSkipReason, startSipStack, until } from '../test/sip/harness.js';

const { values: opts } = parseArgs({
  options: {
    calls: { type: 'string', default: '30' },
    'cpu-seconds': { type: 'string', default: '10' },
    'talk-seconds': { type: 'string', default: '15' },
  },
});

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

function summary(values: number[]): string {
  if (!values.length) return 'no samples';
  const f = (n: number) => n.toFixed(1);
  return `n=${values.length} p50 ${f(percentile(values, 50))} ms, p95 ${f(percentile(values, 95))} ms, p99 ${f(percentile(values, 99))} ms, max ${f(Math.max(...values))} ms`;
}

/** CPU seconds (user + system) of a process so far. */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  // utime and stime are fields 14 and 15 of stat (1-based), i.e. 11 and 12 after the command.
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** tcpdump of the loopback's UDP into `file` (kernel timestamps), or undefined when it cannot run here. */
async function startCapture(file: string): Promise<{ stop(): Promise<Buffer> } | undefined> {
  const binary = ['/usr/bin/tcpdump', '/usr/sbin/tcpdump'].find((candidate) => existsSync(candidate));
  if (!binary) return undefined;
  const child = spawn(binary, ['-i', 'lo', '-n', '-U', '-s', '96', '-w', file, 'udp'], { stdio: ['ignore', 'ignore', 'pipe'] });
  const listening = await new Promise<boolean>((resolve) => {
    child.stderr.on('data', (chunk: Buffer) => chunk.toString().includes('listening on') && resolve(true));
    child.on('exit', () => resolve(false));
    setTimeout(() => resolve(false), 10_000);
  });
  if (!listening) return undefined;
  return {
    async stop() {
      await new Promise((resolve) => {
        child.on('exit', resolve);
        child.kill('SIGINT');
      });
      return readFileSync(file);
    },
  };
}

/**
 * rtpengine's added latency per packet from a pcap of the loopback (Ethernet framing, IPv4/UDP/RTP): each RTP
 * packet the phone's socket (`phonePort`) sent, matched by SSRC and sequence number to the packet rtpengine sent
 * on to another port (SRTP towards the browser keeps the RTP header in the clear, RFC 3711 section 3.1).
 */
function relayLatencies(pcap: Buffer, phonePort: number) {
  const micro = pcap.readUInt32LE(0) === 0xa1b2c3d4;
  const sentAt = new Map<string, number>();
  const relayedAt = new Map<string, number>();
  for (let at = 24; at + 16 <= pcap.length; ) {
    const seconds = pcap.readUInt32LE(at);
    const fraction = pcap.readUInt32LE(at + 4);
    const length = pcap.readUInt32LE(at + 8);
    const frame = pcap.subarray(at + 16, at + 16 + length);
    at += 16 + length;
    if (frame.length < 14 + 20 + 8 + 12 || frame.readUInt16BE(12) !== 0x0800) continue;
    const ip = frame.subarray(14);
    const udp = ip.subarray((ip[0] & 0x0f) * 4);
    const rtp = udp.subarray(8);
    if (rtp.length < 12 || rtp[0] >> 6 !== 2) continue;
    const time = seconds * 1000 + fraction / (micro ? 1000 : 1_000_000);
    const key = `${rtp.readUInt32BE(8)}:${rtp.readUInt16BE(2)}`;
    const [source, destination] = [udp.readUInt16BE(0), udp.readUInt16BE(2)];
    if (source === phonePort) sentAt.set(key, time);
    else if (destination !== phonePort && sentAt.has(key) && !relayedAt.has(key)) relayedAt.set(key, time);
  }
  const latencies = [...relayedAt].map(([key, time]) => time - sentAt.get(key)!);
  return { sent: sentAt.size, matched: latencies.length, latencies };
}

async function main() {
  const skip = sipSkipReason() ?? browserSkipReason();
  if (skip) throw new Error(`bench:softphone needs ${skip}`);
  const wsPort = await freePort();
  const t = await startTestApp({ SIP_WS_URL: `ws://127.0.0.1:${wsPort}` });
  const tenant = await seedTenant(t, 'Softphone bench');
  // The API in process (light-my-request): the admin's reads and writes.
  const request = async (method: 'GET' | 'POST', url: string, attributes?: Record<string, unknown>) => {
    const response = await t.app.inject({
      method,
      url,
      headers: { authorization: `Bearer ${tenant.admin.token}`, 'content-type': 'application/vnd.api+json' },
      payload: attributes ? JSON.stringify({ data: { type: 'SipUser', attributes } }) : undefined,
    });
    return { body: response.json() };
  };
  const admin = { get: (url: string) => request('GET', url) };
  await request('POST', '/api/sip_users', { sip_username: 'op.bench', user_id: tenant.operator.id });
  const password = 'bench-caller-secret-1';
  await request('POST', '/api/sip_users', { sip_username: 'caller.bench', sip_password: password });
  const server = await buildServer({ ...t.services, database: t.database });
  await server.listen({ port: 0, host: '127.0.0.1' });
  const apiUrl = `http://127.0.0.1:${(server.server.address() as AddressInfo).port}`;
  const stack = await startSipStack(t, {
    SIP_RING_TIMEOUT_SECONDS: '30',
    SIP_WS_LISTEN: `ws:127.0.0.1:${wsPort}`,
    SIP_WS_ORIGINS: apiUrl,
    SIP_KAMAILIO_DEBUG: '1',
  });
  const sipUsers = (await admin.get('/api/sip_users')).body.data as { attributes: { sip_username: string; sip_uri: string } }[];
  const domain = sipUsers[0].attributes.sip_uri.split('@')[1];
  const dir = mkdtempSync(path.join(tmpdir(), 'parley-bench-softphone-'));
  const wav = path.join(dir, 'microphone.wav');
  writeToneWav(wav);
  const context = await launchConsoleBrowser(path.join(dir, 'profile'), wav);
  const caller = (args: string[], scenario: string, keys: Record<string, string> = {}, timeoutSeconds = 30) =>
    freeUdpPort().then((localPort) =>
      sipp(scenario, stack.port, {
        localPort,
        keys: { from: 'caller.bench', domain, ...keys },
        args: ['-au', 'caller.bench', '-ap', password, ...args],
        timeoutSeconds,
      }),
    );
  const openTab = async () => {
    const tab = await context.newPage();
    await trackPeerConnections(tab);
    await noteRings(tab);
    // The INVITEs' arrival on the page's WebSocket, noted before JsSIP's own handler runs.
    await tab.addInitScript(`(() => {
      const Native = window.WebSocket;
      window.__invites = [];
      window.WebSocket = class extends Native {
        constructor(...args) {
          super(...args);
          this.addEventListener('message', (e) => {
            if (typeof e.data === 'string' && e.data.startsWith('INVITE ')) window.__invites.push(performance.timeOrigin + performance.now());
          });
        }
      };
    })()`);
    await signIn(tab, apiUrl, tenant.publishableKey, tenant.operator);
    await tab.getByRole('status').filter({ hasText: 'Phone ready' }).waitFor({ timeout: 30_000 });
    return tab;
  };

  try {
    const tab = await openTab();
    console.log(`load: ${readFileSync('/proc/loadavg', 'utf8').trim()}`);

    // 1. INVITE to ringing.
    const ringing: number[] = [];
    const toPage: number[] = [];
    const toPanel: number[] = [];
    const calls = Number(opts.calls);
    for (let i = 0; i < calls; i++) {
      const before = (await tab.evaluate('window.__rings.length')) as number;
      const invitesBefore = (await tab.evaluate('window.__invites.length')) as number;
      const result = await caller(['-s', 'op.bench'], 'caller_cancel');
      if (result.code !== 0) {
        console.warn(`call ${i}: SIPp ${result.code} ${result.errors.slice(0, 200)}`);
        continue;
      }
      const shownAt = (await tab.evaluate(`window.__rings[${before}]`)) as number | undefined;
      const record = (await admin.get('/api/calls?filter[to_number]=op.bench&sort=-started_at&page[limit]=1')).body.data[0];
      const startedAt = Date.parse(record?.attributes.started_at ?? '');
      const arrivedAt = (await tab.evaluate(`window.__invites[${invitesBefore}]`)) as number | undefined;
      if (shownAt && startedAt) ringing.push(shownAt - startedAt);
      if (shownAt && startedAt && arrivedAt) {
        toPage.push(arrivedAt - startedAt);
        toPanel.push(shownAt - arrivedAt);
      }
      await tab.getByRole('region', { name: 'Incoming call' }).waitFor({ state: 'detached', timeout: 10_000 });
    }
    console.log(`INVITE (edge receipt) to the browser ringing: ${summary(ringing)}`);
    console.log(`  of which edge receipt to the INVITE on the page's WebSocket: ${summary(toPage)}`);
    console.log(
      `  and the page's WebSocket to the panel (JsSIP, the console): ${summary(toPanel)}; the first call ${toPanel[0]?.toFixed(1)} ms`,
    );

    // 2. Mouth to ear, phone to browser.
    const phone = await audioSocket();
    const talkSeconds = Number(opts['talk-seconds']);
    const talking = caller(
      ['-s', 'op.bench', '-d', String((talkSeconds + 5) * 1000)],
      'media_caller',
      { mport: String(phone.port) },
      talkSeconds + 40,
    );
    const panel = tab.getByRole('region', { name: 'Incoming call' });
    await panel.waitFor({ timeout: 20_000 });
    await panel.getByRole('button', { name: 'Answer' }).click();
    await until(async () => (phone.received.length > 10 ? true : undefined), 'RTP from the browser', 15_000);
    const rtpenginePort = phone.received[0].port;
    await tab.evaluate(`(() => {
      window.__heard = [];
      const pc = window.__peerConnections[window.__peerConnections.length - 1];
      const track = pc.getReceivers().map((r) => r.track).find((t) => t && t.kind === 'audio');
      const audio = new AudioContext();
      const source = audio.createMediaStreamSource(new MediaStream([track]));
      const probe = audio.createScriptProcessor(256, 1, 1);
      let loud = false;
      probe.onaudioprocess = (event) => {
        const samples = event.inputBuffer.getChannelData(0);
        let peak = 0;
        for (let i = 0; i < samples.length; i++) peak = Math.max(peak, Math.abs(samples[i]));
        if (peak > 0.3 && !loud) window.__heard.push(performance.timeOrigin + performance.now());
        loud = peak > 0.3;
      };
      source.connect(probe);
      probe.connect(audio.destination);
      void audio.resume();
    })()`);
    const receiveStats = async () =>
      (await tab.evaluate(`(async () => {
        const pc = window.__peerConnections[window.__peerConnections.length - 1];
        const out = {};
        for (const s of (await pc.getStats()).values()) {
          if (s.type === 'inbound-rtp' && s.kind === 'audio') Object.assign(out, { jb: s.jitterBufferDelay, jbCount: s.jitterBufferEmittedCount, jbTarget: s.jitterBufferTargetDelay });
          if (s.type === 'media-playout') Object.assign(out, { playout: s.totalPlayoutDelay, playoutCount: s.totalSamplesCount });
        }
        return out;
      })()`)) as { jb?: number; jbCount?: number; jbTarget?: number; playout?: number; playoutCount?: number };
    const statsBefore = await receiveStats();
    const capture = await startCapture(path.join(dir, 'relay.pcap'));
    const silence = Buffer.alloc(160, 0xff);
    const sent: number[] = [];
    const frames = talkSeconds * 50;
    const started = performance.now();
    for (let i = 0; i < frames; i++) {
      // Paced on the clock (not on timer drift): frame i leaves at started + 20 ms * i.
      const due = started + i * 20;
      const wait = due - performance.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      const burst = i > 50 && i % 25 === 0;
      if (burst) sent.push(performance.timeOrigin + performance.now());
      phone.send(rtpenginePort, burst ? toneFrame(i * 160, 1000, 0.9) : silence);
    }
    const heard = (await tab.evaluate('window.__heard')) as number[];
    const statsAfter = await receiveStats();
    const relay = capture ? relayLatencies(await capture.stop(), phone.port) : undefined;
    const mouthToEar: number[] = [];
    for (const [k, at] of sent.entries()) {
      const next = sent[k + 1] ?? Number.POSITIVE_INFINITY;
      const match = heard.find((h) => h >= at && h < next);
      if (match !== undefined) mouthToEar.push(match - at);
    }
    console.log(
      `mouth to ear, SIPp caller's socket to the browser's audio graph through rtpengine: ${summary(mouthToEar)} (${sent.length} bursts sent, ${heard.length} heard)`,
    );
    console.log(
      relay
        ? `  of which rtpengine's relay (capture of both legs, ${relay.matched} of ${relay.sent} packets matched): ${summary(relay.latencies)}`
        : "  rtpengine's relay: not measured (tcpdump not installed or not permitted)",
    );
    const mean = (total?: number, before?: number, count?: number, countBefore?: number) =>
      total !== undefined && count !== undefined && count > (countBefore ?? 0)
        ? `${(((total - (before ?? 0)) / (count - (countBefore ?? 0))) * 1000).toFixed(1)} ms`
        : 'not reported';
    console.log(
      `  and the browser's receive path over the window: jitter buffer mean ${mean(statsAfter.jb, statsBefore.jb, statsAfter.jbCount, statsBefore.jbCount)}` +
        ` (target ${mean(statsAfter.jbTarget, statsBefore.jbTarget, statsAfter.jbCount, statsBefore.jbCount)}), playout delay mean ${mean(statsAfter.playout, statsBefore.playout, statsAfter.playoutCount, statsBefore.playoutCount)}`,
    );
    await talking;
    await phone.close();

    // 3. rtpengine's CPU per browser call.
    const pid = stack.edge.rtpengine.pid()!;
    const cpuWindow = Number(opts['cpu-seconds']);
    const idleBefore = cpuSeconds(pid);
    await new Promise((resolve) => setTimeout(resolve, cpuWindow * 1000));
    const idle = cpuSeconds(pid) - idleBefore;
    // One browser call (the console takes one call per tab; the figure is per call).
    const concurrent = 1;
    const sockets = [await audioSocket()];
    const placed = sockets.map((socket) =>
      caller(['-s', 'op.bench', '-d', String((cpuWindow + 10) * 1000)], 'media_caller', { mport: String(socket.port) }, cpuWindow + 60),
    );
    const ring = tab.getByRole('region', { name: 'Incoming call' });
    await ring.waitFor({ timeout: 20_000 });
    await ring.getByRole('button', { name: 'Answer' }).click();
    await until(async () => (sockets.every((s) => s.received.length > 10) ? true : undefined), 'RTP on every call', 20_000);
    const talkers = sockets.map((socket) => {
      const port = socket.received[0].port;
      let i = 0;
      return setInterval(() => socket.send(port, toneFrame(i++ * 160)), 20);
    });
    const busyBefore = cpuSeconds(pid);
    await new Promise((resolve) => setTimeout(resolve, cpuWindow * 1000));
    const busy = cpuSeconds(pid) - busyBefore;
    for (const timer of talkers) clearInterval(timer);
    const perCall = (busy - idle) / cpuWindow / concurrent;
    console.log(
      `rtpengine CPU: idle ${((idle / cpuWindow) * 100).toFixed(2)}% of a core, with ${concurrent} browser calls ${((busy / cpuWindow) * 100).toFixed(2)}%: ` +
        `${(perCall * 100).toFixed(3)}% per call, about ${perCall > 0 ? Math.floor(1 / perCall) : 'unmeasurably many'} browser calls per core (userspace forwarding, PCMU, SRTP towards the browser)`,
    );
    await Promise.all(placed);
    for (const socket of sockets) await socket.close();
    console.log(`load: ${readFileSync('/proc/loadavg', 'utf8').trim()}`);
  } finally {
    await context.close();
    await stack.stop();
    await server.close();
    await t.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);
