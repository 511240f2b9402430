import { useEffect, useMemo, useState } from 'preact/hooks';
import { describeError, type ApiClient, type CallResource, type CallTranscriptResource } from '../../api/client';
import type { Action, LiveState } from './live';

interface Props {
  api: ApiClient;
  state: LiveState;
  dispatch: (action: Action) => void;
  /** The operator's SIP username: their calls are those it took part in. Without one, every call is shown. */
  sipUsername: string | undefined;
}

const time = (value: string | null | undefined) => (value ? new Date(value).toLocaleString() : '—');

export function Calls({ api, state, dispatch, sipUsername }: Props) {
  const [error, setError] = useState<string | undefined>();
  useEffect(() => {
    void (async () => {
      const { data, error: failure } = await api.GET('/api/call_participants', {
        params: { query: { include: 'call', sort: '-joined_at', 'page[limit]': 100 } },
      });
      if (!data) return setError(describeError(failure, 'The calls could not be loaded.'));
      const calls = (data.included ?? []).filter((r): r is CallResource => (r as { type: string }).type === 'Call');
      dispatch({ kind: 'calls', calls, participants: data.data });
    })();
  }, [api, dispatch]);

  const calls = useMemo(
    () =>
      [...state.calls.values()]
        .filter((c) => !sipUsername || c.attributes.sip_username === sipUsername)
        .sort((a, b) => (a.id < b.id ? 1 : -1))
        .slice(0, 50),
    [state.calls, sipUsername],
  );

  return (
    <section class="pane calls" aria-labelledby="calls-title">
      <div class="pane-head">
        <h2 id="calls-title">{sipUsername ? 'My recent calls' : 'Recent calls'}</h2>
      </div>
      {error && (
        <p class="banner error" role="alert">
          {error}
        </p>
      )}
      {calls.length === 0 ? (
        <p class="muted pad">No calls yet.</p>
      ) : (
        <ul class="call-list">
          {calls.map((call) => (
            <CallRow key={call.id} api={api} call={call} state={state} />
          ))}
        </ul>
      )}
    </section>
  );
}

function CallRow({ api, call, state }: { api: ApiClient; call: CallResource; state: LiveState }) {
  const [transcript, setTranscript] = useState<CallTranscriptResource[] | undefined>();
  const [open, setOpen] = useState(false);
  const a = call.attributes;
  const participants = [...state.participants.values()].filter((p) => p.attributes.call_id === call.id);

  async function toggle() {
    setOpen(!open);
    if (transcript || open) return;
    const { data } = await api.GET('/api/call_transcripts', {
      params: { query: { filter: { call_id: call.id }, sort: 'content_index', 'page[limit]': 100 } },
    });
    setTranscript(data?.data ?? []);
  }

  return (
    <li class="call">
      <div class="call-head">
        <span class="title">
          {a.direction === 'inbound' ? '↙ Inbound' : '↗ Outbound'} {a.from_number ?? '?'} → {a.to_number ?? '?'}
        </span>
        <span class={`badge call-${a.status}`}>{a.status?.replace('_', ' ')}</span>
      </div>
      <p class="muted">
        {time(a.started_at)}
        {a.duration_seconds != null && ` · ${a.duration_seconds} s`}
      </p>
      {participants.length > 0 && (
        <ul class="participants" aria-label="Participants">
          {participants.map((p) => (
            <li key={p.id}>
              {p.attributes.role}: joined {time(p.attributes.joined_at)}
              {p.attributes.left_at ? `, left ${time(p.attributes.left_at)}` : ', on the call'}
            </li>
          ))}
        </ul>
      )}
      <button type="button" class="button" aria-expanded={open} onClick={toggle}>
        {open ? 'Hide transcript' : 'Transcript'}
      </button>
      {open && (
        <ol class="transcript" aria-label="Transcript">
          {transcript === undefined && <li class="muted">Loading…</li>}
          {transcript?.length === 0 && <li class="muted">No transcript for this call.</li>}
          {transcript?.map((t) => (
            <li key={t.id}>
              <strong>{t.attributes.speaker}:</strong> {t.attributes.content}
            </li>
          ))}
        </ol>
      )}
    </li>
  );
}
