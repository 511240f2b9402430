/**
 * What the browser softphone's end-to-end tests and its benchmark share: Debian's Chromium with a fake microphone
 * playing a WAV file, the console signed in, the page's RTCPeerConnections within reach of `getStats()`, and a
 * caller's audio as a UDP socket of the test that sends and counts RTP (RFC 3550).
 */
import dgram from 'node:dgram';
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';

export const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

/** Kamailio's websocket module is a package of its own (Debian: kamailio-websocket-modules). */
export function websocketModule(): boolean {
  return ['/usr/lib', '/usr/lib64', '/usr/local/lib'].some(
    (lib) =>
      existsSync(path.join(lib, 'kamailio/modules/websocket.so')) ||
      (existsSync(lib) && readdirSync(lib).some((arch) => existsSync(path.join(lib, arch, 'kamailio/modules/websocket.so')))),
  );
}

export function browserSkipReason(): string | undefined {
  return (
    (websocketModule() ? undefined : "Kamailio's websocket module is not installed (Debian: kamailio-websocket-modules)") ??
    (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)`)
  );
}

/**
 * A mono 16-bit 48 kHz WAV of `seconds` seconds: a 440 Hz tone, with a 1 kHz click of 20 ms at the start of each
 * second (the marker the latency benchmark looks for). Chromium's fake microphone loops it.
 */
export function writeToneWav(file: string, seconds = 10): void {
  const rate = 48_000;
  const samples = rate * seconds;
  const data = Buffer.alloc(samples * 2);
  for (let i = 0; i < samples; i++) {
    const inSecond = i % rate;
    const click = inSecond < rate / 50;
    const value = click ? Math.sin((2 * Math.PI * 1000 * i) / rate) * 0.9 : Math.sin((2 * Math.PI * 440 * i) / rate) * 0.05;
    data.writeInt16LE(Math.round(value * 32767), i * 2);
  }
  const header = Buffer.alloc(44);
  header.write('RIFF', 0);
  header.writeUInt32LE(36 + data.length, 4);
  header.write('WAVE', 8);
  header.write('fmt ', 12);
  header.writeUInt32LE(16, 16);
  header.writeUInt16LE(1, 20); // PCM
  header.writeUInt16LE(1, 22); // mono
  header.writeUInt32LE(rate, 24);
  header.writeUInt32LE(rate * 2, 28);
  header.writeUInt16LE(2, 32);
  header.writeUInt16LE(16, 34);
  header.write('data', 36);
  header.writeUInt32LE(data.length, 40);
  writeFileSync(file, Buffer.concat([header, data]));
}

/**
 * Chromium with a fake microphone that plays `wav`, allowed without asking (the operator's click on Answer stands
 * for the prompt). Loopback ICE candidates are allowed: rtpengine listens on 127.0.0.1 here.
 */
export function launchConsoleBrowser(profile: string, wav?: string): Promise<BrowserContext> {
  return chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--use-fake-ui-for-media-stream',
      '--use-fake-device-for-media-stream',
      ...(wav ? [`--use-file-for-fake-audio-capture=${wav}`] : []),
      '--allow-loopback-in-peer-connection',
      '--autoplay-policy=no-user-gesture-required',
    ],
    viewport: { width: 1280, height: 800 },
    // axe-core is injected as an inline script, which the console's CSP forbids: bypassed for the audit only.
    bypassCSP: true,
  });
}

export async function signIn(page: Page, apiUrl: string, key: string, member: { email: string; password: string }) {
  await page.goto(`${apiUrl}/console#key=${key}`);
  await page.getByLabel('E-mail').fill(member.email);
  await page.getByLabel('Password').fill(member.password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
}

/** Keeps every RTCPeerConnection the page makes in `window.__peerConnections` (JsSIP's included). */
export async function trackPeerConnections(page: Page) {
  await page.addInitScript(`(() => {
    const Native = window.RTCPeerConnection;
    window.__peerConnections = [];
    window.RTCPeerConnection = class extends Native {
      constructor(...args) { super(...args); window.__peerConnections.push(this); }
    };
  })()`);
}

/**
 * Notes in `window.__rings` the time (`performance.timeOrigin + performance.now()`) each "Incoming call" panel
 * appears, so a ring too short for a locator to see is still counted.
 */
export async function noteRings(page: Page) {
  await page.addInitScript(`(() => {
    window.__rings = [];
    new MutationObserver(() => {
      const shown = document.querySelector('[aria-label="Incoming call"]');
      if (shown && !shown.__seen) { shown.__seen = true; window.__rings.push(performance.timeOrigin + performance.now()); }
    }).observe(document, { subtree: true, childList: true });
  })()`);
}

/** SIPp's error log without its own overload warnings (its scheduler running late on a loaded machine). */
export function sippErrors(errors: string): string {
  const lines = errors.split('\n').filter((line) => line.trim() && !/Overload warning: the minor watchdog timer/.test(line));
  return lines.length === 1 && lines[0].startsWith('The following events occurred') ? '' : lines.join('\n');
}

export interface InboundAudio {
  packetsReceived: number;
  bytesReceived: number;
  codec: string | undefined;
  /** The DTLS transport's state and the selected ICE pair's state. */
  dtls: string | undefined;
  ice: string | undefined;
}

/** The newest peer connection's `inbound-rtp` audio stats (W3C webrtc-stats), or undefined without one. */
export async function inboundAudio(page: Page): Promise<InboundAudio | undefined> {
  // Runs in the page (DOM types are not the server's): the stats as plain records.
  return page.evaluate(async () => {
    type Peer = { getStats(): Promise<Map<string, Record<string, unknown>>> };
    const pcs = (globalThis as unknown as { __peerConnections: Peer[] }).__peerConnections;
    const pc = pcs[pcs.length - 1];
    if (!pc) return undefined;
    const stats = [...(await pc.getStats()).values()];
    const inbound = stats.find((s) => s.type === 'inbound-rtp' && s.kind === 'audio');
    const codec = inbound && stats.find((s) => s.type === 'codec' && s.id === inbound.codecId);
    const transport = stats.find((s) => s.type === 'transport');
    const pair = transport && stats.find((s) => s.type === 'candidate-pair' && s.id === transport.selectedCandidatePairId);
    return {
      packetsReceived: Number(inbound?.packetsReceived ?? 0),
      bytesReceived: Number(inbound?.bytesReceived ?? 0),
      codec: codec ? String(codec.mimeType) : undefined,
      dtls: transport ? String(transport.dtlsState) : undefined,
      ice: pair ? String(pair.state) : undefined,
    };
  });
}

/** A phone's audio: a UDP socket on 127.0.0.1 that keeps what arrives (with when) and sends PCMU. */
export async function audioSocket() {
  const socket = dgram.createSocket('udp4');
  const received: { data: Buffer; address: string; port: number; at: number }[] = [];
  socket.on('message', (data, rinfo) => received.push({ data, address: rinfo.address, port: rinfo.port, at: performance.now() }));
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  let seq = 0;
  const ssrc = 0x5eed0000 + Math.floor(Math.random() * 0xffff);
  return {
    socket,
    port: socket.address().port,
    received,
    /** One 20 ms PCMU packet (payload type 0, RFC 3551) of `payload` (160 bytes of mu-law) to `port`. */
    send(port: number, payload: Buffer, address = '127.0.0.1') {
      const packet = Buffer.alloc(12 + payload.length);
      packet[0] = 0x80;
      packet[1] = 0;
      packet.writeUInt16BE(seq & 0xffff, 2);
      packet.writeUInt32BE((seq * 160) >>> 0, 4);
      packet.writeUInt32BE(ssrc, 8);
      payload.copy(packet, 12);
      seq++;
      socket.send(packet, port, address);
    },
    close: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}

/** G.711 mu-law of one 16-bit sample (ITU-T G.711). */
export function muLaw(sample: number): number {
  const BIAS = 0x84;
  const sign = sample < 0 ? 0x80 : 0;
  let magnitude = Math.min(Math.abs(sample), 32635) + BIAS;
  let exponent = 7;
  for (let mask = 0x4000; (magnitude & mask) === 0 && exponent > 0; mask >>= 1) exponent--;
  const mantissa = (magnitude >> (exponent + 3)) & 0x0f;
  magnitude = 0;
  return ~(sign | (exponent << 4) | mantissa) & 0xff;
}

/** 20 ms of a `hz` tone at 8 kHz in mu-law, starting at sample `offset`. */
export function toneFrame(offset: number, hz = 440, level = 0.3): Buffer {
  const frame = Buffer.alloc(160);
  for (let i = 0; i < 160; i++) frame[i] = muLaw(Math.round(Math.sin((2 * Math.PI * hz * (offset + i)) / 8000) * level * 32767));
  return frame;
}
