import { useMemo, useState } from 'preact/hooks';
import type { ApiClient, Channel, ConversationItemResource, ConversationResource, ConversationStatus } from '../../api/client';
import { type Action, inboxOrder, type LiveState } from './live';
import { SearchBox, type SearchResult } from './Search';

interface Props {
  api: ApiClient;
  dispatch: (action: Action) => void;
  state: LiveState;
  me: string;
  openId: string | undefined;
  onOpen: (id: string) => void;
}

/**
 * The contact's name, when the conversation has one: an answer the agent's workflow stored in the metadata
 * (`contact_name`, `visitor_name`, `name`, then any other `..._name` answer), the names docs/agents.md's
 * examples use for the visitor.
 */
export function contactName(c: ConversationResource): string | undefined {
  const metadata = (c.attributes.metadata ?? {}) as Record<string, unknown>;
  const named = (key: string) => (typeof metadata[key] === 'string' && (metadata[key] as string).trim()) || undefined;
  return (
    named('contact_name') ??
    named('visitor_name') ??
    named('name') ??
    Object.keys(metadata)
      .filter((k) => k.endsWith('_name') && k !== 'agent_name')
      .map(named)
      .find(Boolean)
  );
}

const channelLabel = (c: ConversationResource) =>
  c.attributes.channel === 'voice' ? 'Call' : c.attributes.channel === 'sms' ? 'SMS' : 'Chat';

export const conversationTitle = (c: ConversationResource) =>
  contactName(c) ?? `${channelLabel(c)} ${c.attributes.public_id?.slice(0, 6) ?? c.id.slice(-6)}`;

/** Who wrote an item, in words an operator reads at a glance. */
export const AUTHOR_LABELS: Record<string, string> = {
  user: 'Customer',
  assistant: 'Agent',
  operator: 'Operator',
  system: 'Note',
  tool: 'Tool',
};

const preview = (item: ConversationItemResource | undefined, c: ConversationResource) =>
  item
    ? `${AUTHOR_LABELS[item.attributes.role ?? 'system'] ?? 'Note'}: ${item.attributes.content ?? ''}`
    : `${channelLabel(c)}, no messages yet`;

/** The time of the last message (or of the conversation's last change): a clock time today, a date before. */
function when(item: ConversationItemResource | undefined, c: ConversationResource): { iso: string; text: string } | undefined {
  const iso = item?.attributes.occurred_at ?? c.attributes.updated_at;
  if (!iso) return undefined;
  const date = new Date(iso);
  const today = new Date().toDateString() === date.toDateString();
  return {
    iso,
    text: today
      ? date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })
      : date.toLocaleDateString([], { day: 'numeric', month: 'short' }),
  };
}

const assignedTo = (c: ConversationResource) => (c.attributes.metadata as { assigned_operator?: string } | undefined)?.assigned_operator;

type Scope = 'mine' | 'unassigned' | 'all';
const SCOPES: { value: Scope; label: string }[] = [
  { value: 'mine', label: 'Mine' },
  { value: 'unassigned', label: 'Unassigned' },
  { value: 'all', label: 'All' },
];

export function Inbox({ api, dispatch, state, me, openId, onOpen }: Props) {
  const [search, setSearch] = useState<SearchResult | undefined>();
  const [status, setStatus] = useState<ConversationStatus | 'open' | 'all'>('open');
  const [channel, setChannel] = useState<Channel | 'all'>('all');
  const [scope, setScope] = useState<Scope>('all');
  const list = useMemo(
    () =>
      [...state.conversations.values()]
        .filter((c) => scope === 'all' || (scope === 'mine' ? assignedTo(c) === me : !assignedTo(c)))
        .filter((c) => (status === 'all' ? true : status === 'open' ? c.attributes.status !== 'closed' : c.attributes.status === status))
        .filter((c) => channel === 'all' || c.attributes.channel === channel)
        .filter((c) => !search?.ids || search.ids.has(c.id))
        .sort(inboxOrder(me)),
    [state.conversations, status, channel, me, scope, search],
  );

  return (
    <section class="pane inbox" aria-labelledby="inbox-title">
      <div class="pane-head">
        <h2 id="inbox-title">Inbox</h2>
        <fieldset class="scopes">
          <legend class="visually-hidden">Show</legend>
          {SCOPES.map((s) => (
            <button key={s.value} type="button" class="scope" aria-pressed={scope === s.value} onClick={() => setScope(s.value)}>
              {s.label}
            </button>
          ))}
        </fieldset>
        <div class="filters">
          <label>
            <span class="visually-hidden">Status</span>
            <select value={status} onChange={(e) => setStatus(e.currentTarget.value as never)} aria-label="Filter by status">
              <option value="open">Open</option>
              <option value="pending">Pending</option>
              <option value="active">Active</option>
              <option value="closed">Closed</option>
              <option value="all">All</option>
            </select>
          </label>
          <label>
            <span class="visually-hidden">Channel</span>
            <select value={channel} onChange={(e) => setChannel(e.currentTarget.value as never)} aria-label="Filter by channel">
              <option value="all">All channels</option>
              <option value="chat">Chat</option>
              <option value="voice">Voice</option>
              <option value="sms">SMS</option>
            </select>
          </label>
        </div>
        <SearchBox api={api} dispatch={dispatch} onResult={setSearch} />
      </div>
      {search?.error && (
        <p class="banner error" role="alert">
          {search.error}
        </p>
      )}
      {list.length === 0 ? (
        <p class="muted pad">{search?.ids ? `No conversation mentions “${search.words}” here.` : 'No conversations here.'}</p>
      ) : (
        <ul class="conversation-list" aria-label="Conversations">
          {list.map((c) => {
            const unread = state.unread.get(c.id) ?? 0;
            const latest = state.latest.get(c.id);
            const mine = assignedTo(c) === me;
            const time = when(latest, c);
            return (
              <li key={c.id}>
                <button
                  type="button"
                  class={`conversation-row ${c.id === openId ? 'selected' : ''}`}
                  aria-current={c.id === openId ? 'true' : undefined}
                  data-conversation-id={c.id}
                  onClick={() => onOpen(c.id)}
                >
                  <span class="row-top">
                    <span class="title">{conversationTitle(c)}</span>
                    <span class={`badge status-${c.attributes.status}`}>{c.attributes.status}</span>
                    {time && (
                      <time class="row-time" dateTime={time.iso}>
                        {time.text}
                      </time>
                    )}
                    {unread > 0 && (
                      <span class="unread">
                        {unread}
                        <span class="visually-hidden"> unread</span>
                      </span>
                    )}
                  </span>
                  <span class="row-bottom">
                    {mine && <span class="tag">Assigned to you</span>}
                    <span class="preview">{preview(latest, c)}</span>
                  </span>
                </button>
              </li>
            );
          })}
        </ul>
      )}
    </section>
  );
}
