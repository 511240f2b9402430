/**
 * The loop of a background worker that takes its work from the database (the agent runtime, the webhook worker,
 * the SIP call event queue): `work` runs when a notification on `channel` says something was committed, when
 * `wake()` is called, and every `pollMs` for what a lost notification did not announce. Never two runs at once: a
 * wake-up during a run is kept for after it (none is lost between the look and the wait). At most one start per
 * `gapMs`: under a stream of commits, each a notification, the worker looks every few milliseconds, not once per
 * commit, and takes what came meanwhile together.
 */
import type { DatabaseHandle } from './connection.js';

export interface WorkLoopOptions {
  /** One look for work; resolving to `true` says more may be waiting now (the loop goes again at once). */
  work: () => Promise<unknown>;
  pollMs: number;
  gapMs: number;
  /** Subscribes to `channel`'s notifications; without it the loop only polls. */
  listen?: DatabaseHandle['listen'];
  channel: string;
  /** A look failed, or listening did (the loop then polls only). */
  onError: (error: unknown, during: 'work' | 'listen') => void;
}

export class WorkLoop {
  #started = false;
  #running: Promise<void> | undefined;
  /** A wake-up during the look under way: for right after it ('now') or after the gap. */
  #again: 'now' | 'gap' | false = false;
  #lastStart = 0;
  #poll: NodeJS.Timeout | undefined;
  #gap: NodeJS.Timeout | undefined;
  #unlisten: Promise<(() => Promise<void>) | undefined> | undefined;

  constructor(private readonly o: WorkLoopOptions) {}

  get started(): boolean {
    return this.#started;
  }

  /** Starts: a look now, then on each notification, wake-up and poll. Resolves once listening (or polling only). */
  async start(): Promise<void> {
    if (this.#started) return;
    this.#started = true;
    const notified = () => this.wake();
    this.#poll = setInterval(notified, this.o.pollMs).unref();
    this.#unlisten = this.o.listen?.(this.o.channel, notified, notified).catch((error: unknown) => {
      this.o.onError(error, 'listen');
      return undefined;
    });
    this.wake(true);
    await this.#unlisten;
  }

  /** Look for work: at once with `now`, else once `gapMs` have passed since the last look began. */
  wake(now = false): void {
    if (!this.#started) return;
    if (this.#running) {
      this.#again = now || this.#again === 'now' ? 'now' : 'gap';
      return;
    }
    const wait = now ? 0 : this.#lastStart + this.o.gapMs - Date.now();
    if (wait > 0) {
      this.#gap ??= setTimeout(() => {
        this.#gap = undefined;
        this.wake();
      }, wait);
      return;
    }
    clearTimeout(this.#gap);
    this.#gap = undefined;
    this.#again = false;
    this.#lastStart = Date.now();
    this.#running = this.o
      .work()
      .then(
        (more) => {
          if (more === true) this.#again = 'now';
        },
        (error: unknown) => this.o.onError(error, 'work'),
      )
      .finally(() => {
        this.#running = undefined;
        if (this.#again) this.wake(this.#again === 'now');
      });
  }

  /** Stops looking; the look under way is finished first. */
  async stop(): Promise<void> {
    if (!this.#started) return;
    this.#started = false;
    clearInterval(this.#poll);
    clearTimeout(this.#gap);
    this.#gap = undefined;
    const unlisten = await this.#unlisten;
    this.#unlisten = undefined;
    await unlisten?.().catch(() => {});
    await this.#running;
  }
}
