/**
 * The media worker (docs/voice.md, "The media worker"): a worker thread that owns the agent calls' RTP ports and
 * the 20 ms frame grid, takes whole encoded prompts from the main thread and sends them on time, so the main
 * thread's work (SQL, JSON, SIP, speech, its garbage collection) no longer moves a packet. A UDP port cannot be
 * shared between threads, so the worker receives too, and posts each packet to the main thread.
 */
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import type { Socket } from 'node:dgram';
import { bindRtp, RtpSender } from './rtp.js';

const SPIN_MS = 2;

/**
 * The frame grid (docs/voice.md, "Frames and pacing"): one timer for every stream, ticks due at `origin + k * period`
 * whatever the lateness of earlier ones, the last SPIN_MS before each waited in `setImmediate` turns (polling).
 */
export class FrameGrid {
  private readonly members = new Set<(due: number, now: number) => void>();
  private timer?: NodeJS.Timeout | NodeJS.Immediate;
  private origin = 0;
  private k = 0;

  constructor(readonly periodMs = 20) {}

  /** Joins the grid; returns the due time of the member's first tick (the grid's next one). */
  join(onTick: (due: number, now: number) => void): number {
    const first = this.members.size === 0;
    if (first) [this.origin, this.k] = [performance.now(), 0];
    const due = this.origin + this.k * this.periodMs;
    this.members.add(onTick);
    // The first member's tick is due now: it runs in this call.
    if (first) this.schedule();
    return due;
  }

  leave(onTick: (due: number, now: number) => void): void {
    this.members.delete(onTick);
    if (this.members.size > 0 || !this.timer) return;
    clearTimeout(this.timer as NodeJS.Timeout);
    clearImmediate(this.timer as NodeJS.Immediate);
    this.timer = undefined;
  }

  private schedule(): void {
    this.timer = undefined;
    if (this.members.size === 0) return;
    const due = this.origin + this.k * this.periodMs;
    const wait = due - performance.now();
    if (wait > SPIN_MS) this.timer = setTimeout(() => this.schedule(), wait - SPIN_MS);
    else if (wait > 0) this.timer = setImmediate(() => this.schedule());
    else {
      this.k++;
      // A member that joins during this loop is not in the snapshot: its first tick is the next one.
      for (const member of [...this.members]) if (this.members.has(member)) member(due, performance.now());
      this.schedule();
    }
  }
}

/** What a play ended with: frames sent, when the first left (main-thread performance.now()), cut short or not. */
type Played = { frames: number; firstAt?: number; interrupted: boolean };

type ToWorker =
  | { op: 'open'; id: number; address: string; min: number; max: number; first?: number }
  | { op: 'start'; id: number; remote: { address: string; port: number }; pt: number; step: number; silence: Uint8Array; trace: boolean }
  | { op: 'play'; id: number; n: number; frames: Uint8Array; frameBytes: number }
  | { op: 'flush' | 'close'; id: number };
type FromWorker =
  | { op: 'opened'; id: number; port?: number; error?: string }
  | { op: 'closed'; id: number }
  | { op: 'rtp'; id: number; data: Uint8Array }
  | { op: 'done'; id: number; n: number; frames: number; firstAt?: number; interrupted: boolean }
  | { op: 'sent'; id: number; times: Float64Array };

/** One call's RTP port, as the main thread sees it: packets in, prompts out, paced by the worker. */
export class RtpStream {
  onPacket?: (data: Uint8Array) => void;
  /** Benchmarks: each packet sent, when and when it was due (main-thread performance.now()). */
  onSent?: (at: number, due: number) => void;
  /** Prompts queued or playing, by number: one at a time, but a replaced one's report may still be on its way. */
  private readonly playing = new Map<number, (played: Played) => void>();
  private plays = 0;
  private closed = false;

  constructor(
    private readonly media: MediaWorker,
    readonly id: number,
    readonly port: number,
  ) {}

