/**
 * The voice runtime's turns beyond the plain answer, over real SIP (SIPp calling the voice endpoint
 * directly): barge-in, DTMF reaching the workflow, refusals (488 for codecs, 486 past
 * VOICE_MAX_CALLS), and the OpenAI-compatible speech provider path against a fake provider.
 */
import dgram from 'node:dgram';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Config } from '../../src/config/index.js';
import { systemActor } from '../../src/jsonapi/actor.js';
import { createCodec, toWav } from '../../src/voice/codecs.js';
import { parseRtp, RtpSender } from '../../src/voice/rtp.js';
import type { VoiceRuntime } from '../../src/voice/runtime.js';
import { freeUdpPort } from '../sip/harness.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import {
  callerScenario,
  concat,
  festival,
  runSipp,
  silence,
  startRecorder,
  startVoiceRuntime,
  voiceSkipReason,
  wordsHeard,
  writeRtpPcap,
} from './harness.js';

const skip = voiceSkipReason();

const LONG_GREETING =
  'Good morning. This is the order desk. We are open every day from eight in the morning until eight in the evening, and we are always happy to help you with your orders, your deliveries and your returns.';
const QUESTION = 'What would you like to do?';
const ASK_ACCOUNT = 'Please type your account number and then the hash key.';
const GOODBYE = 'Thank you for calling. Goodbye.';
const SENTENCE = 'I would like to check my order status please';

