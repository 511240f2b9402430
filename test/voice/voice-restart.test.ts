/**
 * The voice runtime restarted mid-call (docs/voice.md, "A call", the end of a call): stopped (SIGTERM: `sip serve`
 * stops it first), the caller gets a BYE and the call is recorded completed; killed (SIGKILL: it is a process of
 * its own here, as in `sip serve`), nothing more is written by it, and the runtime started again ends the call it
 * left open as failed (legs left, conversation closed) and answers the lost dialog's BYE and keep-alive OPTIONS
 * with 481, so the caller (or the edge, docs/voice.md "Behind the SIP edge") ends its side; new calls are
 * answered. The speech engines are a fake OpenAI-compatible provider in this process (a long tone as the
 * greeting, so that the greeting is still playing when the runtime goes); the agent runtime runs here, as in
 * `parley serve`. PostgreSQL only: the runtime's process shares the test's database.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import dgram from 'node:dgram';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentRuntime } from '../../src/agents/runtime.js';
import type { Config } from '../../src/config/index.js';
import { systemActor } from '../../src/jsonapi/actor.js';
import { toWav } from '../../src/voice/codecs.js';
import { parseRtp } from '../../src/voice/rtp.js';
import type { VoiceRuntime } from '../../src/voice/runtime.js';
import { parseSip, type SipMessage } from '../../src/voice/sip-message.js';
import { freeUdpPort, until } from '../sip/harness.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant } from '../support/seed.js';
import { startVoiceRuntime } from './harness.js';

/** A speech provider: no words heard, and 10 s of a 440 Hz tone for anything said. */
function fakeSpeech(): http.Server {
  const tone = Int16Array.from({ length: 160_000 }, (_, i) => Math.round(8000 * Math.sin((2 * Math.PI * 440 * i) / 16000)));
  const wav = toWav(tone, 16000);
  return http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url?.endsWith('/audio/speech')) res.writeHead(200, { 'content-type': 'audio/wav' }).end(wav);
      else res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ text: '' }));
    });
  });
}

/** A minimal SIP caller over UDP (PCMU): INVITE, ACK, then requests in the dialog; counts the RTP it receives. */
async function caller(sipPort: number, agentId: string) {
  const sip = dgram.createSocket('udp4');
  const rtp = dgram.createSocket('udp4');
  await Promise.all([new Promise<void>((r) => sip.bind(0, '127.0.0.1', r)), new Promise<void>((r) => rtp.bind(0, '127.0.0.1', r))]);
  const received: SipMessage[] = [];
  let rtpPackets = 0;
  rtp.on('message', (data) => {
    if (parseRtp(data)?.payloadType === 0) rtpPackets++;
  });
  sip.on('message', (data) => {
    const msg = parseSip(data);
    received.push(msg);
    // The agent's BYE is answered (RFC 3261 15.1.2), so that the runtime's hang-up completes at once.
    if (msg.method === 'BYE') {
      const h = (name: string) => msg.headers.get(name)?.join(', ') ?? '';
      const ok = `SIP/2.0 200 OK\r\nVia: ${h('via')}\r\nFrom: ${h('from')}\r\nTo: ${h('to')}\r\nCall-ID: ${h('call-id')}\r\nCSeq: ${h('cseq')}\r\nContent-Length: 0\r\n\r\n`;
      sip.send(ok, sipPort, '127.0.0.1');
    }
  });
  const callId = `restart-${randomBytes(6).toString('hex')}`;
  const local = `127.0.0.1:${sip.address().port}`;
  let toTag = '';
  let seq = 1;
  const send = (method: string, extra = '', body = '') =>
    sip.send(
      `${method} sip:agent-${agentId}@127.0.0.1:${sipPort} SIP/2.0\r\nVia: SIP/2.0/UDP ${local};branch=z9hG4bK${randomBytes(6).toString('hex')};rport\r\n` +
        `From: <sip:caller@${local}>;tag=c1\r\nTo: <sip:agent-${agentId}@127.0.0.1>${toTag ? `;tag=${toTag}` : ''}\r\nCall-ID: ${callId}\r\n` +
        `CSeq: ${method === 'ACK' ? 1 : seq++} ${method}\r\nContact: <sip:caller@${local}>\r\nMax-Forwards: 70\r\n${extra}Content-Length: ${body.length}\r\n\r\n${body}`,
      sipPort,
      '127.0.0.1',
    );
  /** The response to the last request of `method` (its final status). */
  const response = (method: string) =>
    until(
      async () => received.find((m) => m.status !== undefined && m.status >= 200 && m.headers.get('cseq')?.[0] === `${seq - 1} ${method}`),
      `a final response to ${method}`,
    );
  const sdp = `v=0\r\no=c 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio ${rtp.address().port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n`;
  return {
    callId,
    received,
    get rtpPackets() {
      return rtpPackets;
    },
    async call() {
      send('INVITE', 'Content-Type: application/sdp\r\n', sdp);
      const ok = await response('INVITE');
      toTag = /tag=([^;]+)/.exec(ok.headers.get('to')?.[0] ?? '')?.[1] ?? '';
      if (ok.status === 200) send('ACK');
      return ok.status;
    },
    /** A request in the dialog; resolves with its final status. */
    async request(method: 'BYE' | 'OPTIONS') {
      send(method);
      return (await response(method)).status;
    },
    close() {
      sip.close();
      rtp.close();
    },
  };
}

