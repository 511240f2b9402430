/**
 * The voice runtime's SIP user agent server (RFC 3261) on UDP (docs/voice.md, "Layout" and "Behind the SIP edge"):
 * it answers INVITEs for agent calls with an SDP answer (sdp.ts), keeps each dialog, and ends it on either side's
 * BYE. Requests are answered at the address they came from (RFC 3581 rport behaviour) and taken only from the
 * addresses in `trusted` (the edge, which does routing, authentication and NAT); anyone else gets 403. The route
 * set (the INVITE's Record-Route, 12.1.1) goes back in the 2xx and, as Route headers, on our in-dialog requests.
 */
import { createSocket, type RemoteInfo, type Socket } from 'node:dgram';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import type { Logger } from 'pino';
import { MediaWorker, type RtpStream } from './media.js';
import { buildAnswer, negotiate, parseOffer, SdpError, type Negotiated, type SdpOffer } from './sdp.js';
import { cseqOf, header, parseSip, serialize, type SipMessage, tagOf, uriOf, userOf } from './sip-message.js';

const T1 = 500;
const ALLOW = 'INVITE, ACK, BYE, CANCEL, OPTIONS, NOTIFY';
const T2 = 4000;

type Remote = { address: string; port: number };
type Header = [string, string];

export interface InviteInfo {
  callId: string;
  /** The Request-URI's user (`agent-<id>`). */
  user: string | undefined;
  from: string;
  to: string;
  remote: Remote;
  /** The SIP edge's account of the call (header X-Parley-Call), when the edge relayed it. */
  edgeCall?: string;
}

/** What the application says about a new call: refuse it with a status, or take it. */
export type Admission = { reject: number; reason: string } | { accept: true };

export interface DialogHandle {
  callId: string;
  negotiated: Negotiated;
  offer: SdpOffer;
  /** Our RTP port, bound (in the media worker) before the answer was sent. */
  rtp: RtpStream;
  /** Ends the call from our side (BYE). */
  hangup(): Promise<void>;
  /**
   * Blind transfer (RFC 3515): REFER the caller to `target` in this dialog and wait for the outcome, the status
   * of the caller's new call as its NOTIFYs report it (RFC 3515 2.4.5, message/sipfrag of RFC 3420); a REFER
   * refused, never answered or a call that fails gives that status (408 when nothing came within `timeoutMs`).
   */
  refer(target: string, referredBy: string, timeoutMs: number): Promise<number>;
}

export interface CallHandler {
  /** Decides whether to take a call (before any media is set up). */
  admit(info: InviteInfo): Admission | Promise<Admission>;
  /** The dialog is confirmed (ACK received): media may flow. */
  started(info: InviteInfo, dialog: DialogHandle): void;
  /** The dialog ended (either side's BYE, a CANCEL, or no ACK). */
  ended(callId: string, by: 'caller' | 'agent' | 'timeout'): void;
}

export interface SipEndpointOptions {
  host: string;
  port: number;
  /** The address written into SDP and Contact (the host, unless behind a relay). */
  advertisedAddress?: string;
  rtpPortMin: number;
  rtpPortMax: number;
  handler: CallHandler;
  /**
   * Sources whose requests are taken: `address` (any port) or `address:port` (IPv6 in brackets). Anyone else's
   * request gets 403 and is logged; their responses are dropped.
   */
  trusted: string[];
  logger?: Logger;
}

interface Dialog {
  info: InviteInfo;
  localTag: string;
  remoteTarget: string;
  localSeq: number;
  /** The route set: the INVITE's Record-Route values (12.1.1), in order, as Route headers of our requests. */
  routeSet: string[];
  inviteResponse?: Buffer;
  confirmed: boolean;
  ended: boolean;
  handle?: DialogHandle;
  /** Stops timer G (the 200's retransmission). */
  retransmit?: () => void;
  byeDone?: () => void;
  /** A REFER in progress: its final response, then each NOTIFY's sipfrag status. */
  referResponse?: (status: number) => void;
  referNotify?: (status: number) => void;
}

