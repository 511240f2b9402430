/**
 * Calls between people transcribed per leg, end to end: the SIP edge (Kamailio, rtpengine) relays a call between
 * two registered SIPp phones; each phone's voice (festival sentences, encoded by the test and sent from the socket
 * its SDP names) reaches rtpengine, which forks each leg to the transcriber (src/voice/transcriber.ts) over `subscribe
 * request`/`subscribe answer`; the transcriber endpoints, recognises (local pocketsphinx) and writes CallTranscripts
 * with the leg's speaker while the call runs. With the organisation's `transcribe_calls` off nothing is forked.
 * PostgreSQL, Kamailio, SIPp, rtpengine, festival and pocketsphinx (skipped, with the reason, without).
 */
import dgram from 'node:dgram';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NgAnswer } from '../../src/sip/rtpengine.js';
import { type CodecName, createCodec } from '../../src/voice/codecs.js';
import { RtpSender } from '../../src/voice/rtp.js';
import { PocketsphinxStt } from '../../src/voice/stt.js';
import { CallTranscriber } from '../../src/voice/transcriber.js';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import { concat, festival, haveProgram, PAYLOAD_TYPES, silence, wordsHeard } from '../voice/harness.js';
import { freeUdpPort, register, type SipStack, sipp, sipSkipReason, startSipStack, until } from './harness.js';

const skip =
  sipSkipReason() ??
  (['text2wave', 'pocketsphinx_continuous'].some((p) => !haveProgram(p))
    ? 'festival (text2wave) or pocketsphinx_continuous not installed (Debian: festival pocketsphinx pocketsphinx-en-us)'
    : undefined);
if (skip) console.warn(`per-leg transcription tests skipped: ${skip}`);

const CALLER_SAYS = 'I would like to check my order status please';
const CALLEE_SAYS = 'Your order will arrive tomorrow morning';

/** A phone's audio socket: what it receives is ignored; it sends the phone's voice. */
async function phoneSocket() {
  const socket = dgram.createSocket('udp4');
  socket.on('message', () => {});
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  return { socket, port: socket.address().port, close: () => new Promise<void>((resolve) => socket.close(() => resolve())) };
}

/** Sends `pcm` (16 kHz) as RTP in `codec`, one packet per 20 ms on a clock (not drifting with the timers). */
async function speak(socket: dgram.Socket, port: number, codec: CodecName, pcm: Int16Array): Promise<void> {
  const encoder = createCodec(codec);
  const sender = new RtpSender(PAYLOAD_TYPES[codec]);
  const start = performance.now();
  for (let i = 0, n = 0; i + 320 <= pcm.length; i += 320, n++) {
    const wait = start + n * 20 - performance.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    socket.send(sender.next(encoder.encode(pcm.subarray(i, i + 320)), 160), port, '127.0.0.1');
  }
}

/** rtpengine's local port facing the phone whose audio socket is `phonePort` (ng `query`). */
function portFacing(answer: NgAnswer, phonePort: number): number | undefined {
  const tags = (answer.tags ?? {}) as Record<string, { medias?: { streams?: Record<string, unknown>[] }[] }>;
  for (const tag of Object.values(tags))
    for (const media of tag.medias ?? [])
      for (const stream of media.streams ?? [])
        if ((stream.endpoint as { port?: number } | undefined)?.port === phonePort) return Number(stream['local port']);
  return undefined;
}