describe.skipIf(!process.env.DATABASE_URL)('the voice runtime restarted mid-call', () => {
  let t: TestApp;
  let organisationId: string;
  let agentId: string;
  let voiceSettings: Partial<Config['voice']> & { sipPort: number; sttBaseUrl: string };
  let agents: AgentRuntime;
  const speech = fakeSpeech();

  beforeAll(async () => {
    t = await startTestApp();
    organisationId = (await seedTenant(t, 'Voice restart')).organisationId;
    const agent = await t.services.records!.create(systemActor(organisationId, 'test'), 'AiAgent', {
      name: 'Desk',
      published: true,
      workflow: {
        steps: [
          { type: 'message', text: 'Good morning, this is the order desk.' },
          { type: 'question', text: 'How can I help?', store_as: 'request' },
        ],
      },
    });
    agentId = agent.id;
    await new Promise<void>((resolve) => speech.listen(0, '127.0.0.1', resolve));
    const speechUrl = `http://127.0.0.1:${(speech.address() as AddressInfo).port}/v1`;
    // The runtime's settings: the same SIP port for the runtime started again after the one killed.
    voiceSettings = {
      sipPort: await freeUdpPort(),
      sttBaseUrl: speechUrl,
      sttApiKey: 'test',
      ttsBaseUrl: speechUrl,
      ttsApiKey: 'test',
    };
    agents = new AgentRuntime({ db: t.db, services: t.services, config: { ...t.config, agentPollMs: 50 }, listen: t.database.listen });
    agents.start();
  }, 60_000);

  afterAll(async () => {
    await agents?.stop();
    await t?.close();
    speech.closeAllConnections();
    speech.close();
  });

  /** The call's row, legs, conversation, items and transcript lines. */
  async function records(callUuid: string) {
    const call = await t.db.selectFrom('calls').selectAll().where('call_uuid', '=', callUuid).executeTakeFirstOrThrow();
    const legs = await t.db.selectFrom('call_participants').selectAll().where('call_id', '=', call.id).execute();
    const conversation = await t.db
      .selectFrom('conversations')
      .selectAll()
      .where('id', '=', call.conversation_id!)
      .executeTakeFirstOrThrow();
    const items = await t.db
      .selectFrom('conversation_items')
      .selectAll()
      .where('conversation_id', '=', conversation.id)
      .orderBy('content_index')
      .execute();
    const lines = await t.db.selectFrom('call_transcripts').selectAll().where('call_id', '=', call.id).execute();
    return { call, legs, conversation, items, lines };
  }

  it('stopped mid-greeting (SIGTERM): the caller gets a BYE, the call is completed, the cut greeting recorded as not spoken', async () => {
    const { voice } = await startVoiceRuntime(t, voiceSettings, agents);
    const phone = await caller(voiceSettings.sipPort, agentId);
    try {
      expect(await phone.call()).toBe(200);
      await until(async () => (phone.rtpPackets > 50 ? true : undefined), 'the greeting playing');
      await voice.stop();
      expect(phone.received.some((m) => m.method === 'BYE')).toBe(true);
      const { call, legs, conversation, items, lines } = await records(phone.callId);
      expect(call.status).toBe('completed');
      expect(call.ended_at).not.toBeNull();
      expect(legs.length).toBe(2);
      expect(legs.every((l) => l.left_at !== null)).toBe(true);
      expect(conversation.status).toBe('closed');
      expect(items.map((i) => i.role)).toEqual(['user', 'assistant']);
      expect(lines.map((l) => [l.speaker, (l.metadata as { spoken?: boolean }).spoken])).toEqual([['agent', false]]);
    } finally {
      phone.close();
      await voice.stop();
    }
  }, 60_000);

  it('killed mid-greeting (SIGKILL): started again, it ends the call as failed and answers the lost dialog with 481', async () => {
    const script = fileURLToPath(new URL('./runtime-process.ts', import.meta.url));
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      DATABASE_URL: t.config.databaseUrl,
      LOG_LEVEL: 'silent',
      VOICE_SIP_HOST: '127.0.0.1',
      VOICE_SIP_PORT: String(voiceSettings.sipPort),
      VOICE_SIP_TRUSTED: '127.0.0.1',
      VOICE_RTP_PORT_MIN: '0',
      VOICE_RTP_PORT_MAX: '0',
      STT_BASE_URL: voiceSettings.sttBaseUrl,
      STT_API_KEY: 'test',
      TTS_BASE_URL: voiceSettings.sttBaseUrl,
      TTS_API_KEY: 'test',
    };
    const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', script], {
      env,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const phone = await caller(voiceSettings.sipPort, agentId);
    let voice: VoiceRuntime | undefined;
    try {
      await new Promise((resolve, reject) => {
        child.once('message', resolve);
        child.once('exit', (code) => reject(new Error(`the voice runtime process exited (${code})`)));
      });
      expect(await phone.call()).toBe(200);
      await until(async () => (phone.rtpPackets > 50 ? true : undefined), 'the greeting playing');
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGKILL');
      await exited;
      const before = await records(phone.callId);
      expect(before.call.status).toBe('in_progress'); // a killed process records nothing more

      ({ voice } = await startVoiceRuntime(t, voiceSettings, agents));
      const { call, legs, conversation, items, lines } = await records(phone.callId);
      expect(call.status).toBe('failed');
      expect(call.ended_at).not.toBeNull();
      expect(legs.length).toBe(2);
      expect(legs.every((l) => l.left_at !== null)).toBe(true);
      expect(conversation.status).toBe('closed');
      // Nothing half written: the greeting's turn committed whole; no line claims it was heard.
      expect(items.map((i) => i.role)).toEqual(['user', 'assistant']);
      expect(lines).toEqual([]);
      // The caller's side ends too: the restarted runtime does not know the dialog.
      expect(await phone.request('OPTIONS')).toBe(481);
      expect(await phone.request('BYE')).toBe(481);
      // And it takes calls again.
      const next = await caller(voiceSettings.sipPort, agentId);
      try {
        expect(await next.call()).toBe(200);
        expect(await next.request('BYE')).toBe(200);
      } finally {
        next.close();
      }
    } finally {
      child.kill('SIGKILL');
      phone.close();
      await voice?.stop();
    }
  }, 90_000);
});