  /** Starts the stream to `remote`: a frame every 20 ms, `silence` whenever no prompt is queued. */
  start(o: { remote: { address: string; port: number }; pt: number; step: number; silence: Uint8Array }): void {
    this.media.post({ op: 'start', id: this.id, ...o, trace: !!this.onSent });
  }

  /**
   * Queues a whole prompt (`frames`: one payload every `frameBytes`), replacing any other; resolves when its last
   * frame has been sent, or when it was flushed or the stream closed.
   */
  play(frames: Uint8Array, frameBytes: number): Promise<Played> {
    if (this.closed || this.media.dead) return Promise.resolve({ frames: 0, interrupted: true });
    const n = ++this.plays;
    return new Promise((resolve) => {
      this.playing.set(n, resolve);
      this.media.post({ op: 'play', id: this.id, n, frames, frameBytes }, [frames.buffer as ArrayBuffer]);
    });
  }

  /** Barge-in: the worker drops the prompt at once (before its next frame) and reports what was sent. */
  flush(): void {
    if (!this.closed) this.media.post({ op: 'flush', id: this.id });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    // The prompt under way is reported (what was heard of it) before the worker says the stream is closed.
    this.media.post({ op: 'close', id: this.id });
  }

  /** @internal The worker's report of prompt `n` ending; without `n`, every prompt ends unheard (closed). */
  ended(n?: number, played: Played = { frames: 0, interrupted: true }): void {
    for (const [k, resolve] of this.playing) {
      if (n !== undefined && k !== n) continue;
      this.playing.delete(k);
      resolve(played);
    }
  }
}

/** The main thread's side of the worker: started on the first stream, one per process. */
export class MediaWorker {
  private static shared?: MediaWorker;
  static get(): MediaWorker {
    MediaWorker.shared ??= new MediaWorker();
    return MediaWorker.shared;
  }

  readonly streams = new Map<number, RtpStream>();
  private readonly opening = new Map<number, (reply: { port?: number; error?: string }) => void>();
  private readonly worker: Worker;
  private nextId = 1;
  dead = false;
  /** Resolves when the worker takes messages (its module loaded). */
  readonly ready: Promise<unknown>;

  private constructor() {
    const url = new URL(import.meta.url);
    // From the sources (tests, benchmarks under tsx) the worker loads TypeScript through tsx's loader;
    // built, it is the same module compiled to JavaScript.
    const workerData = { parleyMedia: true };
    const tsx = `import('tsx/esm/api').then((m) => { m.register(); return import(${JSON.stringify(url.href)}); })`;
    this.worker = url.pathname.endsWith('.ts') ? new Worker(tsx, { eval: true, workerData }) : new Worker(url, { workerData });
    this.worker.unref();
    this.ready = new Promise((resolve) => this.opening.set(0, resolve)); // its first message, id 0
    this.worker.on('message', (m: FromWorker) => this.receive(m));
    this.worker.on('error', () => this.lost());
    this.worker.on('exit', () => this.lost());
  }

  /** Binds an RTP port in the worker (bindRtp's rules: an even port of `min..max`, from `first`). */
  async open(address: string, range: { min: number; max: number; first?: number }): Promise<RtpStream> {
    const id = this.nextId++;
    const reply = await new Promise<{ port?: number; error?: string }>((resolve) => {
      this.opening.set(id, resolve);
      this.post({ op: 'open', id, address, ...range });
    });
    if (reply.port === undefined) throw new Error(reply.error ?? 'the media worker stopped');
    const stream = new RtpStream(this, id, reply.port);
    this.streams.set(id, stream);
    return stream;
  }

  /** @internal */
  post = (message: ToWorker, transfer: ArrayBuffer[] = []) => this.worker.postMessage(message, transfer);

