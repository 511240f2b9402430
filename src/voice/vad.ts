/**
 * Voice activity detection and endpointing, by frame energy with hangover.
 *
 * Each 20 ms frame's RMS level (dBFS) is compared with a threshold that sits a margin above a running
 * noise floor (the floor follows quiet frames quickly and loud ones slowly, so steady line noise is
 * learnt and speech is not). Speech starts after `startFrames` loud frames in a row (a click or a
 * single pop does not start an utterance) and ends after `hangoverMs` of quiet (the pauses between
 * words stay inside the utterance). An utterance longer than `maxUtteranceMs` is cut there: a caller
 * who never stops talking still gets answered. The audio of an utterance includes the frames that led
 * up to its start (`preRollFrames`), so the recogniser hears the first syllable whole.
 */

export interface VadOptions {
  /** Frame length (ms). */
  frameMs?: number;
  /** Margin above the noise floor that counts as speech (dB). */
  marginDb?: number;
  /** Absolute level below which nothing is speech (dBFS). */
  minDbfs?: number;
  startFrames?: number;
  hangoverMs?: number;
  maxUtteranceMs?: number;
  preRollFrames?: number;
}

export type VadEvent =
  | { type: 'speech_start'; atFrame: number }
  | { type: 'speech_end'; atFrame: number; audio: Int16Array; reason: 'silence' | 'max_length' };

export function frameDbfs(frame: Int16Array): number {
  let sum = 0;
  for (let i = 0; i < frame.length; i++) sum += frame[i] * frame[i];
  const rms = Math.sqrt(sum / Math.max(1, frame.length));
  return rms <= 0 ? -120 : 20 * Math.log10(rms / 32768);
}

export class Vad {
  private readonly o: Required<VadOptions>;
  private floor = -70;
  private frameIndex = 0;
  private loudRun = 0;
  private quietRun = 0;
  private speaking = false;
  private frames: Int16Array[] = [];
  private preRoll: Int16Array[] = [];

  constructor(options: VadOptions = {}) {
    this.o = {
      frameMs: 20,
      marginDb: 12,
      minDbfs: -45,
      startFrames: 3,
      hangoverMs: 600,
      maxUtteranceMs: 15_000,
      preRollFrames: 10,
      ...options,
    };
  }

  get inSpeech(): boolean {
    return this.speaking;
  }

  /** Feeds one frame; returns the events it caused (at most one start or one end). */
  push(frame: Int16Array): VadEvent[] {
    const index = this.frameIndex++;
    const level = frameDbfs(frame);
    const loud = level > Math.max(this.o.minDbfs, this.floor + this.o.marginDb);
    // The floor adapts: quickly down towards quieter frames, slowly up (speech should not raise it much).
    this.floor = level < this.floor ? this.floor + (level - this.floor) * 0.3 : this.floor + (level - this.floor) * 0.005;
    const events: VadEvent[] = [];
    if (!this.speaking) {
      this.preRoll.push(frame);
      if (this.preRoll.length > this.o.preRollFrames) this.preRoll.shift();
      this.loudRun = loud ? this.loudRun + 1 : 0;
      if (this.loudRun >= this.o.startFrames) {
        this.speaking = true;
        this.quietRun = 0;
        this.frames = [...this.preRoll];
        this.preRoll = [];
        events.push({ type: 'speech_start', atFrame: index - this.o.startFrames + 1 });
      }
      return events;
    }
    this.frames.push(frame);
    this.quietRun = loud ? 0 : this.quietRun + 1;
    if (this.quietRun * this.o.frameMs >= this.o.hangoverMs) events.push(this.finish(index, 'silence'));
    else if (this.frames.length * this.o.frameMs >= this.o.maxUtteranceMs) events.push(this.finish(index, 'max_length'));
    return events;
  }

  private finish(index: number, reason: 'silence' | 'max_length'): VadEvent {
    const total = this.frames.reduce((n, f) => n + f.length, 0);
    const audio = new Int16Array(total);
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
