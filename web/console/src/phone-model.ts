/**
 * The softphone's state and the small parts the console needs before the phone itself, which is loaded on
 * demand (phone.ts with JsSIP, about 250 kB) only for an operator who has a SIP user on a server with a softphone.
 */

/** meta.sip_credential of POST /api/sip_users/credential. */
export interface SipCredential {
  username: string;
  password: string;
  expires_at: string;
  uri: string;
  domain: string;
  ws_uri: string;
}

/** `absent`: this server has no softphone (no SIP_WS_URL), so the console shows none. */
export type Registration = 'starting' | 'connecting' | 'registered' | 'unregistered' | 'failed' | 'absent';

/** The API has no SIP WebSocket address (409): not an error to show, just no phone. */
export class PhoneNotSetUp extends Error {}

export interface CallView {
  direction: 'incoming' | 'outgoing';
  /** ringing: an incoming call waiting for an answer, or an outgoing one waiting for the other side. */
  stage: 'ringing' | 'connecting' | 'talking' | 'ended';
  /** The other party's display name, when it sent one. */
  name: string | undefined;
  /** The other party's user part (a number or a SIP user). */
  number: string;
  /** The SIP Call-ID: the Call record's `call_uuid`. */
  callId: string;
  /**
   * The Call-ID of the Call this call is a leg of, when the SIP edge says so (`Parley-Call-ID`: a transferred
   * call, such as a voice agent's handoff, whose record is the original call's).
   */
  recordCallId: string | undefined;
  muted: boolean;
  held: boolean;
  /** A blind transfer asked for (REFER sent) to this SIP user or number. */
  transferTo: string | undefined;
  answeredAt: number | undefined;
  /** Why the call ended, in words (when it did not end normally). */
  ended: string | undefined;
}

export interface PhoneState {
  registration: Registration;
  /** What is wrong with the phone itself (credential refused, WebSocket down), in words. */
  problem: string | undefined;
  call: CallView | undefined;
  /** The last call's problem (microphone refused, number not reachable), in words. */
  callError: string | undefined;
}

/** A dialled number or SIP user name: digits (spaces, dashes and brackets dropped) or the SIP user's name. */
export function dialTarget(input: string): string | undefined {
  const trimmed = input.trim();
  const digits = trimmed.replace(/[\s().-]/g, '');
  if (/^\+?[0-9*#]{2,20}$/.test(digits)) return digits;
  if (/^[A-Za-z0-9_.+-]{1,64}$/.test(trimmed)) return trimmed;
  return undefined;
}