describe.skipIf(skip !== undefined)('calls between people transcribed per leg (rtpengine forks, Kamailio, SIPp)', () => {
  let t: TestApp;
  let tenant: Tenant;
  let admin: Client;
  let stack: SipStack;
  let transcriber: CallTranscriber;
  let unobserve: () => unknown;
  let n = 0;
  const cleanup: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    t = await startTestApp();
    tenant = await seedTenant(t, 'Transcribe');
    admin = client(t.app, tenant.admin.token);
    // No in-dialog keep-alive OPTIONS during the long calls: the SIPp phones do not answer them.
    stack = await startSipStack(t, { SIP_KEEPALIVE_SECONDS: '600' });
    unobserve = startTranscriber();
  }, 60_000);

  /** A transcriber following the edge's call events, as `sip serve` starts it (again, after a restart). */
  function startTranscriber() {
    transcriber = new CallTranscriber({
      db: t.db,
      records: t.services.records!,
      stt: new PocketsphinxStt(),
      ng: stack.edge.rtpengine.ng,
      address: stack.edge.rtpengine.media.address,
      endpointMs: 600,
      maxUtteranceMs: 15_000,
    });
    const unobserve = stack.edge.events.observe(transcriber.onCallEvents);
    transcriber.start();
    return unobserve;
  }
  afterAll(async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
    await transcriber?.stop();
    await stack?.stop();
    await t?.close();
  });

  async function sipUser(userId?: string) {
    const name = `f${Date.now().toString(36)}${n++}`;
    const password = `pw-${name}-secret`;
    const response = await admin.post(
      '/api/sip_users',
      resourceDocument('SipUser', { sip_username: name, sip_password: password, ...(userId ? { user_id: userId } : {}) }),
    );
    expect(response.status).toBe(201);
    return { id: response.body.data.id as string, name, password };
  }

  /**
   * A call from a new phone to `callee` offering `codec` on both sides; while it is up, `during` runs with the
   * Call and rtpengine's ports facing each phone. The caller hangs up after `holdMs`.
   */
  async function call(
    codec: CodecName,
    callee: { name: string; password: string },
    holdMs: number,
    during: (c: { callId: string; callRowId: string; caller: PhoneAudio; callee: PhoneAudio }) => Promise<void>,
  ) {
    const caller = await sipUser();
    const callerAudio = await phoneSocket();
    const calleeAudio = await phoneSocket();
    cleanup.push(callerAudio.close, calleeAudio.close);
    const calleePort = await freeUdpPort();
    expect((await register(stack, callee.name, callee.password, calleePort)).code).toBe(0);
    const keys = { pt: String(PAYLOAD_TYPES[codec]), codec };
    const answering = sipp('fork_callee', undefined, {
      localPort: calleePort,
      keys: { ...keys, mport: String(calleeAudio.port) },
      timeoutSeconds: 120,
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const placing = sipp('fork_caller', stack.port, {
      localPort: await freeUdpPort(),
      keys: { ...keys, from: caller.name, mport: String(callerAudio.port) },
      timeoutSeconds: 120,
      args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password, '-d', String(holdMs)],
    });
    const row = await until(async () => {
      const r = await t.db
        .selectFrom('calls')
        .select(['id', 'status', 'call_uuid'])
        .where('organisation_id', '=', tenant.organisationId)
        .where('from_number', '=', caller.name)
        .executeTakeFirst();
      return r?.status === 'in_progress' ? r : undefined;
    }, 'the call to be answered');
    const callId = row.call_uuid as string;
    const ports = await until(async () => {
      const answer = await stack.edge.rtpengine.ng('query', { 'call-id': callId });
      const a = portFacing(answer, callerAudio.port);
      const b = portFacing(answer, calleeAudio.port);
      return a && b ? { a, b } : undefined;
    }, "rtpengine's ports facing the phones");
    await during({
      callId,
      callRowId: row.id,
      caller: { socket: callerAudio.socket, port: ports.a },
      callee: { socket: calleeAudio.socket, port: ports.b },
    });
    const [placed, answered] = await Promise.all([placing, answering]);
    // SIPp's own overload warnings (its timers late on a loaded machine) are not errors of the call.
    const errors = (placed.errors + answered.errors)
      .split('\n')
      .map((line) => line.replace(/The following events occurred:/g, '').trim())
      .filter((line) => line && !/Overload warning: the (minor|major) watchdog timer/.test(line));
    expect(errors).toEqual([]);
    expect(placed.code).toBe(0);
    expect(answered.code).toBe(0);
    return { callId, callRowId: row.id };
  }

  interface PhoneAudio {
    socket: dgram.Socket;
    port: number;
  }

  const transcripts = (callRowId: string) =>
    t.db
      .selectFrom('call_transcripts')
      .select(['speaker', 'content', 'content_index', 'occurred_at', 'metadata', 'id'])
      .where('call_id', '=', callRowId)
      .orderBy('content_index')
      .execute();

  const callStatus = async (callRowId: string) =>
    (await t.db.selectFrom('calls').select('status').where('id', '=', callRowId).executeTakeFirstOrThrow()).status;

  /** Each of `speakers` has a line written before the call ended: transcribed live, not after the fact. */
  async function writtenWhileRunning(callRowId: string, speakers: string[]) {
    const ended = await until(async () => {
      const row = await t.db.selectFrom('calls').select(['status', 'ended_at']).where('id', '=', callRowId).executeTakeFirstOrThrow();
      return row.status === 'completed' && row.ended_at ? row.ended_at : undefined;
    }, 'the call to be completed');
    const rows = await t.db.selectFrom('call_transcripts').select(['speaker', 'created_at']).where('call_id', '=', callRowId).execute();
    for (const speaker of speakers)
      expect(
        rows.some((r) => r.speaker === speaker && r.created_at < ended),
        `${speaker} before ${ended.toISOString()}: ${JSON.stringify(rows)}`,
      ).toBe(true);
  }

  it('a phone-to-phone call over G.722: each leg is forked, recognised and written with its speaker while the call runs', async () => {
    const calleePhone = await sipUser();
    const { callId, callRowId } = await call('G722', calleePhone, 75_000, async (c) => {
      // Both legs are forked: two subscriptions of ours in rtpengine's session beside the two phones.
      await until(async () => {
        const fork = transcriber.active().find((f) => f.callId === c.callId);
        return fork?.legs.length === 2 ? fork : undefined;
      }, 'the fork of both legs');
      const tags = Object.keys((await stack.edge.rtpengine.ng('query', { 'call-id': c.callId })).tags as object);
      expect(tags.filter((tag) => tag.startsWith('parley-fork-')).length).toBe(2);
      // The caller speaks, then the callee answers.
      await speak(c.caller.socket, c.caller.port, 'G722', concat(silence(400), festival(CALLER_SAYS), silence(1000)));
      await speak(c.callee.socket, c.callee.port, 'G722', concat(festival(CALLEE_SAYS), silence(1000)));
      const lines = await until(
        async () => {
          const rows = await transcripts(c.callRowId);
          return rows.some((r) => r.speaker === 'caller') && rows.some((r) => r.speaker === 'callee') ? rows : undefined;
        },
        'a transcript of each leg',
        70_000,
      );
      // Published as CallTranscript.created events (written before the call ended: checked after it).
      const events = await t.db
        .selectFrom('events')
        .select(['type', 'data'])
        .where('organisation_id', '=', tenant.organisationId)
        .where('type', '=', 'CallTranscript.created')
        .execute();
      for (const line of lines) expect(events.some((e) => JSON.stringify(e.data).includes(line.id))).toBe(true);
    });

    await writtenWhileRunning(callRowId, ['caller', 'callee']);
    const lines = await transcripts(callRowId);
    expect(lines.map((l) => l.content_index)).toEqual(lines.map((_, i) => i));
    const caller = lines.filter((l) => l.speaker === 'caller');
    const callee = lines.filter((l) => l.speaker === 'callee');
    expect(lines.every((l) => l.speaker === 'caller' || l.speaker === 'callee')).toBe(true);
    // Wideband audio: the local recogniser gets the words (a word or two may go wrong).
    const heardCaller = caller.map((l) => l.content).join(' ');
    const heardCallee = callee.map((l) => l.content).join(' ');
    expect(wordsHeard(heardCaller, ['would', 'like', 'check', 'order', 'status', 'please']).length, heardCaller).toBeGreaterThanOrEqual(3);
    expect(wordsHeard(heardCallee, ['your', 'order', 'will', 'arrive', 'tomorrow', 'morning']).length, heardCallee).toBeGreaterThanOrEqual(
      3,
    );
    // The caller spoke first: its line comes first in the call's order.
    expect(lines[0].speaker).toBe('caller');
    expect(caller[0].metadata).toMatchObject({ leg: 'caller', source: 'fork', codec: 'G722', stt: 'pocketsphinx' });
    expect(callee[0].metadata).toMatchObject({ leg: 'callee', source: 'fork', codec: 'G722', sip_user_id: calleePhone.id });
    // Over the API too.
    const listed = await admin.get(`/api/call_transcripts?filter[call_id]=${callRowId}&sort=content_index`);
    expect(listed.status).toBe(200);
    expect(listed.body.data.map((d: { attributes: { speaker: string } }) => d.attributes.speaker)).toEqual(lines.map((l) => l.speaker));

    // The call ended: the fork stopped and rtpengine's session is gone with our subscriptions.
    await until(async () => (transcriber.active().some((f) => f.callId === callId) ? undefined : true), 'the fork to stop');
    await until(
      async () => ((await stack.edge.rtpengine.ng('query', { 'call-id': callId })).result === 'error' ? true : undefined),
      "rtpengine's session to be deleted",
    );
  }, 200_000);

  it('the transcriber restarted mid-call: the utterance under way is written, the call goes on and is recorded, the new one does not fork it', async () => {
    const calleePhone = await sipUser();
    let restarted = false;
    const media = { before: 0, after: 0 };
    const { callId, callRowId } = await call('G722', calleePhone, 30_000, async (c) => {
      await until(async () => (transcriber.active().find((f) => f.callId === c.callId)?.legs.length === 2 ? true : undefined), 'the fork');
      c.caller.socket.on('message', () => {
        media[restarted ? 'after' : 'before']++;
      });
      // The callee says something first (quiet), so that rtpengine sends to both phones from now on.
      await speak(c.callee.socket, c.callee.port, 'G722', silence(1000));
      // The caller is mid-sentence when `sip serve` stops the transcriber (SIGTERM) and starts it again.
      const speaking = speak(c.caller.socket, c.caller.port, 'G722', concat(silence(400), festival(CALLER_SAYS), festival(CALLER_SAYS)));
      await new Promise((resolve) => setTimeout(resolve, 2500));
      await transcriber.stop();
      restarted = true;
      unobserve();
      unobserve = startTranscriber();
      // rtpengine's session goes on with the phones' legs (our subscriptions were ended, not the session).
      const tags = Object.keys((await stack.edge.rtpengine.ng('query', { 'call-id': c.callId })).tags ?? {});
      expect(tags.filter((tag) => !tag.startsWith('parley-fork-')).length).toBe(2);
      await speaking;
      await speak(c.callee.socket, c.callee.port, 'G722', concat(festival(CALLEE_SAYS), silence(1000)));
      // The call's media still flows between the phones: the caller hears the callee, who spoke after the restart
      // (rtpengine sends to a phone once it has heard from it: the caller spoke first).
      expect(media.before, JSON.stringify(media)).toBeGreaterThan(10);
      expect(media.after, JSON.stringify(media)).toBeGreaterThan(25);
      // The call up before this start is not forked by it (the fork starts on the answer's event).
      expect(transcriber.active().some((f) => f.callId === c.callId)).toBe(false);
    });
    await until(async () => ((await callStatus(callRowId)) === 'completed' ? true : undefined), 'the call to be completed');
    const lines = await transcripts(callRowId);
    // The stop wrote the caller's utterance under way, marked as cut there; nothing of the callee, who spoke after the
    // restart; one order, no gaps.
    expect(lines.length).toBeGreaterThan(0);
    expect(lines.every((l) => l.speaker === 'caller')).toBe(true);
    expect(lines.map((l) => l.content_index)).toEqual(lines.map((_, i) => i));
    expect(lines.at(-1)?.metadata).toMatchObject({ leg: 'caller', source: 'fork', cut: 'transcriber_stopped' });
    const heard = lines.map((l) => l.content).join(' ');
    expect(wordsHeard(heard, ['would', 'like', 'check', 'order', 'status', 'please']).length, heard).toBeGreaterThanOrEqual(2);
    await until(
      async () => ((await stack.edge.rtpengine.ng('query', { 'call-id': callId })).result === 'error' ? true : undefined),
      "rtpengine's session to be deleted",
    );
  }, 200_000);

  it("a call answered by an operator's phone over G.711: the answering leg's speaker is `operator`", async () => {
    const operatorPhone = await sipUser(tenant.operator.id);
    const { callRowId } = await call('PCMU', operatorPhone, 75_000, async (c) => {
      await until(async () => (transcriber.active().find((f) => f.callId === c.callId)?.legs.length === 2 ? true : undefined), 'the fork');
      await speak(c.caller.socket, c.caller.port, 'PCMU', concat(silence(400), festival(CALLER_SAYS), silence(1000)));
      await speak(c.callee.socket, c.callee.port, 'PCMU', concat(festival(CALLEE_SAYS), silence(1000)));
      await until(
        async () => {
          const rows = await transcripts(c.callRowId);
          return rows.some((r) => r.speaker === 'caller') && rows.some((r) => r.speaker === 'operator') ? rows : undefined;
        },
        'a transcript of each leg',
        70_000,
      );
    });
    await writtenWhileRunning(callRowId, ['caller', 'operator']);
    const lines = await transcripts(callRowId);
    // Narrowband audio: recognition is poor, but each leg has lines with words in them.
    expect(new Set(lines.map((l) => l.speaker))).toEqual(new Set(['caller', 'operator']));
    for (const line of lines) expect(line.content.trim()).not.toBe('');
    expect(lines.find((l) => l.speaker === 'operator')?.metadata).toMatchObject({
      leg: 'callee',
      codec: 'PCMU',
      sip_user_id: operatorPhone.id,
    });
  }, 200_000);

  it("with the organisation's transcribe_calls off, nothing is forked and nothing is written", async () => {
    const off = await admin.patch(
      `/api/organisations/${tenant.organisationId}`,
      resourceDocument('Organisation', { transcribe_calls: false }, tenant.organisationId),
    );
    expect(off.status).toBe(200);
    expect(off.body.data.attributes.transcribe_calls).toBe(false);
    try {
      const callee = await sipUser();
      const { callRowId } = await call('G722', callee, 12_000, async (c) => {
        await speak(c.caller.socket, c.caller.port, 'G722', concat(silence(400), festival(CALLER_SAYS), silence(1000)));
        // rtpengine's session holds the two phones only.
        const tags = Object.keys((await stack.edge.rtpengine.ng('query', { 'call-id': c.callId })).tags as object);
        expect(tags.filter((tag) => tag.startsWith('parley-fork-'))).toEqual([]);
        expect(transcriber.active().some((f) => f.callId === c.callId)).toBe(false);
      });
      // The whole call has passed (speech, silence, hang-up): no line.
      await until(async () => ((await callStatus(callRowId)) === 'completed' ? true : undefined), 'the call to end');
      expect(await transcripts(callRowId)).toEqual([]);
    } finally {
      await admin.patch(
        `/api/organisations/${tenant.organisationId}`,
        resourceDocument('Organisation', { transcribe_calls: true }, tenant.organisationId),
      );
    }
  }, 120_000);
});