export class SipEndpoint {
  private socket?: Socket;
  private readonly dialogs = new Map<string, Dialog>();
  /** The RTP port tried first for the next call: the range is used round, not the port a call just freed. */
  private nextPort: number;
  private draining = false;
  port = 0;

  constructor(private readonly options: SipEndpointOptions) {
    this.nextPort = options.rtpPortMin + (options.rtpPortMin % 2);
  }

  get address(): string {
    return this.options.advertisedAddress ?? this.options.host;
  }

  async start(): Promise<void> {
    // The media worker is started now, not at the first call: its start (seconds from the sources under load) would
    // hold that call's answer back.
    await MediaWorker.get().ready;
    const socket = createSocket(this.options.host.includes(':') ? 'udp6' : 'udp4');
    socket.on('message', (data, rinfo) => this.onMessage(data, rinfo));
    socket.on('error', (error) => this.options.logger?.error({ err: error }, 'voice: SIP socket error'));
    socket.bind(this.options.port, this.options.host);
    await once(socket, 'listening');
    this.socket = socket;
    this.port = socket.address().port;
  }

  /** Refuses new calls (503), hangs up the running ones, and closes the socket. */
  async stop(): Promise<void> {
    this.draining = true;
    await Promise.all([...this.dialogs.values()].filter((d) => !d.ended).map((d) => this.bye(d)));
    this.socket?.close();
    this.socket = undefined;
  }

  private send(data: Buffer, to: Remote): void {
    this.socket?.send(data, to.port, to.address);
  }

  private onMessage(data: Buffer, rinfo: RemoteInfo): void {
    let msg: SipMessage;
    try {
      msg = parseSip(data);
    } catch (error) {
      // Unparseable: nothing to answer to (18.1.1 would need the Via we could not read); dropped.
      this.options.logger?.debug({ err: error, from: rinfo.address }, 'voice: unparseable SIP message dropped');
      return;
    }
    const remote = { address: rinfo.address, port: rinfo.port };
    if (!this.isTrusted(remote)) {
      // Not the edge: this endpoint would otherwise answer (and cost media ports to) anyone who reaches it.
      this.options.logger?.info(
        { from: `${rinfo.address}:${rinfo.port}`, method: msg.method },
        'voice: SIP request from an untrusted source refused',
      );
      if (msg.method && msg.method !== 'ACK') this.send(this.response(msg, 403, 'Forbidden'), remote);
      return;
    }
    if (msg.status !== undefined) {
      this.onResponse(msg);
      return;
    }
    const dialog = this.dialogs.get(header(msg, 'call-id')!);
    switch (msg.method) {
      case 'INVITE':
        if (dialog && tagOf(header(msg, 'to'))) {
          // A re-INVITE (session refresh, hold): keep our media as it is and answer with the same SDP.
          if (dialog.inviteResponse && dialog.handle)
            this.reply(msg, remote, 200, 'OK', [['Content-Type', 'application/sdp']], this.answerFor(dialog));
          else this.reply(msg, remote, 491, 'Request Pending');
          return;
        }
        if (dialog) {
          // A retransmission of the INVITE: the same final response again (17.2.1).
          if (dialog.inviteResponse) this.send(dialog.inviteResponse, remote);
          return;
        }
        void this.onInvite(msg, remote);
        return;
      case 'ACK':
        if (dialog) {
          dialog.confirmed = true;
          dialog.retransmit?.();
          if (dialog.handle && !dialog.ended) this.options.handler.started(dialog.info, dialog.handle);
        }
        return;
      case 'BYE':
        if (!dialog || dialog.ended) {
          this.reply(msg, remote, 481, 'Call/Transaction Does Not Exist');
          return;
        }
        this.reply(msg, remote, 200, 'OK');
        this.end(dialog, 'caller');
        return;
      case 'CANCEL':
        if (!dialog) {
          this.reply(msg, remote, 481, 'Call/Transaction Does Not Exist');
          return;
        }
        this.reply(msg, remote, 200, 'OK');
        // Our 200 to the INVITE may already be on its way; then the caller's BYE follows (9.2).
        if (!dialog.confirmed && !dialog.inviteResponse) this.end(dialog, 'caller');
        return;
      case 'OPTIONS':
        // In a dialog (the edge's keep-alive, RFC 3261 11): a dialog this runtime no longer has (it restarted
        // mid-call) is 481, so the edge ends the call and records it instead of keeping a silent line open.
        if (tagOf(header(msg, 'to')) && (!dialog || dialog.ended)) {
          this.reply(msg, remote, 481, 'Call/Transaction Does Not Exist');
          return;
        }
        this.reply(msg, remote, 200, 'OK', [['Allow', ALLOW]]);
        return;
      case 'NOTIFY': {
        // The progress of a transfer we asked for (RFC 3515 2.4.4): `Event: refer`, a message/sipfrag body
        // whose status line is the caller's new call's latest response.
        if (!dialog || dialog.ended || !/^refer\b/i.test(header(msg, 'event') ?? '')) {
          this.reply(msg, remote, 481, 'Subscription Does Not Exist');
          return;
        }
        this.reply(msg, remote, 200, 'OK');
        const status = /^SIP\/2\.0 (\d{3})/.exec(msg.body.trim())?.[1];
        if (status) dialog.referNotify?.(Number(status));
        return;
      }
      default:
        this.reply(msg, remote, 405, 'Method Not Allowed', [['Allow', ALLOW]]);
        return;
    }
  }

