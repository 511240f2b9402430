/**
 * One agent call's audio loop: RTP in -> decode -> voice activity -> utterance -> speech-to-text ->
 * the conversation (where the agent runtime answers it, as in chat) -> text-to-speech -> paced RTP
 * out, with barge-in, DTMF, silence prompts and the per-turn latency budget. The session knows
 * nothing about the database: what it hears and says goes through `CallSink` (runtime.ts), which
 * writes through the records service.
 */
import { createCodec, FRAME_MS, FRAME_SAMPLES, type FrameCodec } from './codecs.js';
import type { RtpStream } from './media.js';
import { parseRtp, parseTelephoneEvent } from './rtp.js';
import type { Negotiated } from './sdp.js';
import { SpeechFailure, type SpeechToText } from './stt.js';
import type { TextToSpeech } from './tts.js';
import { Vad } from './vad.js';

export const SILENCE_PROMPT = 'Are you still there?';
export const GOODBYE = 'I have not heard anything, so I will end the call now. Goodbye.';
export const APOLOGY = 'Sorry, I did not catch that. Could you say it again?';
export const TROUBLE = 'Sorry, I am having trouble right now. I am passing you to a colleague.';

/** Marks of one turn, in performance.now() milliseconds. */
export interface TurnMarks {
  speechEndAt: number;
  transcriptAt?: number;
  replyAt?: number;
  firstAudioAt?: number;
}

export interface Reply {
  text: string;
  /** Hang up once it has been spoken (the workflow ended, or the call was handed off). */
  hangup: boolean;
  /** When the agent answered (the reply item committed), performance.now(). */
  at: number;
  /** The reply's item id, for the transcript. */
  itemId?: string;
  /**
   * The call was handed off: once the reply has been said (heard whole or cut short by the caller), the call
   * is transferred to an operator instead of hung up. Resolves with nothing when the transfer was done, or
   * with a line to say before hanging up (no operator available, the transfer failed).
   */
  transfer?: () => Promise<string | undefined>;
}

/** Where a session's words go: the runtime turns them into records. */
export interface CallSink {
  /**
   * A caller's utterance or DTMF input: stored as a `user` item and (except the call's opening) a
   * caller CallTranscript, together; resolves with the agent's reply (undefined: none came).
   */
  userTurn(input: { text: string; kind: 'speech' | 'dtmf' | 'connected'; metadata?: Record<string, unknown> }): Promise<Reply | undefined>;
  /** A line the agent spoke (or began to), with its latency and how much was heard. */
  agentLine(text: string, metadata: Record<string, unknown>, itemId?: string): Promise<void>;
  /** The speech engines failed twice in a row: hand the conversation to an operator. */
  handoff(reason: string): Promise<void>;
}

export interface SessionOptions {
  /** The call's RTP port; the media worker paces what is sent on it. */
  stream: RtpStream;
  negotiated: Negotiated;
  remote: { address: string; port: number };
  stt: SpeechToText;
  tts: TextToSpeech;
  /** Used for the apology when the configured text-to-speech is what failed. */
  fallbackTts?: TextToSpeech;
  sink: CallSink;
  voice?: string | null;
  language?: string;
  silenceTimeoutMs: number;
  maxUtteranceMs: number;
  endpointMs: number;
  hangup: () => Promise<void>;
  /** Observes each packet sent (benchmarks: send-interval jitter). */
  onPacketSent?: (at: number, due: number) => void;
  onError?: (error: unknown) => void;
}

export class VoiceSession {
  private readonly codec: FrameCodec;
  private readonly vad: Vad;
  /** Prompts queued in the media worker whose report has not come back (a replaced one's may be on its way). */
  private playing = 0;
  private closed = false;
  private turnChain: Promise<void> = Promise.resolve();
  private digits = '';
  private digitTimer?: NodeJS.Timeout;
  private lastDtmfTimestamp = -1;
  private silenceTimer?: NodeJS.Timeout;
  private prompted = false;
  private failures = 0;
  private framesIn = 0;
  /** A line said while the caller waits for the reply (a tool's `say_while_waiting`): the reply follows it. */
  private waiting?: Promise<void>;

