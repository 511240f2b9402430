/**
 * Calls between people transcribed live, per leg (docs/voice.md, "Calls between people", which also says why
 * Parley speaks rtpengine's ng protocol itself; CONTRACT section 14). rtpengine, which anchors every call the edge
 * relays, sends a copy of each party's audio to a port of ours (`subscribe request`/`answer`, an RFC 3264
 * offer/answer per leg, so the port tells who speaks); it is endpointed by the agent calls' detector (vad.ts),
 * recognised (stt.ts), and written as `CallTranscript`s through the records service (system actor, source `sip`).
 * Calls answered by an AI agent are transcribed by the voice runtime itself (runtime.ts) and are not forked.
 */
import { randomUUID } from 'node:crypto';
import type { Socket } from 'node:dgram';
import { availableParallelism } from 'node:os';
import { sql } from 'kysely';
import type { Logger } from 'pino';
import type { Db } from '../db/schema.js';
import { systemActor } from '../jsonapi/actor.js';
import type { Records } from '../jsonapi/records.js';
import type { WriteValues } from '../jsonapi/typed-writes.js';
import type { CallEvent } from '../sip/call-events.js';
import type { Bencoded, NgAnswer } from '../sip/rtpengine.js';
import { type CodecName, createCodec, FRAME_MS, FRAME_SAMPLES, type FrameCodec } from './codecs.js';
import { bindRtp, parseRtp } from './rtp.js';
import { buildAnswer, CODEC_PREFERENCE, negotiate, type Negotiated, parseOffer, type SdpOffer } from './sdp.js';
import type { SpeechToText } from './stt.js';
import { Vad } from './vad.js';

export type LegSpeaker = 'caller' | 'callee' | 'operator';

export interface CallTranscriberOptions {
  db: Db;
  records: Records;
  stt: SpeechToText;
  /** One ng command to the rtpengine that anchors the calls (`sip serve`'s: `edge.rtpengine.ng`). */
  ng: (command: string, args?: Record<string, Bencoded>) => Promise<NgAnswer>;
  /** The address forks are received on: rtpengine's media address (both run on the `sip serve` host). */
  address: string;
  endpointMs: number;
  maxUtteranceMs: number;
  logger?: Logger;
  /**
   * Whether one more fork fits in VOICE_MAX_CALLS (`sip serve`: agent calls and forks share the runtime's capacity,
   * one fork counting as one call). A fork past it is declined: the call goes on untranscribed, never refused.
   */
  room?: () => boolean;
}

/** One party's forked audio. */
interface Leg {
  speaker: LegSpeaker;
  /** The party's SIP tag (rtpengine's monologue) and the subscription's tag (ours). */
  tag: string;
  forkTag: string;
  rtp: Socket;
  rtcp?: Socket;
  codecs: Map<number, FrameCodec>;
  vad: Vad;
  /** Wall-clock time the current utterance started (occurred_at). */
  speechStartedAt?: Date;
  metadata: Record<string, unknown>;
  packets: number;
}

/** Who a leg is, before its subscription. */
type Party = Pick<Leg, 'speaker' | 'tag' | 'metadata'>;

/** One SIP dialog whose legs are forked. */
interface Fork {
  key: string;
  organisationId: string;
  /** The dialog's SIP Call-ID (rtpengine's call-id): the call's, or a transfer leg's own. */
  dialogCallId: string;
  /** The Call the transcripts belong to (its row id). */
  callRowId?: string;
  legs: Leg[];
  starting?: Promise<void>;
  stopped: boolean;
}

/** Follows the edge's call events (`CallEvents.observe`) and keeps one fork per answered dialog between people. */
export class CallTranscriber {
  private readonly forks = new Map<string, Fork>();
  /** Per Call (row id): transcript writes in utterance order, so `content_index` follows the conversation. */
  private readonly writeChains = new Map<string, Promise<void>>();
  private readonly pending = new Set<Promise<unknown>>();
  private sweepTimer?: NodeJS.Timeout;
  private closed = false;
  private recognising = 0;
  private readonly waiting: (() => void)[] = [];
  /**
   * Recognitions run at once, across calls (the rest wait their turn): the local recogniser is a process per
   * utterance, so one per core; a provider is a request, so 32.
   */
  private readonly maxRecognitions: number;

