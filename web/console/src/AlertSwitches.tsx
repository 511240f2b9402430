import { useState } from 'preact/hooks';
import { type AlertSettings, enableDesktop } from './alerts';

interface Props {
  settings: AlertSettings;
  onChange: (settings: AlertSettings) => void;
}

/** The top bar's alert switches: desktop notifications and sound, for new and assigned conversations. */
export function AlertSwitches({ settings, onChange }: Props) {
  const [refused, setRefused] = useState(false);
  return (
    <details class="alerts">
      <summary>Alerts</summary>
      <div class="alerts-menu">
        <label>
          <input
            type="checkbox"
            checked={settings.desktop}
            onChange={async (e) => {
              const on = e.currentTarget.checked;
              const allowed = on ? await enableDesktop() : false;
              setRefused(on && !allowed);
              onChange({ ...settings, desktop: on && allowed });
            }}
          />{' '}
          Desktop notifications
        </label>
        <label>
          <input type="checkbox" checked={settings.sound} onChange={(e) => onChange({ ...settings, sound: e.currentTarget.checked })} />{' '}
          Sound
        </label>
        {refused && (
          <span class="inline-error" role="alert">
            The browser refused notifications for this site.
          </span>
        )}
      </div>
    </details>
  );
}
