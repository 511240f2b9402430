/**
 * Audio between the browser softphone and a phone, end to end: a SIPp phone calls the operator with a plain
 * RTP/AVP PCMU offer whose audio is a UDP socket of this test; the console (Debian's Chromium, its fake microphone
 * playing a WAV) rings and answers; rtpengine bridges the phone's RTP to the browser's ICE/DTLS-SRTP (docs/sip.md,
 * "Media plane"). Audio is checked both ways: RTP from the browser's microphone arrives at the phone's socket, and
 * the phone's RTP shows in the browser's `getStats()` as inbound-rtp packets received. The Call is completed with
 * both participants. PostgreSQL, Kamailio (with its websocket module), rtpengine, SIPp and Chromium needed;
 * skipped, saying why, without.
 */
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { NgAnswer } from '../../src/sip/rtpengine.js';
import type { BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildServer } from '../../src/http/server.js';
import { systemActor } from '../../src/jsonapi/actor.js';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { freePort } from '../helpers/ports.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import {
  audioSocket,
  browserSkipReason,
  inboundAudio,
  launchConsoleBrowser,
  noteRings,
  signIn,
  sippErrors,
  toneFrame,
  trackPeerConnections,
  writeToneWav,
} from './browser.js';
import { freeUdpPort, register, sipp, sipSkipReason, startSipStack, until, type SipStack } from './harness.js';

/** The operator's desk phone's password (the stored `sip_password`; the browser never sees it). */
const DESK_PASSWORD = 'operator-desk-secret-1';

const SCREENSHOTS = path.resolve(process.env.UPDATE_SCREENSHOTS === '1' ? 'docs/screenshots' : 'test-results/screenshots');

const skip = sipSkipReason() ?? browserSkipReason();
if (skip) console.warn(`softphone media tests skipped: ${skip}`);

