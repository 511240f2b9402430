import { useState } from 'preact/hooks';
import { describeError, type ApiClient, type OperatorAvailability } from '../../api/client';

const CHOICES: { value: OperatorAvailability; label: string }[] = [
  { value: 'available', label: 'Available' },
  { value: 'busy', label: 'Busy' },
  { value: 'wrap_up', label: 'Wrap-up' },
  { value: 'away', label: 'Away' },
  { value: 'offline', label: 'Offline' },
];

interface Props {
  api: ApiClient;
  /** The signed-in user: every operator has an availability, with or without a SIP user. */
  userId: string;
  status: OperatorAvailability | undefined;
  onChange: (status: OperatorAvailability) => void;
}

/**
 * The operator's own availability: an OperatorStatus named by the user (`user_id`, which is also their SIP
 * user's status when they have one), with source `widget`; changes made elsewhere arrive as events.
 */
export function Availability({ api, userId, status, onChange }: Props) {
  const [error, setError] = useState<string | undefined>();
  const [saving, setSaving] = useState(false);

  async function choose(next: OperatorAvailability) {
    setSaving(true);
    setError(undefined);
    const { data, error: failure } = await api.POST('/api/operator_statuses', {
      body: { data: { type: 'OperatorStatus', attributes: { user_id: userId, status: next, source: 'widget' } } },
    });
    setSaving(false);
    if (data) onChange(data.data.attributes.status as OperatorAvailability);
    else setError(describeError(failure, 'Your availability could not be changed.'));
  }

  return (
    <span class="availability">
      <span class={`dot dot-${status ?? 'unknown'}`} aria-hidden="true" />
      <label for="availability" class="visually-hidden">
        Availability
      </label>
      <select
        id="availability"
        value={status ?? ''}
        disabled={saving}
        onChange={(e) => choose(e.currentTarget.value as OperatorAvailability)}
      >
        {status === undefined && <option value="">Not set</option>}
        {CHOICES.map((c) => (
          <option value={c.value}>{c.label}</option>
        ))}
      </select>
      {error && (
        <span class="inline-error" role="alert">
          {error}
        </span>
      )}
    </span>
  );
}
