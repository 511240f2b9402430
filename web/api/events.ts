/**
 * The live event stream, GET /api/events (text/event-stream; CONTRACT section 9), read with fetch streaming
 * so that the bearer header can be sent (EventSource cannot). @microsoft/fetch-event-source parses the
 * stream (WHATWG HTML "server-sent events") and, when it reconnects, sends the id of the last event it saw as
 * Last-Event-ID, so the server replays what was missed: after a network loss or a server restart nothing is lost.
 */
import { EventStreamContentType, fetchEventSource } from '@microsoft/fetch-event-source';

import type { EventPayloads } from './schema';

/** An event of the stream; its `type` names what `data` is (EventPayloads, generated from the resources). */
export type ParleyEvent = {
  [Type in keyof EventPayloads]: { id: string; type: Type; occurred_at: string; organisation_id: string; data: EventPayloads[Type] };
}[keyof EventPayloads];

export type StreamState = 'connecting' | 'live' | 'reconnecting' | 'unavailable' | 'unauthorized';

export interface StreamOptions {
  url: string;
  token: () => string | undefined;
  /** Event types (filter[type]); all the caller may read when omitted. */
  types?: string[];
  onEvent: (event: ParleyEvent) => void;
  onState: (state: StreamState) => void;
}

class Fatal extends Error {}

/** Opens the stream; reconnects with growing pauses (1 s to 15 s) until the returned function closes it. */
export function openEventStream(options: StreamOptions): () => void {
  const controller = new AbortController();
  const url = options.types?.length ? `${options.url}?filter[type]=${encodeURIComponent(options.types.join(','))}` : options.url;
  let failures = 0;
  options.onState('connecting');
  void fetchEventSource(url, {
    signal: controller.signal,
    headers: { Authorization: `Bearer ${options.token() ?? ''}`, Accept: EventStreamContentType },
    // Keep reading while the tab is hidden: an operator must see new conversations arrive.
    openWhenHidden: true,
    async onopen(response) {
      const type = response.headers.get('content-type') ?? '';
      if (response.ok && type.startsWith(EventStreamContentType)) {
        failures = 0;
        options.onState('live');
        return;
      }
      if (response.status === 401) {
        options.onState('unauthorized');
        throw new Fatal('unauthorized');
      }
      if (response.status === 404 || response.status === 403) {
        options.onState('unavailable');
        throw new Fatal(`event stream answered ${response.status}`);
      }
      throw new Error(`event stream answered ${response.status}`);
    },
    onmessage(message) {
      if (!message.data) return;
      try {
        options.onEvent(JSON.parse(message.data) as ParleyEvent);
      } catch {
        // A message that is not an event (a future kind) is skipped, not fatal.
      }
    },
    onclose() {
      // The server ended the stream (restart, deploy): reconnect and resume after the last id.
      throw new Error('event stream closed');
    },
    onerror(error) {
      if (error instanceof Fatal) throw error;
      options.onState('reconnecting');
      failures += 1;
      return Math.min(1000 * 2 ** (failures - 1), 15_000);
    },
  }).catch(() => {
    /* closed for good: the state says why */
  });
  return () => controller.abort();
}
