/**
 * Audio between the browser softphone and a phone, end to end: a SIPp phone calls the operator with a plain
 * RTP/AVP PCMU offer whose audio is a UDP socket of this test; the console (Debian's Chromium, its fake microphone
 * playing a WAV) rings and answers; rtpengine bridges the phone's RTP to the browser's ICE/DTLS-SRTP (docs/sip.md,
 * "Media plane"). Audio is checked both ways: RTP from the browser's microphone arrives at the phone's socket, and
 * the phone's RTP shows in the browser's `getStats()` as inbound-rtp packets received. The Call is completed with
 * both participants. PostgreSQL, Kamailio (with its websocket module), rtpengine, SIPp and Chromium needed;
 * skipped, saying why, without.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildServer } from '../../src/http/server.js';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { freePort } from '../helpers/ports.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import {
  audioSocket,
  browserSkipReason,
  inboundAudio,
  launchConsoleBrowser,
  signIn,
  toneFrame,
  trackPeerConnections,
  writeToneWav,
} from './browser.js';
import { freeUdpPort, sipp, sipSkipReason, startSipStack, until, type SipStack } from './harness.js';

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
    const op = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'op.media', user_id: tenant.operator.id }));
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
    context = await launchConsoleBrowser(path.join(dir, 'profile'), wav);
    tab = context.pages()[0] ?? (await context.newPage());
    await trackPeerConnections(tab);
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
        return stats && stats.packetsReceived >= 50 ? stats : undefined;
      }, 'inbound-rtp packets in the browser');
      expect(inbound.dtls).toBe('connected');
      expect(inbound.ice).toBe('succeeded');
      console.log(
        `softphone media: browser got ${inbound.packetsReceived} packets (${inbound.codec}), phone got ${phoneAudio.received.length}`,
      );

      const result = await placing;
      expect(result.errors).toBe('');
      expect(result.code).toBe(0);
      await tab.getByRole('region', { name: 'Call' }).waitFor({ state: 'detached', timeout: 15_000 });

      const record = await until(async () => {
        const found = (await admin.get(`/api/calls?filter[to_number]=${operatorSip.name}`)).body.data[0];
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
});