  private onResponse(msg: SipMessage): void {
    const dialog = this.dialogs.get(header(msg, 'call-id') ?? '');
    if (dialog && cseqOf(msg).method === 'BYE' && (msg.status ?? 0) >= 200) dialog.byeDone?.();
    if (dialog && cseqOf(msg).method === 'REFER' && (msg.status ?? 0) >= 200) dialog.referResponse?.(msg.status ?? 0);
  }

  private async onInvite(msg: SipMessage, remote: Remote): Promise<void> {
    const callId = header(msg, 'call-id')!;
    const info: InviteInfo = {
      callId,
      user: userOf(msg.uri ?? ''),
      from: header(msg, 'from')!,
      to: header(msg, 'to')!,
      remote,
      edgeCall: header(msg, 'x-parley-call'),
    };
    const dialog: Dialog = {
      info,
      localTag: randomBytes(8).toString('hex'),
      remoteTarget: uriOf(header(msg, 'contact') ?? header(msg, 'from')!),
      localSeq: Math.floor(Math.random() * 10000) + 1,
      routeSet: msg.headers.get('record-route') ?? [],
      confirmed: false,
      ended: false,
    };
    this.dialogs.set(callId, dialog);
    this.reply(msg, remote, 100, 'Trying');
    const refuse = (status: number, reason: string, extra: Header[] = []) => {
      dialog.inviteResponse = this.response(msg, status, reason, extra, '', dialog.localTag);
      this.send(dialog.inviteResponse, remote);
      this.forget(dialog);
    };
    if (this.draining) return refuse(503, 'Service Unavailable', [['Retry-After', '5']]);
    let offer: SdpOffer;
    let negotiated: Negotiated | undefined;
    try {
      offer = parseOffer(msg.body);
      negotiated = negotiate(offer);
    } catch (error) {
      if (!(error instanceof SdpError)) throw error;
      return refuse(488, 'Not Acceptable Here', [['Warning', `399 parley "${error.message}"`]]);
    }
    // RFC 3261 21.4.26 with a 305 warning (incompatible media format).
    if (!negotiated)
      return refuse(488, 'Not Acceptable Here', [['Warning', '305 parley "Incompatible media format: offer G722, PCMU or PCMA"']]);
    let admission: Admission;
    try {
      admission = await this.options.handler.admit(info);
    } catch (error) {
      this.options.logger?.error({ err: error, callId }, 'voice: admitting a call failed');
      admission = { reject: 500, reason: 'Server Internal Error' };
    }
    if ('reject' in admission)
      return refuse(admission.reject, admission.reason, [503, 486].includes(admission.reject) ? [['Retry-After', '5']] : []);
    let rtp: RtpStream;
    try {
      const { rtpPortMin: min, rtpPortMax: max } = this.options;
      rtp = await MediaWorker.get().open(this.options.host, { min, max, first: this.nextPort });
      this.nextPort = rtp.port + 2 > max ? min + (min % 2) : rtp.port + 2;
    } catch {
      return refuse(503, 'Service Unavailable', [['Retry-After', '5']]);
    }
    dialog.handle = {
      callId,
      negotiated,
      offer,
      rtp,
      hangup: () => this.bye(dialog),
      refer: (target, referredBy, timeoutMs) => this.refer(dialog, target, referredBy, timeoutMs),
    };
    dialog.inviteResponse = this.response(msg, 200, 'OK', [['Content-Type', 'application/sdp']], this.answerFor(dialog), dialog.localTag);
    // Timer G: the 200 is sent until the ACK, giving up after 64*T1 (13.3.1.4).
    const more = () => !dialog.confirmed && !dialog.ended;
    dialog.retransmit = this.retransmit(dialog.inviteResponse, remote, more, () => void this.bye(dialog, 'timeout'));
  }

