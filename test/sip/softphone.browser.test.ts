/**
 * The browser softphone end to end: the console in Debian's Chromium (fake microphone) registers the operator's
 * SIP user over WebSocket at a real Kamailio (the SIP edge) with the API's short-lived credential; a SIPp phone
 * calls the operator; both of the operator's tabs ring; one answers, the other stops ringing; SIPp sees the 200
 * with the browser's WebRTC answer, ACKs and hangs up; the API shows a completed Call with both participants and
 * the operator busy during the call. PostgreSQL, Kamailio, SIPp and Chromium needed; skipped, saying why, without.
 *
 * Media does not flow here: the caller's offer has no ICE candidates, and bridging a browser's DTLS-SRTP to a
 * phone's RTP is rtpengine's part (docs/sip.md). This tests the signalling and the console.
 */
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import axe from 'axe-core';
import type { FastifyInstance } from 'fastify';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildServer } from '../../src/http/server.js';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { freePort } from '../helpers/ports.js';
import { sql } from 'kysely';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import { freeUdpPort, register, sipp, sipSkipReason, startSipStack, until, type SipStack } from './harness.js';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

/** Kamailio's websocket module is a package of its own (Debian: kamailio-websocket-modules). */
function websocketModule(): boolean {
  return ['/usr/lib', '/usr/lib64', '/usr/local/lib'].some(
    (lib) =>
      existsSync(path.join(lib, 'kamailio/modules/websocket.so')) ||
      (existsSync(lib) && readdirSync(lib).some((arch) => existsSync(path.join(lib, arch, 'kamailio/modules/websocket.so')))),
  );
}

const skip =
  sipSkipReason() ??
  (websocketModule() ? undefined : "Kamailio's websocket module is not installed (Debian: kamailio-websocket-modules)") ??
  (existsSync(CHROMIUM) ? undefined : `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)`);
if (skip) console.warn(`softphone browser tests skipped: ${skip}`);

const SCREENSHOTS = path.resolve(process.env.UPDATE_SCREENSHOTS === '1' ? 'docs/screenshots' : 'test-results/screenshots');

