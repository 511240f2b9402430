/**
 * Text-to-speech behind one small interface: text and the agent's `voice` in, 16 kHz PCM out.
 * Engines: an OpenAI-compatible provider (`POST /v1/audio/speech`, WAVE requested, through the
 * `openai` client with its timeout and retries), and by default the local `festival` (its
 * `text2wave`) from Debian, whose voice the local recogniser understands well, with `espeak-ng` as the
 * fallback where festival is not installed. A local engine's output is resampled to 16 kHz here.
 */
import { execFile, spawn } from 'node:child_process';
import type OpenAI from 'openai';
import type { VoiceConfig } from '../config/index.js';
import { parseWav, resampleTo16k } from './codecs.js';
import { SpeechFailure, speechClient } from './stt.js';

export interface TextToSpeech {
  readonly name: string;
  synthesize(text: string, options?: { voice?: string | null; signal?: AbortSignal }): Promise<Int16Array>;
}

function run(cmd: string, args: string[], input: string, timeoutMs: number, signal?: AbortSignal): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { signal, timeout: timeoutMs, stdio: ['pipe', 'pipe', 'ignore'] });
    const chunks: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => chunks.push(c));
    child.on('error', (error) => reject(new SpeechFailure(`${cmd}: ${error.message}`)));
    child.on('close', (code) => (code === 0 ? resolve(Buffer.concat(chunks)) : reject(new SpeechFailure(`${cmd} exited with ${code}`))));
    child.stdin.on('error', () => {});
    child.stdin.end(input);
  });
}

/** Festival's text2wave (WAVE on stdout), or espeak-ng when festival is missing. */
export class LocalTts implements TextToSpeech {
  name = 'festival';
  private engine?: Promise<'festival' | 'espeak-ng'>;
  constructor(private readonly timeoutMs = 20_000) {}

  private which(): Promise<'festival' | 'espeak-ng'> {
    this.engine ??= new Promise((resolve) =>
      execFile('text2wave', ['-h'], (error) =>
        resolve(error && (error as { code?: unknown }).code === 'ENOENT' ? 'espeak-ng' : 'festival'),
      ),
    );
    return this.engine;
  }

  async synthesize(text: string, options: { voice?: string | null; signal?: AbortSignal } = {}): Promise<Int16Array> {
    const engine = await this.which();
    this.name = engine;
    // Text goes in on stdin, never on a command line; a voice name is used only when it is a plain word.
    const voice = options.voice && /^[A-Za-z0-9_+-]{1,40}$/.test(options.voice) ? options.voice : undefined;
    const args =
      engine === 'festival'
        ? ['-o', '-', ...(voice?.startsWith('voice_') ? ['-eval', `(${voice})`] : [])]
        : ['--stdout', ...(voice && !voice.startsWith('voice_') ? ['-v', voice] : [])];
    const wav = await run(engine === 'festival' ? 'text2wave' : 'espeak-ng', args, text, this.timeoutMs, options.signal);
    const { rate, pcm } = parseWav(wav);
    return resampleTo16k(pcm, rate);
  }
}

export class ProviderTts implements TextToSpeech {
  readonly name: string;
  private readonly client: OpenAI;
  constructor(
    private readonly config: Pick<VoiceConfig, 'ttsBaseUrl' | 'ttsApiKey' | 'ttsModel' | 'speechTimeoutMs' | 'speechMaxRetries'>,
  ) {
    this.name = `provider:${config.ttsModel}`;
    this.client = speechClient(config, config.ttsBaseUrl, config.ttsApiKey);
  }

  async synthesize(text: string, options: { voice?: string | null; signal?: AbortSignal } = {}): Promise<Int16Array> {
    let body: Buffer;
    try {
      const response = await this.client.audio.speech.create(
        { model: this.config.ttsModel, voice: (options.voice || 'alloy') as 'alloy', input: text, response_format: 'wav' },
        { signal: options.signal },
      );
      body = Buffer.from(await response.arrayBuffer());
    } catch (error) {
      throw new SpeechFailure(`text-to-speech provider: ${(error as Error).message}`);
    }
    try {
      const { rate, pcm } = parseWav(body);
      return resampleTo16k(pcm, rate);
    } catch (error) {
      // Garbage instead of audio is a failure like any other (the session apologises and retries).
      throw new SpeechFailure(`text-to-speech provider sent no usable WAVE: ${(error as Error).message}`);
    }
  }
}

export function createTts(config: VoiceConfig): TextToSpeech {
  return config.ttsBaseUrl || config.ttsApiKey ? new ProviderTts(config) : new LocalTts();
}
