/**
 * The console's live picture of the organisation: conversations, their items, calls and the operator's own
 * status, loaded once through the API and then kept current by the event stream's messages.
 */
import type {
  CallParticipantResource,
  CallResource,
  CallTranscriptResource,
  ConversationItemResource,
  ConversationResource,
  OperatorAvailability,
} from '../../api/client';
import type { ParleyEvent } from '../../api/events';

export interface LiveState {
  conversations: Map<string, ConversationResource>;
  /** Items by conversation id, for the conversations that were opened or that received items since sign-in. */
  items: Map<string, Map<string, ConversationItemResource>>;
  /** Items that arrived (from others than me) since the conversation was last looked at. */
  unread: Map<string, number>;
  /** The latest item of each conversation seen since sign-in (for the inbox's preview). */
  latest: Map<string, ConversationItemResource>;
  calls: Map<string, CallResource>;
  participants: Map<string, CallParticipantResource>;
  /** Transcript lines by call id, for the calls the softphone shows (loaded, then CallTranscript.created). */
  transcripts: Map<string, Map<string, CallTranscriptResource>>;
  myStatus?: OperatorAvailability;
  /** Who is typing in each conversation (Conversation.typing signals; docs/events.md, "Typing"). */
  typing: Map<string, Typist[]>;
}

/** One standing typing signal: a visitor, or a member by user id. */
export interface Typist {
  role: 'operator' | 'visitor';
  userId: string | null;
  name: string | null;
  /** Milliseconds since the epoch. */
  expiresAt: number;
}

export const emptyState = (): LiveState => ({
  conversations: new Map(),
  items: new Map(),
  unread: new Map(),
  latest: new Map(),
  calls: new Map(),
  participants: new Map(),
  transcripts: new Map(),
  typing: new Map(),
});

export type Action =
  | { kind: 'conversations'; list: ConversationResource[] }
  | { kind: 'conversation'; record: ConversationResource }
  | { kind: 'items'; conversationId: string; list: ConversationItemResource[] }
  | { kind: 'item'; record: ConversationItemResource; openId?: string }
  | { kind: 'read'; conversationId: string }
  | { kind: 'calls'; calls: CallResource[]; participants: CallParticipantResource[] }
  | { kind: 'call'; record: CallResource }
  | { kind: 'participant'; record: CallParticipantResource }
  | { kind: 'transcript'; callId: string; list: CallTranscriptResource[] }
  | { kind: 'status'; status: OperatorAvailability | undefined }
  | { kind: 'typing'; conversationId: string; typist: Typist };

const copy = <K, V>(map: Map<K, V>) => new Map(map);

