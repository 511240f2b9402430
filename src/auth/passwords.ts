/** Memory-hard password hashing with Node's scrypt; the stored string names its own parameters. */
import { randomBytes, scrypt, timingSafeEqual, type ScryptOptions } from 'node:crypto';
import { promisify } from 'node:util';

import { passwordHashCostLog2 as costLog2 } from '../config/index.js';

const KEY_LENGTH = 32;

const scryptAsync = promisify<string, Buffer, number, ScryptOptions, Buffer>(scrypt);

function derive(password: string, salt: Buffer, options: ScryptOptions): Promise<Buffer> {
  return scryptAsync(password.normalize('NFC'), salt, KEY_LENGTH, { ...options, maxmem: 256 * options.N! * options.r! + 1024 * 1024 });
}

export async function hashPassword(password: string): Promise<string> {
  const options = { N: 2 ** costLog2(), r: 8, p: 1 };
  const salt = randomBytes(16);
  const key = await derive(password, salt, options);
  return ['scrypt', options.N, options.r, options.p, salt.toString('base64url'), key.toString('base64url')].join('$');
}

export async function verifyPassword(stored: string, password: string): Promise<boolean> {
  const [scheme, n, r, p, salt, key] = stored.split('$');
  if (scheme !== 'scrypt' || !salt || !key) return false;
  const expected = Buffer.from(key, 'base64url');
  const actual = await derive(password, Buffer.from(salt, 'base64url'), { N: Number(n), r: Number(r), p: Number(p) });
  return actual.length === expected.length && timingSafeEqual(actual, expected);
}

let dummy: Promise<string> | undefined;

/** Spends the time of a real verification, for unknown e-mails, so timing does not reveal them. */
export async function verifyAgainstDummy(password: string): Promise<false> {
  dummy ??= hashPassword(randomBytes(16).toString('hex'));
  await verifyPassword(await dummy, password);
  return false;
}

/**
 * Admission for password checks: at most `concurrency` hashes run at once and at most `queue` wait; anything
 * beyond is refused at once (503 with Retry-After) instead of joining a queue so long that every login behind
 * it -- the real ones too -- waits for seconds. scrypt runs on libuv's thread pool (4 threads by default).
 * A sign-in whose client has gone (`signal` aborted) leaves the queue at once and is never checked: a burst of
 * abandoned requests would otherwise hold the queue full for the time it takes to hash them all.
 */
export class HashGate {
  private running = 0;
  private readonly waiting: (() => void)[] = [];
  /** Checks run so far (diagnostics and tests). */
  checks = 0;
  /** A recent check's duration in ms (a moving average): what a sign-in that is not checked waits instead. */
  typicalMs = 100;
  constructor(
    private readonly concurrency: number,
    private readonly queue: number,
  ) {}

  /** Runs `work` when a slot is free; undefined when the queue is full or `signal` aborts first (the caller refuses the request). */
  async run<T>(work: () => Promise<T>, signal?: AbortSignal): Promise<{ value: T } | undefined> {
    if (signal?.aborted) return undefined;
    if (this.running >= this.concurrency) {
      if (this.waiting.length >= this.queue) return undefined;
      const admitted = await new Promise<boolean>((resolve) => {
        const admit = () => {
          signal?.removeEventListener('abort', leave);
          resolve(true);
        };
        const leave = () => {
          this.waiting.splice(this.waiting.indexOf(admit), 1);
          resolve(false);
        };
        this.waiting.push(admit);
        signal?.addEventListener('abort', leave, { once: true });
      });
      if (!admitted) return undefined;
    } else this.running += 1;
    const started = performance.now();
    this.checks += 1;
    try {
      return { value: await work() };
    } finally {
      this.typicalMs = 0.8 * this.typicalMs + 0.2 * (performance.now() - started);
      const next = this.waiting.shift();
      // The slot passes straight to the next waiter, so `running` stays counted.
      if (next) next();
      else this.running -= 1;
    }
  }
}
