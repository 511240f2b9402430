import { useEffect, useRef, useState } from 'preact/hooks';
import { describeError, type ApiClient, type ConversationItemResource } from '../../api/client';
import type { Phone } from './phone';
import { type CallView, dialTarget, PhoneNotSetUp, type PhoneState, type SipCredential } from './phone-model';

const KEYS = ['1', '2', '3', '4', '5', '6', '7', '8', '9', '*', '0', '#'];
const ROLE_LABELS: Record<string, string> = { user: 'Customer', assistant: 'Agent', operator: 'Operator', system: 'Note' };

interface Props {
  api: ApiClient;
  /** The operator's SIP user (its id), or undefined without one (then there is no phone). */
  sipUserId: string | undefined;
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
export function Softphone({ api, sipUserId }: Props) {
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
        <CallPanel api={api} call={call} phone={phone.current!} keypad={keypad} onKeypad={() => setKeypad(!keypad)} />
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
  call,
  phone,
  keypad,
  onKeypad,
}: {
  api: ApiClient;
  call: CallView;
  phone: Phone;
  keypad: boolean;
  onKeypad: () => void;
}) {
  const [now, setNow] = useState(Date.now());
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
      <CallConversation api={api} callId={call.callId} />
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
            <button type="button" class="button danger" onClick={() => phone.hangUp()}>
              Hang up
            </button>
          </>
        )}
      </div>
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

/**
 * The conversation of the call so far (a voice agent's transcript and handoff notes, when an agent handed the
 * call over): the Call is found by its Call-ID (`call_uuid`) once the SIP edge has recorded it.
 */
function CallConversation({ api, callId }: { api: ApiClient; callId: string }) {
  const [items, setItems] = useState<ConversationItemResource[] | undefined>();
  useEffect(() => {
    let cancelled = false;
    void (async () => {
      // The edge records the call a moment after it rings: looked for a few times.
      for (let attempt = 0; attempt < 10 && !cancelled; attempt++) {
        const calls = await api.GET('/api/calls', { params: { query: { filter: { call_uuid: callId } } } });
        const conversationId = calls.data?.data[0]?.attributes.conversation_id;
        if (conversationId) {
          const page = await api.GET('/api/conversations/{id}/conversation_items', {
            params: { path: { id: conversationId }, query: { sort: '-content_index', 'page[limit]': 20 } },
          });
          if (!cancelled) setItems((page.data?.data ?? []).slice().reverse());
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    })();
    return () => {
      cancelled = true;
    };
  }, [api, callId]);
  if (!items?.length) return null;
  return (
    <ol class="call-conversation" aria-label="The conversation so far">
      {items.map((item) => (
        <li key={item.id}>
          <span class="muted">{ROLE_LABELS[item.attributes.role ?? ''] ?? item.attributes.role}:</span> {item.attributes.content}
        </li>
      ))}
    </ol>
  );
}
