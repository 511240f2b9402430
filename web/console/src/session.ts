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
}

export function takeKeyFromFragment(): string | undefined {
  const fragment = new URLSearchParams(window.location.hash.replace(/^#/, ''));
  const key = fragment.get('key');
  if (key) {
    localStorage.setItem(KEY, key);
    history.replaceState(null, '', window.location.pathname + window.location.search);
  }
  return localStorage.getItem(KEY) ?? undefined;
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
