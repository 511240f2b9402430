import { useEffect, useRef, useState } from 'preact/hooks';
import {
  describeError,
  type ApiClient,
  type ConversationItemResource,
  type ConversationResource,
  type ConversationStatus,
} from '../../api/client';
import { AUTHOR_LABELS, contactName, conversationTitle } from './Inbox';
import type { Action, Typist } from './live';
import { TypingIndicator, useTypingSignal } from './Typing';

/** Messages per page: enough to fill a tall window, small enough to open at once. */
const PAGE_SIZE = 50;

interface Props {
  api: ApiClient;
  me: string;
  /** The name the visitor sees on my replies (metadata.author_name): my full name, else "Operator". */
  myName: string;
  conversation: ConversationResource;
  items: Map<string, ConversationItemResource> | undefined;
  /** Who is typing here now (Conversation.typing signals). */
  typists?: Typist[];
  dispatch: (action: Action) => void;
  onBack: () => void;
}

/**
 * One conversation: its items as they arrive, the reply box (items with role `operator`), and the actions.
 * Take over and hand back are the conversation's named actions (docs/console.md), which set its metadata's
 * `agent_paused` (the agent runtime stays silent) and `assigned_operator` (who answers) and nothing else.
 */
export function ConversationView({ api, me, myName, conversation, items, typists, dispatch, onBack }: Props) {
  const [draft, setDraft] = useState('');
  const [sending, setSending] = useState(false);
  const [error, setError] = useState<string | undefined>();
  const signalTyping = useTypingSignal(api, conversation.id);
  const listRef = useRef<HTMLOListElement>(null);
  const attributes = conversation.attributes;
  const metadata = (attributes.metadata ?? {}) as Record<string, unknown>;
  const takenOver = metadata.agent_paused === true;
  const closed = attributes.status === 'closed';
  const sorted = [...(items?.values() ?? [])].sort((a, b) => (a.attributes.content_index ?? 0) - (b.attributes.content_index ?? 0));

  /** The cursor of the next page of older messages (links.next's page[after]); null when the first is loaded. */
  const [older, setOlder] = useState<string | null | undefined>(undefined);
  const [loadingOlder, setLoadingOlder] = useState(false);

  /**
   * One page of the conversation's messages, newest first, from its related link (a paged list, so a
   * conversation of any length opens: an include is bounded by INCLUDE_MAX_RECORDS/_BYTES).
   */
  async function loadPage(after: string | undefined) {
    const { data, error: failure } = await api.GET('/api/conversations/{id}/conversation_items', {
      params: {
        path: { id: conversation.id },
        query: { sort: '-content_index', 'page[limit]': PAGE_SIZE, ...(after ? { 'page[after]': after } : {}) },
      },
    });
    if (!data) return setError(describeError(failure, 'The messages could not be loaded.'));
    dispatch({ kind: 'items', conversationId: conversation.id, list: data.data });
    const next = data.links?.next;
    setOlder(next ? (new URL(next, window.location.origin).searchParams.get('page[after]') ?? null) : null);
  }

  useEffect(() => {
    void (async () => {
      // Conversations have no single-record GET (the spec's endpoints): the list, filtered to this one.
      const { data, error: failure } = await api.GET('/api/conversations', { params: { query: { filter: { id: conversation.id } } } });
      if (!data?.data[0]) return setError(describeError(failure, 'The conversation could not be loaded.'));
      dispatch({ kind: 'conversation', record: data.data[0] });
      await loadPage(undefined);
    })();
  }, [api, conversation.id, dispatch]);

  // Follow the newest message (a new one arrived, or the first page loaded), not a page of older ones.
  const newest = sorted.at(-1)?.id;
  useEffect(() => {
    listRef.current?.lastElementChild?.scrollIntoView({ block: 'end' });
  }, [newest]);

  async function loadOlder() {
    if (!older || loadingOlder) return;
    setLoadingOlder(true);
    try {
      await loadPage(older);
    } catch (cause) {
      setError(describeError(cause, 'Older messages could not be loaded: the server could not be reached.'));
    } finally {
      setLoadingOlder(false);
    }
  }

  /** Changes the status alone, or runs a control action: never the whole metadata from the copy shown here. */
  async function update(change: ConversationStatus | 'take_over' | 'hand_back', failureText: string) {
    setError(undefined);
    const path = { id: conversation.id };
    const body = { data: { type: 'Conversation' as const, id: conversation.id } };
    try {
      const { data, error: failure } =
        change === 'take_over' || change === 'hand_back'
          ? await api.POST(`/api/conversations/{id}/${change}`, { params: { path }, body })
          : await api.PATCH('/api/conversations/{id}', {
              params: { path },
              body: { data: { ...body.data, attributes: { status: change } } },
            });
      if (data) dispatch({ kind: 'conversation', record: data.data });
      else setError(describeError(failure, failureText));
    } catch (cause) {
      setError(describeError(cause, `${failureText} The server could not be reached.`));
    }
  }

  /**
   * Sends the draft as an operator item. A refusal or an unreachable server (fetch throws) keeps the draft and
   * says why; Send is enabled again either way, so the operator can retry.
   */
  async function send(event: Event) {
    event.preventDefault();
    const content = draft.trim();
    if (!content || sending) return;
    setSending(true);
    setError(undefined);
    try {
      const { data, error: failure } = await api.POST('/api/conversation_items', {
        body: {
          data: {
            type: 'ConversationItem',
            attributes: {
              conversation_id: conversation.id,
              role: 'operator',
              content,
              ...(myName ? { metadata: { author_name: myName } } : {}),
            },
          },
        },
      });
      if (data) {
        setDraft('');
        dispatch({ kind: 'item', record: data.data, openId: conversation.id });
      } else setError(describeError(failure, 'Your reply was not sent.'));
    } catch (cause) {
      setError(describeError(cause, 'Your reply was not sent: the server could not be reached. Send again to retry.'));
    } finally {
      setSending(false);
    }
  }

  return (
    <section class="pane conversation" aria-labelledby="conversation-title">
      <div class="pane-head">
        <button type="button" class="button quiet back" onClick={onBack} aria-label="Back to the inbox">
          ←
        </button>
        <h2 id="conversation-title">{conversationTitle(conversation)}</h2>
        <span class={`badge status-${attributes.status}`}>{attributes.status}</span>
        {takenOver && <span class="tag">{metadata.assigned_operator === me ? 'You are answering' : 'An operator is answering'}</span>}
        <div class="actions">
          {!closed &&
            (takenOver ? (
              <button type="button" class="button" onClick={() => update('hand_back', 'The conversation could not be handed back.')}>
                Hand back to agent
              </button>
            ) : (
              <button type="button" class="button" onClick={() => update('take_over', 'The conversation could not be taken over.')}>
                Take over
              </button>
            ))}
          {closed ? (
            <button type="button" class="button" onClick={() => update('active', 'The conversation could not be reopened.')}>
              Reopen
            </button>
          ) : (
            <button type="button" class="button" onClick={() => update('closed', 'The conversation could not be closed.')}>
              Close
            </button>
          )}
        </div>
      </div>
      <ol class="items" ref={listRef} aria-label="Messages" aria-live="polite">
        {older && (
          <li class="older">
            <button type="button" class="button quiet" disabled={loadingOlder} onClick={loadOlder}>
              {loadingOlder ? 'Loading…' : 'Load earlier messages'}
            </button>
          </li>
        )}
        {sorted.map((item) => (
          <li key={item.id} class={`item role-${item.attributes.role}`}>
            <span class="item-role">{AUTHOR_LABELS[item.attributes.role ?? 'system'] ?? item.attributes.role}</span>
            <p class="item-content">{item.attributes.content}</p>
            <Sources metadata={item.attributes.metadata} />
            <time class="item-time" dateTime={item.attributes.occurred_at}>
              {item.attributes.occurred_at ? new Date(item.attributes.occurred_at).toLocaleTimeString() : ''}
            </time>
          </li>
        ))}
        {sorted.length === 0 && older === null && <li class="muted pad">No messages yet.</li>}
      </ol>
      <AnalysisPanel analysis={attributes.analysis} />
      <TypingIndicator typists={typists} visitorName={contactName(conversation) ?? 'The customer'} />
      {error && (
        <p class="banner error" role="alert">
          {error}
        </p>
      )}
      <form class="reply" onSubmit={send}>
        <label for="reply" class="visually-hidden">
          Reply as operator
        </label>
        <textarea
          id="reply"
          rows={2}
          placeholder={closed ? 'Reopen the conversation to reply' : 'Write a reply… (Enter sends, Shift+Enter adds a line)'}
          disabled={closed}
          value={draft}
          onInput={(e) => {
            setDraft(e.currentTarget.value);
            signalTyping(e.currentTarget.value);
          }}
          onKeyDown={(e) => {
            if (e.key === 'Enter' && !e.shiftKey) send(e);
          }}
        />
        <button class="button primary" type="submit" disabled={closed || sending || !draft.trim()}>
          Send
        </button>
      </form>
    </section>
  );
}

