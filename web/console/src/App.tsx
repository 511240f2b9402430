import { useCallback, useEffect, useMemo, useReducer, useRef, useState } from 'preact/hooks';
import { apiClient, describeError, type OperatorAvailability } from '../../api/client';
import { openEventStream, type StreamState } from '../../api/events';
import { AlertSwitches } from './AlertSwitches';
import { alertOf, loadAlertSettings, raise, saveAlertSettings } from './alerts';
import { Availability } from './Availability';
import { Calls } from './Calls';
import { ConversationView } from './ConversationView';
import { Inbox } from './Inbox';
import { actionOf, emptyState, reduce } from './live';
import { SignIn } from './SignIn';
import { Softphone } from './Softphone';
import { keepKey, loadSession, saveSession, takeKeyFromFragment, type Session } from './session';

const STREAM_LABELS: Record<StreamState, string> = {
  connecting: 'Connecting…',
  live: 'Live',
  reconnecting: 'Reconnecting…',
  unavailable: 'Live updates unavailable',
  unauthorized: 'Session ended',
};

export function App() {
  const linked = useMemo(() => takeKeyFromFragment(), []);
  const [publishableKey, setPublishableKey] = useState(linked.key);
  const [offeredKey, setOfferedKey] = useState(linked.offered);
  const initial = useMemo(() => loadSession(), []);
  const [session, setSession] = useState<Session | undefined>(initial.session);
  const [notice, setNotice] = useState<string | undefined>(initial.expired ? 'Your session expired. Please sign in again.' : undefined);
  const sessionRef = useRef(session);
  sessionRef.current = session;

  const signOut = useCallback((message?: string) => {
    saveSession(undefined);
    setSession(undefined);
    setNotice(message);
  }, []);

  const api = useMemo(
    () =>
      apiClient({
        baseUrl: window.location.origin,
        token: () => sessionRef.current?.token,
        onUnauthorized: () => signOut('Your session expired or was revoked. Please sign in again.'),
      }),
    [signOut],
  );

  // A link with another organisation's key: switching is the user's decision, never the link's.
  if (offeredKey) {
    return (
      <main class="signin" id="main">
        <div class="card" role="alertdialog" aria-labelledby="switch-title">
          <h1 id="switch-title">Switch organisation?</h1>
          <p>
            This link opens the console of a different organisation than the one this browser signs in to
            {session?.organisationName ? ` (${session.organisationName})` : ''}. Only switch if you trust whoever sent you the link.
          </p>
          <button
            type="button"
            class="button primary"
            onClick={() => {
              keepKey(offeredKey);
              setPublishableKey(offeredKey);
              setOfferedKey(undefined);
              signOut('Sign in to the organisation of the link.');
            }}
          >
            Switch organisation
          </button>{' '}
          <button type="button" class="button quiet" onClick={() => setOfferedKey(undefined)}>
            Keep the current one
          </button>
        </div>
      </main>
    );
  }
  if (!session) {
    return (
      <SignIn
        api={api}
        publishableKey={publishableKey}
        notice={notice}
        onSignedIn={(s) => {
          saveSession(s);
          setNotice(undefined);
          setSession(s);
        }}
      />
    );
  }
  return <Workspace api={api} session={session} onSignOut={() => signOut('You signed out.')} />;
}

type Api = ReturnType<typeof apiClient>;
type View = 'conversations' | 'calls';

