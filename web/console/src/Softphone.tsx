import { useEffect, useRef, useState } from 'preact/hooks';
import { describeError, type ApiClient } from '../../api/client';
import type { Action, LiveState } from './live';
import type { Phone } from './phone';
import { type CallView, dialTarget, PhoneNotSetUp, type PhoneState, type SipCredential } from './phone-model';

const KEYS = ['1', '2', '3', '4', '5', '6', '7', '8', '9', '*', '0', '#'];
const ROLE_LABELS: Record<string, string> = { user: 'Customer', assistant: 'Agent', operator: 'Operator', system: 'Note' };

interface Props {
  api: ApiClient;
  /** The operator's SIP user (its id), or undefined without one (then there is no phone). */
  sipUserId: string | undefined;
  /** The console's live state (the call's transcript, conversation and items are kept current there). */
  state: LiveState;
  dispatch: (action: Action) => void;
}

/** A credential from the API; only the SIP user's name is asked for beside it, never its stored password. */
async function fetchCredential(api: ApiClient, sipUserId: string): Promise<SipCredential> {
  const { data, error, response } = await api.POST('/api/sip_users/credential', {
    params: { query: { fields: { SipUser: 'sip_username' } } },
    body: { data: { type: 'SipUser', attributes: { sip_user_id: sipUserId } } },
  });
  if (response.status === 409) throw new PhoneNotSetUp();
  const credential = (data?.meta as { sip_credential?: SipCredential } | undefined)?.sip_credential;
  if (!credential) throw new Error(describeError(error, 'The phone is not available.'));
  return credential;
}

/**
 * The softphone: registration state, a dial box, and the call panel (incoming: caller, number, the call's
 * conversation so far, answer or decline; in a call: mute, hold, keypad, hang up).
 */
export function Softphone({ api, sipUserId, state: live, dispatch }: Props) {
  const [state, setState] = useState<PhoneState | undefined>();
  const [dial, setDial] = useState('');
  const [dialError, setDialError] = useState<string | undefined>();
  const [keypad, setKeypad] = useState(false);
  const phone = useRef<Phone | undefined>(undefined);
  const audio = useRef<HTMLAudioElement>(null);

  useEffect(() => {
    if (!sipUserId) return;
    let created: Phone | undefined;
    let gone = false;
    // Unregisters when the operator signs out or the tab goes.
    const leave = () => created?.stop();
    void (async () => {
      // The phone (JsSIP) is loaded only here, for operators with a SIP user.
      const { Phone } = await import('./phone');
      if (gone) return;
      created = new Phone({ credential: () => fetchCredential(api, sipUserId), onChange: setState, audio: () => audio.current });
      phone.current = created;
      setState(created.state);
      window.addEventListener('pagehide', leave);
      await created.start();
    })();
    return () => {
      gone = true;
      window.removeEventListener('pagehide', leave);
      created?.stop();
      phone.current = undefined;
    };
  }, [api, sipUserId]);

  if (!sipUserId || !state || state.registration === 'absent') return null;
  const ready = state.registration === 'registered';
  const call = state.call;

  return (
    <section class="softphone" aria-label="Phone">
      <audio ref={audio} autoPlay>
        <track kind="captions" />
      </audio>
      <p class={`phone-status phone-${state.registration}`} role="status">
        {ready ? 'Phone ready' : state.registration === 'failed' ? 'Phone unavailable' : 'Phone connecting…'}
        {state.problem && <span class="muted"> {state.problem}</span>}
      </p>
      {call ? (
        <CallPanel
          api={api}
          live={live}
          dispatch={dispatch}
          call={call}
          phone={phone.current!}
          keypad={keypad}
          onKeypad={() => setKeypad(!keypad)}
        />
      ) : (
        <form
          class="dial"
          onSubmit={(e) => {
            e.preventDefault();
            if (!dialTarget(dial)) {
              setDialError('Enter a phone number or a SIP user name.');
              return;
            }
            setDialError(undefined);
            if (phone.current?.call(dial)) setDial('');
          }}
        >
          <label for="dial">Call a number or SIP user</label>
          <span class="dial-row">
            <input
              id="dial"
              value={dial}
              autoComplete="off"
              inputMode="tel"
              placeholder="+44 20 7946 0018 or ana"
              onInput={(e) => setDial(e.currentTarget.value)}
              aria-invalid={dialError ? 'true' : undefined}
              aria-describedby={dialError ? 'dial-error' : undefined}
            />
            <button type="submit" class="button primary" disabled={!ready}>
              Call
            </button>
          </span>
          {dialError && (
            <span id="dial-error" class="inline-error" role="alert">
              {dialError}
            </span>
          )}
        </form>
      )}
      {state.callError && (
        <p class="inline-error" role="alert">
          {state.callError}
        </p>
      )}
    </section>
  );
}