describe.skipIf(skip)('voice agent turns (SIPp to the voice endpoint)', () => {
  let t: TestApp;
  let tenant: Tenant;
  let agentId: string;
  let dir: string;

  beforeAll(async () => {
    t = await startTestApp();
    tenant = await seedTenant(t, 'Voice turns');
    const agent = await t.services.records!.create(systemActor(tenant.organisationId, 'test'), 'AiAgent', {
      name: 'Desk',
      published: true,
      voice: 'nova',
      languages: ['en'],
      workflow: {
        steps: [
          { type: 'message', text: LONG_GREETING },
          { type: 'question', text: QUESTION, store_as: 'request' },
          { type: 'question', text: ASK_ACCOUNT, store_as: 'account' },
          { type: 'end', text: GOODBYE, close: true },
        ],
      },
    });
    agentId = agent.id;
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-voice-turns-'));
  }, 60_000);

  afterAll(async () => {
    await t?.close();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  async function withVoice<T>(overrides: Partial<Config['voice']>, work: (voice: VoiceRuntime, config: Config) => Promise<T>): Promise<T> {
    const { voice, config, stop } = await startVoiceRuntime(t, overrides);
    try {
      return await work(voice, config);
    } finally {
      await stop();
    }
  }

  /** The call's records once its end is recorded (that follows the BYE: the runtime lets a turn in flight finish first). */
  async function callRecords(callUuid: string) {
    const deadline = Date.now() + 15_000;
    let call = await t.db.selectFrom('calls').selectAll().where('call_uuid', '=', callUuid).executeTakeFirstOrThrow();
    while (call.status === 'in_progress' && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
      call = await t.db.selectFrom('calls').selectAll().where('call_uuid', '=', callUuid).executeTakeFirstOrThrow();
    }
    const lines = await t.db.selectFrom('call_transcripts').selectAll().where('call_id', '=', call.id).orderBy('content_index').execute();
    const conversation = await t.db
      .selectFrom('conversations')
      .selectAll()
      .where('id', '=', call.conversation_id!)
      .executeTakeFirstOrThrow();
    return { call, lines, conversation };
  }

  const call = (config: Config, scenario: string, timeoutSeconds = 120) =>
    Promise.all([freeUdpPort(), freeUdpPort()]).then(([localPort, mediaPort]) =>
      runSipp(
        scenario,
        { host: '127.0.0.1', port: config.voice.sipPort },
        { service: `agent-${agentId}`, localPort, mediaPort, timeoutSeconds },
      ),
    );

  it('barge-in stops the greeting within 300 ms and marks the rest unspoken; DTMF digits answer the workflow', async () => {
    await withVoice({}, async (voice, config) => {
      // SIPp places the call and later types 4 2 #; the caller's voice over the greeting is sent by the test
      // itself, on the same clock as the recorder, so the time from its first sound to the agent's silence is exact.
      const pcap = path.join(dir, 'digits.pcap');
      writeRtpPcap(pcap, 'G722', [{ digit: '4' }, { digit: '2' }, { digit: '#' }, { audio: silence(400) }]);
      const recorder = await startRecorder();
      const mouth = dgram.createSocket('udp4');
      await new Promise<void>((resolve) => mouth.bind(0, '127.0.0.1', resolve));
      try {
        const sipp = call(
          config,
          callerScenario({ codec: 'G722', recorderPort: recorder.port, pcap, waitBeforeMs: 20_000, endBy: 'agent' }),
        );
        const deadline = Date.now() + 60_000;
        // Wait for the greeting to be under way (loud audio for a second).
        let greetingFrom = 0;
        while (Date.now() < deadline) {
          const audio = recorder.audio('G722');
          const first = audio.findIndex((v) => Math.abs(v) > 1000);
          if (first >= 0 && audio.length - first > 16000) {
            greetingFrom = first;
            break;
          }
          await new Promise((r) => setTimeout(r, 50));
        }
        expect(greetingFrom, 'the greeting started').toBeGreaterThan(0);
        const [session] = voice.sessions();
        const speech = festival(SENTENCE);
        const enc = createCodec('G722');
        const sender = new RtpSender(9);
        let speechAt = 0;
        for (let i = 0; i + 320 <= speech.length; i += 320) {
          const frame = speech.subarray(i, i + 320);
          mouth.send(sender.next(enc.encode(frame), 160), session.rtpPort, '127.0.0.1');
          if (!speechAt && frame.some((v) => Math.abs(v) > 500)) speechAt = performance.now();
          await new Promise((r) => setTimeout(r, 20));
        }
        for (let i = 0; i < 60; i++) {
          mouth.send(sender.next(enc.encode(new Int16Array(320)), 160), session.rtpPort, '127.0.0.1');
          await new Promise((r) => setTimeout(r, 20));
        }
        // The last loud packet of the greeting, by arrival time, after the caller's first sound.
        const dec = createCodec('G722');
        let lastLoud = 0;
        for (const p of recorder.packets) {
          const rtp = parseRtp(p.data);
          if (rtp?.payloadType !== 9) continue;
          const pcm = dec.decode(rtp.payload);
          if (p.at <= speechAt + 2000 && pcm.some((v) => Math.abs(v) > 1000)) lastLoud = p.at;
        }
        expect(lastLoud - speechAt, `agent audio until ${Math.round(lastLoud - speechAt)} ms after the caller spoke`).toBeLessThanOrEqual(
          300,
        );

        const result = await sipp;
        expect(result.code, result.errors + result.messages).toBe(0);
        const callId = /Call-ID: (.+)/i.exec(result.messages)?.[1]?.trim() ?? '';
        const { lines, conversation, call: row } = await callRecords(callId);
        const summary = JSON.stringify(lines.map((l) => [l.speaker, l.content, l.metadata]));
        // The greeting was cut: spoken false, and the words after the cut kept as not spoken.
        const greeting = lines[0];
        expect(greeting.speaker).toBe('agent');
        const meta = greeting.metadata as { spoken: boolean; spoken_ms: number; duration_ms: number; unspoken_text?: string };
        expect(meta.spoken, summary).toBe(false);
        expect(meta.spoken_ms).toBeLessThan(meta.duration_ms);
        // The reply was the greeting and the question; the unheard rest is its tail, word for word.
        const said = `${LONG_GREETING} ${QUESTION}`;
        expect(meta.unspoken_text, summary).toBeTruthy();
        expect(said.endsWith(meta.unspoken_text!), summary).toBe(true);
        expect(meta.unspoken_text!.length).toBeLessThan(said.length);
        // The caller's sentence answered the question; the digits (ended by #) answered the next one.
        const metadata = conversation.metadata as { request?: string; account?: string };
        expect(wordsHeard(metadata.request ?? '', SENTENCE.split(' ')).length, summary).toBeGreaterThanOrEqual(5);
        expect(metadata.account, summary).toBe('42');
        const dtmf = lines.find((l) => l.speaker === 'caller' && l.content === '42');
        expect((dtmf?.metadata as { source?: string } | undefined)?.source).toBe('dtmf');
        // The workflow's end step hung up, after saying goodbye.
        expect(lines.at(-1)?.content).toBe(GOODBYE);
        expect(row.status).toBe('completed');
        expect(conversation.status).toBe('closed');
      } finally {
        mouth.close();
        await recorder.close();
      }
    });
  }, 240_000);

  it('a silent caller is asked whether they are still there, then the agent says goodbye and hangs up', async () => {
    await withVoice({ silenceTimeoutMs: 2500 }, async (_voice, config) => {
      const recorder = await startRecorder();
      try {
        const result = await call(config, callerScenario({ codec: 'PCMU', recorderPort: recorder.port, waitBeforeMs: 0, endBy: 'agent' }));
        expect(result.code, result.errors + result.messages).toBe(0);
        const callId = /Call-ID: (.+)/i.exec(result.messages)?.[1]?.trim() ?? '';
        const { lines, call: row } = await callRecords(callId);
        expect(lines.map((l) => [l.speaker, (l.metadata as { prompt?: string }).prompt ?? null])).toEqual([
          ['agent', null],
          ['agent', 'silence'],
          ['agent', 'silence_hangup'],
        ]);
        expect(lines[1].content).toBe('Are you still there?');
        expect(row.status).toBe('completed');
      } finally {
        await recorder.close();
      }
    });
  }, 120_000);

  it('ends, at start, the calls a stopped voice runtime left open (failed, legs left, conversation closed)', async () => {
    const actor = systemActor(tenant.organisationId, 'sip');
    const records = t.services.records!;
    const conversation = await records.create(actor, 'Conversation', { channel: 'voice', mode: 'voice', ai_agent_id: agentId });
    const started = new Date(Date.now() - 60_000);
    const open = await records.create(actor, 'Call', {
      direction: 'inbound',
      status: 'in_progress',
      call_uuid: `left-open-${Date.now()}`,
      call_source: 'voice',
      started_at: started,
      conversation_id: conversation.id,
    });
    const leg = await records.create(actor, 'CallParticipant', {
      call_id: open.id,
      member_uuid: 'sip:caller',
      role: 'caller',
      joined_at: started,
    });
    // A call of the SIP edge (not the voice runtime's) is not touched.
    const other = await records.create(actor, 'Call', {
      direction: 'inbound',
      status: 'in_progress',
      call_uuid: `edge-${Date.now()}`,
      call_source: 'sip',
    });
    await withVoice({}, async () => {});
    const call = await t.db.selectFrom('calls').selectAll().where('id', '=', open.id).executeTakeFirstOrThrow();
    expect(call.status).toBe('failed');
    expect(call.ended_at).not.toBeNull();
    const participant = await t.db.selectFrom('call_participants').selectAll().where('id', '=', leg.id).executeTakeFirstOrThrow();
    expect(participant.left_at).not.toBeNull();
    const conv = await t.db.selectFrom('conversations').select('status').where('id', '=', conversation.id).executeTakeFirstOrThrow();
    expect(conv.status).toBe('closed');
    const untouched = await t.db.selectFrom('calls').select('status').where('id', '=', other.id).executeTakeFirstOrThrow();
    expect(untouched.status).toBe('in_progress');
  }, 60_000);

  it('answers 488 to an offer without G.722 or G.711, and 486 past VOICE_MAX_CALLS while the running call goes on', async () => {
    await withVoice({ maxCalls: 1 }, async (voice, config) => {
      const refused = await call(
        config,
        callerScenario({ codec: 'PCMU', recorderPort: 9, waitBeforeMs: 0, endBy: 'caller', offerOnly: '18 3' }),
        20,
      );
      expect(refused.code, refused.errors + refused.messages).toBe(0);
      expect(refused.messages).toMatch(/SIP\/2\.0 488 Not Acceptable Here[\s\S]*Warning: 305/);
      const recorder = await startRecorder();
      try {
        const first = call(
          config,
          callerScenario({ codec: 'PCMU', recorderPort: recorder.port, waitBeforeMs: 0, endBy: 'caller', byeAfterMs: 6000 }),
          60,
        );
        // Wait until the first call is up, then a second is refused as busy.
        const deadline = Date.now() + 30_000;
        while (voice.activeCalls < 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
        expect(voice.activeCalls).toBe(1);
        const busy = await call(
          config,
          callerScenario({ codec: 'PCMU', recorderPort: 9, waitBeforeMs: 0, endBy: 'caller', refusal: 486 }),
          20,
        );
        expect(busy.code, busy.errors + busy.messages).toBe(0);
        const packetsBefore = recorder.packets.length;
        const done = await first;
        expect(done.code, done.errors + done.messages).toBe(0);
        // The running call kept its media flowing while the other was refused.
        expect(recorder.packets.length).toBeGreaterThan(packetsBefore);
        const callId = /Call-ID: (.+)/i.exec(done.messages)?.[1]?.trim() ?? '';
        const { call: row } = await callRecords(callId);
        expect(row.status).toBe('completed');
      } finally {
        await recorder.close();
      }
    });
  }, 180_000);

  it('uses an OpenAI-compatible speech provider: transcription retried after a 503, speech in the agent voice', async () => {
    const seen = {
      transcriptions: 0,
      speech: [] as { model: string; voice: string; input: string; response_format: string }[],
      wavRates: [] as number[],
    };
    const server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks);
        if (req.url === '/v1/audio/transcriptions' && req.headers.authorization === 'Bearer stt-key') {
          seen.transcriptions++;
          if (seen.transcriptions === 1) {
            res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"busy"}}');
            return;
          }
          const riff = body.indexOf('RIFF');
          seen.wavRates.push(riff >= 0 ? body.readUInt32LE(riff + 24) : 0);
          res
            .writeHead(200, { 'content-type': 'application/json' })
            .end(JSON.stringify({ text: 'I would like to check my order status please' }));
          return;
        }
        if (req.url === '/v1/audio/speech' && req.headers.authorization === 'Bearer tts-key') {
          const request = JSON.parse(body.toString());
          seen.speech.push(request);
          res.writeHead(200, { 'content-type': 'audio/wav' }).end(toWav(festival(request.input), 16000));
          return;
        }
        res.writeHead(404).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/v1`;
    try {
      await withVoice(
        {
          sttBaseUrl: url,
          sttApiKey: 'stt-key',
          sttModel: 'fake-whisper',
          ttsBaseUrl: url,
          ttsApiKey: 'tts-key',
          ttsModel: 'fake-tts',
          speechMaxRetries: 1,
        },
        async (_voice, config) => {
          const pcap = path.join(dir, 'provider.pcap');
          // Speak after the greeting, the question and a pause: no barge-in this time.
          writeRtpPcap(pcap, 'PCMU', [
            { audio: concat(festival(SENTENCE), silence(1200)) },
            { digit: '7' },
            { digit: '#' },
            { audio: silence(400) },
          ]);
          const recorder = await startRecorder();
          try {
            const result = await call(
              config,
              callerScenario({ codec: 'PCMU', recorderPort: recorder.port, pcap, waitBeforeMs: 16_000, endBy: 'agent' }),
            );
            expect(result.code, result.errors + result.messages).toBe(0);
            const callId = /Call-ID: (.+)/i.exec(result.messages)?.[1]?.trim() ?? '';
            const { lines, conversation } = await callRecords(callId);
            expect(seen.transcriptions).toBe(2); // one 503, one retry
            expect(seen.wavRates).toEqual([16000]); // the recogniser gets 16 kHz audio, even from a G.711 call
            expect(seen.speech.map((s) => s.input)).toEqual([`${LONG_GREETING}\n\n${QUESTION}`, ASK_ACCOUNT, GOODBYE]);
            expect(seen.speech.every((s) => s.model === 'fake-tts' && s.voice === 'nova' && s.response_format === 'wav')).toBe(true);
            const caller = lines.find((l) => l.speaker === 'caller');
            expect(caller?.content).toBe('I would like to check my order status please');
            expect((caller?.metadata as { stt?: string } | undefined)?.stt).toBe('provider:fake-whisper');
            expect((conversation.metadata as { account?: string }).account).toBe('7');
            expect(
              lines.filter((l) => l.speaker === 'agent').every((l) => (l.metadata as { tts?: string }).tts === 'provider:fake-tts'),
            ).toBe(true);
          } finally {
            await recorder.close();
          }
        },
      );
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  }, 240_000);
});
