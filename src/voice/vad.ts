/**
 * Voice activity detection and endpointing, by frame energy with hangover (docs/voice.md, "Voice activity,
 * endpointing and barge-in"): a frame is loud above a margin over a running noise floor; speech starts after three
 * loud frames in a row, ends after `hangoverMs` of quiet or at `maxUtteranceMs`, and keeps the ten frames before it.
 */
import { FRAME_MS } from './codecs.js';

/** Margin above the noise floor that counts as speech (dB), and the level below which nothing is speech (dBFS). */
const MARGIN_DB = 12;
const MIN_DBFS = -45;
const START_FRAMES = 3;
const PRE_ROLL_FRAMES = 10;

export type VadEvent =
  | { type: 'speech_start'; atFrame: number }
  | { type: 'speech_end'; atFrame: number; audio: Int16Array; reason: 'silence' | 'max_length' };

function frameDbfs(frame: Int16Array): number {
  let sum = 0;
  for (let i = 0; i < frame.length; i++) sum += frame[i] * frame[i];
  const rms = Math.sqrt(sum / Math.max(1, frame.length));
  return rms <= 0 ? -120 : 20 * Math.log10(rms / 32768);
}

export class Vad {
  private readonly hangoverMs: number;
  private readonly maxUtteranceMs: number;
  private floor = -70;
  private frameIndex = 0;
  private loudRun = 0;
  private quietRun = 0;
  private speaking = false;
  private frames: Int16Array[] = [];
  private preRoll: Int16Array[] = [];

  constructor(o: { hangoverMs?: number; maxUtteranceMs?: number } = {}) {
    this.hangoverMs = o.hangoverMs ?? 600;
    this.maxUtteranceMs = o.maxUtteranceMs ?? 15_000;
  }

  get inSpeech(): boolean {
    return this.speaking;
  }

  /** Feeds one frame; returns the events it caused (at most one start or one end). */
  push(frame: Int16Array): VadEvent[] {
    const index = this.frameIndex++;
    const level = frameDbfs(frame);
    const loud = level > Math.max(MIN_DBFS, this.floor + MARGIN_DB);
    // The floor adapts: quickly down towards quieter frames, slowly up (speech should not raise it much).
    this.floor = level < this.floor ? this.floor + (level - this.floor) * 0.3 : this.floor + (level - this.floor) * 0.005;
    if (!this.speaking) {
      this.preRoll.push(frame);
      if (this.preRoll.length > PRE_ROLL_FRAMES) this.preRoll.shift();
      this.loudRun = loud ? this.loudRun + 1 : 0;
      if (this.loudRun < START_FRAMES) return [];
      this.speaking = true;
      this.quietRun = 0;
      this.frames = [...this.preRoll];
      this.preRoll = [];
      return [{ type: 'speech_start', atFrame: index - START_FRAMES + 1 }];
    }
    this.frames.push(frame);
    this.quietRun = loud ? 0 : this.quietRun + 1;
    if (this.quietRun * FRAME_MS >= this.hangoverMs) return [this.finish(index, 'silence')];
    if (this.frames.length * FRAME_MS >= this.maxUtteranceMs) return [this.finish(index, 'max_length')];
    return [];
  }

  private finish(index: number, reason: 'silence' | 'max_length'): VadEvent {
    const audio = new Int16Array(this.frames.reduce((n, f) => n + f.length, 0));
    let offset = 0;
    for (const f of this.frames) {
      audio.set(f, offset);
      offset += f.length;
    }
    this.speaking = false;
    this.loudRun = 0;
    this.frames = [];
    // The end is where the quiet began, not where the hangover ran out: that is when the caller stopped.
    const atFrame = reason === 'silence' ? index - this.quietRun + 1 : index;
    this.quietRun = 0;
    return { type: 'speech_end', atFrame, audio, reason };
  }
}
