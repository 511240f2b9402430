/**
 * The visitor chat widget. A website embeds it with one tag:
 *
 *   <script src="https://parley.example.com/widget.js" data-key="<publishable key>" data-agent="<AI agent id>" async></script>
 *
 * On the first message it trades the publishable key for a visitor credential (POST /api/visitor_sessions),
 * which creates the visitor's one conversation; it then posts the visitor's messages as `user` items and reads
 * the conversation's newest items (its related link, a page of 50, with the conversation included) every few
 * seconds, showing the agent's and operators' replies and,
 * when the conversation waits for a human (`pending`), that an operator will join. The page's origin must be in
 * the server's CORS_ALLOWED_ORIGINS. Everything lives in a shadow root, so the host page's styles do not leak in.
 *
 * `system` items are never shown to visitors: they are the service's notes for operators (a handoff's reason
 * may quote the agent's configuration); the visitor sees a friendly status line instead. A closed conversation
 * offers a new one in the same tab. Escape closes the panel wherever the focus is inside the widget.
 *
 * The panel never opens empty: until the conversation has messages it shows a greeting (`data-greeting`, the
 * organisation's own words in its embed tag, else a default), which is not stored; the agent's own first reply
 * follows the visitor's first message. Typing goes both ways (docs/events.md, "Typing"): the visitor's draft
 * signals `POST /api/conversations/{id}/typing` (every 3 s at most), and the operators' signals arrive on the
 * visitor's event stream (`GET /api/events?filter[type]=Conversation.typing`, open while the panel is), shown as
 * "Anna is typing…". A message longer than `MAX_MESSAGE_CHARS` (a paste of 10,000 lines) is not sent: the
 * visitor is told its length and the limit, and keeps the text to shorten.
 */
import { apiClient, describeError, type ConversationItemResource, type ConversationResource } from '../api/client';
import { openEventStream } from '../api/events';

interface VisitorSession {
  token: string;
  expiresAt: string;
  conversationId: string;
  publicId: string;
}

const POLL_MS = 2000;
/** The longest message the widget sends (the server takes up to 32 KiB of UTF-8; 4,000 characters fit any script). */
const MAX_MESSAGE_CHARS = 4000;
/** How often the visitor's draft repeats the typing signal (it stands for 6 s). */
const TYPING_REPEAT_MS = 3000;
const DEFAULT_GREETING = 'Hi! How can we help you today?';

const STYLE = `
  :host { all: initial; }
  * { box-sizing: border-box; font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; }
  .launcher { position: fixed; right: 16px; bottom: 16px; z-index: 2147483000; border: 0; border-radius: 999px; padding: 12px 18px;
    background: #0b5fca; color: #fff; font-size: 15px; cursor: pointer; box-shadow: 0 4px 14px rgba(0,0,0,.2); }
  .panel { position: fixed; right: 16px; bottom: 72px; z-index: 2147483000; width: min(360px, calc(100vw - 32px)); height: min(480px, calc(100vh - 100px));
    display: flex; flex-direction: column; background: #fff; color: #1b1f24; border: 1px solid #d8dee4; border-radius: 12px; box-shadow: 0 8px 28px rgba(0,0,0,.18); }
  .panel[hidden] { display: none; }
  header { padding: 10px 14px; border-bottom: 1px solid #d8dee4; font-weight: 600; display: flex; justify-content: space-between; align-items: center; }
  header button { border: 0; background: none; font-size: 18px; cursor: pointer; color: #57606a; min-width: 32px; min-height: 32px; }
  .log { flex: 1; overflow-y: auto; }
  ol { list-style: none; margin: 0; padding: 12px; display: flex; flex-direction: column; gap: 8px; }
  li { max-width: 85%; padding: 8px 10px; border-radius: 10px; font-size: 14px; white-space: pre-wrap; overflow-wrap: anywhere; }
  li small { display: block; font-size: 11px; color: #57606a; font-weight: 600; }
  .user { align-self: flex-end; background: #0b5fca; color: #fff; }
  .user small { color: #dbe9ff; }
  .assistant, .operator, .greeting { align-self: flex-start; background: #f1f3f5; }
  .typing { margin: 0; padding: 0 12px 4px; min-height: 18px; font-size: 12px; font-style: italic; color: #57606a; }
  .system { align-self: center; background: #fff8c5; font-size: 13px; }
  .status { margin: 0; padding: 6px 12px; font-size: 13px; color: #0a3069; background: #ddf4ff; }
  .status:empty { display: none; }
  .restart { margin: 0 10px 10px; border: 1px solid #0b5fca; border-radius: 8px; background: #fff; color: #0b5fca; padding: 8px; cursor: pointer; font-size: 14px; }
  .restart[hidden] { display: none; }
  form { display: flex; gap: 6px; padding: 10px; border-top: 1px solid #d8dee4; }
  input { flex: 1; font-size: 14px; padding: 8px; border: 1px solid #8c959f; border-radius: 8px; }
  form button { border: 0; border-radius: 8px; background: #0b5fca; color: #fff; padding: 8px 12px; cursor: pointer; font-size: 14px; }
  button:focus-visible, input:focus-visible { outline: 3px solid #0b5fca; outline-offset: 2px; }
`;

