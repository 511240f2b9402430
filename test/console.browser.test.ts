/**
 * The operator console and the visitor widget in a real headless Chromium (Debian's /usr/bin/chromium,
 * driven by playwright-core; no browser is downloaded). Skipped, saying so, when Chromium is missing.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import axe from 'axe-core';
import type { FastifyInstance } from 'fastify';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildServer } from '../src/http/server.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, resourceDocument } from './helpers/http.js';
import { insertAgent } from './helpers/telephony.js';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const hasChromium = existsSync(CHROMIUM);
if (!hasChromium)
  console.warn(`console browser tests skipped: no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)`);

// Screenshots go to a scratch folder (ignored by git), so a test run changes no tracked file;
// `npm run screenshots` runs this file with UPDATE_SCREENSHOTS=1 to refresh the ones in docs/screenshots/.
const SCREENSHOTS = path.resolve(process.env.UPDATE_SCREENSHOTS === '1' ? 'docs/screenshots' : 'test-results/screenshots');

describe.skipIf(!hasChromium)('operator console and visitor widget in Chromium', () => {
  let t: TestApp;
  let tenant: Tenant;
  let server: FastifyInstance;
  let apiUrl: string;
  let port: number;
  let site: Server;
  let siteUrl: string;
  let context: BrowserContext;
  let page: Page;
  let profile: string;
  let sipUserId: string;
  let agentId: string;
  let hasEvents = false;
  const admin = () => client(t.app, tenant.admin.token);

  async function listen(onPort = 0) {
    server = await buildServer({ ...t.services, database: t.database });
    await server.listen({ port: onPort, host: '127.0.0.1' });
    port = (server.server.address() as AddressInfo).port;
    apiUrl = `http://127.0.0.1:${port}`;
  }

  /** The conversation as the API renders it, with its items. */
  async function conversation(id: string) {
    const response = await admin().get(`/api/conversations?filter[id]=${id}&include=conversation_items`);
    return { record: response.body.data[0], items: response.body.included as { attributes: Record<string, unknown> }[] };
  }

  async function until<T>(probe: () => Promise<T | undefined>, ms = 5000): Promise<T> {
    const deadline = Date.now() + ms;
    for (;;) {
      const value = await probe();
      if (value !== undefined) return value;
      if (Date.now() > deadline) throw new Error('condition not met in time');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  async function noSeriousViolations(target: Page, what: string) {
    await target.addScriptTag({ content: axe.source });
    const result = (await target.evaluate('axe.run()')) as axe.AxeResults;
    const serious = result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    expect(serious.map((v) => `${what}: ${v.id} (${v.impact}) ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`)).toEqual([]);
  }

  beforeAll(async () => {
    // The visitor's website: another origin (another port), which CORS must allow.
    site = createServer((_request, response) => {
      response.setHeader('Content-Type', 'text/html; charset=utf-8');
      response.end(`<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
        <title>Shop</title></head><body><main><h1>A shop</h1><p>Welcome.</p></main>
        <script src="${apiUrl}/widget.js" data-key="${tenant.publishableKey}" data-agent="${agentId}" data-open="true" async></script></body></html>`);
    });
    await new Promise<void>((resolve) => site.listen(0, '127.0.0.1', resolve));
    siteUrl = `http://127.0.0.1:${(site.address() as AddressInfo).port}`;

    t = await startTestApp({ CORS_ALLOWED_ORIGINS: siteUrl });
    tenant = await seedTenant(t, 'Console');
    agentId = await insertAgent(t.db, tenant.organisationId);
    sipUserId = (
      await admin().post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'console.op', user_id: tenant.operator.id }))
    ).body.data.id;
    await listen();
    hasEvents = server.hasRoute({ method: 'GET', url: '/api/events' });
    if (!hasEvents) console.warn('console browser tests: GET /api/events is not on this branch; the live-update checks are skipped');

    profile = mkdtempSync(path.join(tmpdir(), 'parley-chromium-'));
    // A fresh profile per run (launchPersistentContext is how Playwright passes --user-data-dir).
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
      viewport: { width: 1280, height: 800 },
      // axe-core is injected as an inline script, which the console's CSP forbids: bypass it for the audit only.
      bypassCSP: true,
    });
    page = context.pages()[0] ?? (await context.newPage());
    mkdirSync(SCREENSHOTS, { recursive: true });
  }, 120_000);

  afterAll(async () => {
    await context?.close();
    await server?.close();
    await new Promise((resolve) => site?.close(resolve));
    await t?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
  });

  it('signs in with the key from the link fragment, which is then cleared', async () => {
    await page.goto(`${apiUrl}/console#key=${tenant.publishableKey}`);
    await page.getByLabel('E-mail').fill(tenant.operator.email);
    await page.getByLabel('Password').fill('wrong password');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('alert').filter({ hasText: 'e-mail or password is wrong' }).waitFor();
    // A wrong password is the form's error, not an ended session.
    expect(await page.getByText(/expired or was revoked/).count()).toBe(0);
    await page.getByLabel('Password').fill(tenant.operator.password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('button', { name: 'Sign out' }).waitFor();
    expect(page.url()).toBe(`${apiUrl}/console`);
    expect(await page.evaluate("localStorage.getItem('parley.publishableKey')")).toBe(tenant.publishableKey);
    // The organisation signed in to is always named.
    await page.locator('.org').filter({ hasText: 'Console' }).waitFor();
  });

  it("never replaces the kept key from another organisation's link without asking", async () => {
    const elsewhere = await seedTenant(t, 'Elsewhere');
    await page.goto(`${apiUrl}/console#key=${elsewhere.publishableKey}`);
    await page.reload();
    await page.getByRole('alertdialog').filter({ hasText: 'Switch organisation?' }).waitFor();
    expect(await page.evaluate("localStorage.getItem('parley.publishableKey')")).toBe(tenant.publishableKey);
    await page.getByRole('button', { name: 'Keep the current one' }).click();
    await page.getByRole('button', { name: 'Sign out' }).waitFor();
    expect(await page.evaluate("localStorage.getItem('parley.publishableKey')")).toBe(tenant.publishableKey);
  });

  it('changes availability as an OperatorStatus with source widget', async () => {
    await page.getByLabel('Availability').selectOption('busy');
    const latest = await until(async () => {
      const events = await admin().get(`/api/operator_status_events?filter[sip_user_id]=${sipUserId}&sort=-occurred_at`);
      const event = events.body.data[0];
      return event?.attributes.status === 'busy' ? event : undefined;
    });
    expect(latest.attributes).toMatchObject({ status: 'busy', source: 'widget', changed_by_user_id: tenant.operator.id });
  });

  it('reflects an availability change made elsewhere', async (ctx) => {
    if (!hasEvents) return ctx.skip();
    await admin().post(
      '/api/operator_statuses',
      resourceDocument('OperatorStatus', { sip_user_id: sipUserId, status: 'away', source: 'api' }),
    );
    await expect.poll(() => page.getByLabel('Availability').inputValue(), { timeout: 2000 }).toBe('away');
  });

  it('gives an operator without a SIP user the availability control, stored by user_id', async () => {
    // The admin has no SIP user (the operator has console.op). A second tab signs in on its own (sessionStorage).
    const chatOnly = await context.newPage();
    try {
      await chatOnly.goto(`${apiUrl}/console`);
      await chatOnly.getByLabel('E-mail').fill(tenant.admin.email);
      await chatOnly.getByLabel('Password').fill(tenant.admin.password);
      await chatOnly.getByRole('button', { name: 'Sign in' }).click();
      await chatOnly.getByRole('button', { name: 'Sign out' }).waitFor();
      expect(await chatOnly.getByText('No SIP user').count()).toBe(0);
      await chatOnly.getByLabel('Availability').selectOption('available');
      const status = await until(async () => {
        const list = await admin().get(`/api/operator_statuses?filter[user_id]=${tenant.admin.id}`);
        return list.body.data[0]?.attributes.status === 'available' ? list.body.data[0] : undefined;
      });
      expect(status.attributes).toMatchObject({ sip_user_id: null, user_id: tenant.admin.id, source: 'widget' });
      await noSeriousViolations(chatOnly, 'console of a chat-only operator');
      await chatOnly.getByLabel('Availability').selectOption('offline');
      await until(async () => {
        const list = await admin().get(`/api/operator_statuses?filter[user_id]=${tenant.admin.id}`);
        return list.body.data[0]?.attributes.status === 'offline' ? true : undefined;
      });
    } finally {
      await chatOnly.close();
    }
  });

  it('searches the conversations by the words of their messages', async () => {
    const wanted = (await admin().post('/api/conversations', resourceDocument('Conversation', { channel: 'chat' }))).body.data.id;
    await admin().post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: wanted, role: 'user', content: 'My zebra-striped parcel never arrived' }),
    );
    const other = (await admin().post('/api/conversations', resourceDocument('Conversation', { channel: 'chat' }))).body.data.id;
    await page.reload();
    await page.locator(`[data-conversation-id="${other}"]`).waitFor();
    await page.getByLabel('Search messages').fill('zebra parc');
    await page.locator(`[data-conversation-id="${wanted}"]`).waitFor({ timeout: 5000 });
    await expect.poll(() => page.locator(`[data-conversation-id="${other}"]`).count(), { timeout: 5000 }).toBe(0);
    await page.getByLabel('Search messages').fill('nothing-mentions-this');
    await page.getByText(/No conversation mentions/).waitFor({ timeout: 5000 });
    await page.getByLabel('Search messages').fill('');
    await page.locator(`[data-conversation-id="${other}"]`).waitFor({ timeout: 5000 });
  });

  it('shows a conversation created through the API within 1 s', async (ctx) => {
    if (!hasEvents) return ctx.skip();
    await page.getByText(/^Live$/).waitFor();
    const created = await admin().post('/api/conversations', resourceDocument('Conversation', { channel: 'chat' }));
    await page.locator(`[data-conversation-id="${created.body.data.id}"]`).waitFor({ timeout: 1000 });
  });

  it("inbox rows show the contact's name, the last message in words, its time and the unread count; Mine and Unassigned views", async (ctx) => {
    if (!hasEvents) return ctx.skip();
    const named = (
      await admin().post(
        '/api/conversations',
        resourceDocument('Conversation', { channel: 'chat', metadata: { visitor_name: 'Sam Carter' } }),
      )
    ).body.data.id;
    await admin().post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: named, role: 'user', content: 'Where is my order?' }),
    );
    const row = page.locator(`[data-conversation-id="${named}"]`);
    await row.getByText('Sam Carter').waitFor({ timeout: 5000 });
    await row.getByText('Customer: Where is my order?').waitFor({ timeout: 5000 });
    expect(await row.locator('.unread').innerText()).toMatch(/^1/);
    expect(await row.locator('time').getAttribute('datetime')).toMatch(/^\d{4}-\d{2}-\d{2}T/);
    await expect.poll(() => page.title()).toMatch(/^\(\d+\) Parley console$/);

    // Mine: only what is assigned to me; Unassigned: what nobody has.
    const mine = (
      await admin().post(
        '/api/conversations',
        resourceDocument('Conversation', { channel: 'chat', metadata: { assigned_operator: tenant.operator.id } }),
      )
    ).body.data.id;
    await page.locator(`[data-conversation-id="${mine}"]`).waitFor({ timeout: 5000 });
    await page.getByRole('button', { name: 'Mine', exact: true }).click();
    await page.locator(`[data-conversation-id="${named}"]`).waitFor({ state: 'detached' });
    expect(await page.locator(`[data-conversation-id="${mine}"]`).count()).toBe(1);
    await page.getByRole('button', { name: 'Unassigned', exact: true }).click();
    await page.locator(`[data-conversation-id="${mine}"]`).waitFor({ state: 'detached' });
    expect(await page.locator(`[data-conversation-id="${named}"]`).count()).toBe(1);
    await page.getByRole('button', { name: 'All', exact: true }).click();
    await page.locator(`[data-conversation-id="${mine}"]`).waitFor();
  });

  it('alerts (desktop notification and sound, each switchable) for a new conversation and one assigned to me, when not in front', async (ctx) => {
    if (!hasEvents) return ctx.skip();
    // Recorders in place of the browser's Notification and AudioContext; the console is "behind" another window.
    await page.evaluate(`(() => {
      window.__alerts = { notes: [], tones: 0 };
      window.Notification = class {
        static permission = 'granted';
        static requestPermission() { return Promise.resolve('granted'); }
        constructor(title, options) { window.__alerts.notes.push(title + ': ' + options.body); }
        close() {}
      };
      window.AudioContext = class {
        currentTime = 0; destination = {};
        createOscillator() { window.__alerts.tones++; return { frequency: {}, connect: (g) => g, start() {}, stop() {} }; }
        createGain() { return { gain: { setValueAtTime() {}, exponentialRampToValueAtTime() {} }, connect: (d) => d }; }
      };
      document.hasFocus = () => false;
    })()`);
    const alerts = async () => (await page.evaluate('window.__alerts')) as { notes: string[]; tones: number };
    await page.getByText('Alerts', { exact: true }).click();
    await page.getByLabel('Desktop notifications').check();
    await page.getByText('Alerts', { exact: true }).click();

    const fresh = (await admin().post('/api/conversations', resourceDocument('Conversation', { channel: 'chat' }))).body.data.id;
    await page.locator(`[data-conversation-id="${fresh}"]`).waitFor({ timeout: 5000 });
    await expect.poll(async () => (await alerts()).notes).toContainEqual(expect.stringMatching(/^New conversation: Chat /));
    expect((await alerts()).tones).toBeGreaterThan(0);

    // Assigned to me later: an alert of its own. With sound switched off, no tone.
    await page.getByText('Alerts', { exact: true }).click();
    await page.getByLabel('Sound').uncheck();
    await page.getByText('Alerts', { exact: true }).click();
    const tones = (await alerts()).tones;
    await admin().patch(
      `/api/conversations/${fresh}`,
      resourceDocument('Conversation', { metadata: { assigned_operator: tenant.operator.id } }, fresh),
    );
    await expect.poll(async () => (await alerts()).notes).toContainEqual(expect.stringMatching(/^Assigned to you: /));
    expect((await alerts()).tones).toBe(tones);
    expect(await page.evaluate("JSON.parse(localStorage.getItem('parley.alerts'))")).toEqual({ desktop: true, sound: false });
    await page.evaluate('delete document.hasFocus');
  });

  it('stores a typed reply as an operator item; takes over, hands back, closes and reopens', async () => {
    const id = (await admin().post('/api/conversations', resourceDocument('Conversation', { ai_agent_id: agentId }))).body.data.id;
    await admin().post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content: 'My parcel is late' }),
    );
    if (!hasEvents) await page.reload();
    await page.locator(`[data-conversation-id="${id}"]`).click();
    await page.locator('.items').getByText('My parcel is late').waitFor();

    await page.getByRole('button', { name: 'Take over' }).click();
    await page.getByRole('button', { name: 'Hand back to agent' }).waitFor();
    let current = await conversation(id);
    expect(current.record.attributes.metadata).toMatchObject({ agent_paused: true, assigned_operator: tenant.operator.id });

    await page.getByLabel('Reply as operator').fill('Let me check that for you.');
    await page.keyboard.press('Enter');
    const reply = await until(async () => (await conversation(id)).items.find((i) => i.attributes.role === 'operator'));
    expect(reply.attributes).toMatchObject({ role: 'operator', content: 'Let me check that for you.', conversation_id: id });
    await expect.poll(() => page.getByLabel('Reply as operator').inputValue()).toBe('');

    await page.getByRole('button', { name: 'Hand back to agent' }).click();
    await page.getByRole('button', { name: 'Take over' }).waitFor();
    current = await conversation(id);
    expect(current.record.attributes.metadata).toMatchObject({ agent_paused: false, assigned_operator: null });

    await page.getByRole('button', { name: 'Close' }).click();
    await page.getByRole('button', { name: 'Reopen' }).waitFor();
    expect((await conversation(id)).record.attributes.status).toBe('closed');
    await page.getByRole('button', { name: 'Reopen' }).click();
    await page.getByRole('button', { name: 'Close' }).waitFor();
    expect((await conversation(id)).record.attributes.status).toBe('active');
  });

  it('tells the operator when a write fails', async () => {
    // The next write is refused by the server: the console must say so, not lose the draft silently.
    await page.route('**/api/conversation_items', (route) =>
      route.fulfill({
        status: 422,
        contentType: 'application/vnd.api+json',
        body: JSON.stringify({
          errors: [
            {
              id: 'x',
              status: '422',
              code: 'invalid_attribute',
              title: 'Invalid',
              detail: 'The conversation is closed; reopen it to add items.',
            },
          ],
          jsonapi: { version: '1.0' },
        }),
      }),
    );
    await page.getByLabel('Reply as operator').fill('This one fails');
    await page.getByRole('button', { name: 'Send' }).click();
    await expect.poll(() => page.getByRole('alert').allTextContents()).toContainEqual(expect.stringContaining('Your reply was not sent'));
    expect(await page.getByLabel('Reply as operator').inputValue()).toBe('This one fails');
    await page.unroute('**/api/conversation_items');
    await page.getByLabel('Reply as operator').fill('');
  });

  it('says so when the server cannot be reached, and sends again once it can', async () => {
    // The request fails at the network (fetch throws), as when the server is down.
    await page.route('**/api/conversation_items', (route) => route.abort('connectionrefused'));
    await page.getByLabel('Reply as operator').fill('Sent on the second try');
    await page.getByRole('button', { name: 'Send' }).click();
    await expect
      .poll(() => page.getByRole('alert').allTextContents())
      .toContainEqual(expect.stringContaining('the server could not be reached'));
    expect(await page.getByLabel('Reply as operator').inputValue()).toBe('Sent on the second try');
    await page.unroute('**/api/conversation_items');
    // The Send button is usable again, and the retry stores the reply.
    await expect.poll(() => page.getByRole('button', { name: 'Send' }).isEnabled()).toBe(true);
    await page.getByRole('button', { name: 'Send' }).click();
    await expect.poll(() => page.getByLabel('Reply as operator').inputValue()).toBe('');
    await page.locator('.items').getByText('Sent on the second try').waitFor();
  });

  it('reconnects after the server restarts and resumes after the last event', async (ctx) => {
    if (!hasEvents) return ctx.skip();
    await page.getByText(/^Live$/).waitFor();
    await server.close();
    // Made while the server is down: only a resumed stream (Last-Event-ID) brings it.
    const missed = (await admin().post('/api/conversations', resourceDocument('Conversation', { channel: 'sms' }))).body.data.id;
    await page.getByText('Reconnecting…').waitFor({ timeout: 10_000 });
    await listen(port);
    await page.locator(`[data-conversation-id="${missed}"]`).waitFor({ timeout: 20_000 });
    await page.getByText(/^Live$/).waitFor();
  });

  it("a visitor's message from another origin reaches the inbox and the operator's reply reaches the widget", async () => {
    const visitor = await context.newPage();
    await visitor.goto(siteUrl);
    const widget = visitor.locator('[data-parley-widget]');
    // The panel never opens empty: the greeting (data-greeting, else the default) is there before any message.
    await widget.getByText('Hi! How can we help you today?').waitFor();
    await noSeriousViolations(visitor, 'widget with its greeting');
    // A paste of 10,000 lines is refused with its length and the limit, and kept for the visitor to shorten.
    await widget.getByLabel('Your message').fill(Array.from({ length: 10_000 }, (_, i) => `line ${i}`).join('\n'));
    await widget.getByRole('button', { name: 'Send' }).click();
    await widget.getByText(/Your message is too long: [\d,]+ characters, at most 4,000/).waitFor();
    expect((await admin().get(`/api/conversations?filter[ai_agent_id]=${agentId}&filter[content][matches]=line`)).body.data).toEqual([]);
    await widget.getByLabel('Your message').fill('Hello, is anyone there?');
    await widget.getByRole('button', { name: 'Send' }).click();
    await widget.getByText('Hello, is anyone there?').waitFor();

    // The conversation exists, as the visitor's, with the widget's message as a user item.
    const found = await until(async () => {
      const list = await admin().get(`/api/conversations?filter[ai_agent_id]=${agentId}&sort=-id&include=conversation_items`);
      const item = (list.body.included ?? []).find(
        (i: { attributes: { content: string } }) => i.attributes.content === 'Hello, is anyone there?',
      );
      return item ? (item.attributes.conversation_id as string) : undefined;
    });
    if (!hasEvents) await page.reload();
    await page.locator(`[data-conversation-id="${found}"]`).click();
    await page.locator('.items').getByText('Hello, is anyone there?').waitFor();
    // Typing, both ways: the operator's draft shows in the widget with their name, the visitor's in the console.
    await page.getByLabel('Reply as operator').fill('Yes, I am');
    await widget.getByText(`${tenant.operator.fullName} is typing…`).waitFor({ timeout: 5000 });
    await widget.getByLabel('Your message').fill('Still the visitor');
    await page.getByText('The customer is typing…').waitFor({ timeout: 5000 });
    await widget.getByLabel('Your message').fill('');
    await page.getByLabel('Reply as operator').fill('Yes, I am here to help.');
    await page.getByRole('button', { name: 'Send' }).click();
    await widget.getByText('Yes, I am here to help.').waitFor({ timeout: 5000 });
    // The visitor sees the operator's name on the reply (the console sends it as metadata.author_name).
    expect(await widget.locator('li.operator small').first().innerText()).toBe(tenant.operator.fullName);

    // A handoff (the conversation waits for a human) is announced to the visitor.
    await admin().patch(`/api/conversations/${found}`, resourceDocument('Conversation', { status: 'pending' }, found));
    await widget.getByText('An operator will join shortly.').waitFor({ timeout: 5000 });

    await noSeriousViolations(visitor, 'widget');
    await visitor.setViewportSize({ width: 375, height: 700 });
    await visitor.screenshot({ path: path.join(SCREENSHOTS, 'widget-375.png') });

    // The service's notes (system items, e.g. a handoff's internal reason) are not shown to the visitor.
    await admin().post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', {
        conversation_id: found,
        role: 'system',
        content: 'Handed to an operator: internal routing note',
      }),
    );
    await admin().post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: found, role: 'operator', content: 'Shown after the note' }),
    );
    await widget.getByText('Shown after the note').waitFor({ timeout: 5000 });
    expect(await widget.getByText(/internal routing note/).count()).toBe(0);

    // A closed conversation can be followed by a new one in the same tab.
    await admin().patch(`/api/conversations/${found}`, resourceDocument('Conversation', { status: 'closed' }, found));
    await widget.getByText('This conversation has ended.').waitFor({ timeout: 5000 });
    await widget.getByRole('button', { name: 'Start a new conversation' }).click();
    await widget.getByText('Hi! How can we help you today?').waitFor();
    await widget.getByLabel('Your message').fill('A new question');
    await widget.getByRole('button', { name: 'Send' }).click();
    await widget.getByText('A new question').waitFor();
    const second = await until(async () => {
      const list = await admin().get(`/api/conversations?filter[ai_agent_id]=${agentId}&sort=-id&include=conversation_items`);
      const item = (list.body.included ?? []).find((i: { attributes: { content: string } }) => i.attributes.content === 'A new question');
      return item ? (item.attributes.conversation_id as string) : undefined;
    });
    expect(second).not.toBe(found);
    expect(await widget.getByText('Yes, I am here to help.').count()).toBe(0);

    // Escape closes the panel from the message box.
    await widget.getByLabel('Your message').focus();
    await visitor.keyboard.press('Escape');
    await expect.poll(() => widget.getByRole('dialog', { includeHidden: true }).isHidden()).toBe(true);
    await visitor.close();
  });

  it('has no serious accessibility violations and works at 1280 and 375 px (screenshots)', async () => {
    await page.setViewportSize({ width: 1280, height: 800 });
    await noSeriousViolations(page, 'console 1280');
    await page.screenshot({ path: path.join(SCREENSHOTS, 'console-1280.png') });
    await page.getByRole('button', { name: 'Calls' }).click();
    await page.getByRole('heading', { name: /calls/i }).waitFor();
    await noSeriousViolations(page, 'calls');
    await page.getByRole('button', { name: 'Conversations' }).click();

    await page.setViewportSize({ width: 375, height: 740 });
    // Page functions run in the browser; the test's own types have no DOM.
    const width = await page.evaluate('document.documentElement.scrollWidth');
    expect(width as number).toBeLessThanOrEqual(375);
    await noSeriousViolations(page, 'console 375');
    await page.screenshot({ path: path.join(SCREENSHOTS, 'console-375.png') });
    // Keyboard: the back button returns to the inbox, whose rows are buttons reachable by Tab.
    await page.getByRole('button', { name: 'Back to the inbox' }).focus();
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: 'Inbox' }).waitFor();
    await page.locator('.conversation-row').first().focus();
    await page.keyboard.press('Enter');
    await page.getByRole('button', { name: 'Back to the inbox' }).waitFor();
  });

  it('keeps the top bar and the reply box in view in a conversation of 200 messages, at 1280x800 and 390x844', async () => {
    const id = (await admin().post('/api/conversations', resourceDocument('Conversation', { channel: 'chat' }))).body.data.id;
    for (let i = 0; i < 200; i++) {
      const role = i % 2 ? 'operator' : 'user';
      const content = `Message ${i}: ${'a fairly long line of text that wraps in a narrow window '.repeat(1 + (i % 3))}`;
      await admin().post('/api/conversation_items', resourceDocument('ConversationItem', { conversation_id: id, role, content }));
    }
    for (const viewport of [
      { width: 1280, height: 800 },
      { width: 390, height: 844 },
    ]) {
      await page.setViewportSize(viewport);
      await page.reload();
      await page.locator(`[data-conversation-id="${id}"]`).click();
      await page.locator('.items').getByText('Message 199:').waitFor();
      const box = async (selector: string) => {
        const found = await page.locator(selector).boundingBox();
        if (!found) throw new Error(`${selector} is not displayed`);
        return found;
      };
      const topbar = await box('.topbar');
      const reply = await box('.reply');
      // Measured after layout: the page itself never scrolls; the messages scroll in their own pane.
      expect(topbar.y, `top bar at ${viewport.width}`).toBeGreaterThanOrEqual(0);
      expect(reply.y + reply.height, `reply box at ${viewport.width}`).toBeLessThanOrEqual(viewport.height);
      expect((await page.evaluate('document.scrollingElement.scrollTop')) as number).toBe(0);
      const items = (await page.evaluate(
        `(() => { const l = document.querySelector('.items'); return [l.scrollHeight, l.clientHeight]; })()`,
      )) as [number, number];
      expect(items[0], 'the message list scrolls inside its pane').toBeGreaterThan(items[1]);
      await page.getByLabel('Reply as operator').fill('Still here');
      expect(await page.getByLabel('Reply as operator').isVisible()).toBe(true);
      await page.getByLabel('Reply as operator').fill('');
    }
    await page.setViewportSize({ width: 1280, height: 800 });

    // Messages come a page at a time, newest first: the oldest are one "Load earlier messages" per page away.
    expect(await page.locator('.items').getByText('Message 0:').count()).toBe(0);
    for (let page_ = 0; page_ < 10 && (await page.getByRole('button', { name: 'Load earlier messages' }).count()) > 0; page_++) {
      await page.getByRole('button', { name: 'Load earlier messages' }).click();
      await page.waitForFunction(`!document.querySelector('.older button')?.disabled`);
    }
    await page.locator('.items').getByText('Message 0:').waitFor();
    expect(await page.locator('.items li.item').count()).toBe(200);
    expect((await page.locator('.topbar').boundingBox())!.y).toBeGreaterThanOrEqual(0);
  });

  it('clears an expired session with a message', async () => {
    await page.evaluate(`(() => {
      const session = JSON.parse(sessionStorage.getItem('parley.session'));
      sessionStorage.setItem('parley.session', JSON.stringify({ ...session, expiresAt: '2000-01-01T00:00:00Z' }));
    })()`);
    await page.reload();
    await page.getByText('Your session expired. Please sign in again.').waitFor();
  });
});
