/**
 * The browser softphone's engine: JsSIP registers the operator's SIP user at the SIP edge over WebSocket
 * (RFC 7118) with a short-lived credential from the API (POST /api/sip_users/credential), never the SIP user's
 * stored password, and renews it before it expires. Each tab registers its own contact, so the edge's forking
 * rings every tab, and a call answered in one is cancelled in the others (RFC 3261 section 16.7).
 * The view (Softphone.tsx) renders `PhoneState` and calls the methods below.
 */
import { C, UA, WebSocketInterface } from 'jssip';
import type { RTCSession } from 'jssip/lib/RTCSession';
import type { RTCSessionEvent } from 'jssip/lib/UA';
import { type CallView, dialTarget, type PhoneState, PhoneNotSetUp, type SipCredential } from './phone-model';

const MICROPHONE_REFUSED =
  'The microphone is blocked, so calls cannot be taken or made. Allow it for this site in the browser (the icon in the address bar) and try again; chat keeps working.';

/** A cause of a failed or ended session in words, or undefined for a normal end. */
function causeText(cause: string | undefined, originator: string): string | undefined {
  switch (cause) {
    case undefined:
    case C.causes.BYE:
    case C.causes.CANCELED:
      return undefined;
    case C.causes.USER_DENIED_MEDIA_ACCESS:
      return MICROPHONE_REFUSED;
    case C.causes.BUSY:
      return 'Busy.';
    case C.causes.REJECTED:
      return originator === 'local' ? undefined : 'The call was declined.';
    case C.causes.NOT_FOUND:
      return 'No such number or SIP user.';
    case C.causes.UNAVAILABLE:
      return 'Not reachable now.';
    case C.causes.AUTHENTICATION_ERROR:
      return 'The phone credential was refused; it is renewed automatically.';
    case C.causes.CONNECTION_ERROR:
    case C.causes.REQUEST_TIMEOUT:
    case C.causes.RTP_TIMEOUT:
      return 'The connection to the phone server was lost.';
    default:
      return `The call ended (${cause}).`;
  }
}

/** A ring tone (Web Audio, no file): two short bursts every 3 s while a call rings. */
class Ringer {
  private audio: AudioContext | undefined;
  private timer: ReturnType<typeof setInterval> | undefined;

  /**
   * Opens the audio output when the phone starts, suspended until a call rings: opening it blocks the page for
   * tens to hundreds of milliseconds on a busy machine (measured about 300 ms at load 22, docs/benchmarks.md), which
   * in the ring path delayed the first ringing panel; resuming is asynchronous.
   */
  prepare() {
    try {
      this.audio ??= new AudioContext();
      void this.audio.suspend();
    } catch {
      /* no audio output: calls still show */
    }
  }

  start() {
    if (this.timer) return;
    const ring = () => {
      try {
        this.audio ??= new AudioContext();
        void this.audio.resume();
        const start = this.audio.currentTime + 0.02;
        for (const offset of [0, 0.5]) {
          const tone = this.audio.createOscillator();
          const gain = this.audio.createGain();
          tone.frequency.value = 440;
          gain.gain.setValueAtTime(0.1, start + offset);
          gain.gain.setValueAtTime(0.0001, start + offset + 0.4);
          tone.connect(gain).connect(this.audio.destination);
          tone.start(start + offset);
          tone.stop(start + offset + 0.4);
        }
      } catch {
        /* no audio output: the panel still shows the call */
      }
    };
    ring();
    this.timer = setInterval(ring, 3000);
  }

  stop() {
    clearInterval(this.timer);
    this.timer = undefined;
    void this.audio?.suspend();
  }
}

export interface PhoneOptions {
  /** A fresh credential (each call makes a new one). */
  credential: () => Promise<SipCredential>;
  onChange: (state: PhoneState) => void;
  /** Where the other party's audio plays. */
  audio: () => HTMLAudioElement | null;
}

export class Phone {
  private ua: UA | undefined;
  private session: RTCSession | undefined;
  private renewal: ReturnType<typeof setTimeout> | undefined;
  private stopped = false;
  private ringer = new Ringer();
  private credential: SipCredential | undefined;
  state: PhoneState = { registration: 'starting', problem: undefined, call: undefined, callError: undefined };

  constructor(private readonly options: PhoneOptions) {}

  private set(change: Partial<PhoneState>) {
    this.state = { ...this.state, ...change };
    this.options.onChange(this.state);
  }

  private setCall(change: Partial<CallView>) {
    if (this.state.call) this.set({ call: { ...this.state.call, ...change } });
  }

