/**
 * The SIP edge over TLS (RFC 3261 section 26.2; issue 21, transports), end to end: Kamailio's tls module with
 * a certificate made at test time, a phone registering with digest authentication over TLS and calling a
 * phone on UDP. Debian's SIPp has no TLS, so the TLS phone is the small client of ./tls.ts.
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../helpers/ports.js';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant } from '../support/seed.js';
import { DOMAIN, freeUdpPort, register, sipp, startSipStack, tlsSkipReason, until, type SipStack } from './harness.js';
import { connectTls, selfSignedCertificate, type SipMessage, type TlsPhone } from './tls.js';

const skip = tlsSkipReason();
if (skip) console.warn(`SIP over TLS tests skipped: ${skip}`);

const md5 = (text: string) => createHash('md5').update(text).digest('hex');
const random = () => randomBytes(6).toString('hex');

/** The digest Authorization for a challenge (RFC 2617 section 3.2.2: MD5, no qop, as the edge challenges). */
function authorization(challenge: string, method: string, uri: string, user: string, password: string): string {
  const realm = /realm="([^"]*)"/.exec(challenge)![1];
  const nonce = /nonce="([^"]*)"/.exec(challenge)![1];
  const response = md5(`${md5(`${user}:${realm}:${password}`)}:${nonce}:${md5(`${method}:${uri}`)}`);
  return `Digest username="${user}", realm="${realm}", nonce="${nonce}", uri="${uri}", response="${response}", algorithm=MD5`;
}