  constructor(private readonly o: CallTranscriberOptions) {
    this.maxRecognitions = o.stt.name === 'pocketsphinx' ? availableParallelism() : 32;
  }

  /** Recognises one utterance when a slot is free (maxRecognitions at once). */
  private async recognise(audio: Int16Array): Promise<string> {
    // A waiter is handed the slot of the recognition that ends (the count stays), so none is taken twice.
    if (this.recognising >= this.maxRecognitions) await new Promise<void>((resolve) => this.waiting.push(resolve));
    else this.recognising++;
    try {
      return await this.o.stt.transcribe(audio);
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.recognising--;
    }
  }

  start(): void {
    this.sweepTimer = setInterval(() => void this.sweep().catch(() => {}), 30_000).unref();
  }

  /** Stops every fork (their last utterances are still transcribed and written). */
  async stop(): Promise<void> {
    this.closed = true;
    clearInterval(this.sweepTimer);
    await Promise.all([...this.forks.values()].map((f) => this.stopFork(f, 'transcriber_stopped')));
    await Promise.all([...this.pending]);
    await Promise.all([...this.writeChains.values()]);
  }

  /** How many calls are forked (or being set up): what they take of VOICE_MAX_CALLS. */
  get forking(): number {
    return this.forks.size;
  }

  /** The forks in progress: dialog Call-ID and each leg's speaker and port (diagnostics, tests). */
  active(): { callId: string; legs: { speaker: LegSpeaker; port: number; packets: number }[] }[] {
    return [...this.forks.values()].map((f) => ({
      callId: f.dialogCallId,
      legs: f.legs.map((l) => ({ speaker: l.speaker, port: l.rtp.address().port, packets: l.packets })),
    }));
  }

  /** A batch of one call's events, applied (CallEvents.observe). */
  onCallEvents = (events: CallEvent[]): void => {
    if (this.closed) return;
    for (const event of events) {
      // An agent's call is the voice runtime's: it transcribes both sides itself.
      if (event.ai_agent_id && !event.leg) continue;
      const dialogCallId = event.leg ?? event.call_id;
      const key = `${event.organisation_id}/${dialogCallId}`;
      if (event.event === 'answered') {
        if (this.forks.has(key)) continue;
        // A batch that also holds the dialog's end is a call already over: nothing to fork.
        if (events.some((e) => e.event === 'ended' && (e.leg ?? e.call_id) === dialogCallId)) continue;
        if (this.o.room && !this.o.room()) {
          this.o.logger?.warn({ callId: dialogCallId }, 'transcriber: VOICE_MAX_CALLS reached; the call is not transcribed');
          continue;
        }
        const fork: Fork = { key, organisationId: event.organisation_id, dialogCallId, legs: [], stopped: false };
        this.forks.set(key, fork);
        fork.starting = this.track(
          this.startFork(fork, event).catch((error) => {
            this.o.logger?.warn({ err: error, callId: dialogCallId }, 'transcriber: the call is not transcribed');
            void this.stopFork(fork, 'fork_failed');
          }),
        );
      } else if (event.event === 'ended') {
        // (Not `failed`: after the answer that is another branch's failure, and the call goes on.)
        const fork = this.forks.get(key);
        if (fork) void this.track(this.stopFork(fork));
        // Not forked here: a previous run's subscriptions (unsubscribed at its stop) may still hold rtpengine's
        // session after Kamailio's delete; the dialog is over, so the session goes (unknown: already gone, fine).
        else void this.track(this.o.ng('delete', { 'call-id': dialogCallId }).catch(() => undefined));
      }
    }
  };

  private track<T>(work: Promise<T>): Promise<T> {
    this.pending.add(work);
    void work.finally(() => this.pending.delete(work)).catch(() => {});
    return work;
  }

  // ------------------------------------------------------------ forking