const LABELS: Record<string, string> = { user: 'You', assistant: 'Assistant', operator: 'Operator', system: '' };

function start(script: HTMLScriptElement) {
  const publishableKey = script.dataset.key ?? '';
  const agentId = script.dataset.agent || null;
  const baseUrl = script.dataset.api ?? new URL(script.src, window.location.href).origin;
  const storageKey = `parley.visitor.${publishableKey.slice(-16)}`;
  const greeting = script.dataset.greeting?.trim() || DEFAULT_GREETING;
  let closeStream: (() => void) | undefined;
  let typingTimer: number | undefined;
  let lastTypingSignal = 0;
  let session: VisitorSession | undefined = restore();
  let timer: number | undefined;
  /** The items seen in this conversation so far, by id: each poll brings the newest page, and older ones stay. */
  let known = new Map<string, ConversationItemResource>();
  let lastStatus: string | undefined;

  const api = apiClient({
    baseUrl,
    token: () => session?.token,
    onUnauthorized: () => forget('Your chat session ended. Send a message to start a new one.'),
  });

  const host = document.createElement('div');
  host.setAttribute('data-parley-widget', '');
  const root = host.attachShadow({ mode: 'open' });
  root.innerHTML = `<style>${STYLE}</style>
    <button class="launcher" type="button" aria-expanded="false" aria-controls="parley-panel">Chat with us</button>
    <section class="panel" id="parley-panel" role="dialog" aria-label="Chat" hidden>
      <header><span>Chat</span><button type="button" class="close" aria-label="Close chat">×</button></header>
      <div class="log" role="log" aria-live="polite" aria-label="Messages"><ol></ol></div>
      <p class="typing" aria-live="polite"></p>
      <p class="status" role="status"></p>
      <button type="button" class="restart" hidden>Start a new conversation</button>
      <form><label style="position:absolute;left:-9999px" for="parley-input">Your message</label>
        <input id="parley-input" name="message" autocomplete="off" placeholder="Type your message…" />
        <button type="submit">Send</button></form>
    </section>`;
  document.body.appendChild(host);
  const launcher = root.querySelector<HTMLButtonElement>('.launcher')!;
  const panel = root.querySelector<HTMLElement>('.panel')!;
  const list = root.querySelector<HTMLOListElement>('ol')!;
  const status = root.querySelector<HTMLParagraphElement>('.status')!;
  const form = root.querySelector<HTMLFormElement>('form')!;
  const input = root.querySelector<HTMLInputElement>('input')!;
  const restart = root.querySelector<HTMLButtonElement>('.restart')!;
  const typing = root.querySelector<HTMLParagraphElement>('.typing')!;

  function setOpen(open: boolean) {
    panel.hidden = !open;
    launcher.setAttribute('aria-expanded', String(open));
    if (open) {
      input.focus();
      if (session) {
        poll();
        listen();
      } else greet();
    } else {
      closeStream?.();
      closeStream = undefined;
    }
  }

  /** The greeting shown while the conversation has no messages (not stored; the agent's own reply follows). */
  function greet() {
    if (list.childElementCount > 0) return;
    const li = document.createElement('li');
    li.className = 'greeting';
    li.append(document.createTextNode(greeting));
    list.replaceChildren(li);
  }

  /** Operators typing: the visitor's own event stream, typing signals only, while the panel is open. */
  function listen() {
    if (closeStream || !session) return;
    closeStream = openEventStream({
      url: `${baseUrl}/api/events`,
      token: () => session?.token,
      types: ['Conversation.typing'],
      onState: () => {},
      onEvent: (event) => {
        const signal = (event.data as { meta?: { typing?: { role?: string; name?: string | null; expires_at?: string } } }).meta?.typing;
        if (!signal || signal.role === 'visitor') return;
        const name = signal.name?.trim().slice(0, 80) || 'An operator';
        typing.textContent = `${name} is typing…`;
        window.clearTimeout(typingTimer);
        const left = (Date.parse(signal.expires_at ?? '') || Date.now() + 6000) - Date.now();
        typingTimer = window.setTimeout(() => (typing.textContent = ''), Math.max(0, left));
      },
    });
  }
  launcher.addEventListener('click', () => setOpen(panel.hidden));
  root.querySelector('.close')!.addEventListener('click', () => {
    setOpen(false);
    launcher.focus();
  });
  // On the shadow root: a key pressed on the launcher, the panel or any control in it (events from inside a
  // shadow root reach its host's listeners retargeted, so the root is where every one of them is seen).
  root.addEventListener('keydown', (e) => {
    if ((e as KeyboardEvent).key === 'Escape' && !panel.hidden) {
      setOpen(false);
      launcher.focus();
    }
  });
  // A closed conversation stays closed; the visitor starts a new one (the next message opens a new session).
  restart.addEventListener('click', () => {
    forget('');
    list.replaceChildren();
    greet();
    restart.hidden = true;
    input.disabled = false;
    input.focus();
  });

  // The visitor's draft: a typing signal every few seconds while there is one, and a word when it is too long.
  input.addEventListener('input', () => {
    const length = input.value.length;
    if (length > MAX_MESSAGE_CHARS) status.textContent = tooLong(length);
    else if (status.textContent?.startsWith('Your message is too long')) status.textContent = '';
    const now = Date.now();
    if (!session || !input.value.trim() || now - lastTypingSignal < TYPING_REPEAT_MS) return;
    lastTypingSignal = now;
    void api.POST('/api/conversations/{id}/typing', { params: { path: { id: session.conversationId } } }).catch(() => {});
  });

  function tooLong(length: number) {
    return `Your message is too long: ${length.toLocaleString('en')} characters, at most ${MAX_MESSAGE_CHARS.toLocaleString('en')}. Shorten it or send it in parts.`;
  }

  function restore(): VisitorSession | undefined {
    try {
      const saved = JSON.parse(sessionStorage.getItem(storageKey) ?? 'null') as VisitorSession | null;
      return saved && Date.parse(saved.expiresAt) > Date.now() ? saved : undefined;
    } catch {
      return undefined;
    }
  }

  function forget(message: string) {
    session = undefined;
    known = new Map();
    lastStatus = undefined;
    sessionStorage.removeItem(storageKey);
    window.clearTimeout(timer);
    closeStream?.();
    closeStream = undefined;
    typing.textContent = '';
    status.textContent = message;
  }

  async function openSession(): Promise<VisitorSession | undefined> {
    const { data, error } = await api.POST('/api/visitor_sessions', {
      body: { data: { type: 'Conversation', attributes: { ai_agent_id: agentId } } },
      headers: { Authorization: `Bearer ${publishableKey}` },
    });
    if (!data) {
      status.textContent = describeError(error, 'The chat could not be started.');
      return undefined;
    }
    const meta = data.meta as { token: string; token_expires_at: string };
    session = {
      token: meta.token,
      expiresAt: meta.token_expires_at,
      conversationId: data.data.id,
      publicId: data.data.attributes.public_id ?? '',
    };
    sessionStorage.setItem(storageKey, JSON.stringify(session));
    return session;
  }

  function render(conversation: ConversationResource | undefined, items: ConversationItemResource[]) {
    for (const item of items) known.set(item.id, item);
    const shown = [...known.values()]
      .filter((i) => i.attributes.role !== 'tool' && i.attributes.role !== 'system')
      .sort((a, b) => (a.attributes.content_index ?? 0) - (b.attributes.content_index ?? 0));
    if (shown.length === 0) greet();
    else if (list.childElementCount !== shown.length || list.firstElementChild?.className === 'greeting') {
      list.replaceChildren(
        ...shown.map((item) => {
          const li = document.createElement('li');
          const role = item.attributes.role ?? 'system';
          li.className = role;
          // An operator's reply carries the name the console put in its metadata (author_name).
          const author = (item.attributes.metadata as { author_name?: unknown } | undefined)?.author_name;
          const name = role === 'operator' && typeof author === 'string' && author.trim() ? author.trim().slice(0, 80) : LABELS[role];
          if (name) {
            const label = document.createElement('small');
            label.textContent = name;
            li.append(label);
          }
          li.append(document.createTextNode(item.attributes.content ?? ''));
          // Their message is here: whoever was typing it is done.
          if (role === 'operator') typing.textContent = '';
          return li;
        }),
      );
      list.lastElementChild?.scrollIntoView({ block: 'end' });
    }
    // A page without items includes no conversation: its status is the one last seen.
    const state = conversation?.attributes.status ?? lastStatus;
    lastStatus = state;
    status.textContent = state === 'pending' ? 'An operator will join shortly.' : state === 'closed' ? 'This conversation has ended.' : '';
    input.disabled = state === 'closed';
    restart.hidden = state !== 'closed';
  }

  async function poll() {
    window.clearTimeout(timer);
    if (!session) return;
    let wait = POLL_MS;
    try {
      // One request a poll: the newest items (so a conversation of any length is read in bounded pages) and,
      // included, the conversation's status.
      const { data, response } = await api.GET('/api/conversations/{id}/conversation_items', {
        params: {
          path: { id: session.conversationId },
          query: { sort: '-content_index', 'page[limit]': 50, include: 'conversation' },
        },
      });
      if (data) {
        const conversation = (data.included ?? []).find((r) => (r as { type: string }).type === 'Conversation') as
          | ConversationResource
          | undefined;
        render(conversation, data.data);
      }
      if (response.status === 429) wait = Number(response.headers.get('Retry-After') ?? 10) * 1000;
    } catch {
      wait = POLL_MS * 3; // offline: try again a little later
    }
    if (session && !panel.hidden) timer = window.setTimeout(poll, wait);
  }

  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const content = input.value.trim();
    if (!content) return;
    // Bounded before anything is sent: a paste of 10,000 lines is refused here with its length, and kept.
    if (content.length > MAX_MESSAGE_CHARS) {
      status.textContent = tooLong(content.length);
      return;
    }
    input.value = '';
    const current = session ?? (await openSession());
    if (!current) {
      input.value = content;
      return;
    }
    const { error } = await api.POST('/api/conversation_items', {
      body: { data: { type: 'ConversationItem', attributes: { conversation_id: current.conversationId, role: 'user', content } } },
    });
    if (error) {
      input.value = content;
      status.textContent = describeError(error, 'Your message was not sent.');
    }
    await poll();
    listen();
  });

  if (script.dataset.open === 'true') setOpen(true);
  else greet();
}

const current = document.currentScript as HTMLScriptElement | null;
if (current) {
  if (document.body) start(current);
  else document.addEventListener('DOMContentLoaded', () => start(current));
}
