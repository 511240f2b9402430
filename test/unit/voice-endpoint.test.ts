/**
 * The voice runtime's SIP endpoint behind the edge, over loopback UDP with a fake call handler: requests from
 * anyone but the trusted source are 403; the dialog keeps the edge in its route (Record-Route copied into the
 * 200, Route on our requests); a blind transfer is a REFER answered 202 and followed by NOTIFYs (RFC 3515);
 * an in-dialog OPTIONS for a dialog the endpoint does not have is 481.
 */
import dgram from 'node:dgram';
import { afterEach, describe, expect, it } from 'vitest';
import { type DialogHandle, type InviteInfo, SipEndpoint } from '../../src/voice/sip-endpoint.js';
import { header, parseSip, type SipMessage } from '../../src/voice/sip-message.js';

interface Peer {
  port: number;
  received: SipMessage[];
  send(text: string, to: number): void;
  next(match: (m: SipMessage) => boolean, timeoutMs?: number): Promise<SipMessage>;
  close(): Promise<void>;
}

async function peer(): Promise<Peer> {
  const socket = dgram.createSocket('udp4');
  const received: SipMessage[] = [];
  const waiters: { match: (m: SipMessage) => boolean; resolve: (m: SipMessage) => void }[] = [];
  socket.on('message', (data) => {
    const msg = parseSip(data);
    received.push(msg);
    for (const w of [...waiters]) {
      if (w.match(msg)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(msg);
      }
    }
  });
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  return {
    port: socket.address().port,
    received,
    send: (text, to) => socket.send(text, to, '127.0.0.1'),
    next: (match, timeoutMs = 3000) =>
      new Promise((resolve, reject) => {
        const seen = received.find(match);
        if (seen) return resolve(seen);
        const timer = setTimeout(() => reject(new Error('no such message')), timeoutMs);
        waiters.push({
          match,
          resolve: (m) => {
            clearTimeout(timer);
            resolve(m);
          },
        });
      }),
    close: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}

const SDP = 'v=0\r\no=x 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n';

function request(method: string, o: { port: number; callId: string; toTag?: string; cseq: number; body?: string; extra?: string[] }) {
  const body = o.body ?? '';
  return [
    `${method} sip:agent-1@127.0.0.1 SIP/2.0`,
    `Via: SIP/2.0/UDP 127.0.0.1:${o.port};branch=z9hG4bK${method}${o.cseq};rport`,
    'Max-Forwards: 70',
    `From: <sip:caller@example.test>;tag=caller1`,
    `To: <sip:agent-1@example.test>${o.toTag ? `;tag=${o.toTag}` : ''}`,
    `Call-ID: ${o.callId}`,
    `CSeq: ${o.cseq} ${method}`,
    `Contact: <sip:caller@127.0.0.1:${o.port}>`,
    ...(o.extra ?? []),
    ...(body ? ['Content-Type: application/sdp'] : []),
    `Content-Length: ${Buffer.byteLength(body)}`,
    '',
    body,
  ].join('\r\n');
}

describe('the voice SIP endpoint behind the edge', () => {
  const cleanups: (() => Promise<void>)[] = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0)) await c();
  });

  async function setup() {
    const edge = await peer();
    const stranger = await peer();
    const admitted: InviteInfo[] = [];
    let dialog: DialogHandle | undefined;
    const endpoint = new SipEndpoint({
      host: '127.0.0.1',
      port: 0,
      rtpPortMin: 0,
      rtpPortMax: 0,
      trusted: [`127.0.0.1:${edge.port}`],
      handler: {
        admit: (info) => {
          admitted.push(info);
          return { accept: true };
        },
        started: (_info, handle) => {
          dialog = handle;
        },
        ended: () => {},
      },
    });
    await endpoint.start();
    cleanups.push(
      () => endpoint.stop(),
      () => edge.close(),
      () => stranger.close(),
    );
    return { endpoint, edge, stranger, admitted, dialog: () => dialog };
  }

  it('refuses requests from anyone but the edge (403) without admitting them', async () => {
    const { endpoint, stranger, admitted } = await setup();
    stranger.send(request('INVITE', { port: stranger.port, callId: 'x1', cseq: 1, body: SDP }), endpoint.port);
    const answer = await stranger.next((m) => m.status !== undefined);
    expect(answer.status).toBe(403);
    expect(admitted).toEqual([]);
  });

  it('answers out-of-dialog OPTIONS, and 481 to an in-dialog OPTIONS of a dialog it does not have', async () => {
    const { endpoint, edge } = await setup();
    edge.send(request('OPTIONS', { port: edge.port, callId: 'o1', cseq: 1 }), endpoint.port);
    expect((await edge.next((m) => header(m, 'call-id') === 'o1')).status).toBe(200);
    edge.send(request('OPTIONS', { port: edge.port, callId: 'o2', cseq: 1, toTag: 'gone' }), endpoint.port);
    expect((await edge.next((m) => header(m, 'call-id') === 'o2')).status).toBe(481);
  });

  it('keeps the edge in the dialog and transfers the caller with REFER, following its NOTIFYs', async () => {
    const { endpoint, edge, admitted, dialog } = await setup();
    const route = `<sip:127.0.0.1:${edge.port};lr;did=abc.1>`;
    edge.send(
      request('INVITE', { port: edge.port, callId: 'c1', cseq: 1, body: SDP, extra: [`Record-Route: ${route}`, 'X-Parley-Call: e30='] }),
      endpoint.port,
    );
    const ok = await edge.next((m) => m.status === 200 && header(m, 'cseq') === '1 INVITE');
    expect(admitted[0].edgeCall).toBe('e30=');
    // RFC 3261 12.1.1: the route set goes back in the 2xx.
    expect(ok.headers.get('record-route')).toEqual([route]);
    const toTag = /tag=([^;]+)/.exec(header(ok, 'to') ?? '')![1];
    edge.send(request('ACK', { port: edge.port, callId: 'c1', cseq: 1, toTag }), endpoint.port);
    for (let i = 0; i < 50 && !dialog(); i++) await new Promise((r) => setTimeout(r, 20));
    const handle = dialog()!;
    expect(handle).toBeDefined();

    const outcome = handle.refer('sip:ana@acme.parley.test', 'sip:agent-1@acme.parley.test', 5000);
    const refer = await edge.next((m) => m.method === 'REFER');
    expect(refer.uri).toBe(`sip:caller@127.0.0.1:${edge.port}`);
    expect(refer.headers.get('route')).toEqual([route]);
    expect(header(refer, 'refer-to')).toBe('<sip:ana@acme.parley.test>');
    expect(header(refer, 'referred-by')).toBe('<sip:agent-1@acme.parley.test>');
    const viaBranch = refer.headers.get('via')![0];
    edge.send(
      [
        'SIP/2.0 202 Accepted',
        `Via: ${viaBranch}`,
        `From: ${header(refer, 'from')}`,
        `To: ${header(refer, 'to')}`,
        'Call-ID: c1',
        `CSeq: ${header(refer, 'cseq')}`,
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n'),
      endpoint.port,
    );
    const notify = (cseq: number, frag: string) =>
      request('NOTIFY', {
        port: edge.port,
        callId: 'c1',
        cseq,
        toTag,
        extra: ['Event: refer', 'Subscription-State: active'],
        body: `${frag}\r\n`,
      });
    edge.send(notify(2, 'SIP/2.0 180 Ringing'), endpoint.port);
    expect((await edge.next((m) => header(m, 'cseq') === '2 NOTIFY')).status).toBe(200);
    edge.send(notify(3, 'SIP/2.0 200 OK'), endpoint.port);
    expect((await edge.next((m) => header(m, 'cseq') === '3 NOTIFY')).status).toBe(200);
    expect(await outcome).toBe(200);

    // Our BYE goes through the edge too.
    const bye = handle.hangup();
    const request_ = await edge.next((m) => m.method === 'BYE');
    expect(request_.headers.get('route')).toEqual([route]);
    edge.send(
      [
        'SIP/2.0 200 OK',
        `Via: ${request_.headers.get('via')![0]}`,
        `From: ${header(request_, 'from')}`,
        `To: ${header(request_, 'to')}`,
        'Call-ID: c1',
        `CSeq: ${header(request_, 'cseq')}`,
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n'),
      endpoint.port,
    );
    await bye;
  });

  it('a REFER refused is the outcome (its status), and a NOTIFY outside a dialog is 481', async () => {
    const { endpoint, edge, dialog } = await setup();
    edge.send(request('INVITE', { port: edge.port, callId: 'c2', cseq: 1, body: SDP }), endpoint.port);
    const ok = await edge.next((m) => m.status === 200 && header(m, 'call-id') === 'c2');
    const toTag = /tag=([^;]+)/.exec(header(ok, 'to') ?? '')![1];
    edge.send(request('ACK', { port: edge.port, callId: 'c2', cseq: 1, toTag }), endpoint.port);
    for (let i = 0; i < 50 && !dialog(); i++) await new Promise((r) => setTimeout(r, 20));
    const outcome = dialog()!.refer('sip:ana@acme.parley.test', 'sip:agent-1@acme.parley.test', 5000);
    const refer = await edge.next((m) => m.method === 'REFER' && header(m, 'call-id') === 'c2');
    edge.send(
      [
        'SIP/2.0 603 Decline',
        `Via: ${refer.headers.get('via')![0]}`,
        `From: ${header(refer, 'from')}`,
        `To: ${header(refer, 'to')}`,
        'Call-ID: c2',
        `CSeq: ${header(refer, 'cseq')}`,
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n'),
      endpoint.port,
    );
    expect(await outcome).toBe(603);
    edge.send(
      request('NOTIFY', { port: edge.port, callId: 'nope', cseq: 1, toTag: 'x', extra: ['Event: refer'], body: 'SIP/2.0 200 OK\r\n' }),
      endpoint.port,
    );
    expect((await edge.next((m) => header(m, 'call-id') === 'nope')).status).toBe(481);
    // The call goes on after a failed transfer; ended here (its BYE answered) so that nothing waits on it.
    const bye = dialog()!.hangup();
    const request_ = await edge.next((m) => m.method === 'BYE' && header(m, 'call-id') === 'c2');
    edge.send(
      [
        'SIP/2.0 200 OK',
        `Via: ${request_.headers.get('via')![0]}`,
        `From: ${header(request_, 'from')}`,
        `To: ${header(request_, 'to')}`,
        'Call-ID: c2',
        `CSeq: ${header(request_, 'cseq')}`,
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n'),
      endpoint.port,
    );
    await bye;
  });
});