  private answerFor(dialog: Dialog): string {
    const handle = dialog.handle!;
    return buildAnswer({
      address: this.address,
      port: handle.rtp.port,
      sessionId: String(dialog.localSeq),
      negotiated: handle.negotiated,
      direction: handle.offer.direction,
    });
  }

  /** A response to `req`, with our tag on its To (but a 100's: 8.2.6.2) when it has none. */
  private response(req: SipMessage, status: number, reason: string, extra: Header[] = [], body = '', localTag?: string): Buffer {
    const to = header(req, 'to')!;
    const headers: [string, string | string[]][] = [
      ['Via', req.headers.get('via') ?? []],
      ['From', header(req, 'from')!],
      ['To', localTag && !tagOf(to) && status > 100 ? `${to};tag=${localTag}` : to],
      ['Call-ID', header(req, 'call-id')!],
      ['CSeq', header(req, 'cseq')!],
    ];
    if (req.method === 'INVITE' && status >= 200 && status < 300) {
      // The route set goes back in the 2xx (12.1.1), so the caller's side keeps the edge in the dialog.
      const recordRoute = req.headers.get('record-route');
      if (recordRoute?.length) headers.push(['Record-Route', recordRoute]);
      headers.push(['Contact', `<sip:parley@${this.hostPort()}>`]);
    }
    headers.push(['Server', 'parley-voice'], ...extra);
    return serialize(`SIP/2.0 ${status} ${reason}`, headers, body);
  }

  /** Answers `req` in its dialog (our tag), if there is one. */
  private reply(req: SipMessage, to: Remote, status: number, reason: string, extra: Header[] = [], body = ''): void {
    this.send(this.response(req, status, reason, extra, body, this.dialogs.get(header(req, 'call-id') ?? '')?.localTag), to);
  }

  private isTrusted(remote: Remote): boolean {
    const host = remote.address.includes(':') ? `[${remote.address}]` : remote.address;
    return this.options.trusted.some((t) => t === remote.address || t === host || t === `${host}:${remote.port}`);
  }

  private hostPort(): string {
    const host = this.address.includes(':') ? `[${this.address}]` : this.address;
    return `${host}:${this.port}`;
  }

  /**
   * A request of ours in the dialog as the UAS (12.2.1.1): to the remote target, with the next CSeq and, as Route
   * headers, the INVITE's Record-Route values in order (12.1.1). The edge's Record-Route has `lr` (loose routing,
   * RFC 3261 16.12), so the Request-URI stays the remote target and the request goes to the first Route's host,
   * which is where the INVITE came from.
   */
  private request(dialog: Dialog, method: string, extra: Header[] = []): Buffer {
    dialog.localSeq++;
    return serialize(`${method} ${dialog.remoteTarget} SIP/2.0`, [
      ['Via', `SIP/2.0/UDP ${this.hostPort()};branch=z9hG4bK${randomBytes(8).toString('hex')};rport`],
      ['Max-Forwards', '70'],
      ...dialog.routeSet.map((route): Header => ['Route', route]),
      ['From', `${dialog.info.to};tag=${dialog.localTag}`],
      ['To', dialog.info.from],
      ['Call-ID', dialog.info.callId],
      ['CSeq', `${dialog.localSeq} ${method}`],
      ...extra,
    ]);
  }