describe.skipIf(skip !== undefined)('audio between the browser softphone and a phone (rtpengine, Chromium, SIPp)', () => {
  let t: TestApp;
  let tenant: Tenant;
  let admin: Client;
  let server: FastifyInstance;
  let stack: SipStack;
  let apiUrl: string;
  let context: BrowserContext;
  let dir: string;
  let tab: Page;
  let operatorSip: { id: string; name: string };
  let caller: { id: string; name: string; password: string };
  let domain: string;

  beforeAll(async () => {
    const wsPort = await freePort();
    t = await startTestApp({ SIP_WS_URL: `ws://127.0.0.1:${wsPort}` });
    tenant = await seedTenant(t, 'Softphone media');
    admin = client(t.app, tenant.admin.token);
    const op = await admin.post(
      '/api/sip_users',
      resourceDocument('SipUser', { sip_username: 'op.media', sip_password: DESK_PASSWORD, user_id: tenant.operator.id }),
    );
    operatorSip = { id: op.body.data.id, name: 'op.media' };
    const password = 'caller-media-secret-1';
    const desk = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'desk.media', sip_password: password }));
    caller = { id: desk.body.data.id, name: 'desk.media', password };

    server = await buildServer({ ...t.services, database: t.database });
    await server.listen({ port: 0, host: '127.0.0.1' });
    apiUrl = `http://127.0.0.1:${(server.server.address() as AddressInfo).port}`;
    stack = await startSipStack(t, { SIP_RING_TIMEOUT_SECONDS: '30', SIP_WS_LISTEN: `ws:127.0.0.1:${wsPort}`, SIP_WS_ORIGINS: apiUrl });
    domain = (await admin.get(`/api/sip_users/${operatorSip.id}`)).body.data.attributes.sip_uri.split('@')[1];

    dir = mkdtempSync(path.join(tmpdir(), 'parley-softphone-media-'));
    const wav = path.join(dir, 'microphone.wav');
    writeToneWav(wav);
    mkdirSync(SCREENSHOTS, { recursive: true });
    context = await launchConsoleBrowser(path.join(dir, 'profile'), wav);
    tab = context.pages()[0] ?? (await context.newPage());
    await trackPeerConnections(tab);
    await noteRings(tab);
    await signIn(tab, apiUrl, tenant.publishableKey, tenant.operator);
    await tab.getByRole('status').filter({ hasText: 'Phone ready' }).waitFor({ timeout: 20_000 });
  }, 120_000);

  afterAll(async () => {
    await context?.close();
    await stack?.stop();
    await server?.close();
    await t?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /**
   * Audio both ways between the answered browser and the phone whose audio is `phoneAudio`: RTP (PCMU, the
   * phone's only codec) from the browser's microphone arrives at the phone's socket from rtpengine's range, and
   * the phone's RTP shows in the browser's inbound-rtp stats over a connected DTLS transport.
   */
  async function audioBothWays(phoneAudio: Awaited<ReturnType<typeof audioSocket>>) {
    const before = (await inboundAudio(tab))?.packetsReceived ?? 0;
    // The browser's microphone reaches the phone: rtpengine's RTP (PCMU, the phone's only codec) at its socket.
    await until(async () => (phoneAudio.received.length >= 25 ? true : undefined), 'RTP from the browser at the phone', 15_000);
    const first = phoneAudio.received[0];
    expect(first.address).toBe('127.0.0.1');
    expect(first.data[0] >> 6).toBe(2); // RTP version 2
    expect(first.data[1] & 0x7f).toBe(0); // PCMU
    const rtpenginePorts = stack.edge.rtpengine.media;
    expect(first.port).toBeGreaterThanOrEqual(rtpenginePorts.min);
    expect(first.port).toBeLessThanOrEqual(rtpenginePorts.max);
    // The fake microphone's tone is not silence: mu-law silence is 0xff/0x7f throughout.
    const payloads = phoneAudio.received.slice(5).map((p) => p.data.subarray(12));
    expect(payloads.some((p) => p.some((b) => b !== 0xff && b !== 0x7f))).toBe(true);

    // The phone talks (symmetric RTP, RFC 4961: to the port rtpengine sends from): the browser receives it.
    for (let i = 0; i < 150; i++) {
      phoneAudio.send(first.port, toneFrame(i * 160));
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const inbound = await until(async () => {
      const stats = await inboundAudio(tab);
      return stats && stats.packetsReceived >= before + 50 ? stats : undefined;
    }, 'inbound-rtp packets in the browser');
    expect(inbound.dtls).toBe('connected');
    expect(inbound.ice).toBe('succeeded');
    console.log(
      `softphone media: browser got ${inbound.packetsReceived} packets (${inbound.codec}), phone got ${phoneAudio.received.length}`,
    );
  }

  it('a phone calls the operator: the browser answers, audio flows both ways through rtpengine, the Call completes with both legs', async () => {
    const phoneAudio = await audioSocket();
    try {
      const placing = sipp('media_caller', stack.port, {
        localPort: await freeUdpPort(),
        keys: { from: caller.name, domain, mport: String(phoneAudio.port) },
        args: ['-s', operatorSip.name, '-au', caller.name, '-ap', caller.password, '-d', '8000'],
        timeoutSeconds: 45,
      });
      const panel = tab.getByRole('region', { name: 'Incoming call' });
      await panel.waitFor({ timeout: 20_000 });
      await panel.getByRole('button', { name: 'Answer' }).click();
      await tab
        .getByRole('region', { name: 'Call' })
        .getByText(/In call/)
        .waitFor({ timeout: 15_000 });

      await audioBothWays(phoneAudio);

      const result = await placing;
      expect(sippErrors(result.errors), result.errors).toBe('');
      expect(result.code).toBe(0);
      await tab.getByRole('region', { name: 'Call' }).waitFor({ state: 'detached', timeout: 15_000 });

      const record = await until(async () => {
        const found = (await admin.get(`/api/calls?filter[to_number]=${operatorSip.name}&sort=-started_at`)).body.data[0];
        return found?.attributes.status === 'completed' ? found : undefined;
      }, 'the call to complete');
      expect(record.attributes).toMatchObject({ status: 'completed', from_number: caller.name, to_number: operatorSip.name });
      const legs = (await admin.get(`/api/call_participants?filter[call_id]=${record.id}&sort=joined_at`)).body.data.map(
        (p: { attributes: Record<string, unknown> }) => [p.attributes.role, p.attributes.member_uuid, p.attributes.left_at !== null],
      );
      expect(legs).toEqual([
        ['caller', caller.id, true],
        ['callee', operatorSip.id, true],
      ]);
    } finally {
      await phoneAudio.close();
    }
  }, 120_000);

  /**
   * The operator's desk phone, registered with the stored password beside the browser: a call forks to both.
   * Unregistered again after its test (`unregister`), so later calls to the operator ring the browser alone.
   */
  async function deskPhone() {
    const port = await freeUdpPort();
    expect((await register(stack, operatorSip.name, DESK_PASSWORD, port, undefined, domain)).code).toBe(0);
    return port;
  }

  async function unregisterDesk(port: number) {
    const done = await sipp('unregister', stack.port, {
      localPort: port,
      keys: { domain },
      args: ['-s', operatorSip.name, '-au', operatorSip.name, '-ap', DESK_PASSWORD],
    });
    expect(done.code).toBe(0);
  }

  it('a desk phone and the browser of one operator ring together (mixed fork); the browser answers: audio both ways, the desk phone is cancelled', async () => {
    const deskPort = await deskPhone();
    const phoneAudio = await audioSocket();
    try {
      const ringing = sipp('callee_ring', undefined, { localPort: deskPort, keys: { domain }, timeoutSeconds: 40 });
      await new Promise((resolve) => setTimeout(resolve, 300));
      const placing = sipp('media_caller', stack.port, {
        localPort: await freeUdpPort(),
        keys: { from: caller.name, domain, mport: String(phoneAudio.port) },
        args: ['-s', operatorSip.name, '-au', caller.name, '-ap', caller.password, '-d', '8000'],
        timeoutSeconds: 45,
      });
      const panel = tab.getByRole('region', { name: 'Incoming call' });
      await panel.waitFor({ timeout: 20_000 });
      await panel.getByRole('button', { name: 'Answer' }).click();
      await tab
        .getByRole('region', { name: 'Call' })
        .getByText(/In call/)
        .waitFor({ timeout: 15_000 });
      // The desk phone's branch is cancelled (RFC 3261 section 16.7): callee_ring ends well only after a CANCEL.
      const desk = await ringing;
      expect(sippErrors(desk.errors), desk.errors).toBe('');
      expect(desk.code).toBe(0);

      await audioBothWays(phoneAudio);
      const placed = await placing;
      expect(sippErrors(placed.errors), placed.errors).toBe('');
      expect(placed.code).toBe(0);
      await tab.getByRole('region', { name: 'Call' }).waitFor({ state: 'detached', timeout: 15_000 });
    } finally {
      await phoneAudio.close();
      await unregisterDesk(deskPort);
    }
  }, 120_000);

  it('the same fork answered by the desk phone: plain RTP between the two phones, the browser stops ringing', async () => {
    const deskPort = await deskPhone();
    const phoneAudio = await audioSocket();
    const deskAudio = await audioSocket();
    try {
      const panel = tab.getByRole('region', { name: 'Incoming call' });
      const rings = (await tab.evaluate('window.__rings.length')) as number;
      const answering = sipp('media_callee', undefined, {
        localPort: deskPort,
        keys: { domain, mport: String(deskAudio.port) },
        timeoutSeconds: 40,
      });
      await new Promise((resolve) => setTimeout(resolve, 300));
      const placing = sipp('media_caller', stack.port, {
        localPort: await freeUdpPort(),
        keys: { from: caller.name, domain, mport: String(phoneAudio.port) },
        args: ['-s', operatorSip.name, '-au', caller.name, '-ap', caller.password, '-d', '5000'],
        timeoutSeconds: 45,
      });
      // Each phone talks to the port rtpengine sends to it from (learnt from the first packet, since each SDP
      // named rtpengine): both hear the other, in PCMU, through rtpengine.
      const session = await until(async () => {
        const call = (await admin.get(`/api/calls?filter[to_number]=${operatorSip.name}&sort=-started_at`)).body.data[0];
        if (call?.attributes.status !== 'in_progress') return undefined;
        const answer = await stack.edge.rtpengine.ng('query', { 'call-id': call.attributes.call_uuid as string });
        return answer.result === 'ok' ? answer : undefined;
      }, 'the answered call in rtpengine');
      // Both rang; the desk phone answered (after 300 ms) and the browser's branch was cancelled: the panel showed
      // (counted in the page, as it may come and go between two looks of a locator) and is gone.
      await until(
        async () => (((await tab.evaluate('window.__rings.length')) as number) > rings ? true : undefined),
        'the browser to ring',
      );
      await panel.waitFor({ state: 'detached', timeout: 15_000 });
      const ports = portsFacing(session);
      const towardsCaller = ports.get(phoneAudio.port);
      const towardsDesk = ports.get(deskAudio.port);
      expect(towardsCaller, JSON.stringify(session)).toBeDefined();
      expect(towardsDesk, JSON.stringify(session)).toBeDefined();
      for (let i = 0; i < 50; i++) {
        phoneAudio.send(towardsCaller!, toneFrame(i * 160));
        deskAudio.send(towardsDesk!, toneFrame(i * 160, 660));
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      await until(
        async () => (phoneAudio.received.length >= 40 && deskAudio.received.length >= 40 ? true : undefined),
        'RTP between the caller and the desk phone',
      );
      expect(deskAudio.received.every((p) => p.port === towardsDesk && (p.data[1] & 0x7f) === 0)).toBe(true);
      expect(phoneAudio.received.every((p) => p.port === towardsCaller && (p.data[1] & 0x7f) === 0)).toBe(true);

      const [placed, answered] = await Promise.all([placing, answering]);
      expect(sippErrors(placed.errors) + sippErrors(answered.errors), placed.errors + answered.errors).toBe('');
      expect(placed.code).toBe(0);
      expect(answered.code).toBe(0);
    } finally {
      await phoneAudio.close();
      await deskAudio.close();
      await unregisterDesk(deskPort);
    }
  }, 120_000);

  /** A SIP user of the organisation (a desk phone with its stored password). */
  async function sipUser(name: string) {
    const password = `${name}-secret-1`;
    const created = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: name, sip_password: password }));
    expect(created.status).toBe(201);
    return { id: created.body.data.id as string, name, password };
  }

  /** A phone of `user` registered on its own port, then running `scenario` as the UAS. */
  async function phone(user: { name: string; password: string }, scenario: string, keys: Record<string, string> = {}) {
    const port = await freeUdpPort();
    expect((await register(stack, user.name, user.password, port, undefined, domain)).code).toBe(0);
    const done = sipp(scenario, undefined, { localPort: port, keys: { domain, ...keys }, timeoutSeconds: 40 });
    await new Promise((resolve) => setTimeout(resolve, 500));
    return { done };
  }

  async function legsOf(callRowId: string) {
    return (await admin.get(`/api/call_participants?filter[call_id]=${callRowId}&sort=joined_at`)).body.data.map(
      (p: { attributes: Record<string, unknown> }) => p.attributes,
    ) as Record<string, unknown>[];
  }

  it("the operator transfers the call to a colleague from the softphone (REFER): the caller calls them, one Call with the colleague's leg", async () => {
    // The desk phones of the tests above are unregistered: the operator's one contact is the browser's.
    const contacts = await t.db.selectFrom('sip_locations').select('contact').where('username', '=', operatorSip.name).execute();
    expect(contacts.map((c) => c.contact)).toEqual([expect.stringMatching(/\.invalid;transport=ws/)]);
    const colleague = await sipUser('op.colleague');
    const target = await phone(colleague, 'callee_answer');
    const transferee = sipp('caller_transferee', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain },
      args: ['-s', operatorSip.name, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 40,
    });
    const panel = tab.getByRole('region', { name: 'Incoming call' });
    await panel.waitFor({ timeout: 20_000 });
    await panel.getByRole('button', { name: 'Answer' }).click();
    const inCall = tab.getByRole('region', { name: 'Call' });
    await inCall.getByText(/In call/).waitFor({ timeout: 15_000 });
    await inCall.getByRole('button', { name: 'Transfer' }).click();
    await inCall.getByLabel(/Transfer to/).fill('not a target!');
    await inCall.getByRole('button', { name: 'Transfer call' }).click();
    await inCall.getByRole('alert').filter({ hasText: "Enter a colleague's SIP user name" }).waitFor();
    await inCall.getByLabel(/Transfer to/).fill(colleague.name);
    await inCall.getByRole('button', { name: 'Transfer call' }).click();

    // The caller got the REFER for the colleague (relayed by the edge, RFC 3515), accepted it, and the console
    // hung up after its NOTIFY: the call panel goes.
    const followed = await transferee;
    expect(sippErrors(followed.errors), followed.errors).toBe('');
    expect(followed.code).toBe(0);
    expect(followed.logs).toContain(`REFER received, Refer-To: <sip:${colleague.name}@${domain}>`);
    await inCall.waitFor({ state: 'detached', timeout: 15_000 });

    const placed = await sipp('caller_referred', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain, referrer: operatorSip.name },
      args: ['-s', colleague.name, '-au', caller.name, '-ap', caller.password, '-d', '1000'],
      timeoutSeconds: 40,
    });
    expect(sippErrors(placed.errors), placed.errors).toBe('');
    expect((await target.done).code).toBe(0);

    const record = await until(async () => {
      const call = (await admin.get(`/api/calls?filter[to_number]=${operatorSip.name}&sort=-started_at`)).body.data[0];
      return call?.attributes.status === 'completed' ? call : undefined;
    }, 'the transferred call to complete');
    const legs = await legsOf(record.id);
    expect(legs.map((l) => [l.member_uuid, l.role, l.left_at !== null])).toEqual([
      [caller.id, 'caller', true],
      [operatorSip.id, 'callee', true],
      [colleague.id, 'callee', true],
    ]);
    // The transfer's new call is a leg of this Call, not a Call of its own.
    expect((await admin.get(`/api/calls?filter[to_number]=${colleague.name}`)).body.data).toEqual([]);
  }, 150_000);

  it("a call handed to the browser by a voice agent (a transfer) shows the agent's handoff summary and the live transcript", async () => {
    // The agent's side is a SIP phone here that answers and REFERs the caller to the operator, as the voice
    // runtime does (docs/voice.md, "Handoff on a call"); its transcript and handoff are written as it writes them.
    const agent = await sipUser('agent.standin');
    const agentPhone = await phone(agent, 'callee_transfer', { target: operatorSip.name, target_domain: domain });
    const transferee = await sipp('caller_transferee', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain },
      args: ['-s', agent.name, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 40,
    });
    expect(sippErrors(transferee.errors), transferee.errors).toBe('');
    expect((await agentPhone.done).code).toBe(0);
    const call = await until(async () => {
      const found = (await admin.get(`/api/calls?filter[to_number]=${agent.name}&sort=-started_at`)).body.data[0];
      return found?.attributes.conversation_id ? found : undefined;
    }, "the agent's call");
    const conversationId = call.attributes.conversation_id as string;
    const records = t.services.records!;
    const line = (speaker: 'caller' | 'agent', content: string, index: number) =>
      records.create(systemActor(tenant.organisationId, 'sip'), 'CallTranscript', {
        call_id: call.id,
        speaker,
        content,
        item_id: `voice_test_${index}`,
        content_index: index,
        occurred_at: new Date(),
      });
    await line('agent', 'Hello, this is Ava. How can I help?', 0);
    await line('caller', 'My parcel never arrived, order 4417.', 1);
    const handoff = await admin.post(
      `/api/conversations/${conversationId}/hand_off`,
      resourceDocument('Conversation', { reason: 'Lost parcel, order 4417: the caller wants a refund' }, conversationId),
    );
    expect(handoff.status).toBeLessThan(300);

    // The caller follows the REFER: its new call to the operator rings the browser, named as a leg of the
    // agent's call (Parley-Call-ID), so the panel shows that call's handoff and transcript.
    const placing = sipp('caller_referred', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain, referrer: agent.name },
      args: ['-s', operatorSip.name, '-au', caller.name, '-ap', caller.password, '-d', '5000'],
      timeoutSeconds: 45,
    });
    const panel = tab.getByRole('region', { name: 'Incoming call' });
    await panel.waitFor({ timeout: 20_000 });
    await panel.getByText("Agent's handoff summary: Lost parcel, order 4417: the caller wants a refund").waitFor({ timeout: 10_000 });
    const transcript = panel.getByRole('list', { name: 'Live transcript' });
    await transcript.getByText('Agent: Hello, this is Ava. How can I help?').waitFor();
    await transcript.getByText('Caller: My parcel never arrived, order 4417.').waitFor();
    // A line written while it rings arrives through the event stream (CallTranscript.created).
    await line('agent', 'Let me put you through to a colleague.', 2);
    await transcript.getByText('Agent: Let me put you through to a colleague.').waitFor({ timeout: 10_000 });
    await tab.screenshot({ path: path.join(SCREENSHOTS, 'softphone-handoff.png') });

    await panel.getByRole('button', { name: 'Answer' }).click();
    const inCall = tab.getByRole('region', { name: 'Call' });
    await inCall.getByText(/In call/).waitFor({ timeout: 15_000 });
    // Beside the call, the transcript stays and keeps growing.
    await line('caller', 'Thanks.', 3);
    await inCall.getByRole('list', { name: 'Live transcript' }).getByText('Caller: Thanks.').waitFor({ timeout: 10_000 });

    const placed = await placing;
    expect(sippErrors(placed.errors), placed.errors).toBe('');
    await inCall.waitFor({ state: 'detached', timeout: 15_000 });
    const done = await until(async () => {
      const found = (await admin.get(`/api/calls/${call.id}`)).body.data;
      return found.attributes.status === 'completed' ? found : undefined;
    }, 'the handed-over call to complete');
    expect((await legsOf(done.id)).map((l) => [l.member_uuid, l.role])).toEqual([
      [caller.id, 'caller'],
      [agent.id, 'callee'],
      [operatorSip.id, 'callee'],
    ]);
  }, 150_000);

  it('the WebSocket dropping mid-call: the call is ended cleanly over the new connection (BYE) and recorded completed', async () => {
    const page = await context.newPage();
    // The page's WebSockets within reach (JsSIP's is the only one: the event stream is a fetch).
    await page.addInitScript(`(() => {
      const Native = window.WebSocket;
      window.__sockets = [];
      window.WebSocket = class extends Native {
        constructor(...args) { super(...args); window.__sockets.push(this); }
      };
    })()`);
    await signIn(page, apiUrl, tenant.publishableKey, tenant.operator);
    await page.getByRole('status').filter({ hasText: 'Phone ready' }).waitFor({ timeout: 20_000 });
    const waiting = sipp('caller_hold', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain },
      args: ['-s', operatorSip.name, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 40,
    });
    const panel = page.getByRole('region', { name: 'Incoming call' });
    await panel.waitFor({ timeout: 20_000 });
    await panel.getByRole('button', { name: 'Answer' }).click();
    const inCall = page.getByRole('region', { name: 'Call' });
    await inCall.getByText(/In call/).waitFor({ timeout: 15_000 });

    await page.evaluate('window.__sockets.forEach((socket) => socket.close())');
    // JsSIP reconnects; the console ends the call over the new connection and says why.
    await page
      .getByRole('alert')
      .filter({ hasText: 'connection to the phone server was lost, so the call was ended' })
      .waitFor({ timeout: 20_000 });
    expect(await inCall.count()).toBe(0);
    // The caller got the BYE through the edge (caller_hold ends well only on the callee's BYE).
    const ended = await waiting;
    expect(sippErrors(ended.errors), ended.errors).toBe('');
    expect(ended.code).toBe(0);
    const record = await until(async () => {
      const call = (await admin.get(`/api/calls?filter[to_number]=${operatorSip.name}&sort=-started_at`)).body.data[0];
      return call?.attributes.status === 'completed' ? call : undefined;
    }, 'the call to be recorded completed');
    expect((await legsOf(record.id)).every((leg) => leg.left_at !== null)).toBe(true);
    await page.getByRole('status').filter({ hasText: 'Phone ready' }).waitFor({ timeout: 20_000 });
    await page.close();
  }, 120_000);

  it("a session revoked mid-call ends the call; the tab's registration, left behind, is no longer called", async () => {
    // The admin takes calls in a tab of their own; the owner signs them out everywhere during a call.
    const adminSip = await admin.post(
      '/api/sip_users',
      resourceDocument('SipUser', { sip_username: 'admin.web', user_id: tenant.admin.id }),
    );
    expect(adminSip.status).toBe(201);
    const page = await context.newPage();
    await signIn(page, apiUrl, tenant.publishableKey, tenant.admin);
    await page.getByRole('status').filter({ hasText: 'Phone ready' }).waitFor({ timeout: 20_000 });

    const waiting = sipp('caller_hold', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain },
      args: ['-s', 'admin.web', '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 40,
    });
    const panel = page.getByRole('region', { name: 'Incoming call' });
    await panel.waitFor({ timeout: 20_000 });
    await panel.getByRole('button', { name: 'Answer' }).click();
    await page
      .getByRole('region', { name: 'Call' })
      .getByText(/In call/)
      .waitFor({ timeout: 15_000 });

    const owner = client(t.app, tenant.owner.token);
    const revoked = await owner.patch(`/api/users/${tenant.admin.id}`, resourceDocument('User', { revoke_tokens: true }, tenant.admin.id));
    expect(revoked.status).toBe(200);
    // The event stream ends with the credential, its reconnection gets 401: the console signs out, which hangs
    // up (BYE: caller_hold ends well only on the callee's BYE).
    await page.getByText(/session expired or was revoked/i).waitFor({ timeout: 20_000 });
    const ended = await waiting;
    expect(sippErrors(ended.errors), ended.errors).toBe('');
    expect(ended.code).toBe(0);
    const record = await until(async () => {
      const call = (await owner.get('/api/calls?filter[to_number]=admin.web')).body.data[0];
      return call?.attributes.status === 'completed' ? call : undefined;
    }, 'the call ended by the revocation to be recorded');
    const legs = (await owner.get(`/api/call_participants?filter[call_id]=${record.id}&sort=joined_at`)).body.data.map(
      (p: { attributes: Record<string, unknown> }) => [p.attributes.member_uuid, p.attributes.left_at !== null],
    );
    expect(legs).toEqual([
      [caller.id, true],
      [adminSip.body.data.id, true],
    ]);

    // Signing out tried to unregister, with the revoked credential: refused, so the tab's contact is still in
    // the location table until it expires. Calls are no longer sent to it.
    const contacts = await t.db.selectFrom('sip_locations').select('contact').where('username', '=', 'admin.web').execute();
    expect(contacts.length).toBeGreaterThan(0);
    const refused = await sipp('caller_refused', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain },
      args: ['-s', 'admin.web', '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 20,
    });
    expect(sippErrors(refused.errors), refused.errors).toBe('');
    expect(refused.code).toBe(0);
    expect(stack.kamailioLog.join('\n')).toMatch(/registered with credential admin\.web~\S+, which no longer stands: not called/);
    await page.close();
  }, 150_000);

  it('a page that ignores its revoked session (a stolen one) loses its call too: the edge ends it', async () => {
    const waiting = sipp('caller_hold', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain },
      args: ['-s', operatorSip.name, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 60,
    });
    const panel = tab.getByRole('region', { name: 'Incoming call' });
    await panel.waitFor({ timeout: 20_000 });
    await panel.getByRole('button', { name: 'Answer' }).click();
    const inCall = tab.getByRole('region', { name: 'Call' });
    await inCall.getByText(/In call/).waitFor({ timeout: 15_000 });
    // The page no longer reaches the API, so it never learns of the revocation and never hangs up itself.
    await tab.route('**/api/**', (route) => route.abort());
    const owner = client(t.app, tenant.owner.token);
    const revokedAt = Date.now();
    const revoked = await owner.patch(
      `/api/users/${tenant.operator.id}`,
      resourceDocument('User', { revoke_tokens: true }, tenant.operator.id),
    );
    expect(revoked.status).toBe(200);
    // The edge ends the dialog (BYE to both): caller_hold ends well only on a BYE, and the page's call ends.
    const ended = await waiting;
    expect(sippErrors(ended.errors), ended.errors).toBe('');
    expect(ended.code).toBe(0);
    await inCall.waitFor({ state: 'detached', timeout: 15_000 });
    expect(await tab.getByText(/session expired or was revoked/i).count()).toBe(0);
    const record = await until(async () => {
      const call = (await owner.get(`/api/calls?filter[to_number]=${operatorSip.name}&sort=-started_at`)).body.data[0];
      return call?.attributes.status === 'completed' ? call : undefined;
    }, 'the call ended at the edge to be recorded completed');
    expect(Date.parse(record.attributes.ended_at)).toBeGreaterThanOrEqual(revokedAt - 1000);
    const legs = (await owner.get(`/api/call_participants?filter[call_id]=${record.id}`)).body.data;
    expect(legs.length).toBe(2);
    expect(legs.every((p: { attributes: { left_at: string | null } }) => p.attributes.left_at !== null)).toBe(true);
    await tab.unroute('**/api/**');
  }, 150_000);
});

/** rtpengine's local port facing each remote endpoint port of a session (ng `query`). */
function portsFacing(answer: NgAnswer): Map<number, number> {
  const ports = new Map<number, number>();
  const tags = (answer.tags ?? {}) as Record<string, { medias?: { streams?: { 'local port': number; endpoint?: { port: number } }[] }[] }>;
  for (const tag of Object.values(tags))
    for (const media of tag.medias ?? [])
      for (const stream of media.streams ?? []) if (stream.endpoint) ports.set(stream.endpoint.port, stream['local port']);
  return ports;
}
