/**
 * The voice runtime end to end: SIPp calls an agent directly (no Kamailio yet) and plays a
 * festival-spoken sentence; the agent's greeting and answer come back as RTP, recorded and recognised
 * by the local speech-to-text; the API's records show the call, its voice conversation and transcripts.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Config } from '../../src/config/index.js';
import { toWav } from '../../src/voice/codecs.js';
import { freeUdpPort } from '../sip/harness.js';
import type { TestApp } from '../support/app.js';
import {
  callerScenario,
  concat,
  DESK,
  festival,
  recognise,
  runSipp,
  silence,
  startDesk,
  startRecorder,
  voiceSkipReason,
  wordsHeard,
  writeRtpPcap,
} from './harness.js';

const skip = voiceSkipReason();

const { goodbye: GOODBYE, sentence: SENTENCE } = DESK;

describe.skipIf(skip)('voice agent calls (SIPp to the voice endpoint)', () => {
  let desk: Awaited<ReturnType<typeof startDesk>>;
  let t: TestApp;
  let agentId: string;
  let config: Config;
  let dir: string;

  beforeAll(async () => {
    desk = await startDesk('Voice');
    ({ t, agentId, config } = desk);
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-voice-test-'));
  }, 60_000);

  afterAll(async () => {
    await desk?.close();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  /** The call and its lines once its end is recorded (that follows the BYE: a turn in flight finishes first). */
  async function transcripts(callUuid: string) {
    const read = () => t.db.selectFrom('calls').selectAll().where('call_uuid', '=', callUuid).executeTakeFirst();
    const deadline = Date.now() + 15_000;
    let call = await read();
    while (call?.status === 'in_progress' && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
      call = await read();
    }
    const lines = call
      ? await t.db.selectFrom('call_transcripts').selectAll().where('call_id', '=', call.id).orderBy('content_index').execute()
      : [];
    return { call, lines };
  }

  for (const codec of ['G722', 'PCMU'] as const) {
    it(`answers over ${codec}: the greeting is heard, the caller's sentence is transcribed, the agent answers and hangs up`, async () => {
      const pcap = path.join(dir, `caller-${codec}.pcap`);
      writeRtpPcap(pcap, codec, [{ audio: concat(festival(SENTENCE), silence(1500)) }]);
      const recorder = await startRecorder();
      try {
        const result = await runSipp(
          callerScenario({ codec, recorderPort: recorder.port, pcap, waitBeforeMs: 9000, endBy: 'agent' }),
          { host: '127.0.0.1', port: config.voice.sipPort },
          { service: `agent-${agentId}`, localPort: await freeUdpPort(), mediaPort: await freeUdpPort(), timeoutSeconds: 120 },
        );
        expect(result.code, result.errors + result.messages).toBe(0);
        const callId = /Call-ID: (.+)/i.exec(result.messages)?.[1]?.trim() ?? '';
        const { call, lines } = await transcripts(callId);
        // What the caller heard before speaking (the greeting), and after (the answer).
        const before = recorder.audio(codec, 0, 9000);
        const after = recorder.audio(codec, 9000);
        if (process.env.VOICE_TEST_KEEP) {
          fs.writeFileSync(path.join(process.env.VOICE_TEST_KEEP, `heard-${codec}.wav`), toWav(concat(before, after), 16000));
        }
        const greeting = await recognise(before);
        const heard = await recognise(after);
        const summary = JSON.stringify({ greeting, heard, lines: lines.map((l) => [l.speaker, l.content, l.metadata]) });
        expect(
          wordsHeard(greeting, ['good', 'morning', 'this', 'order', 'desk', 'how', 'can', 'help', 'you']).length,
          summary,
        ).toBeGreaterThanOrEqual(5);
        expect(
          wordsHeard(heard, ['thank', 'you', 'for', 'calling', 'order', 'arrive', 'tomorrow', 'morning', 'goodbye']).length,
          summary,
        ).toBeGreaterThanOrEqual(5);
        expect(call?.status).toBe('completed');
        const caller = lines.find((l) => l.speaker === 'caller');
        expect(wordsHeard(caller?.content ?? '', SENTENCE.split(' ')).length, summary).toBeGreaterThanOrEqual(5);
        expect(lines.map((l) => l.speaker)).toEqual(['agent', 'caller', 'agent']);
        expect(lines.map((l) => l.content_index)).toEqual([0, 1, 2]);
        const goodbye = lines[2];
        expect(goodbye.content).toBe(GOODBYE);
        const meta = goodbye.metadata as { spoken?: boolean; latency_ms?: Record<string, number> };
        expect(meta.spoken).toBe(true);
        // The latency budget, each stage measured: end of speech -> transcript -> reply -> first packet.
        expect(Object.keys(meta.latency_ms ?? {}).sort()).toEqual([
          'reply_to_first_audio',
          'speech_end_to_transcript',
          'transcript_to_reply',
          'voice_to_voice',
        ]);
        const conversation = await t.db
          .selectFrom('conversations')
          .selectAll()
          .where('id', '=', call!.conversation_id!)
          .executeTakeFirstOrThrow();
        expect(conversation.mode).toBe('voice');
        expect(conversation.status).toBe('closed');
        expect((conversation.metadata as { request?: string }).request).toBe(caller?.content);
        const items = await t.db
          .selectFrom('conversation_items')
          .select(['role', 'content'])
          .where('conversation_id', '=', conversation.id)
          .orderBy('content_index')
          .execute();
        expect(items.map((i) => i.role)).toEqual(['user', 'assistant', 'user', 'assistant']);
        expect(items[2].content).toBe(caller?.content);
        expect(items[3].content).toBe(GOODBYE);
      } finally {
        await recorder.close();
      }
    }, 240_000);
  }
});