function elapsed(since: number | undefined, now: number): string {
  if (!since) return '';
  const s = Math.max(0, Math.floor((now - since) / 1000));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

function CallPanel({
  api,
  live,
  dispatch,
  call,
  phone,
  keypad,
  onKeypad,
}: {
  api: ApiClient;
  live: LiveState;
  dispatch: (action: Action) => void;
  call: CallView;
  phone: Phone;
  keypad: boolean;
  onKeypad: () => void;
}) {
  const [now, setNow] = useState(Date.now());
  const [transferring, setTransferring] = useState(false);
  const [transferTarget, setTransferTarget] = useState('');
  const [transferError, setTransferError] = useState<string | undefined>();
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(timer);
  }, []);
  const ringing = call.stage === 'ringing' && call.direction === 'incoming';
  const who = call.name && call.name !== call.number ? call.name : undefined;
  const stage =
    call.stage === 'talking'
      ? `${call.held ? 'On hold' : 'In call'} ${elapsed(call.answeredAt, now)}`
      : ringing
        ? 'Incoming call'
        : call.stage === 'ringing'
          ? 'Ringing…'
          : 'Connecting…';
  return (
    <section class={`call ${ringing ? 'call-ringing' : ''}`} aria-label={ringing ? 'Incoming call' : 'Call'}>
      <p class="call-stage" aria-live="assertive">
        {stage}
      </p>
      <p class="call-peer">
        <strong>{who ?? call.number}</strong>
        {who && <span class="muted"> {call.number}</span>}
      </p>
      <CallConversation api={api} callId={call.recordCallId ?? call.callId} state={live} dispatch={dispatch} />
      <div class="call-actions">
        {ringing ? (
          <>
            <button type="button" class="button primary" onClick={() => phone.answer()}>
              Answer
            </button>
            <button type="button" class="button danger" onClick={() => phone.decline()}>
              Decline
            </button>
          </>
        ) : (
          <>
            <button
              type="button"
              class="button"
              aria-pressed={call.muted}
              disabled={call.stage !== 'talking'}
              onClick={() => phone.toggleMute()}
            >
              {call.muted ? 'Unmute' : 'Mute'}
            </button>
            <button
              type="button"
              class="button"
              aria-pressed={call.held}
              disabled={call.stage !== 'talking'}
              onClick={() => phone.toggleHold()}
            >
              {call.held ? 'Resume' : 'Hold'}
            </button>
            <button type="button" class="button" aria-expanded={keypad} disabled={call.stage !== 'talking'} onClick={onKeypad}>
              Keypad
            </button>
            <button
              type="button"
              class="button"
              aria-expanded={transferring}
              disabled={call.stage !== 'talking' || call.transferTo !== undefined}
              onClick={() => setTransferring(!transferring)}
            >
              Transfer
            </button>
            <button type="button" class="button danger" onClick={() => phone.hangUp()}>
              Hang up
            </button>
          </>
        )}
      </div>
      {call.transferTo && (
        <p class="muted" role="status">
          Transferring to {call.transferTo}…
        </p>
      )}
      {transferring && call.stage === 'talking' && !call.transferTo && (
        <form
          class="dial"
          onSubmit={(e) => {
            e.preventDefault();
            if (!dialTarget(transferTarget)) {
              setTransferError("Enter a colleague's SIP user name or a phone number.");
              return;
            }
            setTransferError(undefined);
            if (phone.transfer(transferTarget)) setTransferring(false);
          }}
        >
          <label for="transfer-target">Transfer to (a colleague's SIP user or a number)</label>
          <span class="dial-row">
            <input
              id="transfer-target"
              value={transferTarget}
              autoComplete="off"
              onInput={(e) => setTransferTarget(e.currentTarget.value)}
              aria-invalid={transferError ? 'true' : undefined}
              aria-describedby={transferError ? 'transfer-error' : undefined}
            />
            <button type="submit" class="button primary">
              Transfer call
            </button>
          </span>
          {transferError && (
            <span id="transfer-error" class="inline-error" role="alert">
              {transferError}
            </span>
          )}
        </form>
      )}
      {keypad && call.stage === 'talking' && (
        <fieldset class="keypad">
          <legend class="visually-hidden">Keypad</legend>
          {KEYS.map((key) => (
            <button type="button" class="button" onClick={() => phone.dtmf(key)} aria-label={`Key ${key}`}>
              {key}
            </button>
          ))}
        </fieldset>
      )}
    </section>
  );
}