  private async startFork(fork: Fork, event: CallEvent): Promise<void> {
    const org = await this.o.db
      .selectFrom('organisations')
      .select('transcribe_calls')
      .where('id', '=', event.organisation_id)
      .executeTakeFirst();
    if (!org?.transcribe_calls) {
      this.forks.delete(fork.key);
      return;
    }
    const call = await this.o.db
      .selectFrom('calls')
      .select(['id'])
      .where('organisation_id', '=', event.organisation_id)
      .where('call_uuid', '=', event.call_id)
      .executeTakeFirst();
    if (!call) throw new Error(`no Call for ${event.call_id}`);
    fork.callRowId = call.id;
    const tags = await this.dialogTags(fork.dialogCallId);
    if (!tags) throw new Error('the dialog has no SIP tags in sip_dialogs');
    // The answering party is an operator when its SIP user belongs to a user of the organisation.
    const calleeId = event.callee_sip_user_id;
    const operator = calleeId
      ? await this.o.db.selectFrom('sip_users').select('user_id').where('id', '=', calleeId).executeTakeFirst()
      : undefined;
    const parties: Party[] = [
      {
        speaker: 'caller',
        tag: tags.from,
        metadata: { leg: 'caller', ...(event.caller_sip_user_id ? { sip_user_id: event.caller_sip_user_id } : { from: event.from }) },
      },
      {
        speaker: operator?.user_id ? 'operator' : 'callee',
        tag: tags.to,
        metadata: { leg: 'callee', ...(calleeId ? { sip_user_id: calleeId } : { to: event.to }) },
      },
    ];
    for (const party of parties) {
      if (fork.stopped) return;
      fork.legs.push(await this.subscribe(fork, party));
    }
    this.o.logger?.info(
      { callId: fork.dialogCallId, legs: fork.legs.map((l) => `${l.speaker}:${l.rtp.address().port}`) },
      'transcriber: forking the call',
    );
  }