  constructor(private readonly o: SessionOptions) {
    this.codec = createCodec(o.negotiated.codec);
    this.vad = new Vad({ maxUtteranceMs: o.maxUtteranceMs, hangoverMs: o.endpointMs });
  }

  start(): void {
    const { stream, negotiated, remote } = this.o;
    stream.onPacket = (data) => this.onRtp(data);
    stream.onSent = this.o.onPacketSent;
    const silence = createCodec(negotiated.codec).encode(new Int16Array(FRAME_SAMPLES));
    stream.start({ remote, pt: negotiated.pt, step: this.codec.timestampStep, silence });
    this.armSilence();
    this.enqueue(async () => {
      const reply = await this.o.sink.userTurn({ text: 'Hello', kind: 'connected' });
      if (reply) await this.speakReply(reply, { speechEndAt: performance.now() });
    });
  }

  /**
   * Says `text` now, outside the turn queue (the turn is waiting for its reply: a tool of the agent is running),
   * recorded as an agent line with `metadata`. The reply, when it comes, is spoken after it, not over it; the
   * caller speaking cuts it as any line (barge-in).
   */
  interject(text: string, metadata: Record<string, unknown>): void {
    // A line not said (the speech engine failed) is reported: the reply still comes; nothing else depends on it.
    if (!this.closed) this.waiting = this.after(this.waiting ?? Promise.resolve(), () => this.say(text, metadata));
  }

