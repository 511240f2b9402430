/**
 * A minimal reader of a text/event-stream (WHATWG HTML, "Server-sent events": fields `id`, `event`, `data`,
 * comment lines starting with a colon) over a real HTTP connection, for tests.
 */
import http from 'node:http';

export interface SseMessage {
  id?: string;
  event?: string;
  data: string;
}

export interface SseStream {
  status: number;
  headers: http.IncomingHttpHeaders;
  /** The body of a non-stream answer (an error document). */
  body: string;
  messages: SseMessage[];
  comments: string[];
  /** Resolves once `count` messages (matching `where`) have arrived; rejects after `timeoutMs`. */
  waitFor(count: number, where?: (m: SseMessage) => boolean, timeoutMs?: number): Promise<SseMessage[]>;
  closed: Promise<void>;
  close(): void;
}

export function openSse(baseUrl: string, path: string, token: string, headers: Record<string, string> = {}): Promise<SseStream> {
  return new Promise((resolve, reject) => {
    const request = http.get(
      `${baseUrl}${path}`,
      { headers: { authorization: `Bearer ${token}`, accept: 'text/event-stream', ...headers } },
      (response) => {
        const messages: SseMessage[] = [];
        const comments: string[] = [];
        let buffer = '';
        let body = '';
        const waiters = new Set<() => void>();
        let resolveClosed!: () => void;
        const closed = new Promise<void>((r) => (resolveClosed = r));
        const isStream = (response.headers['content-type'] ?? '').startsWith('text/event-stream');
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => {
          if (!isStream) {
            body += chunk;
            return;
          }
          buffer += chunk;
          for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            const message: SseMessage = { data: '' };
            const data: string[] = [];
            let any = false;
            for (const line of block.split('\n')) {
              if (line.startsWith(':')) {
                comments.push(line.slice(1).trim());
                continue;
              }
              const colon = line.indexOf(':');
              const field = colon < 0 ? line : line.slice(0, colon);
              const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
              any = true;
              if (field === 'id') message.id = value;
              else if (field === 'event') message.event = value;
              else if (field === 'data') data.push(value);
            }
            if (!any) continue;
            message.data = data.join('\n');
            messages.push(message);
          }
          for (const waiter of waiters) waiter();
        });
        response.on('close', () => {
          resolveClosed();
          for (const waiter of waiters) waiter();
        });
        resolve({
          status: response.statusCode ?? 0,
          headers: response.headers,
          get body() {
            return body;
          },
          messages,
          comments,
          closed,
          close: () => request.destroy(),
          waitFor(count, where = () => true, timeoutMs = 5000) {
            return new Promise((done, fail) => {
              const check = () => {
                const found = messages.filter(where);
                if (found.length >= count) {
                  waiters.delete(check);
                  clearTimeout(timer);
                  done(found);
                }
              };
              const timer = setTimeout(() => {
                waiters.delete(check);
                fail(
                  new Error(
                    `waited ${timeoutMs} ms for ${count} messages, have ${messages.filter(where).length}: ${JSON.stringify(messages.map((m) => m.event))}`,
                  ),
                );
              }, timeoutMs);
              waiters.add(check);
              check();
            });
          },
        });
      },
    );
    request.on('error', reject);
  });
}

/** Reads the whole body of a non-stream answer. */
export async function bodyOf(stream: SseStream): Promise<unknown> {
  await stream.closed;
  return JSON.parse(stream.body);
}
