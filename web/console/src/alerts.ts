/**
 * Alerts for what needs an operator: a conversation that is new, or newly assigned to me. Each kind of alert is
 * the operator's choice, remembered in this browser (localStorage): a desktop notification (the Notification
 * API, asked for when switched on) and a short sound (Web Audio, no file to load). Both fire only while the
 * console is not in front (the tab hidden or the window without focus): in front, the inbox itself shows it.
 * The tab title's unread count (App.tsx) is always on.
 */
import type { ConversationResource } from '../../api/client';
import type { ParleyEvent } from '../../api/events';
import { conversationTitle } from './Inbox';

export interface AlertSettings {
  desktop: boolean;
  sound: boolean;
}

const SETTINGS = 'parley.alerts';

export function loadAlertSettings(): AlertSettings {
  try {
    const saved = JSON.parse(localStorage.getItem(SETTINGS) ?? '{}') as Partial<AlertSettings>;
    return { desktop: saved.desktop === true, sound: saved.sound !== false };
  } catch {
    return { desktop: false, sound: true };
  }
}

export function saveAlertSettings(settings: AlertSettings): void {
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
}

export interface Alert {
  conversationId: string;
  title: string;
  body: string;
}

const assigned = (c: ConversationResource | undefined) =>
  (c?.attributes.metadata as { assigned_operator?: string } | undefined)?.assigned_operator;

/** The alert an event deserves, given the conversation as the console knew it before the event. */
export function alertOf(event: ParleyEvent, before: ConversationResource | undefined, me: string): Alert | undefined {
  if (event.type !== 'Conversation.created' && event.type !== 'Conversation.updated') return undefined;
  const after = event.data;
  if (event.type === 'Conversation.created' && !before)
    return { conversationId: after.id, title: 'New conversation', body: conversationTitle(after) };
  if (assigned(after) === me && assigned(before) !== me)
    return { conversationId: after.id, title: 'Assigned to you', body: conversationTitle(after) };
  return undefined;
}

const inFront = () => document.visibilityState === 'visible' && document.hasFocus();

let audio: AudioContext | undefined;

/** Two short tones: audible, not alarming. */
function chime(): void {
  audio ??= new AudioContext();
  const start = audio.currentTime;
  for (const [offset, frequency] of [
    [0, 880],
    [0.16, 1175],
  ]) {
    const tone = audio.createOscillator();
    const gain = audio.createGain();
    tone.frequency.value = frequency;
    gain.gain.setValueAtTime(0.12, start + offset);
    gain.gain.exponentialRampToValueAtTime(0.001, start + offset + 0.14);
    tone.connect(gain).connect(audio.destination);
    tone.start(start + offset);
    tone.stop(start + offset + 0.15);
  }
}

export function raise(alert: Alert, settings: AlertSettings, onOpen: (conversationId: string) => void): void {
  if (inFront()) return;
  if (settings.sound) {
    try {
      chime();
    } catch {
      /* no audio output: the notification and the title still tell */
    }
  }
  if (settings.desktop && typeof Notification !== 'undefined' && Notification.permission === 'granted') {
    const shown = new Notification(alert.title, { body: alert.body, tag: alert.conversationId });
    shown.onclick = () => {
      window.focus();
      onOpen(alert.conversationId);
      shown.close();
    };
  }
}

/** Switching desktop notifications on asks the browser's permission (from the click, as browsers require). */
export async function enableDesktop(): Promise<boolean> {
  if (typeof Notification === 'undefined') return false;
  if (Notification.permission === 'granted') return true;
  return (await Notification.requestPermission()) === 'granted';
}
