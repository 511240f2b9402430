/**
 * What the console remembers in the browser. The organisation's publishable key arrives once in the link's
 * fragment (/console#key=...; fragments are never sent to servers, RFC 3986 section 3.5) and is kept in
 * localStorage (it is public by design: it can only sign users in); the fragment is then removed from the
 * address bar and history. The user's access token is kept in sessionStorage, for this tab, until it expires.
 */
const KEY = 'parley.publishableKey';
const SESSION = 'parley.session';

export interface Session {
  token: string;
  expiresAt: string;
  userId: string;
  email: string;
  fullName: string;
  /** The organisation signed in to, named on every screen. */
  organisationName: string;
}

/**
 * The publishable key to sign in with, and one a link brought that differs from the kept one. A link never
 * replaces a kept key by itself: a link to another organisation's console (anyone can make one) would
 * otherwise sign the next person into that organisation. The console asks first (`keepKey`).
 */
export function takeKeyFromFragment(): { key: string | undefined; offered: string | undefined } {
  const fragment = new URLSearchParams(window.location.hash.replace(/^#/, ''));
  const linked = fragment.get('key') ?? undefined;
  if (linked) history.replaceState(null, '', window.location.pathname + window.location.search);
  const kept = localStorage.getItem(KEY) ?? undefined;
  if (linked && !kept) {
    localStorage.setItem(KEY, linked);
    return { key: linked, offered: undefined };
  }
  return { key: kept, offered: linked && linked !== kept ? linked : undefined };
}

/** Keeps `key` as the organisation's key (the user agreed to switch). */
export function keepKey(key: string): void {
  localStorage.setItem(KEY, key);
}

export function loadSession(): { session?: Session; expired: boolean } {
  const raw = sessionStorage.getItem(SESSION);
  if (!raw) return { expired: false };
  try {
    const session = JSON.parse(raw) as Session;
    if (Date.parse(session.expiresAt) > Date.now()) return { session, expired: false };
  } catch {
    /* unreadable: treated as expired */
  }
  sessionStorage.removeItem(SESSION);
  return { expired: true };
}

export function saveSession(session: Session | undefined): void {
  if (session) sessionStorage.setItem(SESSION, JSON.stringify(session));
  else sessionStorage.removeItem(SESSION);
}