describe.skipIf(skip !== undefined)('SIP edge over TLS (Kamailio tls module)', () => {
  let t: TestApp;
  let admin: Client;
  let domain: string;
  let stack: SipStack;
  let certificate: ReturnType<typeof selfSignedCertificate>;
  let tlsPort: number;
  const phones: TlsPhone[] = [];
  let n = 0;

  beforeAll(async () => {
    t = await startTestApp();
    const tenant = await seedTenant(t, 'Acme');
    admin = client(t.app, tenant.admin.token);
    domain = `acme.${DOMAIN}`;
    certificate = selfSignedCertificate();
    // UDP and TLS on two numbers: the UDP one is free for UDP (the harness), the TLS one for TCP, and they differ.
    const udpPort = await freeUdpPort();
    do tlsPort = await freePort();
    while (tlsPort === udpPort);
    stack = await startSipStack(
      t,
      {
        SIP_LISTEN: `udp:127.0.0.1:PORT,tls:127.0.0.1:${tlsPort}`,
        SIP_TLS_CERT: certificate.cert,
        SIP_TLS_KEY: certificate.key,
      },
      udpPort,
    );
  }, 60_000);
  afterAll(async () => {
    for (const phone of phones) phone.close();
    await stack?.stop();
    await t?.close();
    if (certificate) fs.rmSync(certificate.dir, { recursive: true, force: true });
  });

  async function sipUser() {
    const name = `tls${Date.now().toString(36)}${n++}`;
    const password = `pw-${name}-secret`;
    const response = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: name, sip_password: password }));
    expect(response.status).toBe(201);
    return { id: response.body.data.id as string, name, password };
  }

  async function phone() {
    const connected = await connectTls(tlsPort, certificate.pem);
    phones.push(connected);
    return connected;
  }

  /** Sends `build(authorization header or '')`, answers one challenge, and returns the final response. */
  async function withDigest(
    tls: TlsPhone,
    method: string,
    uri: string,
    user: { name: string; password: string },
    build: (cseq: number, auth: string) => string,
  ): Promise<SipMessage> {
    const final = (m: SipMessage) => m.status >= 200 && m.header('CSeq')?.endsWith(method) === true;
    tls.send(build(1, ''));
    const challenge = await tls.next(final);
    if (challenge.status !== 401 && challenge.status !== 407) return challenge;
    const header = challenge.status === 401 ? 'WWW-Authenticate' : 'Proxy-Authenticate';
    const answer = challenge.status === 401 ? 'Authorization' : 'Proxy-Authorization';
    if (method === 'INVITE') tls.send(ack(challenge, uri));
    tls.send(build(2, `${answer}: ${authorization(challenge.header(header)!, method, uri, user.name, user.password)}\r\n`));
    return tls.next(final);
  }

  /** The ACK of a negative answer to an INVITE (RFC 3261 section 17.1.1.3: same branch, same request URI). */
  function ack(response: SipMessage, uri: string) {
    return [
      `ACK ${uri} SIP/2.0`,
      `Via: ${response.header('Via')}`,
      'Max-Forwards: 70',
      `From: ${response.header('From')}`,
      `To: ${response.header('To')}`,
      `Call-ID: ${response.header('Call-ID')}`,
      `CSeq: ${response.header('CSeq')!.split(' ')[0]} ACK`,
      'Content-Length: 0',
      '',
      '',
    ].join('\r\n');
  }

  async function registerOverTls(tls: TlsPhone, user: { name: string; password: string }) {
    const callId = `${random()}@tls-phone`;
    const fromTag = random();
    const uri = `sip:${domain}`;
    return withDigest(tls, 'REGISTER', uri, user, (cseq, auth) =>
      [
        `REGISTER ${uri} SIP/2.0`,
        `Via: SIP/2.0/TLS ${tls.local};branch=z9hG4bK${random()};rport`,
        'Max-Forwards: 70',
        `From: <sip:${user.name}@${domain}>;tag=${fromTag}`,
        `To: <sip:${user.name}@${domain}>`,
        `Call-ID: ${callId}`,
        `CSeq: ${cseq} REGISTER`,
        `Contact: <sip:${user.name}@${tls.local};transport=tls>`,
        `${auth}Expires: 300`,
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n'),
    );
  }

  it('registers over TLS with digest authentication: 200, and the SIP user is registered', async () => {
    const alice = await sipUser();
    const tls = await phone();
    expect(['TLSv1.2', 'TLSv1.3']).toContain(tls.protocol);
    const before = await admin.get(`/api/sip_users/${alice.id}`);
    expect(before.body.data.attributes.registered).toBe(false);
    const answer = await registerOverTls(tls, alice);
    expect(answer.status).toBe(200);
    expect(answer.header('Contact')).toContain(`;transport=tls`);
    const after = await admin.get(`/api/sip_users/${alice.id}`);
    expect(after.body.data.attributes.registered).toBe(true);
  });

  it('refuses a wrong password over TLS (403 after the challenge) and leaves the user unregistered', async () => {
    const bob = await sipUser();
    const tls = await phone();
    const answer = await registerOverTls(tls, { name: bob.name, password: 'not-the-password' });
    expect(answer.status).toBe(403);
    expect((await admin.get(`/api/sip_users/${bob.id}`)).body.data.attributes.registered).toBe(false);
  });

  it('calls from a TLS phone to a UDP phone: answered, hung up over TLS, recorded completed', async () => {
    const caller = await sipUser();
    const callee = await sipUser();
    const calleePort = await freeUdpPort();
    expect((await register(stack, callee.name, callee.password, calleePort, undefined, domain)).code).toBe(0);
    const answering = sipp('callee_answer', undefined, { localPort: calleePort, keys: { domain }, timeoutSeconds: 20 });
    await new Promise((resolve) => setTimeout(resolve, 300));

    const tls = await phone();
    expect((await registerOverTls(tls, caller)).status).toBe(200);
    const uri = `sip:${callee.name}@${domain}`;
    const callId = `${random()}@tls-phone`;
    const fromTag = random();
    const sdp = ['v=0', 'o=tls 1 1 IN IP4 127.0.0.1', 's=-', 'c=IN IP4 127.0.0.1', 't=0 0', 'm=audio 4000 RTP/AVP 0', ''].join('\r\n');
    const answer = await withDigest(tls, 'INVITE', uri, caller, (cseq, auth) =>
      [
        `INVITE ${uri} SIP/2.0`,
        `Via: SIP/2.0/TLS ${tls.local};branch=z9hG4bK${random()};rport`,
        'Max-Forwards: 70',
        `From: <sip:${caller.name}@${domain}>;tag=${fromTag}`,
        `To: <sip:${callee.name}@${domain}>`,
        `Call-ID: ${callId}`,
        `CSeq: ${cseq} INVITE`,
        `Contact: <sip:${caller.name}@${tls.local};transport=tls>`,
        `${auth}Content-Type: application/sdp`,
        `Content-Length: ${Buffer.byteLength(sdp)}`,
        '',
        sdp,
      ].join('\r\n'),
    );
    expect(answer.status).toBe(200);
    // The dialog's route set is the Record-Route in reverse (RFC 3261 section 12.1.2); the edge's first entry
    // for this side must be its TLS address, or the ACK and BYE would not find their way back over TLS.
    const routeSet = answer.headers('Record-Route').reverse();
    expect(routeSet[0]).toMatch(/transport=tls/i);
    const target = /<([^>]+)>/.exec(answer.header('Contact')!)![1];
    const toHeader = answer.header('To')!;
    const inDialog = (method: string, cseq: number) =>
      [
        `${method} ${target} SIP/2.0`,
        `Via: SIP/2.0/TLS ${tls.local};branch=z9hG4bK${random()};rport`,
        'Max-Forwards: 70',
        ...routeSet.map((route) => `Route: ${route}`),
        `From: <sip:${caller.name}@${domain}>;tag=${fromTag}`,
        `To: ${toHeader}`,
        `Call-ID: ${callId}`,
        `CSeq: ${cseq} ${method}`,
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n');
    tls.send(inDialog('ACK', 2));
    await until(async () => {
      const calls = await admin.get(`/api/calls?filter[to_number]=${callee.name}&filter[status]=in_progress`);
      return calls.body.data.length ? true : undefined;
    }, 'the call to be answered');
    tls.send(inDialog('BYE', 3));
    const bye = await tls.next((m) => m.status >= 200 && m.header('CSeq') === '3 BYE');
    expect(bye.status).toBe(200);
    expect((await answering).code).toBe(0);
    const call = await until(async () => {
      const calls = await admin.get(`/api/calls?filter[to_number]=${callee.name}`);
      const found = calls.body.data[0];
      return found?.attributes.status === 'completed' ? found : undefined;
    }, 'the call to be completed');
    expect(call.attributes).toMatchObject({ status: 'completed', from_number: caller.name, call_uuid: callId });
  });
  /** A response to `request` copying its Via, Record-Route, From, Call-ID and CSeq lines (RFC 3261 section 8.2.6). */
  function reply(request: SipMessage, status: string, toTag: string, contact: string, body = '') {
    const head = request.text.split('\r\n\r\n')[0].split('\r\n');
    const copied = head.filter((line) => /^(Via|v|Record-Route|From|f|Call-ID|i|CSeq):/i.test(line));
    const to = head.find((line) => /^(To|t):/i.test(line))!;
    return [
      `SIP/2.0 ${status}`,
      ...copied,
      /;tag=/.test(to) ? to : `${to};tag=${toTag}`,
      `Contact: <${contact}>`,
      ...(body ? ['Content-Type: application/sdp'] : []),
      `Content-Length: ${Buffer.byteLength(body)}`,
      '',
      body,
    ].join('\r\n');
  }

  it('calls a phone registered over TLS whose Contact is not its connection: reached over that connection', async () => {
    const caller = await sipUser();
    const callee = await sipUser();
    const tls = await phone();
    // Phones give their listening port (5061, or any) in Contact, not the connection's ephemeral source port;
    // nothing listens on this one, so the call can only reach the phone over the connection it registered on.
    const contact = `sip:${callee.name}@127.0.0.1:${await freePort()};transport=tls`;
    const callId = `${random()}@tls-callee`;
    const fromTag = random();
    const uri = `sip:${domain}`;
    const registered = await withDigest(tls, 'REGISTER', uri, callee, (cseq, auth) =>
      [
        `REGISTER ${uri} SIP/2.0`,
        `Via: SIP/2.0/TLS ${tls.local};branch=z9hG4bK${random()};rport`,
        'Max-Forwards: 70',
        `From: <sip:${callee.name}@${domain}>;tag=${fromTag}`,
        `To: <sip:${callee.name}@${domain}>`,
        `Call-ID: ${callId}`,
        `CSeq: ${cseq} REGISTER`,
        `Contact: <${contact}>`,
        `${auth}Expires: 300`,
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n'),
    );
    expect(registered.status).toBe(200);

    const placing = sipp('caller_call', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain },
      args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password, '-d', '300'],
    });
    const invite = await tls.next((m) => m.method === 'INVITE', 10_000);
    const toTag = random();
    const sdp = ['v=0', 'o=tls 1 1 IN IP4 127.0.0.1', 's=-', 'c=IN IP4 127.0.0.1', 't=0 0', 'm=audio 4002 RTP/AVP 0', ''].join('\r\n');
    tls.send(reply(invite, '180 Ringing', toTag, contact));
    tls.send(reply(invite, '200 OK', toTag, contact, sdp));
    await tls.next((m) => m.method === 'ACK');
    const bye = await tls.next((m) => m.method === 'BYE', 10_000);
    tls.send(reply(bye, '200 OK', toTag, contact));
    const placed = await placing;
    expect(placed.errors).toBe('');
    expect(placed.code).toBe(0);
    const call = await until(async () => {
      const calls = await admin.get(`/api/calls?filter[to_number]=${callee.name}`);
      const found = calls.body.data[0];
      return found?.attributes.status === 'completed' ? found : undefined;
    }, 'the call to be completed');
    expect(call.attributes).toMatchObject({ status: 'completed', from_number: caller.name });
  });
  it('calls between two TLS phones whose Contacts are not their connections; the callee hangs up', async () => {
    const caller = await sipUser();
    const callee = await sipUser();
    const calling = await phone();
    const answering = await phone();
    // Neither phone listens where its Contact says: both are reached only over their own connection.
    const callerContact = `sip:${caller.name}@127.0.0.1:${await freePort()};transport=tls`;
    const calleeContact = `sip:${callee.name}@127.0.0.1:${await freePort()};transport=tls`;
    const uri = `sip:${domain}`;
    const registration = (tls: TlsPhone, user: { name: string; password: string }, contact: string) => {
      const callId = `${random()}@tls-phone`;
      const fromTag = random();
      return withDigest(tls, 'REGISTER', uri, user, (cseq, auth) =>
        [
          `REGISTER ${uri} SIP/2.0`,
          `Via: SIP/2.0/TLS ${tls.local};branch=z9hG4bK${random()};rport`,
          'Max-Forwards: 70',
          `From: <sip:${user.name}@${domain}>;tag=${fromTag}`,
          `To: <sip:${user.name}@${domain}>`,
          `Call-ID: ${callId}`,
          `CSeq: ${cseq} REGISTER`,
          `Contact: <${contact}>`,
          `${auth}Expires: 300`,
          'Content-Length: 0',
          '',
          '',
        ].join('\r\n'),
      );
    };
    expect((await registration(answering, callee, calleeContact)).status).toBe(200);
    expect((await registration(calling, caller, callerContact)).status).toBe(200);

    const target = `sip:${callee.name}@${domain}`;
    const callId = `${random()}@tls-to-tls`;
    const fromTag = random();
    const toTag = random();
    const sdp = ['v=0', 'o=tls 1 1 IN IP4 127.0.0.1', 's=-', 'c=IN IP4 127.0.0.1', 't=0 0', 'm=audio 4004 RTP/AVP 0', ''].join('\r\n');
    const answered = withDigest(calling, 'INVITE', target, caller, (cseq, auth) =>
      [
        `INVITE ${target} SIP/2.0`,
        `Via: SIP/2.0/TLS ${calling.local};branch=z9hG4bK${random()};rport`,
        'Max-Forwards: 70',
        `From: <sip:${caller.name}@${domain}>;tag=${fromTag}`,
        `To: <sip:${callee.name}@${domain}>`,
        `Call-ID: ${callId}`,
        `CSeq: ${cseq} INVITE`,
        `Contact: <${callerContact}>`,
        `${auth}Content-Type: application/sdp`,
        `Content-Length: ${Buffer.byteLength(sdp)}`,
        '',
        sdp,
      ].join('\r\n'),
    );
    const invite = await answering.next((m) => m.method === 'INVITE', 10_000);
    answering.send(reply(invite, '200 OK', toTag, calleeContact, sdp));
    const ok = await answered;
    expect(ok.status).toBe(200);
    const callerRoutes = ok.headers('Record-Route').reverse();
    const calleeTarget = /<([^>]+)>/.exec(ok.header('Contact')!)![1];
    calling.send(
      [
        `ACK ${calleeTarget} SIP/2.0`,
        `Via: SIP/2.0/TLS ${calling.local};branch=z9hG4bK${random()};rport`,
        'Max-Forwards: 70',
        ...callerRoutes.map((route) => `Route: ${route}`),
        `From: <sip:${caller.name}@${domain}>;tag=${fromTag}`,
        `To: ${ok.header('To')}`,
        `Call-ID: ${callId}`,
        `CSeq: 2 ACK`,
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n'),
    );
    await answering.next((m) => m.method === 'ACK');
    // The callee hangs up: its BYE goes to the caller's Contact as the edge relayed it (with the alias of the
    // caller's connection), along the Record-Route as received (RFC 3261 section 12.1.1).
    const callerTarget = /<([^>]+)>/.exec(invite.header('Contact')!)![1];
    expect(callerTarget).toContain('alias=');
    answering.send(
      [
        `BYE ${callerTarget} SIP/2.0`,
        `Via: SIP/2.0/TLS ${answering.local};branch=z9hG4bK${random()};rport`,
        'Max-Forwards: 70',
        ...invite.headers('Record-Route').map((route) => `Route: ${route}`),
        `From: <sip:${callee.name}@${domain}>;tag=${toTag}`,
        `To: <sip:${caller.name}@${domain}>;tag=${fromTag}`,
        `Call-ID: ${callId}`,
        'CSeq: 1 BYE',
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n'),
    );
    const bye = await calling.next((m) => m.method === 'BYE', 10_000);
    expect(bye.text.split('\r\n')[0]).not.toContain('alias=');
    calling.send(reply(bye, '200 OK', fromTag, callerContact));
    expect((await answering.next((m) => m.status >= 200 && m.header('CSeq') === '1 BYE')).status).toBe(200);
    const call = await until(async () => {
      const calls = await admin.get(`/api/calls?filter[to_number]=${callee.name}`);
      const found = calls.body.data[0];
      return found?.attributes.status === 'completed' ? found : undefined;
    }, 'the call to be completed');
    expect(call.attributes).toMatchObject({ status: 'completed', from_number: caller.name, call_uuid: callId });
  });
});