/** A conversation's analysis as the agent runtime wrote it when the conversation closed (docs/agents.md, "Analysis"). */
interface Analysis {
  summary?: string | null;
  data?: Record<string, unknown> | null;
  success?: boolean | null;
  analysed_at?: string;
  skipped?: string;
  error?: string;
}

function AnalysisPanel({ analysis }: { analysis: unknown }) {
  if (!analysis || typeof analysis !== 'object') return null;
  const a = analysis as Analysis;
  const data = a.data && Object.keys(a.data).length > 0 ? Object.entries(a.data) : [];
  return (
    <section class="analysis" aria-label="Analysis">
      <h3>
        Analysis
        {typeof a.success === 'boolean' && (
          <span class={`badge ${a.success ? 'success' : 'failure'}`}>{a.success ? 'success' : 'not a success'}</span>
        )}
      </h3>
      {a.skipped && <p class="muted">Not analysed: {a.skipped}.</p>}
      {a.summary && <p>{a.summary}</p>}
      {data.length > 0 && (
        <dl>
          {data.map(([key, value]) => (
            <div key={key}>
              <dt>{key}</dt>
              <dd>{typeof value === 'string' ? value : JSON.stringify(value)}</dd>
            </div>
          ))}
        </dl>
      )}
      {a.error && <p class="muted">{a.error}</p>}
    </section>
  );
}

/** The knowledge passages a reply was given (`metadata.sources`). */
function Sources({ metadata }: { metadata: unknown }) {
  const sources = (metadata as { sources?: { document_id: string; title: string; chunk: number }[] } | undefined)?.sources;
  if (!Array.isArray(sources) || sources.length === 0) return null;
  return (
    <p class="item-sources">
      Sources:{' '}
      {sources.map((s, i) => (
        <span key={`${s.document_id}:${s.chunk}`} title={s.document_id}>
          {i > 0 ? ', ' : ''}
          {s.title} (part {s.chunk + 1})
        </span>
      ))}
    </p>
  );
}