export function reduce(state: LiveState, action: Action): LiveState {
  switch (action.kind) {
    case 'conversations': {
      const conversations = copy(state.conversations);
      for (const c of action.list) conversations.set(c.id, c);
      return { ...state, conversations };
    }
    case 'conversation':
      return { ...state, conversations: copy(state.conversations).set(action.record.id, action.record) };
    case 'items': {
      // A page of items (any order), added to those already known: pages of older ones, and live ones that
      // arrived while a page was loading, all stay.
      const list = copy(state.items.get(action.conversationId) ?? new Map<string, ConversationItemResource>());
      for (const item of action.list) list.set(item.id, item);
      let latest = state.latest.get(action.conversationId);
      for (const item of list.values())
        if (!latest || (item.attributes.content_index ?? 0) > (latest.attributes.content_index ?? 0)) latest = item;
      return {
        ...state,
        items: copy(state.items).set(action.conversationId, list),
        latest: latest ? copy(state.latest).set(action.conversationId, latest) : state.latest,
      };
    }
    case 'item': {
      const item = action.record;
      const conversationId = item.attributes.conversation_id!;
      if (state.items.get(conversationId)?.has(item.id)) return state;
      const items = copy(state.items);
      items.set(conversationId, copy(items.get(conversationId) ?? new Map()).set(item.id, item));
      const unread = copy(state.unread);
      if (conversationId !== action.openId && item.attributes.role !== 'operator') {
        unread.set(conversationId, (unread.get(conversationId) ?? 0) + 1);
      }
      // The message a typist was writing has arrived: their indicator goes (a visitor's `user` item, an operator's).
      const typists = state.typing.get(conversationId);
      const writer = item.attributes.role === 'user' ? 'visitor' : item.attributes.role === 'operator' ? 'operator' : undefined;
      const typing = typists?.some((t) => t.role === writer)
        ? copy(state.typing).set(
            conversationId,
            typists.filter((t) => t.role !== writer),
          )
        : state.typing;
      return { ...state, items, unread, typing, latest: copy(state.latest).set(conversationId, item) };
    }
    case 'read': {
      if (!state.unread.get(action.conversationId)) return state;
      const unread = copy(state.unread);
      unread.delete(action.conversationId);
      return { ...state, unread };
    }
    case 'calls': {
      const calls = copy(state.calls);
      for (const c of action.calls) calls.set(c.id, c);
      const participants = copy(state.participants);
      for (const p of action.participants) participants.set(p.id, p);
      return { ...state, calls, participants };
    }
    case 'call':
      return { ...state, calls: copy(state.calls).set(action.record.id, action.record) };
    case 'participant':
      return { ...state, participants: copy(state.participants).set(action.record.id, action.record) };
    case 'transcript': {
      const lines = copy(state.transcripts.get(action.callId) ?? new Map<string, CallTranscriptResource>());
      for (const line of action.list) lines.set(line.id, line);
      return { ...state, transcripts: copy(state.transcripts).set(action.callId, lines) };
    }
    case 'status':
      return { ...state, myStatus: action.status };
    case 'typing': {
      const { typist } = action;
      const others = (state.typing.get(action.conversationId) ?? []).filter(
        (t) => t.expiresAt > Date.now() && !(t.role === typist.role && t.userId === typist.userId),
      );
      return { ...state, typing: copy(state.typing).set(action.conversationId, [...others, typist]) };
    }
  }
}

/** What an event from GET /api/events changes, if anything. */
export function actionOf(event: ParleyEvent, context: { openId?: string; mySipUserId?: string; me?: string }): Action | undefined {
  switch (event.type) {
    case 'Conversation.created':
    case 'Conversation.updated':
      return { kind: 'conversation', record: event.data };
    case 'ConversationItem.created':
      return { kind: 'item', record: event.data, openId: context.openId };
    case 'Call.created':
    case 'Call.updated':
      return { kind: 'call', record: event.data };
    case 'CallParticipant.created':
    case 'CallParticipant.updated':
      return { kind: 'participant', record: event.data };
    case 'CallTranscript.created': {
      const line = event.data;
      return line.attributes.call_id ? { kind: 'transcript', callId: line.attributes.call_id, list: [line] } : undefined;
    }
    case 'OperatorStatus.created':
    case 'OperatorStatus.updated': {
      const { attributes } = event.data;
      const mine =
        (attributes.user_id && attributes.user_id === context.me) ||
        (attributes.sip_user_id && attributes.sip_user_id === context.mySipUserId);
      return mine ? { kind: 'status', status: attributes.status } : undefined;
    }
    case 'Conversation.typing': {
      const { typing } = event.data.meta;
      if (typing.user_id === context.me) return undefined;
      return {
        kind: 'typing',
        conversationId: event.data.id,
        typist: {
          role: typing.role,
          userId: typing.user_id,
          name: typing.name,
          expiresAt: Date.parse(typing.expires_at) || Date.now() + 6000,
        },
      };
    }
    default:
      return undefined;
  }
}

/** Order of the inbox: pending and assigned to me, then other pending, then active, then closed; newest first within. */
export function inboxOrder(me: string) {
  const rank = (c: ConversationResource) => {
    const assigned = (c.attributes.metadata as { assigned_operator?: string } | undefined)?.assigned_operator === me;
    const status = c.attributes.status;
    if (status === 'pending') return assigned ? 0 : 1;
    if (status === 'active') return assigned ? 2 : 3;
    return 4;
  };
  // UUIDv7 ids sort by creation time.
  return (a: ConversationResource, b: ConversationResource) => rank(a) - rank(b) || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0);
}
