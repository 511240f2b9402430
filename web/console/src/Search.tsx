import { useEffect, useState } from 'preact/hooks';
import { describeError, type ApiClient } from '../../api/client';
import type { Action } from './live';

/** What the inbox shows for a search: the ids of the matching conversations, or why there are none. */
export interface SearchResult {
  words: string;
  ids?: Set<string>;
  error?: string;
}

/**
 * The inbox's search by content: `GET /api/conversations?filter[content][matches]=<words>` (docs/api.md,
 * "Search"), 300 ms after the last keystroke; the matching conversations join the inbox's state (an older one
 * may not be loaded yet) and the inbox shows only them while the box has words.
 */
export function SearchBox({
  api,
  dispatch,
  onResult,
}: {
  api: ApiClient;
  dispatch: (action: Action) => void;
  onResult: (result: SearchResult | undefined) => void;
}) {
  const [words, setWords] = useState('');
  useEffect(() => {
    const query = words.trim();
    if (!query) {
      onResult(undefined);
      return;
    }
    let current = true;
    const timer = setTimeout(async () => {
      try {
        const { data, error } = await api.GET('/api/conversations', {
          params: { query: { 'filter[content][matches]': query, sort: '-id', 'page[limit]': 100 } as never },
        });
        if (!current) return;
        if (data) {
          dispatch({ kind: 'conversations', list: data.data });
          onResult({ words: query, ids: new Set(data.data.map((c) => c.id)) });
        } else onResult({ words: query, error: describeError(error, 'The search failed.') });
      } catch (cause) {
        if (current) onResult({ words: query, error: describeError(cause, 'The search failed: the server could not be reached.') });
      }
    }, 300);
    return () => {
      current = false;
      clearTimeout(timer);
    };
  }, [words, api, dispatch, onResult]);
  return (
    <div class="search">
      <label for="inbox-search" class="visually-hidden">
        Search messages
      </label>
      <input
        id="inbox-search"
        type="search"
        placeholder="Search messages…"
        value={words}
        onInput={(e) => setWords(e.currentTarget.value)}
        autocomplete="off"
      />
    </div>
  );
}
