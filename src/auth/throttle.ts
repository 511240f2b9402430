/**
 * Login throttling: failures are counted per e-mail and per client address in
 * a fixed window; past the limit, login answers 429 until the window ends.
 * In memory on one node; in Redis (shared by every node) when one is given,
 * with this node's memory as the fallback while Redis is unreachable.
 */
import type { Redis } from 'ioredis';
import type { Config } from '../config/index.js';
import { ApiError } from '../jsonapi/errors.js';

export interface FailureCounter {
  /** Failures recorded for the key in the current window, and seconds until it ends. */
  get(key: string): Promise<{ count: number; retryAfter: number }>;
  add(key: string): Promise<void>;
}

export class MemoryFailureCounter implements FailureCounter {
  private readonly windows = new Map<string, { count: number; endsAt: number }>();
  constructor(private readonly windowSeconds: number) {}

  private current(key: string) {
    const now = Date.now();
    const window = this.windows.get(key);
    if (window && window.endsAt > now) return window;
    if (window) this.windows.delete(key);
    return undefined;
  }

  async get(key: string) {
    const window = this.current(key);
    return { count: window?.count ?? 0, retryAfter: window ? Math.ceil((window.endsAt - Date.now()) / 1000) : 0 };
  }

  async add(key: string) {
    const window = this.current(key);
    if (window) window.count += 1;
    else this.windows.set(key, { count: 1, endsAt: Date.now() + this.windowSeconds * 1000 });
    if (this.windows.size > 100_000) this.sweep();
  }

  private sweep() {
    const now = Date.now();
    for (const [key, window] of this.windows) if (window.endsAt <= now) this.windows.delete(key);
  }
}

export class RedisFailureCounter implements FailureCounter {
  constructor(private readonly redis: Redis, private readonly windowSeconds: number) {}

  async get(key: string) {
    const [count, ttl] = await Promise.all([this.redis.get(`parley:login:${key}`), this.redis.ttl(`parley:login:${key}`)]);
    return { count: Number(count ?? 0), retryAfter: Math.max(ttl, 0) };
  }

  async add(key: string) {
    const name = `parley:login:${key}`;
    const count = await this.redis.incr(name);
    if (count === 1) await this.redis.expire(name, this.windowSeconds);
  }
}

/**
 * Redis while it answers; this node's memory while it does not, so that an
 * outage of the shared store neither blocks logins nor lifts the throttle.
 */
export class FallbackFailureCounter implements FailureCounter {
  constructor(private readonly primary: FailureCounter, private readonly fallback: FailureCounter) {}

  async get(key: string) {
    const [shared, local] = await Promise.all([this.primary.get(key).catch(() => undefined), this.fallback.get(key)]);
    if (!shared) return local;
    return shared.count >= local.count ? shared : local;
  }

  async add(key: string) {
    await Promise.all([this.primary.add(key).catch(() => undefined), this.fallback.add(key)]);
  }
}

export class LoginThrottle {
  constructor(private readonly counter: FailureCounter, private readonly limit: number) {}

  private keys(email: string, address: string) {
    return [`email:${email.toLowerCase()}`, `address:${address}`];
  }

  /** 429 when the e-mail or the address has failed too often in this window. */
  async check(email: string, address: string): Promise<void> {
    for (const key of this.keys(email, address)) {
      const { count, retryAfter } = await this.counter.get(key);
      if (count >= this.limit) {
        throw ApiError.of(429, 'rate_limited', 'Too many failed logins; try again later.', undefined, { 'Retry-After': String(Math.max(retryAfter, 1)) });
      }
    }
  }

  async fail(email: string, address: string): Promise<void> {
    await Promise.all(this.keys(email, address).map((key) => this.counter.add(key)));
  }
}

export function createLoginThrottle(config: Config, redis?: Redis): LoginThrottle {
  const memory = new MemoryFailureCounter(config.loginWindowSeconds);
  const counter = redis ? new FallbackFailureCounter(new RedisFailureCounter(redis, config.loginWindowSeconds), memory) : memory;
  return new LoginThrottle(counter, config.loginFailuresPerWindow);
}
