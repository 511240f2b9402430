/**
 * Voice runtime overhead (issue 23), in-process on PostgreSQL: N callers at once call an agent whose model
 * (an OpenAI-compatible server in this process) and speech engines answer instantly, so what is measured
 * is Parley's own work: endpointing, storing the turn, the agent runtime's turn, playback scheduling.
 *
 *   voice-to-voice: the caller's last loud frame sent -> the agent's first loud frame received, minus the
 *     endpointing hangover (VOICE_ENDPOINT_MS, which is a setting, not overhead). Target p95 <= 250 ms.
 *   RTP send-interval jitter: |interval between two packets of a call - 20 ms|. Target p99 <= 5 ms.
 *   CPU seconds per call-minute (the whole process: SIP, RTP, codecs, VAD, database client, agent runtime).
 *
 * Run alone: `npx tsx bench/voice.ts [calls] [turns]` (default 10 calls, 5 turns each; BENCH_VOICE_DATABASE_URL,
 * default postgres://postgres@127.0.0.1:5432/parley_bench_voice, recreated). Independent of `npm run bench`.
 */
import { randomBytes } from 'node:crypto';
import dgram from 'node:dgram';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { AgentRuntime } from '../src/agents/runtime.js';
import { createServices } from '../src/app.js';
import { createOrganisation } from '../src/auth/accounts.js';
import { loadConfig } from '../src/config/index.js';
import { openDatabase } from '../src/db/connection.js';
import { migrate } from '../src/db/migrate.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { createCodec } from '../src/voice/codecs.js';
import { parseRtp, RtpSender } from '../src/voice/rtp.js';
import { VoiceRuntime } from '../src/voice/runtime.js';
import { parseSip } from '../src/voice/sip-message.js';
import type { SpeechToText } from '../src/voice/stt.js';
import type { TextToSpeech } from '../src/voice/tts.js';
import { recreateDatabase } from './database.js';

