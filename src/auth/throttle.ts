/**
 * Login throttling. Each attempt reserves a slot on two counters before the
 * password is checked -- one for the organisation and e-mail, one for the
 * client address -- atomically, so that a burst of parallel attempts cannot
 * all pass a check made before any of them is counted. Past the limit in the
 * window, login answers 429 (the correct password too) until the window ends.
 * A successful login gives its reservation back; a failed one keeps it.
 */
import ipaddr from 'ipaddr.js';
import type { Config } from '../config/index.js';
import { ApiError } from '../jsonapi/errors.js';
import type { WindowCounter } from './counters.js';

/**
 * The network a client address counts for: an IPv6 address by its /64, the smallest prefix a site is given
 * (one subscriber's usual allocation, RFC 6177), so a host cannot pass a limit by changing the interface
 * identifier it sends from; an IPv4 address (IPv4-mapped IPv6 included) by its /24, so that the addresses of
 * one network, easily had by the dozen, share one budget (RFC 7934), or alone with `ipv4Prefix` 32.
 */
export function addressGroup(address: string, ipv4Prefix: 24 | 32 = 24): string {
  if (!ipaddr.isValid(address)) return address;
  const ip = ipaddr.process(address);
  if (ip.kind() === 'ipv4') return ipv4Prefix === 32 ? ip.toString() : `${ip.toByteArray().slice(0, 3).join('.')}.0/24`;
  return `${(ip as ipaddr.IPv6).parts
    .slice(0, 4)
    .map((p) => p.toString(16))
    .join(':')}::/64`;
}

export class LoginThrottle {
  private readonly windowMs: number;
  constructor(
    private readonly counter: WindowCounter,
    private readonly limit: number,
    windowSeconds: number,
    private readonly unknownPerOrganisation = Number.POSITIVE_INFINITY,
  ) {
    this.windowMs = windowSeconds * 1000;
  }

  private keys(organisationId: string, email: string, address: string) {
    return [`login:email:${organisationId}:${email.toLowerCase()}`, `login:address:${addressGroup(address)}`];
  }

  /**
   * Counts a sign-in for an e-mail that has no account in the organisation; false once the organisation's
   * budget of such checks in the window is spent (the caller answers alike, without checking a password).
   * Many addresses guessing e-mails would otherwise keep every password check busy, and every sign-in of the
   * installation would answer 503.
   */
  async unknownAccount(organisationId: string): Promise<boolean> {
    const { count } = await this.counter.add(`login:unknown:${organisationId}`, this.windowMs, 1);
    return count <= this.unknownPerOrganisation;
  }

  /**
   * Counts a sign-in whose body was refused (malformed, too large, too complex, invalid) against its address:
   * such a request cost the server its parsing and validation and proved nothing, like a wrong password.
   */
  async refused(address: string): Promise<void> {
    await this.counter.add(`login:address:${addressGroup(address)}`, this.windowMs, 1);
  }

  /** Counts the attempt against the e-mail (in this organisation) and the address; 429 past the limit on either. */
  async reserve(organisationId: string, email: string, address: string) {
    const keys = this.keys(organisationId, email, address);
    const results = await Promise.all(keys.map((key) => this.counter.add(key, this.windowMs, 1)));
    /** Gives the attempt back (it succeeded, or it failed for a reason other than the credentials). */
    const release = () => Promise.all(keys.map((key) => this.counter.add(key, this.windowMs, -1).catch(() => undefined)));
    const over = results.filter((r) => r.count > this.limit);
    if (over.length > 0) {
      // The refused attempt is not counted: only attempts whose password was checked use the budget.
      await release();
      const retryAfter = Math.max(1, ...over.map((r) => Math.ceil(r.ttlMs / 1000)));
      throw ApiError.of('rate_limited', 'Too many failed logins; try again later.', undefined, { 'Retry-After': String(retryAfter) });
    }
    return { release };
  }
}

export function createLoginThrottle(config: Config, counter: WindowCounter): LoginThrottle {
  return new LoginThrottle(counter, config.loginFailuresPerWindow, config.loginWindowSeconds, config.loginUnknownPerOrganisation);
}