  /** The call is over (either side): the stream stops; a reply being spoken is recorded as cut off. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.silenceTimer);
    clearTimeout(this.digitTimer);
    this.o.stream.close();
  }

  /** The local RTP port (diagnostics, tests). */
  get rtpPort(): number {
    return this.o.stream.port;
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Resolves when the turns queued so far are finished (tests, shutdown). */
  idle(): Promise<void> {
    return this.turnChain;
  }

  // ------------------------------------------------------------ media in

  private onRtp(data: Uint8Array): void {
    if (this.closed) return;
    const packet = parseRtp(data);
    if (!packet) return;
    if (packet.payloadType === this.o.negotiated.dtmfPt) {
      this.onDtmf(packet.payload, packet.timestamp);
      return;
    }
    if (packet.payloadType !== this.o.negotiated.pt) return;
    const pcm = this.codec.decode(packet.payload);
    // A packet may carry more or less than 20 ms (ptime); the detector takes 20 ms frames.
    for (let i = 0; i + FRAME_SAMPLES <= pcm.length; i += FRAME_SAMPLES) this.onFrame(pcm.subarray(i, i + FRAME_SAMPLES));
  }

  private onFrame(frame: Int16Array): void {
    this.framesIn++;
    for (const event of this.vad.push(frame)) {
      if (event.type === 'speech_start') {
        clearTimeout(this.silenceTimer);
        // The caller is there: the next silence gets a prompt again before the hang-up.
        this.prompted = false;
        // Barge-in: the caller speaks over the agent, so the agent stops at the next frame.
        if (this.playing) this.o.stream.flush();
      } else {
        const lateFrames = this.framesIn - 1 - event.atFrame;
        const speechEndAt = performance.now() - lateFrames * FRAME_MS;
        this.enqueue(() => this.onUtterance(event.audio, speechEndAt, event.reason));
      }
    }
  }

  /** RFC 4733 2.5.1.4: an event's end packet is sent three times; one digit per event (its timestamp). */
  private onDtmf(payload: Uint8Array, timestamp: number): void {
    const event = parseTelephoneEvent(payload);
    if (!event?.end || timestamp === this.lastDtmfTimestamp) return;
    this.lastDtmfTimestamp = timestamp;
    clearTimeout(this.silenceTimer);
    this.prompted = false;
    if (this.playing) this.o.stream.flush();
    clearTimeout(this.digitTimer);
    if (event.digit === '#') {
      this.flushDigits();
      return;
    }
    this.digits += event.digit;
    // Digits typed in a row are one input: it ends with '#' or a 1.5 s pause.
    this.digitTimer = setTimeout(() => this.flushDigits(), 1500);
  }

  private flushDigits(): void {
    const digits = this.digits;
    this.digits = '';
    if (!digits) return;
    const at = performance.now();
    this.enqueue(async () => {
      const reply = await this.o.sink.userTurn({ text: digits, kind: 'dtmf', metadata: { source: 'dtmf' } });
      if (reply) await this.speakReply(reply, { speechEndAt: at, transcriptAt: at });
    });
  }

  // ------------------------------------------------------------ turns

  private enqueue(work: () => Promise<void>): void {
    this.turnChain = this.after(this.turnChain, work);
  }

  /** `work` once `previous` is done, unless the call is over by then; its failure is reported (onError). */
  private after(previous: Promise<void>, work: () => Promise<void>): Promise<void> {
    return previous.then(async () => {
      if (this.closed) return;
      try {
        await work();
      } catch (error) {
        this.o.onError?.(error);
      }
    });
  }

  private async onUtterance(audio: Int16Array, speechEndAt: number, reason: 'silence' | 'max_length'): Promise<void> {
    const marks: TurnMarks = { speechEndAt };
    let text: string;
    try {
      text = await this.o.stt.transcribe(audio, { language: this.o.language });
      this.failures = 0;
    } catch (error) {
      if (!(error instanceof SpeechFailure)) throw error;
      this.o.onError?.(error);
      return this.speechTrouble(error.message);
    }
    marks.transcriptAt = performance.now();
    if (text === '') return this.armSilence(); // noise, a cough: nothing to answer
    const durationMs = Math.round((audio.length / 16000) * 1000);
    const reply = await this.o.sink.userTurn({
      text,
      kind: 'speech',
      metadata: { stt: this.o.stt.name, duration_ms: durationMs, ...(reason === 'max_length' ? { cut: 'max_length' } : {}) },
    });
    if (reply) await this.speakReply(reply, marks);
    else this.armSilence();
  }

  /** A speech engine failed: apologise (retry: the caller says it again); a second failure in a row hands off. */
  private async speechTrouble(message: string): Promise<void> {
    this.failures++;
    const handoff = this.failures >= 2;
    await this.say(
      handoff ? TROUBLE : APOLOGY,
      { source: 'voice', prompt: handoff ? 'speech_failure_handoff' : 'speech_failure', error: message },
      true,
    );
    if (handoff) {
      await this.o.sink.handoff(`The speech engine failed: ${message}`);
      await this.o.hangup();
    } else this.armSilence();
  }

  private async speakReply(reply: Reply, marks: TurnMarks): Promise<void> {
    marks.replyAt = reply.at;
    const synthesize = () => this.o.tts.synthesize(reply.text, { voice: this.o.voice });
    let pcm: Int16Array;
    try {
      // A speech engine's failure is tried once more.
      pcm = await synthesize().catch((error) => (error instanceof SpeechFailure ? synthesize() : Promise.reject(error)));
    } catch (error) {
      if (!(error instanceof SpeechFailure)) throw error;
      await this.o.sink.agentLine(reply.text, { spoken: false, error: error.message }, reply.itemId);
      return this.speechTrouble(error.message);
    }
    // A line said while the reply was being made (synthesised meanwhile) is not cut off by it.
    await this.waiting;
    this.waiting = undefined;
    const result = await this.play(pcm, marks);
    await this.o.sink.agentLine(
      reply.text,
      {
        latency_ms: latencyOf(marks),
        spoken: !result.interrupted,
        spoken_ms: result.spokenMs,
        duration_ms: Math.round((pcm.length / 16000) * 1000),
        ...(result.interrupted ? { unspoken_text: unspokenRest(reply.text, result.spokenMs / ((pcm.length / 16000) * 1000)) } : {}),
        tts: this.o.tts.name,
      },
      reply.itemId,
    );
    if (reply.transfer) {
      // Handed off: the caller goes to an operator even after cutting the handoff line short.
      const line = await reply.transfer();
      if (line && !this.closed) await this.say(line, { source: 'voice', prompt: 'transfer_failed' });
      await this.o.hangup();
    } else if (reply.hangup && !result.interrupted) await this.o.hangup();
    else this.armSilence();
  }

  /** Speaks a line of the session's own (prompts, apologies), recorded as an agent line. */
  private async say(text: string, metadata: Record<string, unknown>, fallback = false): Promise<void> {
    let pcm: Int16Array;
    let tts = this.o.tts;
    try {
      pcm = await tts.synthesize(text, { voice: this.o.voice });
    } catch (error) {
      if (!fallback || !this.o.fallbackTts) throw error;
      tts = this.o.fallbackTts;
      pcm = await tts.synthesize(text);
    }
    const result = await this.play(pcm);
    await this.o.sink.agentLine(text, { ...metadata, spoken: !result.interrupted, spoken_ms: result.spokenMs, tts: tts.name });
  }

  // ------------------------------------------------------------ silence

  private armSilence(): void {
    clearTimeout(this.silenceTimer);
    if (this.closed) return;
    this.silenceTimer = setTimeout(() => {
      if (this.vad.inSpeech || this.playing) return this.armSilence();
      const second = this.prompted;
      this.prompted = true;
      this.enqueue(async () => {
        if (!second) {
          await this.say(SILENCE_PROMPT, { source: 'voice', prompt: 'silence' });
          this.armSilence();
        } else {
          await this.say(GOODBYE, { source: 'voice', prompt: 'silence_hangup' });
          await this.o.hangup();
        }
      });
    }, this.o.silenceTimeoutMs).unref();
  }

  // ------------------------------------------------------------ media out

  /**
   * Hands the whole line, encoded, to the media worker (replacing any other); resolves when it has been sent or
   * cut short (barge-in, hang-up), with the time its first packet left, which is the turn's first-audio mark.
   */
  private async play(pcm: Int16Array, marks?: TurnMarks): Promise<{ spokenMs: number; interrupted: boolean }> {
    if (this.closed) return { spokenMs: 0, interrupted: true };
    const count = Math.ceil(pcm.length / FRAME_SAMPLES);
    const frame = new Int16Array(FRAME_SAMPLES);
    let frames = new Uint8Array(0);
    for (let i = 0; i < count; i++) {
      frame.fill(0).set(pcm.subarray(i * FRAME_SAMPLES, (i + 1) * FRAME_SAMPLES));
      const payload = this.codec.encode(frame);
      if (i === 0) frames = new Uint8Array(count * payload.length);
      frames.set(payload, i * payload.length);
    }
    if (count === 0) return { spokenMs: 0, interrupted: false };
    this.playing++;
    const played = await this.o.stream.play(frames, frames.length / count);
    this.playing--;
    if (marks && played.firstAt !== undefined) marks.firstAudioAt ??= played.firstAt;
    return { spokenMs: Math.min(played.frames * FRAME_MS, Math.round((pcm.length / 16000) * 1000)), interrupted: played.interrupted };
  }
}

/** The turn's latency budget: each stage from the end of the caller's speech (ms). */
export function latencyOf(m: TurnMarks): Record<string, number> {
  const ms = (a?: number, b?: number) => (a === undefined || b === undefined ? undefined : Math.round(b - a));
  const out: Record<string, number | undefined> = {
    speech_end_to_transcript: ms(m.speechEndAt, m.transcriptAt),
    transcript_to_reply: ms(m.transcriptAt, m.replyAt),
    reply_to_first_audio: ms(m.replyAt, m.firstAudioAt),
    voice_to_voice: ms(m.speechEndAt, m.firstAudioAt),
  };
  return Object.fromEntries(Object.entries(out).filter(([, v]) => v !== undefined)) as Record<string, number>;
}

/** The words not yet spoken when playback stopped at `fraction` of the audio (by word share; an estimate). */
export function unspokenRest(text: string, fraction: number): string {
  const words = text.split(/\s+/).filter(Boolean);
  const spoken = Math.max(0, Math.min(words.length, Math.floor(words.length * fraction)));
  return words.slice(spoken).join(' ');
}
