/**
 * Fixed-window counters shared by the request limiter and the login throttle.
 * In memory on one node; in Redis (shared by every node) when one is given,
 * with this node's memory as the fallback while Redis is unreachable, so that
 * an outage of the shared store neither blocks requests nor lifts a limit.
 */
import type { Redis } from 'ioredis';

export interface CountResult {
  /** The key's count in the current window after this change. */
  count: number;
  /** Milliseconds until the window ends. */
  ttlMs: number;
}

export interface WindowCounter {
  /**
   * Adds `by` (1 to count, -1 to give a reservation back) to the key's count in
   * its current window, atomically, and returns the new count. A window starts
   * with the first positive add and lasts `windowMs`.
   */
  add(key: string, windowMs: number, by?: number): Promise<CountResult>;
}

/** Keys one node's memory counts at most; beyond, expired windows go, then the oldest. */
const MAX_KEYS = 100_000;

class MemoryCounter implements WindowCounter {
  private readonly windows = new Map<string, { count: number; endsAt: number }>();

  /** Synchronous under the hood: in one Node process, no other request can interleave with it. */
  async add(key: string, windowMs: number, by = 1): Promise<CountResult> {
    return this.addNow(key, windowMs, by);
  }

  addNow(key: string, windowMs: number, by = 1): CountResult {
    const now = Date.now();
    let window = this.windows.get(key);
    if (window && window.endsAt <= now) {
      this.windows.delete(key);
      window = undefined;
    }
    if (!window) {
      if (by <= 0) return { count: 0, ttlMs: 0 };
      if (this.windows.size >= MAX_KEYS) this.sweep(now);
      window = { count: 0, endsAt: now + windowMs };
      this.windows.set(key, window);
    }
    window.count = Math.max(0, window.count + by);
    return { count: window.count, ttlMs: window.endsAt - now };
  }

  private sweep(now: number) {
    for (const [key, window] of this.windows) if (window.endsAt <= now) this.windows.delete(key);
    // Still full: drop the oldest windows (Map keeps insertion order) rather than grow without bound.
    for (const key of this.windows.keys()) {
      if (this.windows.size < MAX_KEYS) break;
      this.windows.delete(key);
    }
  }
}

/** INCRBY and its expiry in one script, so that concurrent nodes see one consistent count (no lost updates). */
const COUNT_SCRIPT = `
local count = redis.call('INCRBY', KEYS[1], ARGV[2])
if count < 0 then
  redis.call('SET', KEYS[1], 0, 'KEEPTTL')
  count = 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {count, ttl}`;

/** Redis while it answers; this node's memory (which always counts too) while it does not. */
class RedisCounter implements WindowCounter {
  private readonly memory = new MemoryCounter();

  constructor(private readonly redis: Redis) {}

  async add(key: string, windowMs: number, by = 1): Promise<CountResult> {
    const local = this.memory.addNow(key, windowMs, by);
    try {
      const [count, ttlMs] = (await this.redis.eval(COUNT_SCRIPT, 1, `parley:${key}`, windowMs, by)) as [number, number];
      return { count, ttlMs };
    } catch {
      return local;
    }
  }
}

export function createCounter(redis: Redis | undefined): WindowCounter {
  return redis ? new RedisCounter(redis) : new MemoryCounter();
}
