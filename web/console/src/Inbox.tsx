import { useMemo, useState } from 'preact/hooks';
import type { Channel, ConversationResource, ConversationStatus } from '../../api/client';
import { inboxOrder, type LiveState } from './live';

interface Props {
  state: LiveState;
  me: string;
  openId: string | undefined;
  onOpen: (id: string) => void;
}

export const conversationTitle = (c: ConversationResource) =>
  `${c.attributes.channel === 'voice' ? 'Call' : c.attributes.channel === 'sms' ? 'SMS' : 'Chat'} ${c.attributes.public_id?.slice(0, 6) ?? c.id.slice(-6)}`;

const assignedTo = (c: ConversationResource) => (c.attributes.metadata as { assigned_operator?: string } | undefined)?.assigned_operator;

export function Inbox({ state, me, openId, onOpen }: Props) {
  const [status, setStatus] = useState<ConversationStatus | 'open' | 'all'>('open');
  const [channel, setChannel] = useState<Channel | 'all'>('all');
  const list = useMemo(
    () =>
      [...state.conversations.values()]
        .filter((c) => (status === 'all' ? true : status === 'open' ? c.attributes.status !== 'closed' : c.attributes.status === status))
        .filter((c) => channel === 'all' || c.attributes.channel === channel)
        .sort(inboxOrder(me)),
    [state.conversations, status, channel, me],
  );

  return (
    <section class="pane inbox" aria-labelledby="inbox-title">
      <div class="pane-head">
        <h2 id="inbox-title">Inbox</h2>
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
      </div>
      {list.length === 0 ? (
        <p class="muted pad">No conversations here.</p>
      ) : (
        <ul class="conversation-list" aria-label="Conversations">
          {list.map((c) => {
            const unread = state.unread.get(c.id) ?? 0;
            const latest = state.latest.get(c.id);
            const mine = assignedTo(c) === me;
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
                    {unread > 0 && (
                      <span class="unread">
                        {unread}
                        <span class="visually-hidden"> unread</span>
                      </span>
                    )}
                  </span>
                  <span class="row-bottom">
                    {mine && <span class="tag">Assigned to you</span>}
                    <span class="preview">{latest ? `${latest.attributes.role}: ${latest.attributes.content}` : c.attributes.channel}</span>
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