  async start(): Promise<void> {
    this.ringer.prepare();
    let credential: SipCredential;
    try {
      credential = await this.options.credential();
    } catch (error) {
      if (error instanceof PhoneNotSetUp) this.set({ registration: 'absent', problem: undefined });
      else this.set({ registration: 'failed', problem: error instanceof Error ? error.message : String(error) });
      return;
    }
    if (this.stopped) return;
    this.credential = credential;
    const ua = new UA({
      sockets: [new WebSocketInterface(credential.ws_uri)],
      uri: credential.uri,
      authorization_user: credential.username,
      password: credential.password,
      realm: credential.domain,
      register: true,
      // Short registrations: a tab closed without unregistering stops ringing within two minutes.
      register_expires: 120,
      session_timers: false,
      user_agent: 'Parley console',
    });
    this.ua = ua;
    ua.on('connecting', () => this.set({ registration: 'connecting' }));
    let dropped = false;
    ua.on('disconnected', () => {
      dropped = true;
      this.set({ registration: 'connecting', problem: 'The connection to the phone server was lost; reconnecting…' });
    });
    ua.on('connected', () => {
      // A call that outlived its WebSocket is ended cleanly over the new one: the edge reaches this tab only over
      // the connection the dialog was set up on (its Contact's alias, docs/sip.md), so the other party's BYE or a
      // re-INVITE could no longer arrive, and the edge's keep-alive would end the dialog without telling this tab.
      // The BYE goes through the edge (the dialog's route set), which records the end. Resuming the call instead
      // (an ICE restart in a re-INVITE) is not done.
      if (dropped && this.session?.isEstablished()) {
        this.session.terminate();
        this.set({ callError: 'The connection to the phone server was lost, so the call was ended. Call back if needed.' });
      }
      dropped = false;
    });
    ua.on('registered', () => this.set({ registration: 'registered', problem: undefined }));
    ua.on('unregistered', () => this.set({ registration: 'unregistered' }));
    ua.on('registrationFailed', (event) =>
      this.set({ registration: 'failed', problem: `The phone could not register (${event.cause ?? 'refused'}).` }),
    );
    ua.on('newRTCSession', (event: RTCSessionEvent) => this.onSession(event));
    ua.start();
    this.scheduleRenewal();
  }

  /** A new credential at about 70% of the current one's life; the next REGISTER or INVITE uses it. */
  private scheduleRenewal() {
    if (!this.credential) return;
    const life = Date.parse(this.credential.expires_at) - Date.now();
    this.renewal = setTimeout(
      async () => {
        try {
          const next = await this.options.credential();
          this.credential = next;
          this.ua?.set('authorization_user', next.username);
          this.ua?.set('password', next.password);
        } catch {
          // Retried at the next turn; the registration lives until its own expiry meanwhile.
        }
        if (!this.stopped) this.scheduleRenewal();
      },
      Math.max(5000, life * 0.7),
    );
  }

  private onSession(event: RTCSessionEvent) {
    const session = event.session;
    if (this.session) {
      // One call at a time: another caller hears busy (RFC 3261 section 21.4.7).
      if (event.originator === 'remote') session.terminate({ status_code: 486, reason_phrase: 'Busy Here' });
      return;
    }
    this.session = session;
    const identity = session.remote_identity;
    this.set({
      callError: undefined,
      call: {
        direction: event.originator === 'remote' ? 'incoming' : 'outgoing',
        stage: event.originator === 'remote' ? 'ringing' : 'connecting',
        name: identity.display_name || undefined,
        number: identity.uri.user ?? '',
        callId: (event.request as { call_id: string }).call_id,
        recordCallId:
          event.originator === 'remote'
            ? ((event.request as { getHeader(name: string): string | undefined }).getHeader('Parley-Call-ID') ?? undefined)
            : undefined,
        muted: false,
        held: false,
        transferTo: undefined,
        answeredAt: undefined,
        ended: undefined,
      },
    });
    if (event.originator === 'remote') this.ringer.start();
    session.on('peerconnection', ({ peerconnection }) => this.playRemote(peerconnection));
    session.on('progress', () => {
      if (session.direction === 'outgoing') this.setCall({ stage: 'ringing' });
    });
    session.on('accepted', () => {
      this.ringer.stop();
      this.setCall({ stage: 'talking', answeredAt: Date.now() });
    });
    session.on('confirmed', () => {
      if (session.connection) this.playRemote(session.connection);
    });
    session.on('muted', () => this.setCall({ muted: true }));
    session.on('unmuted', () => this.setCall({ muted: false }));
    session.on('hold', () => this.setCall({ held: true }));
    session.on('unhold', () => this.setCall({ held: false }));
    const finish = (cause: string | undefined, originator: string) => {
      this.ringer.stop();
      if (this.session !== session) return;
      this.session = undefined;
      const problem = causeText(cause, originator);
      this.set({ call: undefined, callError: problem });
    };
    session.on('failed', (e) => finish(e.cause, e.originator));
    session.on('ended', (e) => finish(e.cause, e.originator));
  }