describe.skipIf(skip !== undefined)('the softphone in the console (Chromium, Kamailio over WebSocket, SIPp)', () => {
  let t: TestApp;
  let tenant: Tenant;
  let admin: Client;
  let server: FastifyInstance;
  let stack: SipStack;
  let apiUrl: string;
  let wsPort: number;
  let context: BrowserContext;
  let profile: string;
  let tabs: Page[] = [];
  let operatorSip: { id: string; name: string };
  let caller: { id: string; name: string; password: string };
  let domain: string;

  async function signIn(page: Page) {
    await page.goto(`${apiUrl}/console#key=${tenant.publishableKey}`);
    await page.getByLabel('E-mail').fill(tenant.operator.email);
    await page.getByLabel('Password').fill(tenant.operator.password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('button', { name: 'Sign out' }).waitFor();
  }

  async function callRecord(callId: string) {
    const response = await admin.get(`/api/calls?filter[call_uuid]=${encodeURIComponent(callId)}`);
    return response.body.data[0] as { id: string; attributes: Record<string, unknown> } | undefined;
  }

  beforeAll(async () => {
    wsPort = await freePort();
    t = await startTestApp({ SIP_WS_URL: `ws://127.0.0.1:${wsPort}` });
    tenant = await seedTenant(t, 'Softphone');
    admin = client(t.app, tenant.admin.token);
    const op = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'op.web', user_id: tenant.operator.id }));
    operatorSip = { id: op.body.data.id, name: 'op.web' };
    const password = 'caller-desk-secret-1';
    const desk = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'desk.caller', sip_password: password }));
    caller = { id: desk.body.data.id, name: 'desk.caller', password };

    server = await buildServer({ ...t.services, database: t.database });
    await server.listen({ port: 0, host: '127.0.0.1' });
    apiUrl = `http://127.0.0.1:${(server.server.address() as AddressInfo).port}`;
    // The console's origin is the only one whose pages may open the SIP WebSocket.
    // The harness's 2 s ring timeout is too short for a browser to show the call and a click to answer it.
    stack = await startSipStack(t, { SIP_RING_TIMEOUT_SECONDS: '30', SIP_WS_LISTEN: `ws:127.0.0.1:${wsPort}`, SIP_WS_ORIGINS: apiUrl });
    domain = (await admin.get(`/api/sip_users/${operatorSip.id}`)).body.data.attributes.sip_uri.split('@')[1];

    profile = mkdtempSync(path.join(tmpdir(), 'parley-softphone-'));
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        // A fake microphone, allowed without asking (the operator's click on Answer stands for the prompt).
        '--use-fake-ui-for-media-stream',
        '--use-fake-device-for-media-stream',
        '--autoplay-policy=no-user-gesture-required',
      ],
      viewport: { width: 1280, height: 800 },
      // axe-core is injected as an inline script, which the console's CSP forbids: bypassed for the audit only.
      bypassCSP: true,
    });
    mkdirSync(SCREENSHOTS, { recursive: true });
  }, 120_000);

  afterAll(async () => {
    await context?.close();
    await stack?.stop();
    await server?.close();
    await t?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
  });

  /** The status line's code of a WebSocket handshake (RFC 6455 section 4.1) sent to `port` with `origin`. */
  function handshake(port: number, origin: string): Promise<number> {
    return new Promise((resolve, reject) => {
      const socket = net.connect(port, '127.0.0.1', () => {
        socket.write(
          [
            'GET / HTTP/1.1',
            `Host: 127.0.0.1:${port}`,
            `Origin: ${origin}`,
            'Connection: Upgrade',
            'Upgrade: websocket',
            'Sec-WebSocket-Version: 13',
            'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==',
            'Sec-WebSocket-Protocol: sip',
            '',
            '',
          ].join('\r\n'),
        );
      });
      let head = '';
      socket.on('data', (chunk) => {
        head += chunk.toString('latin1');
        const match = /^HTTP\/1\.1 (\d{3})/.exec(head);
        if (match) {
          socket.destroy();
          resolve(Number(match[1]));
        }
      });
      socket.on('error', reject);
      socket.setTimeout(5000, () => {
        socket.destroy();
        reject(new Error('no answer to the handshake'));
      });
    });
  }

  it("upgrades a WebSocket handshake only from the console's origin", async () => {
    expect(await handshake(wsPort, 'https://evil.example')).toBe(403);
    expect(await handshake(wsPort, apiUrl)).toBe(101);
  });

  it('registers every tab of the operator with its own short-lived credential, never the stored password', async () => {
    tabs = [context.pages()[0] ?? (await context.newPage()), await context.newPage()];
    const stored = (await t.db.selectFrom('sip_users').select('sip_password').where('id', '=', operatorSip.id).executeTakeFirstOrThrow())
      .sip_password;
    const bodies: string[] = [];
    tabs[0].on('response', async (response) => {
      if (response.url().includes('/api/')) bodies.push(await response.text().catch(() => ''));
    });
    for (const tab of tabs) {
      await signIn(tab);
      await tab.getByRole('status').filter({ hasText: 'Phone ready' }).waitFor({ timeout: 20_000 });
    }
    expect(bodies.some((b) => b.includes('sip_credential'))).toBe(true);
    expect(bodies.join('\n')).not.toContain(stored);
    expect((await admin.get(`/api/sip_users/${operatorSip.id}`)).body.data.attributes.registered).toBe(true);
    const contacts = await t.db
      .selectFrom('sip_locations')
      .select(['contact', 'received'])
      .where('username', '=', operatorSip.name)
      .execute();
    expect(contacts).toHaveLength(2);
    for (const contact of contacts) {
      expect(contact.contact).toMatch(/\.invalid;transport=ws/);
      expect(contact.received).toMatch(/^sip:127\.0\.0\.1:\d+;transport=ws$/);
    }
  }, 60_000);

  it('rings in both tabs; one answers, the other stops; SIPp gets 200, hangs up; a completed Call with both legs', async () => {
    const status = await admin.post(
      '/api/operator_statuses',
      resourceDocument('OperatorStatus', { sip_user_id: operatorSip.id, status: 'available', source: 'api' }),
    );
    expect(status.status).toBeLessThan(300);
    const statusId = status.body.data.id;

    const sent = Date.now();
    const placing = sipp('caller_webrtc', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain },
      args: ['-s', operatorSip.name, '-au', caller.name, '-ap', caller.password, '-d', '4000'],
      timeoutSeconds: 40,
    });
    for (const tab of tabs) await tab.getByRole('region', { name: 'Incoming call' }).waitFor({ timeout: 20_000 });
    const ringingAfterMs = Date.now() - sent;
    const panel = tabs[0].getByRole('region', { name: 'Incoming call' });
    expect(await panel.textContent()).toContain(caller.name);
    await tabs[0].screenshot({ path: path.join(SCREENSHOTS, 'softphone-ringing.png') });

    await tabs[0].addScriptTag({ content: axe.source });
    const audit = (await tabs[0].evaluate("axe.run('.softphone')")) as axe.AxeResults;
    const serious = audit.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    expect(serious.map((v) => `${v.id}: ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`)).toEqual([]);

    await panel.getByRole('button', { name: 'Answer' }).click();
    await tabs[0]
      .getByRole('region', { name: 'Call' })
      .getByText(/In call/)
      .waitFor({ timeout: 15_000 });
    // Answered here: the other tab's branch is cancelled (RFC 3261 section 16.7), and it stops ringing.
    await tabs[1].getByRole('region', { name: 'Incoming call' }).waitFor({ state: 'detached', timeout: 15_000 });
    expect(await tabs[1].getByRole('region', { name: 'Call' }).count()).toBe(0);

    // The operator is busy while the call lasts (the SIP edge sets it, through the records service).
    const during = await until(async () => {
      const response = await admin.get(`/api/operator_statuses/${statusId}`);
      return response.body.data.attributes.status === 'busy' ? response.body.data.attributes : undefined;
    }, 'the operator to be busy');
    expect(during.source).toBe('system');

    const result = await placing;
    expect(result.errors).toBe('');
    expect(result.code).toBe(0);
    expect(result.logs).toMatch(/answered with m=audio \d+ /);
    // SIPp hung up: the call panel goes.
    await tabs[0].getByRole('region', { name: 'Call' }).waitFor({ state: 'detached', timeout: 15_000 });

    const callId = await until(async () => {
      const row = await t.db
        .selectFrom('calls')
        .select('call_uuid')
        .where('organisation_id', '=', tenant.organisationId)
        .executeTakeFirst();
      return row?.call_uuid ?? undefined;
    }, 'the call record');
    const record = await until(async () => {
      const found = await callRecord(callId);
      return found?.attributes.status === 'completed' ? found : undefined;
    }, 'the call to complete');
    expect(record.attributes).toMatchObject({ status: 'completed', from_number: caller.name, to_number: operatorSip.name });
    expect(record.attributes.duration_seconds).toBeGreaterThanOrEqual(3);
    const legs = (await admin.get(`/api/call_participants?filter[call_id]=${record.id}&sort=joined_at`)).body.data.map(
      (p: { attributes: Record<string, unknown> }) => [p.attributes.role, p.attributes.member_uuid, p.attributes.left_at !== null],
    );
    expect(legs).toEqual([
      ['caller', caller.id, true],
      ['callee', operatorSip.id, true],
    ]);
    const after = await until(async () => {
      const response = await admin.get(`/api/operator_statuses/${statusId}`);
      return response.body.data.attributes.status === 'available' ? response.body.data.attributes : undefined;
    }, 'the operator to be available again');
    expect(after.status).toBe('available');
    console.log(`softphone: INVITE to both tabs ringing in ${ringingAfterMs} ms (SIPp start to the panel shown, loaded machine)`);
  }, 90_000);
  it('says so in words when the microphone is refused, and the rest of the console keeps working', async () => {
    const page = await context.newPage();
    // The browser's answer when the user (or a policy) blocks the microphone.
    await page.addInitScript(
      "navigator.mediaDevices.getUserMedia = () => Promise.reject(new DOMException('Permission denied', 'NotAllowedError'));",
    );
    await signIn(page);
    await page.getByRole('status').filter({ hasText: 'Phone ready' }).waitFor({ timeout: 20_000 });
    await page.getByLabel('Call a number or SIP user').fill('no good!');
    await page.getByRole('button', { name: 'Call', exact: true }).click();
    await page.getByRole('alert').filter({ hasText: 'Enter a phone number or a SIP user name' }).waitFor();
    await page.getByLabel('Call a number or SIP user').fill(caller.name);
    await page.getByRole('button', { name: 'Call', exact: true }).click();
    await page.getByRole('alert').filter({ hasText: 'The microphone is blocked' }).waitFor({ timeout: 10_000 });
    expect(await page.getByRole('region', { name: 'Call' }).count()).toBe(0);
    // Chat is untouched: the inbox and the other sections still answer.
    await page.getByRole('button', { name: 'Calls' }).click();
    await page.getByRole('button', { name: 'Conversations' }).click();
    expect(await page.getByRole('button', { name: 'Sign out' }).isVisible()).toBe(true);
    await page.close();
  }, 60_000);

  it('Kamailio takes a credential only as its own SIP user, and no longer once its session is revoked or it expired', async () => {
    const ask = async (token: string) =>
      (await client(t.app, token).post('/api/sip_users/credential', resourceDocument('SipUser', { sip_user_id: operatorSip.id }))).body.meta
        .sip_credential as { username: string; password: string };
    const registerAs = (user: string, credential: { username: string; password: string }, scenario = 'register') =>
      freeUdpPort().then((localPort) =>
        sipp(scenario, stack.port, {
          localPort,
          keys: { domain },
          args: ['-s', user, '-au', credential.username, '-ap', credential.password],
        }),
      );
    const own = await ask(tenant.operator.token);
    expect((await registerAs(operatorSip.name, own)).code).toBe(0);
    // The credential names its SIP user: it cannot register (or call) as another.
    expect((await registerAs(caller.name, own, 'register_refused')).code).toBe(0);
    // The SIP user's stored password still works for desk phones.
    expect((await register(stack, caller.name, caller.password, await freeUdpPort(), undefined, domain)).code).toBe(0);

    const expiring = await ask(tenant.admin.token);
    expect((await registerAs(operatorSip.name, expiring)).code).toBe(0);
    await sql`UPDATE sip_credentials SET expires_at = now() - interval '1 second' WHERE username = ${expiring.username}`.execute(t.db);
    expect((await registerAs(operatorSip.name, expiring, 'register_refused')).code).toBe(0);

    // Signing the operator out everywhere (an admin's revoke_tokens) ends the sessions and their credentials.
    const revoke = await admin.patch(
      `/api/users/${tenant.operator.id}`,
      resourceDocument('User', { revoke_tokens: true }, tenant.operator.id),
    );
    expect(revoke.status).toBe(200);
    expect((await registerAs(operatorSip.name, own, 'register_refused')).code).toBe(0);
  }, 60_000);
});
