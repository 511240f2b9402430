import { useEffect, useRef, useState } from 'preact/hooks';
import type { ApiClient } from '../../api/client';
import type { Typist } from './live';

/** How often a draft being typed repeats the signal (it stands for 6 s on the server; docs/events.md, "Typing"). */
const REPEAT_MS = 3000;

/**
 * Returns a function to call on each keystroke of a draft: it sends `POST /api/conversations/{id}/typing` at
 * most every 3 s. A failed signal is not worth an error on screen (the message itself will say so if it fails).
 */
export function useTypingSignal(api: ApiClient, conversationId: string): (draft: string) => void {
  const last = useRef(0);
  return (draft: string) => {
    const now = Date.now();
    if (!draft.trim() || now - last.current < REPEAT_MS) return;
    last.current = now;
    void api.POST('/api/conversations/{id}/typing', { params: { path: { id: conversationId } } }).catch(() => {});
  };
}

/** "Sam is typing…" while a signal stands; hidden at its `expires_at`. */
export function TypingIndicator({ typists, visitorName }: { typists: Typist[] | undefined; visitorName: string }) {
  const [now, setNow] = useState(Date.now());
  const standing = (typists ?? []).filter((t) => t.expiresAt > now);
  const next = Math.min(...standing.map((t) => t.expiresAt));
  useEffect(() => {
    if (!Number.isFinite(next)) return;
    const timer = setTimeout(() => setNow(Date.now()), Math.max(0, next - Date.now()) + 50);
    return () => clearTimeout(timer);
  }, [next, typists]);
  useEffect(() => setNow(Date.now()), [typists]);
  const names = standing.map((t) => (t.role === 'visitor' ? visitorName : t.name || 'An operator'));
  return (
    <p class="typing" aria-live="polite">
      {names.length > 0 ? `${names.join(' and ')} ${names.length > 1 ? 'are' : 'is'} typing…` : ''}
    </p>
  );
}