const SPEAKER_LABELS: Record<string, string> = { caller: 'Caller', agent: 'Agent', operator: 'Operator' };

/**
 * What the operator needs to take the call: the call's conversation so far and, for a call a voice agent handed
 * over, the agent's handoff summary (the conversation's `metadata.handoff_reason`) and the call's transcript,
 * kept live by the event stream (CallTranscript.created, ConversationItem.created, Conversation.updated in
 * `state`). The Call is found by its Call-ID (`call_uuid`): the SIP edge's `Parley-Call-ID` header when this
 * is a transferred call's new leg (docs/sip.md, "Transfers"), else the INVITE's own, once the edge recorded it.
 */
function CallConversation({
  api,
  callId,
  state,
  dispatch,
}: {
  api: ApiClient;
  callId: string;
  state: LiveState;
  dispatch: (action: Action) => void;
}) {
  const [found, setFound] = useState<{ callRowId: string; conversationId: string | undefined } | undefined>();
  useEffect(() => {
    let cancelled = false;
    void (async () => {
      // The edge records the call a moment after it rings: looked for a few times.
      for (let attempt = 0; attempt < 10 && !cancelled; attempt++) {
        const calls = await api.GET('/api/calls', { params: { query: { filter: { call_uuid: callId } } } });
        const call = calls.data?.data[0];
        if (call) {
          const conversationId = call.attributes.conversation_id ?? undefined;
          const [lines, conversation, page] = await Promise.all([
            api.GET('/api/call_transcripts', {
              params: { query: { filter: { call_id: call.id }, sort: '-content_index', 'page[limit]': 50 } },
            }),
            conversationId ? api.GET('/api/conversations/{id}', { params: { path: { id: conversationId } } }) : undefined,
            conversationId
              ? api.GET('/api/conversations/{id}/conversation_items', {
                  params: { path: { id: conversationId }, query: { sort: '-content_index', 'page[limit]': 20 } },
                })
              : undefined,
          ]);
          if (cancelled) return;
          dispatch({ kind: 'transcript', callId: call.id, list: lines.data?.data ?? [] });
          if (conversation?.data) dispatch({ kind: 'conversation', record: conversation.data.data });
          if (conversationId && page?.data) dispatch({ kind: 'items', conversationId, list: page.data.data });
          setFound({ callRowId: call.id, conversationId });
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    })();
    return () => {
      cancelled = true;
    };
  }, [api, callId, dispatch]);
  if (!found) return null;
  const byIndex = <T extends { attributes: { content_index?: number | null } }>(a: T, b: T) =>
    (a.attributes.content_index ?? 0) - (b.attributes.content_index ?? 0);
  const transcript = [...(state.transcripts.get(found.callRowId)?.values() ?? [])].sort(byIndex).slice(-50);
  const items = found.conversationId ? [...(state.items.get(found.conversationId)?.values() ?? [])].sort(byIndex).slice(-20) : [];
  const conversation = found.conversationId ? state.conversations.get(found.conversationId) : undefined;
  const handoff = (conversation?.attributes.metadata as { handoff_reason?: unknown } | undefined)?.handoff_reason;
  return (
    <>
      {typeof handoff === 'string' && handoff && (
        <p class="call-handoff">
          <strong>Agent's handoff summary:</strong> {handoff}
        </p>
      )}
      {transcript.length > 0 ? (
        <ol class="call-conversation" aria-label="Live transcript" aria-live="polite">
          {transcript.map((line) => (
            <li key={line.id}>
              <span class="muted">{SPEAKER_LABELS[line.attributes.speaker ?? ''] ?? line.attributes.speaker}:</span>{' '}
              {line.attributes.content}
            </li>
          ))}
        </ol>
      ) : (
        items.length > 0 && (
          <ol class="call-conversation" aria-label="The conversation so far">
            {items.map((item) => (
              <li key={item.id}>
                <span class="muted">{ROLE_LABELS[item.attributes.role ?? ''] ?? item.attributes.role}:</span> {item.attributes.content}
              </li>
            ))}
          </ol>
        )
      )}
    </>
  );
}