const percentile = (values: number[], p: number) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
};
const round = (n: number) => Math.round(n * 10) / 10;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** An OpenAI-compatible chat server that streams a fixed short answer at once. */
async function instantModel(): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (delta: unknown, finish: string | null) =>
        `data: ${JSON.stringify({ id: 'b', object: 'chat.completion.chunk', created: 0, model: 'instant', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      res.end(`${chunk({ role: 'assistant', content: 'Noted.' }, null) + chunk({}, 'stop')}data: [DONE]\n\n`);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** 16 kHz tone frames: what the instant engines "say", and what the callers "speak". */
const tone = (ms: number, hz: number) =>
  Int16Array.from({ length: (ms / 1000) * 16000 }, (_, i) => Math.round(8000 * Math.sin((2 * Math.PI * hz * i) / 16000)));
const instantStt: SpeechToText = { name: 'instant', transcribe: async () => 'I would like to check my order' };
const instantTts: TextToSpeech = { name: 'instant', synthesize: async () => tone(600, 440) };

const loud = (pcm: Int16Array) => pcm.some((v) => Math.abs(v) > 1000);

/** One caller: a minimal SIP UAC with PCMU media, speaking `turns` times after each agent reply ends. */
async function caller(target: { port: number }, agentId: string, turns: number, v2v: number[]): Promise<void> {
  const sip = dgram.createSocket('udp4');
  const rtp = dgram.createSocket('udp4');
  await Promise.all([new Promise<void>((r) => sip.bind(0, '127.0.0.1', r)), new Promise<void>((r) => rtp.bind(0, '127.0.0.1', r))]);
  const callId = `bench-${randomBytes(6).toString('hex')}`;
  const local = `127.0.0.1:${sip.address().port}`;
  const codec = createCodec('PCMU');
  const dec = createCodec('PCMU');
  let remoteRtp = 0;
  let lastLoudIn = 0;
  let firstLoudAfter: ((at: number) => void) | undefined;
  rtp.on('message', (data) => {
    const p = parseRtp(data);
    if (p?.payloadType !== 0) return;
    if (loud(dec.decode(p.payload))) {
      const now = performance.now();
      lastLoudIn = now;
      firstLoudAfter?.(now);
      firstLoudAfter = undefined;
    }
  });
  const answered = new Promise<{ toTag: string; port: number }>((resolve) => {
    sip.on('message', (data) => {
      const msg = parseSip(data);
      if (msg.status === 200 && msg.headers.get('cseq')?.[0].endsWith('INVITE')) {
        const to = msg.headers.get('to')![0];
        resolve({ toTag: /tag=([^;]+)/.exec(to)![1], port: Number(/m=audio (\d+)/.exec(msg.body)![1]) });
      } else if (msg.method === 'BYE') {
        const h = (n: string) => msg.headers.get(n)![0];
        const ok = `SIP/2.0 200 OK\r\nVia: ${msg.headers.get('via')!.join(', ')}\r\nFrom: ${h('from')}\r\nTo: ${h('to')}\r\nCall-ID: ${h('call-id')}\r\nCSeq: ${h('cseq')}\r\nContent-Length: 0\r\n\r\n`;
        sip.send(ok, target.port, '127.0.0.1');
      }
    });
  });
  const sdp = `v=0\r\no=b 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio ${rtp.address().port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n`;
  const head = (method: string, seq: number, toTag = '') =>
    `${method} sip:agent-${agentId}@127.0.0.1:${target.port} SIP/2.0\r\nVia: SIP/2.0/UDP ${local};branch=z9hG4bK${randomBytes(6).toString('hex')};rport\r\nFrom: <sip:bench@${local}>;tag=b1\r\nTo: <sip:agent-${agentId}@127.0.0.1>${toTag ? `;tag=${toTag}` : ''}\r\nCall-ID: ${callId}\r\nCSeq: ${seq} ${method}\r\nContact: <sip:bench@${local}>\r\nMax-Forwards: 70\r\n`;
  sip.send(`${head('INVITE', 1)}Content-Type: application/sdp\r\nContent-Length: ${sdp.length}\r\n\r\n${sdp}`, target.port, '127.0.0.1');
  const { toTag, port } = await answered;
  remoteRtp = port;
  sip.send(`${head('ACK', 1, toTag)}Content-Length: 0\r\n\r\n`, target.port, '127.0.0.1');

  const sender = new RtpSender(0);
  const send = (pcm: Int16Array) => rtp.send(sender.next(codec.encode(pcm), 160), remoteRtp, '127.0.0.1');
  const silence = new Int16Array(320);
  const speech = tone(800, 300);
  // Send silence continuously; speak when the agent has been quiet for 500 ms after talking.
  let speaking: Int16Array | undefined;
  let offset = 0;
  let lastLoudOut = 0;
  const origin = performance.now();
  let n = 0;
  let running = true;
  const pump = async () => {
    while (running) {
      const frame = speaking ? speaking.subarray(offset, offset + 320) : silence;
      send(frame.length === 320 ? frame : silence);
      if (speaking) {
        offset += 320;
        lastLoudOut = performance.now();
        if (offset >= speaking.length) speaking = undefined;
      }
      n++;
      await sleep(Math.max(0, origin + n * 20 - performance.now()));
    }
  };
  const pumping = pump();
  for (let turn = 0; turn <= turns; turn++) {
    // Wait for the agent's reply (the greeting first) to be heard and to end.
    const deadline = performance.now() + 20_000;
    while (performance.now() < deadline && (lastLoudIn === 0 || performance.now() - lastLoudIn < 500)) await sleep(20);
    if (turn === turns) break;
    const heard = new Promise<number>((resolve) => (firstLoudAfter = resolve));
    speaking = speech;
    offset = 0;
    while (speaking) await sleep(5);
    const spokeAt = lastLoudOut;
    const at = await Promise.race([heard, sleep(20_000).then(() => Number.NaN)]);
    v2v.push(at - spokeAt);
  }
  running = false;
  await pumping;
  sip.send(`${head('BYE', 2, toTag)}Content-Length: 0\r\n\r\n`, target.port, '127.0.0.1');
  await sleep(200);
  sip.close();
  rtp.close();
}

export interface VoiceBenchResult {
  calls: number;
  turns: number;
  voiceToVoice: { p50: number; p95: number };
  overhead: { p50: number; p95: number };
  jitter: { p50: number; p99: number; max: number };
  cpuSecondsPerCallMinute: number;
}

export async function voiceBenchmark(databaseUrl: string, calls = 10, turns = 5): Promise<VoiceBenchResult> {
  await recreateDatabase(databaseUrl);
  const model = await instantModel();
  const endpointMs = 600;
  const config = loadConfig({
    DATABASE_URL: databaseUrl,
    LOG_LEVEL: 'silent',
    LLM_BASE_URL: model.url,
    LLM_API_KEY: 'bench',
    LLM_MODEL: 'instant',
    AGENT_CONCURRENCY: String(calls),
    AGENT_POLL_MS: '200',
    DATABASE_POOL_SIZE: '20',
    VOICE_SIP_PORT: '0',
    // The bench's callers are this process, on loopback (no SIP edge in front).
    VOICE_SIP_TRUSTED: '127.0.0.1',
    VOICE_RTP_PORT_MIN: '0',
    VOICE_RTP_PORT_MAX: '0',
    VOICE_MAX_CALLS: String(calls),
    VOICE_ENDPOINT_MS: String(endpointMs),
    VOICE_SILENCE_TIMEOUT_MS: '60000',
  } as NodeJS.ProcessEnv);
  const database = await openDatabase(config);
  await migrate(database.db);
  const services = await createServices(database, config);
  const organisation = await createOrganisation(services.records!, { name: 'Bench' });
  const agent = await services.records!.create(systemActor(organisation.id, 'cli'), 'AiAgent', {
    name: 'Bench',
    published: true,
    workflow: { steps: [{ type: 'message', text: 'Hello.' }, { type: 'model' }] },
  });
  const agents = new AgentRuntime({ db: database.db, services, config });
  agents.start();
  const last = new Map<string, number>();
  const jitter: number[] = [];
  const voice = new VoiceRuntime({
    db: database.db,
    services,
    config,
    agents,
    stt: instantStt,
    tts: instantTts,
    onPacketSent: (callId, at) => {
      const previous = last.get(callId);
      if (previous !== undefined) jitter.push(Math.abs(at - previous - 20));
      last.set(callId, at);
    },
  });
  await voice.start();
  const v2v: number[] = [];
  const cpu = process.cpuUsage();
  const started = performance.now();
  await Promise.all(Array.from({ length: calls }, () => caller({ port: voice.endpoint.port }, agent.id, turns, v2v)));
  const minutes = (performance.now() - started) / 60_000;
  const used = process.cpuUsage(cpu);
  await voice.stop();
  await agents.stop();
  await database.close();
  await model.close();
  const measured = v2v.filter((x) => Number.isFinite(x));
  return {
    calls,
    turns: measured.length,
    voiceToVoice: { p50: round(percentile(measured, 50)), p95: round(percentile(measured, 95)) },
    overhead: { p50: round(percentile(measured, 50) - endpointMs), p95: round(percentile(measured, 95) - endpointMs) },
    jitter: { p50: round(percentile(jitter, 50)), p99: round(percentile(jitter, 99)), max: round(Math.max(...jitter)) },
    cpuSecondsPerCallMinute: round((used.user + used.system) / 1e6 / (calls * minutes)),
  };
}

export function voiceChecks(r: VoiceBenchResult): string[] {
  return [
    `${r.overhead.p95 <= 250 ? 'PASS' : 'FAIL'} voice-to-voice overhead beyond the ${600} ms endpointing at ${r.calls} calls: p50 ${r.overhead.p50} ms, p95 ${r.overhead.p95} ms (target p95 <= 250; raw p50 ${r.voiceToVoice.p50}, p95 ${r.voiceToVoice.p95}; ${r.turns} turns)`,
    `${r.jitter.p99 <= 5 ? 'PASS' : 'FAIL'} RTP send-interval jitter at ${r.calls} calls: p50 ${r.jitter.p50} ms, p99 ${r.jitter.p99} ms, max ${r.jitter.max} ms (target p99 <= 5)`,
    `INFO CPU per call-minute: ${r.cpuSecondsPerCallMinute} s`,
  ];
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const url = process.env.BENCH_VOICE_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/parley_bench_voice';
  const result = await voiceBenchmark(url, Number(process.argv[2] ?? 10), Number(process.argv[3] ?? 5));
  console.log(JSON.stringify(result));
  for (const line of voiceChecks(result)) console.log(line);
  process.exit(0);
}