function Workspace({ api, session, onSignOut }: { api: Api; session: Session; onSignOut: () => void }) {
  const [state, dispatch] = useReducer(reduce, undefined, emptyState);
  const [view, setView] = useState<View>('conversations');
  const [openId, setOpenId] = useState<string | undefined>();
  const [stream, setStream] = useState<StreamState>('connecting');
  const [sipUser, setSipUser] = useState<{ id: string; username: string } | null | undefined>(undefined);
  const [error, setError] = useState<string | undefined>();
  const context = useRef({ openId, mySipUserId: sipUser?.id, me: session.userId });
  const known = useRef(new Set<string>());
  known.current = new Set(state.conversations.keys());
  const conversationsRef = useRef(state.conversations);
  conversationsRef.current = state.conversations;
  const [alertSettings, setAlertSettings] = useState(loadAlertSettings);
  const alertSettingsRef = useRef(alertSettings);
  alertSettingsRef.current = alertSettings;
  context.current = { openId, mySipUserId: sipUser?.id, me: session.userId };

  // The event stream ends when the session is revoked (sign-out elsewhere, revoke_tokens, removal) and its
  // reconnection gets 401. One API request confirms it, and its 401 signs the console out at once (which stops
  // the phone: a call in progress is hung up), instead of waiting for the operator's next action.
  useEffect(() => {
    if (stream === 'unauthorized') void api.GET('/api/operator_statuses', { params: { query: { filter: { user_id: session.userId } } } });
  }, [api, stream, session.userId]);

  // The session's end, scheduled: the token stops working at token_expires_at.
  useEffect(() => {
    const ms = Date.parse(session.expiresAt) - Date.now();
    const timer = setTimeout(onSignOut, Math.max(0, Math.min(ms, 2 ** 31 - 1)));
    return () => clearTimeout(timer);
  }, [session.expiresAt, onSignOut]);

  // Initial load: conversations, my SIP user and its current status.
  useEffect(() => {
    void (async () => {
      const conversations = await api.GET('/api/conversations', { params: { query: { sort: '-id', 'page[limit]': 100 } } });
      if (conversations.data) dispatch({ kind: 'conversations', list: conversations.data.data });
      else setError(describeError(conversations.error, 'The conversations could not be loaded.'));
      // Only the name: the SIP user's stored password never comes into the page (the softphone gets a
      // short-lived credential of its own).
      const sipUsers = await api.GET('/api/sip_users', {
        params: { query: { filter: { user_id: session.userId }, fields: { SipUser: 'sip_username' } } },
      });
      const mine = sipUsers.data?.data[0];
      setSipUser(mine ? { id: mine.id, username: mine.attributes.sip_username ?? '' } : null);
      // My one current status, named by my user whether or not I have a SIP user.
      const current = await api.GET('/api/operator_statuses', { params: { query: { filter: { user_id: session.userId } } } });
      dispatch({ kind: 'status', status: current.data?.data[0]?.attributes.status as OperatorAvailability | undefined });
    })();
  }, [api, session.userId]);

  // The live stream: opened once per session; it resumes by itself after losses.
  useEffect(
    () =>
      openEventStream({
        url: `${window.location.origin}/api/events`,
        token: () => session.token,
        onState: setStream,
        onEvent: (event) => {
          const alert = alertOf(event, conversationsRef.current.get(event.data.id), session.userId);
          if (alert)
            raise(alert, alertSettingsRef.current, (id) => {
              setView('conversations');
              setOpenId(id);
            });
          const action = actionOf(event, context.current);
          if (action) dispatch(action);
          // An item of a conversation the inbox has not loaded (older than its first page): fetch that one.
          if (action?.kind === 'item' && !known.current.has(action.record.attributes.conversation_id!)) {
            const id = action.record.attributes.conversation_id!;
            known.current.add(id);
            void api.GET('/api/conversations', { params: { query: { filter: { id } } } }).then(({ data }) => {
              if (data?.data.length) dispatch({ kind: 'conversations', list: data.data });
            });
          }
        },
      }),
    [api, session.token, session.userId],
  );

  // The tab's title counts unread messages, so a new message is seen from another tab.
  const unread = [...state.unread.values()].reduce((n, count) => n + count, 0);
  useEffect(() => {
    document.title = unread ? `(${unread}) Parley console` : 'Parley console';
  }, [unread]);

  const open = (id: string | undefined) => {
    setOpenId(id);
    if (id) dispatch({ kind: 'read', conversationId: id });
  };

  return (
    <div class="shell">
      <header class="topbar">
        <a class="skip" href="#main">
          Skip to content
        </a>
        <span class="brand" aria-hidden="true">
          Parley
        </span>
        <nav class="tabs" aria-label="Sections">
          <button type="button" aria-current={view === 'conversations' ? 'page' : undefined} onClick={() => setView('conversations')}>
            Conversations
          </button>
          <button type="button" aria-current={view === 'calls' ? 'page' : undefined} onClick={() => setView('calls')}>
            Calls
          </button>
        </nav>
        <div class="topbar-end">
          <AlertSwitches
            settings={alertSettings}
            onChange={(next) => {
              saveAlertSettings(next);
              setAlertSettings(next);
            }}
          />
          <Availability
            api={api}
            userId={session.userId}
            status={state.myStatus}
            onChange={(s) => dispatch({ kind: 'status', status: s })}
          />
          <span class={`stream stream-${stream}`} role="status" aria-live="polite">
            {STREAM_LABELS[stream]}
          </span>
          <span class="org" title="Organisation">
            {session.organisationName || 'Unnamed organisation'}
          </span>
          <span class="who" title={session.email}>
            {session.fullName || session.email}
          </span>
          <button type="button" class="button quiet" onClick={onSignOut}>
            Sign out
          </button>
        </div>
      </header>
      {error && (
        <p class="banner error" role="alert">
          {error}
        </p>
      )}
      <main id="main" tabIndex={-1} class={`main ${openId ? 'has-open' : ''}`}>
        {view === 'conversations' ? (
          <>
            <Inbox api={api} dispatch={dispatch} state={state} me={session.userId} openId={openId} onOpen={open} />
            {openId && state.conversations.get(openId) ? (
              <ConversationView
                key={openId}
                api={api}
                me={session.userId}
                myName={session.fullName}
                conversation={state.conversations.get(openId)!}
                items={state.items.get(openId)}
                typists={state.typing.get(openId)}
                dispatch={dispatch}
                onBack={() => open(undefined)}
              />
            ) : (
              <section class="pane empty" aria-label="Conversation">
                <p>Select a conversation to read it and reply.</p>
              </section>
            )}
          </>
        ) : (
          <Calls api={api} state={state} dispatch={dispatch} sipUsername={sipUser?.username} />
        )}
      </main>
      <Softphone api={api} sipUserId={sipUser?.id} state={state} dispatch={dispatch} />
    </div>
  );
}