  /**
   * The caller's and the answering party's SIP tags (rtpengine knows the parties by them), from Kamailio's dialog,
   * which it writes every second (db_mode 2): the row may come a moment after the answer's event.
   */
  private async dialogTags(callId: string): Promise<{ from: string; to: string } | undefined> {
    const deadline = Date.now() + 5000;
    for (;;) {
      const row = await this.o.db
        .selectFrom('sip_dialogs')
        .select(['from_tag', 'to_tag'])
        .where('callid', '=', callId)
        .where('to_tag', '<>', '')
        .orderBy('id', 'desc')
        .executeTakeFirst();
      if (row) return { from: row.from_tag, to: row.to_tag };
      if (Date.now() > deadline) return undefined;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  /** One leg: `subscribe request` for the party's media, a port of ours, `subscribe answer` naming it. */
  private async subscribe(fork: Fork, party: Party): Promise<Leg> {
    const forkTag = `parley-fork-${party.speaker}-${randomUUID()}`;
    const request = await this.o.ng('subscribe request', {
      'call-id': fork.dialogCallId,
      'from-tag': party.tag,
      'to-tag': forkTag,
      // Plain RTP to us whatever the party speaks (a browser's DTLS-SRTP, ICE and rtcp-mux undone, as towards a
      // phone: docs/sip.md "Flags"); G.722 added to the offer so that a codec we do not decode (Opus) is
      // transcoded to wideband rather than refused.
      flags: ['trust-address'],
      'transport-protocol': 'RTP/AVP',
      ICE: 'remove',
      DTLS: 'off',
      'rtcp-mux': ['demux'],
      codec: { transcode: ['G722'] },
    });
    if (request.result !== 'ok' || typeof request.sdp !== 'string')
      throw new Error(`rtpengine refused the subscription to the ${party.speaker}: ${String(request['error-reason'] ?? request.result)}`);
    const offer = parseOffer(request.sdp);
    const negotiated = forkCodec(offer);
    if (!negotiated) throw new Error(`no codec to receive the ${party.speaker}'s audio in: ${request.sdp}`);
    const { rtp, rtcp } = await bindRtp(this.o.address, { min: 0, max: 0, rtcp: true });
    const leg: Leg = {
      ...party,
      forkTag,
      rtp,
      rtcp,
      codecs: new Map([[negotiated.pt, createCodec(negotiated.codec)]]),
      vad: new Vad({ maxUtteranceMs: this.o.maxUtteranceMs, hangoverMs: this.o.endpointMs }),
      metadata: { ...party.metadata, codec: negotiated.codec },
      packets: 0,
    };
    rtcp?.on('message', () => {}); // RTCP reports are not used
    rtp.on('message', (data) => this.onRtp(fork, leg, data));
    try {
      const answer = await this.o.ng('subscribe answer', {
        'call-id': fork.dialogCallId,
        'to-tag': forkTag,
        sdp: buildAnswer({
          address: this.o.address,
          port: rtp.address().port,
          sessionId: String(Date.now()),
          negotiated,
          direction: offer.direction,
        }),
        // The answer takes one codec: what the party sends is passed through when it is that one, else transcoded.
        flags: ['trust-address', 'allow-transcoding'],
      });
      if (answer.result !== 'ok') throw new Error(`rtpengine refused the answer: ${String(answer['error-reason'] ?? answer.result)}`);
    } catch (error) {
      closeLeg(leg);
      throw error;
    }
    return leg;
  }

  /** Ends a fork; `reason` marks the utterance it cuts short (the call ended, or the transcriber stopped before it). */
  private async stopFork(fork: Fork, reason = 'call_ended'): Promise<void> {
    if (fork.stopped) return;
    fork.stopped = true;
    await fork.starting?.catch(() => {});
    this.forks.delete(fork.key);
    for (const leg of fork.legs) {
      // The utterance under way when the call ended is transcribed too.
      this.finishUtterance(fork, leg, reason);
      closeLeg(leg);
    }
    // Our subscriptions keep rtpengine's session alive after Kamailio deleted the dialog's (at the BYE):
    // deleting them lets it go. Unknown by now (the session already gone) is fine. A call that goes on (the
    // transcriber stopped) is unsubscribed from instead: a `delete` there ended the whole session, and with it the
    // phones' media (found by test/sip/transcribe.test.ts).
    for (const leg of fork.legs) {
      const [command, tag] = reason === 'call_ended' ? ['delete', 'from-tag'] : ['unsubscribe', 'to-tag'];
      await this.o.ng(command, { 'call-id': fork.dialogCallId, [tag]: leg.forkTag }).catch(() => undefined);
    }
    this.o.logger?.info(
      { callId: fork.dialogCallId, packets: fork.legs.map((l) => `${l.speaker}:${l.packets}`) },
      'transcriber: fork ended',
    );
  }

  /** Forks of calls that ended without their event reaching here (reconciliation ends calls too). */
  private async sweep(): Promise<void> {
    for (const fork of [...this.forks.values()]) {
      if (!fork.callRowId) continue;
      const row = await this.o.db.selectFrom('calls').select('status').where('id', '=', fork.callRowId).executeTakeFirst();
      if (!row || !['initiated', 'ringing', 'in_progress'].includes(row.status)) await this.stopFork(fork);
    }
  }

  // ------------------------------------------------------------ audio

  private onRtp(fork: Fork, leg: Leg, data: Buffer): void {
    if (fork.stopped) return;
    const packet = parseRtp(data);
    if (!packet) return;
    const codec = leg.codecs.get(packet.payloadType);
    if (!codec) return; // telephone-event, comfort noise: not speech
    leg.packets++;
    const pcm = codec.decode(packet.payload);
    for (let i = 0; i + FRAME_SAMPLES <= pcm.length; i += FRAME_SAMPLES) {
      for (const event of leg.vad.push(pcm.subarray(i, i + FRAME_SAMPLES))) {
        // The frames before the start rule fired (3 of them) and the pre-roll are part of the utterance.
        if (event.type === 'speech_start') leg.speechStartedAt = new Date(Date.now() - 3 * FRAME_MS);
        else this.utterance(fork, leg, event.audio, event.reason);
      }
    }
  }

  /** Ends an utterance still under way (the call ended, or the transcriber stopped, mid-sentence). */
  private finishUtterance(fork: Fork, leg: Leg, reason: string): void {
    if (!leg.vad.inSpeech) return;
    // Enough quiet frames to close it: the hangover's worth.
    const quiet = new Int16Array(FRAME_SAMPLES);
    for (let n = 0; n * FRAME_MS <= this.o.endpointMs && leg.vad.inSpeech; n++) {
      for (const event of leg.vad.push(quiet)) if (event.type === 'speech_end') this.utterance(fork, leg, event.audio, reason);
    }
  }

  /**
   * A finished utterance: recognised at once (both legs' in parallel, up to maxRecognitions across calls),
   * written in the order the utterances ended, so the call's `content_index` follows the conversation whichever recognition ends first.
   */
  private utterance(fork: Fork, leg: Leg, audio: Int16Array, reason: string): void {
    const callRowId = fork.callRowId;
    if (!callRowId) return;
    const occurredAt = leg.speechStartedAt ?? new Date();
    leg.speechStartedAt = undefined;
    const text = this.recognise(audio).then(
      (t) => ({ text: t.trim() }),
      (error: unknown) => ({ text: '', error: error instanceof Error ? error.message : String(error) }),
    );
    const next = (this.writeChains.get(callRowId) ?? Promise.resolve()).then(async () => {
      const result = await text;
      if ('error' in result) {
        this.o.logger?.warn({ callId: fork.dialogCallId, speaker: leg.speaker, error: result.error }, 'transcriber: speech-to-text failed');
        return;
      }
      // Noise, a cough: nothing recognised, no line.
      if (!result.text) return;
      await this.write(fork, {
        call_id: callRowId,
        speaker: leg.speaker,
        content: result.text.slice(0, 32 * 1024),
        occurred_at: occurredAt,
        metadata: {
          ...leg.metadata,
          source: 'fork',
          stt: this.o.stt.name,
          duration_ms: Math.round((audio.length / 16000) * 1000),
          ...(reason === 'silence' ? {} : { cut: reason }),
        },
      });
    });
    const chained = next.catch((error) =>
      this.o.logger?.error({ err: error, callId: fork.dialogCallId }, 'transcriber: writing a line failed'),
    );
    this.writeChains.set(callRowId, chained);
    void chained.finally(() => {
      if (this.writeChains.get(callRowId) === chained) this.writeChains.delete(callRowId);
    });
  }

  /** One line, next in the call's `content_index` (an index another writer took meanwhile: the next one). */
  private async write(fork: Fork, line: WriteValues<'CallTranscript'> & { call_id: string }): Promise<void> {
    const actor = systemActor(fork.organisationId, 'sip');
    for (let attempt = 0; ; attempt++) {
      const { rows } = await sql<{ next: number }>`
        SELECT coalesce(max(content_index) + 1, 0)::int AS next FROM call_transcripts WHERE call_id = ${line.call_id}`.execute(this.o.db);
      try {
        await this.o.records.create(actor, 'CallTranscript', {
          ...line,
          item_id: `fork_${randomUUID().replaceAll('-', '')}`,
          content_index: rows[0].next,
        });
        this.o.logger?.debug({ callId: fork.dialogCallId, speaker: line.speaker, content: line.content }, 'transcriber: line written');
        return;
      } catch (error) {
        // The voice runtime (a transferred agent call) wrote that index first: the unique index says so.
        if ((error as { status?: number }).status === 409 && attempt < 3) continue;
        throw error;
      }
    }
  }
}

/**
 * The codec to receive a leg in: the offer's first format when we decode it (what the party sends: rtpengine
 * lists it first, so it passes through untouched), else G.722 (added for transcoding), else our preference.
 */
export function forkCodec(offer: SdpOffer): Negotiated | undefined {
  const first = offer.formats.find((f) => f.name !== 'TELEPHONE-EVENT');
  const sent = (first?.rate === 8000 ? first.name : '') as CodecName;
  return negotiate(offer, CODEC_PREFERENCE.includes(sent) ? [sent, ...CODEC_PREFERENCE] : CODEC_PREFERENCE);
}

function closeLeg(leg: Leg): void {
  for (const socket of [leg.rtp, leg.rtcp]) {
    try {
      socket?.close();
    } catch {}
  }
}