  private receive(m: FromWorker): void {
    if (m.op === 'opened') {
      this.opening.get(m.id)?.(m);
      this.opening.delete(m.id);
      return;
    }
    const stream = this.streams.get(m.id);
    if (!stream) return;
    // The worker's times are epoch milliseconds: moved onto this thread's performance.now().
    const origin = performance.timeOrigin;
    if (m.op === 'rtp') stream.onPacket?.(m.data);
    else if (m.op === 'closed') {
      this.streams.delete(m.id);
      stream.ended();
    } else if (m.op === 'done') stream.ended(m.n, { ...m, firstAt: m.firstAt === undefined ? undefined : m.firstAt - origin });
    else for (let i = 0; i < m.times.length; i += 2) stream.onSent?.(m.times[i] - origin, m.times[i + 1] - origin);
  }

  /** The worker died (a bug): every stream's prompt ends unheard and new streams get a new worker. */
  private lost(): void {
    this.dead = true;
    if (MediaWorker.shared === this) MediaWorker.shared = undefined;
    for (const resolve of this.opening.values()) resolve({ error: 'the media worker stopped' });
    for (const stream of this.streams.values()) stream.ended();
  }
}

/** The worker: its streams, each on the grid once started. Times are posted as epoch milliseconds. */
function serve(): void {
  const port = parentPort!;
  const grid = new FrameGrid();
  const epoch = (t: number) => performance.timeOrigin + t;
  interface Stream {
    socket: Socket;
    sender?: RtpSender;
    to?: { address: string; port: number; step: number; silence: Uint8Array; trace?: number[] };
    prompt?: { n: number; frames: Uint8Array; frameBytes: number; sent: number; firstAt?: number };
    member?: (due: number, now: number) => void;
  }
  const streams = new Map<number, Stream>();
  const finish = (id: number, s: Stream, interrupted: boolean) => {
    const p = s.prompt;
    s.prompt = undefined;
    if (p) port.postMessage({ op: 'done', id, n: p.n, frames: p.sent, firstAt: p.firstAt, interrupted });
  };
  const tick = (id: number, s: Stream, due: number) => {
    const to = s.to!;
    const p = s.prompt;
    const payload = p ? p.frames.subarray(p.sent * p.frameBytes, (p.sent + 1) * p.frameBytes) : to.silence;
    s.socket.send(s.sender!.next(payload, to.step), to.port, to.address);
    const now = performance.now();
    if (to.trace) {
      to.trace.push(epoch(now), epoch(due));
      if (to.trace.length >= 100) {
        port.postMessage({ op: 'sent', id, times: Float64Array.from(to.trace) });
        to.trace.length = 0;
      }
    }
    if (!p) return;
    p.firstAt ??= epoch(now);
    if (++p.sent * p.frameBytes >= p.frames.length) finish(id, s, false);
  };
  port.on('message', async (m: ToWorker) => {
    if (m.op === 'open') {
      try {
        const { rtp } = await bindRtp(m.address, m);
        streams.set(m.id, { socket: rtp });
        rtp.on('message', (data) => port.postMessage({ op: 'rtp', id: m.id, data }));
        port.postMessage({ op: 'opened', id: m.id, port: rtp.address().port });
      } catch (error) {
        port.postMessage({ op: 'opened', id: m.id, error: (error as Error).message });
      }
      return;
    }
    const s = streams.get(m.id);
    if (!s) return;
    if (m.op === 'start' && !s.member) {
      s.sender = new RtpSender(m.pt);
      s.to = { ...m.remote, step: m.step, silence: m.silence, trace: m.trace ? [] : undefined };
      s.member = (due) => tick(m.id, s, due);
      grid.join(s.member);
    } else if (m.op === 'play') {
      finish(m.id, s, true);
      s.prompt = { n: m.n, frames: m.frames, frameBytes: m.frameBytes, sent: 0 };
    } else if (m.op === 'flush') finish(m.id, s, true);
    else if (m.op === 'close') {
      if (s.member) grid.leave(s.member);
      finish(m.id, s, true);
      streams.delete(m.id);
      s.socket.close();
      port.postMessage({ op: 'closed', id: m.id });
    }
  });
}

if (!isMainThread && workerData?.parleyMedia) {
  serve();
  parentPort!.postMessage({ op: 'opened', id: 0 }); // ready
}