  private playRemote(peerconnection: RTCPeerConnection) {
    const play = () => {
      const audio = this.options.audio();
      const stream = new MediaStream(
        peerconnection
          .getReceivers()
          .map((r) => r.track)
          .filter((t): t is MediaStreamTrack => Boolean(t)),
      );
      if (audio) {
        audio.srcObject = stream;
        void audio.play().catch(() => {});
      }
    };
    peerconnection.addEventListener('track', play);
    play();
  }

  answer() {
    if (!this.session || this.state.call?.stage !== 'ringing' || this.state.call.direction !== 'incoming') return;
    this.ringer.stop();
    this.setCall({ stage: 'connecting' });
    this.session.answer({ mediaConstraints: { audio: true, video: false }, pcConfig: { iceServers: [] } });
  }

  /** Refuses a ringing call: 603 Decline (RFC 3261 section 21.6.2), so the caller is not sent to another phone of this user. */
  decline() {
    if (!this.session) return;
    this.session.terminate({ status_code: 603, reason_phrase: 'Decline' });
  }

  hangUp() {
    this.session?.terminate();
  }

  /**
   * Blind transfer (RFC 3515; RFC 5589 section 6): a REFER in the call's dialog asks the other party to call
   * `input` (a colleague's SIP user or a number of the organisation), which the SIP edge relays only inside its
   * dialogs and only to the organisation's own domain (docs/sip.md, "Transfers"). This side hangs up once the
   * other party reports that it is calling (its first NOTIFY), or 3 s after the REFER's 202 without one; the
   * edge records the new call as a leg of this Call. False when the target is not one or no call is up.
   */
  transfer(input: string): boolean {
    const target = dialTarget(input);
    const session = this.session;
    if (!target || !this.credential || !session?.isEstablished()) return false;
    this.set({ callError: undefined });
    this.setCall({ transferTo: target });
    let over = false;
    const hangUp = () => {
      if (over) return;
      over = true;
      if (this.session === session) session.terminate();
    };
    const refused = (why: string) => {
      if (over) return;
      over = true;
      this.setCall({ transferTo: undefined });
      this.set({ callError: why });
    };
    session.refer(`sip:${target}@${this.credential.domain}`, {
      eventHandlers: {
        requestSucceeded: () => setTimeout(hangUp, 3000),
        requestFailed: (e: { cause?: string }) => refused(`The transfer was refused (${e.cause ?? 'no answer'}); the call goes on.`),
        // After JsSIP has answered the NOTIFY (200), which it does once these handlers return.
        trying: () => setTimeout(hangUp),
        progress: () => setTimeout(hangUp),
        accepted: () => setTimeout(hangUp),
        failed: () => refused('The transfer failed; the call goes on.'),
      },
    });
    return true;
  }

  toggleMute() {
    if (!this.session) return;
    if (this.state.call?.muted) this.session.unmute({ audio: true });
    else this.session.mute({ audio: true });
  }

  toggleHold() {
    if (!this.session) return;
    if (this.state.call?.held) this.session.unhold();
    else this.session.hold();
  }

  /** One DTMF tone (RFC 2833 in the media when the peer offers it, else SIP INFO). */
  dtmf(tone: string) {
    if (!this.session?.isEstablished() || !/^[0-9*#A-D]$/.test(tone)) return;
    this.session.sendDTMF(tone, { duration: 120, interToneGap: 70 });
  }

  /** Calls a number or a SIP user of the organisation; false when the target is not one. */
  call(input: string): boolean {
    const target = dialTarget(input);
    if (!target || !this.ua || !this.credential || this.session) return false;
    this.set({ callError: undefined });
    try {
      this.ua.call(`sip:${target}@${this.credential.domain}`, {
        mediaConstraints: { audio: true, video: false },
        pcConfig: { iceServers: [] },
      });
    } catch (error) {
      this.set({ callError: error instanceof Error ? error.message : String(error) });
      return false;
    }
    return true;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.renewal);
    this.ringer.stop();
    this.session?.terminate();
    this.ua?.stop();
  }
}
