/**
 * Helpers for the voice runtime's end-to-end tests: speech made by festival (and sox), RTP captures
 * for SIPp's `play_pcap_audio`, a recorder standing in for the caller's loudspeaker, SIPp scenarios
 * written per test, and the local recogniser to hear what the agent said.
 */
import { execFile, execFileSync } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { AgentRuntime } from '../../src/agents/runtime.js';
import type { Config } from '../../src/config/index.js';
import { systemActor } from '../../src/jsonapi/actor.js';
import { type CodecName, createCodec, parseWav, resampleTo16k } from '../../src/voice/codecs.js';
import { parseRtp, RtpSender } from '../../src/voice/rtp.js';
import { VoiceRuntime } from '../../src/voice/runtime.js';
import { PocketsphinxStt } from '../../src/voice/stt.js';
import { freeUdpPort } from '../sip/harness.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant } from '../support/seed.js';

export function haveProgram(name: string): boolean {
  try {
    execFileSync('sh', ['-c', `command -v ${name}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** Why these tests cannot run here, or undefined. */
export function voiceSkipReason(): string | undefined {
  const missing = ['sipp', 'text2wave', 'pocketsphinx_continuous'].filter((p) => !haveProgram(p));
  if (missing.length) return `${missing.join(', ')} not installed (Debian: sip-tester festival pocketsphinx pocketsphinx-en-us)`;
  // SIPp's play_pcap_audio sends through a raw socket.
  if (process.getuid?.() !== 0) return 'SIPp play_pcap_audio needs root (a raw socket)';
  return undefined;
}

/** A sentence spoken by festival, as 16 kHz PCM. */
export function festival(text: string): Int16Array {
  const wav = execFileSync('text2wave', ['-o', '-'], { input: text });
  const { rate, pcm } = parseWav(wav);
  return resampleTo16k(pcm, rate);
}

export function silence(ms: number): Int16Array {
  return new Int16Array(Math.round((ms / 1000) * 16000));
}

export function concat(...parts: Int16Array[]): Int16Array {
  const out = new Int16Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

export const PAYLOAD_TYPES: Record<CodecName, number> = { PCMU: 0, PCMA: 8, G722: 9 };

/** RFC 4733 events for `digits` (each 100 ms, three end packets), as RTP payloads at 20 ms steps. */
function dtmfPackets(digit: string): { payload: Buffer; end: boolean }[] {
  const event = '0123456789*#'.indexOf(digit);
  const out: { payload: Buffer; end: boolean }[] = [];
  for (let i = 1; i <= 5; i++) {
    const end = i === 5;
    const payload = Buffer.from([event, (end ? 0x80 : 0) | 10, 0, 0]);
    payload.writeUInt16BE(i * 160, 2);
    out.push({ payload, end });
  }
  return out;
}

export type Stream = { audio: Int16Array } | { digit: string };

/**
 * A pcap (Ethernet, IPv4, UDP) of RTP packets, one per 20 ms, carrying `streams` in order: audio
 * encoded with `codec`, digits as RFC 4733 events (payload type 101, one timestamp per event).
 * SIPp rewrites the addresses and ports and sends the packets at their capture times.
 */
export function writeRtpPcap(file: string, codec: CodecName, streams: Stream[]): void {
  const enc = createCodec(codec);
  const sender = new RtpSender(PAYLOAD_TYPES[codec]);
  const dtmf = new RtpSender(101);
  const packets: Buffer[] = [];
  for (const s of streams) {
    if ('audio' in s) {
      for (let i = 0; i + 320 <= s.audio.length; i += 320) packets.push(sender.next(enc.encode(s.audio.subarray(i, i + 320)), 160));
    } else {
      for (const p of dtmfPackets(s.digit)) {
        // One event: the same timestamp on each of its packets (RFC 4733 2.5.1.2).
        const pkt = dtmf.next(p.payload, 0);
        packets.push(pkt);
        if (p.end) {
          packets.push(Buffer.from(pkt), Buffer.from(pkt));
          dtmf.skip(160 * 20);
        }
      }
      // Keep the audio stream's clock going across the digit's time.
      for (let i = 0; i < 7; i++) sender.skip(160);
      for (let i = 0; i < 10; i++) packets.push(sender.next(enc.encode(new Int16Array(320)), 160));
    }
  }
  const header = Buffer.alloc(24);
  header.writeUInt32LE(0xa1b2c3d4, 0);
  header.writeUInt16LE(2, 4);
  header.writeUInt16LE(4, 6);
  header.writeUInt32LE(65535, 16);
  header.writeUInt32LE(1, 20); // DLT_EN10MB
  const chunks = [header];
  packets.forEach((rtp, n) => {
    const udpLen = 8 + rtp.length;
    const ipLen = 20 + udpLen;
    const frame = Buffer.alloc(14 + ipLen);
    frame.writeUInt16BE(0x0800, 12);
    frame[14] = 0x45;
    frame.writeUInt16BE(ipLen, 16);
    frame[22] = 64;
    frame[23] = 17;
    frame.set([127, 0, 0, 1], 26);
    frame.set([127, 0, 0, 1], 30);
    frame.writeUInt16BE(6000, 34);
    frame.writeUInt16BE(6000, 36);
    frame.writeUInt16BE(udpLen, 38);
    rtp.copy(frame, 42);
    const rec = Buffer.alloc(16);
    const usec = n * 20_000;
    rec.writeUInt32LE(Math.floor(usec / 1e6), 0);
    rec.writeUInt32LE(usec % 1e6, 4);
    rec.writeUInt32LE(frame.length, 8);
    rec.writeUInt32LE(frame.length, 12);
    chunks.push(rec, frame);
  });
  fs.writeFileSync(file, Buffer.concat(chunks));
}

/** The caller's loudspeaker: records the RTP the agent sends, with arrival times. */
export async function startRecorder(): Promise<{
  port: number;
  packets: { at: number; data: Buffer }[];
  /** The audio received so far, decoded, in sequence order (payload type `pt` only). */
  audio(codec: CodecName, fromMs?: number, toMs?: number): Int16Array;
  close(): Promise<void>;
}> {
  const socket = dgram.createSocket('udp4');
  const packets: { at: number; data: Buffer }[] = [];
  socket.on('message', (data) => packets.push({ at: performance.now(), data }));
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  return {
    port: socket.address().port,
    packets,
    audio(codec, fromMs = 0, toMs = Number.POSITIVE_INFINITY) {
      const dec = createCodec(codec);
      const start = packets[0]?.at ?? 0;
      const frames = packets
        .filter((p) => p.at - start >= fromMs && p.at - start < toMs)
        .map((p) => parseRtp(p.data))
        .filter((p) => p && p.payloadType === PAYLOAD_TYPES[codec]);
      return concat(...frames.map((p) => dec.decode(p!.payload)));
    },
    close: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}

export async function recognise(pcm: Int16Array): Promise<string> {
  return new PocketsphinxStt(60_000).transcribe(pcm);
}

/** Words of `expected` that `heard` contains (lower case, whole words). */
export function wordsHeard(heard: string, expected: string[]): string[] {
  const words = new Set(heard.toLowerCase().split(/\s+/));
  return expected.filter((w) => words.has(w.toLowerCase()));
}

/**
 * A SIPp caller: INVITE to the agent offering `codec` (and telephone-event 101) with its media port
 * being `recorderPort`, ACK, a pause, the pcap played, and then it waits for the agent's BYE (the
 * workflow ends the call) or sends its own after `byeAfterMs`.
 */
export function callerScenario(o: {
  codec: CodecName;
  recorderPort: number;
  pcap?: string;
  waitBeforeMs: number;
  endBy: 'agent' | 'caller';
  byeAfterMs?: number;
  /** Offer only these payload types (and expect a refusal, 488 unless `refusal` says otherwise). */
  offerOnly?: string;
  /** Expect this final response instead of an answer. */
  refusal?: number;
}): string {
  const pt = PAYLOAD_TYPES[o.codec];
  const m = o.offerOnly ?? `${pt} 101`;
  const sdp = [
    'v=0',
    'o=sipp 1 1 IN IP4 127.0.0.1',
    's=-',
    'c=IN IP4 127.0.0.1',
    't=0 0',
    `m=audio ${o.recorderPort} RTP/AVP ${m}`,
    ...(o.offerOnly ? [] : [`a=rtpmap:${pt} ${o.codec}/8000`, 'a=rtpmap:101 telephone-event/8000', 'a=fmtp:101 0-16', 'a=ptime:20']),
  ].join('\n      ');
  const invite = `
  <send retrans="500">
    <![CDATA[
      INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch];rport
      From: "Caller" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: <sip:caller@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

      ${sdp}

    ]]>
  </send>
  <recv response="100" optional="true"/>`;
  if (o.offerOnly || o.refusal) {
    return `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="voice_refused">${invite}
  <recv response="${o.refusal ?? 488}"/>
  <send><![CDATA[
      ACK sip:[service]@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch];rport
      From: "Caller" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0

  ]]></send>
</scenario>`;
  }
  const ack = `
  <send>
    <![CDATA[
      ACK [next_url] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch];rport
      From: "Caller" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>`;
  const end =
    o.endBy === 'agent'
      ? `
  <recv request="BYE" timeout="60000"/>
  <send>
    <![CDATA[
      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0

    ]]>
  </send>
  <timewait milliseconds="300"/>`
      : `
  <pause milliseconds="${o.byeAfterMs ?? 1000}"/>
  <send retrans="500">
    <![CDATA[
      BYE [next_url] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch];rport
      From: "Caller" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 BYE
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>
  <recv response="200"/>`;
  return `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="voice_caller">${invite}
  <recv response="180" optional="true"/>
  <recv response="200" rrs="true"/>${ack}
  <pause milliseconds="${o.waitBeforeMs}"/>
  ${o.pcap ? `<nop><action><exec play_pcap_audio="${o.pcap}"/></action></nop>` : ''}${end}
</scenario>`;
}

/** Runs SIPp with a scenario text against host:port, calling `service`. */
export function runSipp(
  scenarioXml: string,
  target: { host: string; port: number },
  o: { service: string; localPort: number; mediaPort: number; timeoutSeconds: number },
): Promise<{ code: number; errors: string; messages: string }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-voice-sipp-'));
  const file = path.join(dir, 'scenario.xml');
  fs.writeFileSync(file, scenarioXml);
  const args = [
    `${target.host}:${target.port}`,
    '-sf',
    file,
    '-s',
    o.service,
    '-i',
    '127.0.0.1',
    '-p',
    String(o.localPort),
    '-mp',
    String(o.mediaPort),
    '-m',
    '1',
    '-nostdin',
    '-timeout',
    `${o.timeoutSeconds}s`,
    '-timeout_error',
    '-trace_err',
    '-trace_msg',
  ];
  return new Promise((resolve) => {
    execFile('sipp', args, { cwd: dir, timeout: (o.timeoutSeconds + 10) * 1000 }, (error) => {
      const read = (suffix: string) =>
        fs
          .readdirSync(dir)
          .filter((f) => f.endsWith(suffix))
          .map((f) => fs.readFileSync(path.join(dir, f), 'utf8'))
          .join('\n');
      const result = {
        code: error ? (typeof error.code === 'number' ? error.code : 1) : 0,
        errors: read('_errors.log'),
        messages: read('_messages.log'),
      };
      fs.rmSync(dir, { recursive: true, force: true });
      resolve(result);
    });
  });
}

/** The order desk of the direct-call tests: a greeting, one question, and the goodbye that ends the call. */
export const DESK = {
  greeting: 'Good morning. This is the order desk.',
  question: 'How can I help you?',
  goodbye: 'Thank you for calling. Your order will arrive tomorrow morning. Goodbye.',
  sentence: 'I would like to check my order status please',
};

/**
 * The voice runtime as the tests run it, in this process on the test app's database: its SIP endpoint on a free
 * loopback port taking calls from loopback (the test's caller dials it directly: no SIP edge in front), RTP ports
 * from the kernel, the agent runtime's commits heard through the database's notifications (as `sip serve`), no
 * model (the agents' workflows answer), a 30 s silence timeout; `overrides` changes voice settings. With
 * `agents`, that agent runtime answers the turns (a test that restarts the voice runtime keeps it); without, one
 * is started with the runtime and stopped with it.
 */
export async function startVoiceRuntime(t: TestApp, overrides: Partial<Config['voice']> = {}, agents?: AgentRuntime) {
  const config: Config = {
    ...t.config,
    agentPollMs: 50,
    llmBaseUrl: undefined,
    llmApiKey: undefined,
    voice: {
      ...t.config.voice,
      sipHost: '127.0.0.1',
      sipPort: await freeUdpPort(),
      rtpPortMin: 0,
      rtpPortMax: 0,
      sipTrusted: ['127.0.0.1'],
      silenceTimeoutMs: 30_000,
      ...overrides,
    },
  };
  const own = agents ?? new AgentRuntime({ db: t.db, services: t.services, config, listen: t.database.listen });
  if (!agents) own.start();
  const logger = pino({ level: process.env.VOICE_TEST_LOG ?? 'silent' });
  const voice = new VoiceRuntime({ db: t.db, services: t.services, config, agents: own, listen: t.database.listen, logger });
  await voice.start();
  return {
    voice,
    config,
    async stop() {
      await voice.stop();
      if (!agents) await own.stop();
    },
  };
}

/** A test app with the order desk agent and the voice runtime (`startVoiceRuntime`). */
export async function startDesk(tenantName: string) {
  const t = await startTestApp();
  const tenant = await seedTenant(t, tenantName);
  const agent = await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'AiAgent', {
    name: 'Desk',
    published: true,
    languages: ['en'],
    workflow: {
      steps: [
        { type: 'message', text: DESK.greeting },
        { type: 'question', text: DESK.question, store_as: 'request' },
        { type: 'end', text: DESK.goodbye, close: true },
      ],
    },
  });
  const runtime = await startVoiceRuntime(t);
  return {
    t,
    tenant,
    agentId: agent.id,
    config: runtime.config,
    async close() {
      await runtime.stop();
      await t.close();
    },
  };
}
