import type { Principal } from '../jsonapi/principal.js';

/** The notification channel the 0009 migration's triggers announce credential changes on. */
export const CREDENTIALS_CHANNEL = 'parley_credentials';

/**
 * Verified API keys and user tokens (the principal their key or session record and membership gave), kept
 * for a few seconds so that a request need not read them again: without it every request pays a database
 * round trip before its own query. Revocation stays immediate (docs/architecture.md, "Verified credentials"):
 * every change to the records behind credentials is announced at commit and drops the whole cache
 * (`invalidate`); a read that began before a change is not kept (`mark`); nothing is cached while the
 * listening connection is down (`suspend`, `resume`: notifications sent meanwhile are lost); an entry never
 * outlives its key's or session's own expiry; and on PostgreSQL an entry is served only once a fresh read of the
 * credential epoch finds it current (`current`). Visitor credentials are not cached (they depend on their
 * conversation too).
 */
export class CredentialCache {
  private readonly entries = new Map<string, { principal: Principal; until: number; epoch?: string }>();
  /**
   * Reads the credential epoch (migration 0014_c) in a statement that starts after the call; set on
   * PostgreSQL, where other processes' changes are announced a moment after their commit.
   */
  private epochProbe?: SharedRead<string>;
  private generation = 0;
  private live = false;

  constructor(
    private readonly ttlMs: number,
    private readonly capacity = 10_000,
    private readonly now: () => number = Date.now,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  get(token: string): Principal | undefined {
    if (!this.live) return undefined;
    const entry = this.entries.get(token);
    if (!entry) return undefined;
    if (entry.until <= this.now()) {
      this.entries.delete(token);
      return undefined;
    }
    return { ...entry.principal };
  }

  /** Serve entries only once a fresh read of the credential epoch finds them current (see `current`). */
  checkEpoch(read: () => Promise<string>): void {
    this.epochProbe = new SharedRead(read);
  }

  /**
   * Whether the entry for `token` may be served to a request that has just arrived: with an epoch check, only
   * when the credential epoch read by a statement that began after this call is the one the entry was read
   * at. Any commit that changed a credential record before that statement began has moved the epoch, even if
   * its notification has not reached this process yet; then the whole cache is dropped (as the notification
   * would have).
   */
  async current(token: string): Promise<boolean> {
    const probe = this.epochProbe;
    if (!probe) return true;
    const epoch = this.entries.get(token)?.epoch;
    if (epoch === undefined) return false;
    const now = await probe.read();
    if (now === epoch) return true;
    this.invalidate();
    return false;
  }

  /** Taken before reading a credential's records; `set` keeps the result only if nothing changed since. */
  mark(): number {
    return this.generation;
  }

  /** Keeps a principal read since `mark`, until the cache's lifetime or `notAfterMs` (the record's expiry). */
  set(token: string, principal: Principal, notAfterMs: number, mark: number, epoch?: string): void {
    const now = this.now();
    if (!this.live || this.ttlMs <= 0 || mark !== this.generation) return;
    const until = Math.min(now + this.ttlMs, notAfterMs);
    if (until <= now) return;
    if (this.entries.size >= this.capacity) this.entries.delete(this.entries.keys().next().value!);
    this.entries.set(token, { principal: { ...principal }, until, epoch });
  }

  /** A credential record changed (a notification): forget everything, and void reads in flight. */
  invalidate(): void {
    this.entries.clear();
    this.generation++;
  }

  /** Listening (again): changes are announced from now on; what was kept before may be stale. */
  resume(): void {
    this.invalidate();
    this.live = true;
  }

  /** Not listening: changes would go unseen, so nothing is kept or served. */
  suspend(): void {
    this.invalidate();
    this.live = false;
  }
}

/**
 * Reads of one value shared by the callers that wait for them: a caller gets the result of a read that
 * started after its call. While a read is in flight, later callers share the next one, which starts when it
 * ends, so that concurrent callers cost one statement per round trip, not one each.
 */
export class SharedRead<T> {
  private inFlight?: Promise<T>;
  private next?: Promise<T>;

  constructor(private readonly readOnce: () => Promise<T>) {}

  read(): Promise<T> {
    if (!this.inFlight) {
      const started = this.readOnce().finally(() => {
        if (this.inFlight === started) this.inFlight = undefined;
      });
      this.inFlight = started;
      return started;
    }
    if (!this.next) {
      const previous = this.inFlight;
      const next: Promise<T> = previous
        .catch(() => undefined)
        .then(() => {
          this.inFlight = next;
          this.next = undefined;
          return this.readOnce();
        })
        .finally(() => {
          if (this.inFlight === next) this.inFlight = undefined;
        });
      this.next = next;
    }
    return this.next;
  }
}
