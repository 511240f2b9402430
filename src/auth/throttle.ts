/**
 * Login throttling. Each attempt reserves a slot on two counters before the
 * password is checked -- one for the organisation and e-mail, one for the
 * client address -- atomically, so that a burst of parallel attempts cannot
 * all pass a check made before any of them is counted. Past the limit in the
 * window, login answers 429 (the correct password too) until the window ends.
 * A successful login gives its reservation back; a failed one keeps it.
 */
import type { Config } from '../config/index.js';
import { ApiError } from '../jsonapi/errors.js';
import type { WindowCounter } from './counters.js';

export interface Reservation {
  /** Gives the attempt back (it succeeded, or it failed for a reason other than the credentials). */
  release(): Promise<void>;
}

export class LoginThrottle {
  private readonly windowMs: number;
  constructor(
    private readonly counter: WindowCounter,
    private readonly limit: number,
    windowSeconds: number,
  ) {
    this.windowMs = windowSeconds * 1000;
  }

  private keys(organisationId: string, email: string, address: string) {
    return [`login:email:${organisationId}:${email.toLowerCase()}`, `login:address:${address}`];
  }

  /**
   * Counts a sign-in whose body was refused (malformed, too large, too complex, invalid) against its address:
   * such a request cost the server its parsing and validation and proved nothing, like a wrong password.
   */
  async refused(address: string): Promise<void> {
    await this.counter.add(`login:address:${address}`, this.windowMs, 1);
  }

  /** Counts the attempt against the e-mail (in this organisation) and the address; 429 past the limit on either. */
  async reserve(organisationId: string, email: string, address: string): Promise<Reservation> {
    const keys = this.keys(organisationId, email, address);
    const results = await Promise.all(keys.map((key) => this.counter.add(key, this.windowMs, 1)));
    const release = async () => {
      await Promise.all(keys.map((key) => this.counter.add(key, this.windowMs, -1).catch(() => undefined)));
    };
    const over = results.filter((r) => r.count > this.limit);
    if (over.length > 0) {
      // The refused attempt is not counted: only attempts whose password was checked use the budget.
      await release();
      const retryAfter = Math.max(1, ...over.map((r) => Math.ceil(r.ttlMs / 1000)));
      throw ApiError.of(429, 'rate_limited', 'Too many failed logins; try again later.', undefined, { 'Retry-After': String(retryAfter) });
    }
    return { release };
  }
}

export function createLoginThrottle(config: Config, counter: WindowCounter): LoginThrottle {
  return new LoginThrottle(counter, config.loginFailuresPerWindow, config.loginWindowSeconds);
}
