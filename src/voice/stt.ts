/**
 * Speech-to-text behind one small interface: a finished utterance (16 kHz PCM) in, its text out.
 * Two engines: an OpenAI-compatible provider (`POST /v1/audio/transcriptions` through the `openai`
 * client, with its timeout and retries), and by default the local `pocketsphinx` from Debian with its
 * wideband US English model (no keys, no network; good on clear 16 kHz speech, poor on narrowband
 * G.711 audio, so production telephony wants the provider: docs/voice.md).
 */
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import OpenAI, { toFile } from 'openai';
import type { VoiceConfig } from '../config/index.js';
import { toWav } from './codecs.js';

export interface SpeechToText {
  readonly name: string;
  /** The text of one utterance ('' when nothing was recognised); throws SpeechFailure when the engine fails. */
  transcribe(pcm16k: Int16Array, options?: { language?: string; signal?: AbortSignal }): Promise<string>;
}

export class SpeechFailure extends Error {}

/** pocketsphinx_continuous on a temporary WAVE file (the Debian package's 16 kHz en-US model by default). */
export class PocketsphinxStt implements SpeechToText {
  readonly name = 'pocketsphinx';
  /** Generous: the decoder is a subprocess that, on a busy machine, takes several times the audio's length. */
  constructor(private readonly timeoutMs = 60_000) {}

  async transcribe(pcm16k: Int16Array, options: { signal?: AbortSignal } = {}): Promise<string> {
    const dir = await mkdtemp(join(tmpdir(), 'parley-stt-'));
    try {
      const file = join(dir, 'utterance.wav');
      await writeFile(file, toWav(pcm16k, 16000));
      const { stdout } = await promisify(execFile)('pocketsphinx_continuous', ['-infile', file, '-logfn', '/dev/null'], {
        timeout: this.timeoutMs,
        signal: options.signal,
        maxBuffer: 1024 * 1024,
      }).catch((error: Error) => {
        throw new SpeechFailure(`pocketsphinx: ${error.message}`);
      });
      // One hypothesis line per segment it found; together they are the utterance.
      return stdout.replace(/\s*\n\s*/g, ' ').trim();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
}

/** An OpenAI-compatible transcription endpoint. */
export class ProviderStt implements SpeechToText {
  readonly name: string;
  private readonly client: OpenAI;
  constructor(
    private readonly config: Pick<VoiceConfig, 'sttBaseUrl' | 'sttApiKey' | 'sttModel' | 'speechTimeoutMs' | 'speechMaxRetries'>,
  ) {
    this.name = `provider:${config.sttModel}`;
    this.client = speechClient(config, config.sttBaseUrl, config.sttApiKey);
  }

  async transcribe(pcm16k: Int16Array, options: { language?: string; signal?: AbortSignal } = {}): Promise<string> {
    try {
      const file = await toFile(toWav(pcm16k, 16000), 'utterance.wav', { type: 'audio/wav' });
      const result = await this.client.audio.transcriptions.create(
        { file, model: this.config.sttModel, ...(options.language ? { language: options.language.slice(0, 2) } : {}) },
        { signal: options.signal },
      );
      const text = (result as { text?: unknown }).text;
      // A provider that answers with something other than text is failing, not silent.
      if (typeof text !== 'string') throw new SpeechFailure('transcription without text');
      return text.trim();
    } catch (error) {
      if (error instanceof SpeechFailure) throw error;
      throw new SpeechFailure(`speech-to-text provider: ${(error as Error).message}`);
    }
  }
}

/** An OpenAI-compatible speech provider's client, with the configured timeout and retries. */
export function speechClient(c: Pick<VoiceConfig, 'speechTimeoutMs' | 'speechMaxRetries'>, baseURL?: string, apiKey = 'none'): OpenAI {
  return new OpenAI({ baseURL, apiKey, timeout: c.speechTimeoutMs, maxRetries: c.speechMaxRetries });
}

export function createStt(config: VoiceConfig): SpeechToText {
  return config.sttBaseUrl || config.sttApiKey ? new ProviderStt(config) : new PocketsphinxStt();
}