  /**
   * Sends `data` at once and again after T1, T2 at most apart (17.1.2.2; timer G of 13.3.1.4), while `more()`;
   * after 64*T1, or once the socket is closed, `giveUp()`. Returns what stops it.
   */
  private retransmit(data: Buffer, to: Remote, more: () => boolean, giveUp: () => void): () => void {
    let interval = T1;
    let waited = 0;
    let timer: NodeJS.Timeout | undefined;
    const fire = () => {
      if (!more()) return;
      if (!this.socket || waited >= 64 * T1) return giveUp();
      this.send(data, to);
      waited += interval;
      timer = setTimeout(fire, interval);
      interval = Math.min(interval * 2, T2);
    };
    fire();
    return () => clearTimeout(timer);
  }

  /** Sends BYE in the dialog and waits for its final response (or 64*T1), retransmitting (17.1.2.2). */
  private async bye(dialog: Dialog, by: 'agent' | 'timeout' = 'agent'): Promise<void> {
    if (dialog.ended) return;
    this.end(dialog, by);
    if (!dialog.inviteResponse || !dialog.handle) return;
    const request = this.request(dialog, 'BYE');
    await new Promise<void>((resolve) => {
      const stop = this.retransmit(request, dialog.info.remote, () => true, resolve);
      dialog.byeDone = () => {
        stop();
        resolve();
      };
    });
  }

  /**
   * Sends REFER in the dialog (retransmitted as a non-INVITE request, 17.1.2.2, until a final response) and
   * follows the implicit subscription: a 2xx answer (202 Accepted) is followed by NOTIFYs, and the first one
   * with a final status (>= 200) is the outcome. The caller hanging up meanwhile ends the wait (487).
   */
  private async refer(dialog: Dialog, target: string, referredBy: string, timeoutMs: number): Promise<number> {
    if (dialog.ended || !dialog.handle) return 481;
    const request = this.request(dialog, 'REFER', [
      ['Contact', `<sip:parley@${this.hostPort()}>`],
      ['Refer-To', `<${target}>`],
      ['Referred-By', `<${referredBy}>`],
    ]);
    return new Promise<number>((resolve) => {
      let answered = false;
      const deadline = setTimeout(() => done(408), timeoutMs);
      const done = (status: number) => {
        stop();
        clearTimeout(deadline);
        dialog.referResponse = undefined;
        dialog.referNotify = undefined;
        resolve(status);
      };
      dialog.referResponse = (status) => {
        if (answered) return;
        answered = true;
        stop();
        if (status >= 300) done(status);
      };
      dialog.referNotify = (status) => {
        if (status >= 200) done(status);
      };
      const more = () => !answered && !!this.socket;
      const stop = this.retransmit(request, dialog.info.remote, more, () => done(408));
    });
  }

  private end(dialog: Dialog, by: 'caller' | 'agent' | 'timeout'): void {
    if (dialog.ended) return;
    this.forget(dialog);
    dialog.retransmit?.();
    dialog.handle?.rtp.close();
    this.options.handler.ended(dialog.info.callId, by);
    // A transfer under way ends with the dialog (the caller hung up meanwhile).
    dialog.referNotify?.(487);
  }

  private forget(dialog: Dialog): void {
    dialog.ended = true;
    // Kept a while to answer retransmitted BYEs and INVITEs (the final response again) until the caller has
    // surely given up (32 s, timer J/H of 17.2).
    setTimeout(() => {
      if (this.dialogs.get(dialog.info.callId) === dialog) this.dialogs.delete(dialog.info.callId);
    }, 32_000).unref();
  }
}
