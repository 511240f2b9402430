/**
 * Typing indicators (docs/events.md, "Typing"): an ephemeral signal, passed to the event streams of those who
 * may read the conversation, never stored (no resource row, no outbox event), coalesced per sender.
 */
import type net from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { client, errorCodes, resourceDocument, type Client } from './helpers/http.js';
import { openSse, type SseMessage, type SseStream } from './helpers/sse.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

let t: TestApp;
let tenant: Tenant;
let baseUrl: string;
let operator: Client;
const streams: SseStream[] = [];

beforeAll(async () => {
  t = await startTestApp({ VISITOR_SESSIONS_PER_HOUR: '1000' });
  await t.app.listen({ port: 0, host: '127.0.0.1' });
  baseUrl = `http://127.0.0.1:${(t.app.server.address() as net.AddressInfo).port}`;
  tenant = await seedTenant(t, 'Typing');
  operator = client(t.app, tenant.operator.token);
});
afterAll(async () => {
  for (const s of streams) s.close();
  await t?.close();
});

async function stream(token: string, path = '/api/events'): Promise<SseStream> {
  const s = await openSse(baseUrl, path, token);
  streams.push(s);
  expect(s.status).toBe(200);
  return s;
}

async function visitorSession(): Promise<{ token: string; conversation: string }> {
  const session = await client(t.app, tenant.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
  expect(session.status).toBe(201);
  return { token: session.body.meta.token as string, conversation: session.body.data.id as string };
}

const typingOf = (m: SseMessage) =>
  JSON.parse(m.data) as { type: string; data: { type: string; id: string; meta: { typing: Record<string, unknown> } } };
const isTyping = (m: SseMessage) => m.event === 'Conversation.typing';

async function counts() {
  const { rows } = await sql<{ events: number; items: number }>`
    SELECT (SELECT count(*)::int FROM events) AS events, (SELECT count(*)::int FROM conversation_items) AS items`.execute(t.db);
  return rows[0];
}

describe('typing signals', () => {
  it('reach the visitor from an operator and the operators from the visitor, live, without an id, storing nothing', async () => {
    const visitor = await visitorSession();
    const visitorStream = await stream(visitor.token);
    const operatorStream = await stream(tenant.operator.token);
    const adminStream = await stream(tenant.admin.token, '/api/events?filter[type]=Conversation.typing');
    const before = await counts();

    const sent = await operator.post(`/api/conversations/${visitor.conversation}/typing`, undefined);
    expect(sent.status).toBe(202);
    expect(sent.body.meta.typing.coalesced).toBe(false);
    expect(sent.body.jsonapi).toEqual({ version: '1.0' });
    const [heard] = await visitorStream.waitFor(1, isTyping);
    expect(heard.id).toBeUndefined();
    const event = typingOf(heard);
    expect(event.type).toBe('Conversation.typing');
    expect(event.data).toMatchObject({ type: 'Conversation', id: visitor.conversation });
    expect(event.data.meta.typing).toMatchObject({ role: 'operator', user_id: tenant.operator.id, name: 'Typing Operator' });
    expect(Date.parse(String(event.data.meta.typing.expires_at)) - Date.now()).toBeGreaterThan(2000);
    // Other members hear it; the sender does not.
    await adminStream.waitFor(1, isTyping);

    const fromVisitor = await client(t.app, visitor.token).post(`/api/conversations/${visitor.conversation}/typing`, undefined);
    expect(fromVisitor.status).toBe(202);
    const [visitorTyping] = await operatorStream.waitFor(1, isTyping);
    expect(typingOf(visitorTyping).data.meta.typing).toMatchObject({ role: 'visitor', user_id: null, name: null });
    await adminStream.waitFor(2, isTyping);
    await new Promise((r) => setTimeout(r, 300));
    expect(operatorStream.messages.filter(isTyping)).toHaveLength(1);
    expect(visitorStream.messages.filter(isTyping)).toHaveLength(1);

    // Nothing stored: no item, no outbox event.
    expect(await counts()).toEqual(before);
  });

  it("coalesces a sender's repeats, and keeps visitors to their own conversation", async () => {
    const visitor = await visitorSession();
    const other = await visitorSession();
    const otherStream = await stream(other.token);
    const adminStream = await stream(tenant.admin.token, '/api/events?filter[type]=Conversation.typing');
    const first = await operator.post(`/api/conversations/${visitor.conversation}/typing`, undefined);
    expect(first.body.meta.typing.coalesced).toBe(false);
    for (let i = 0; i < 20; i++) {
      const repeat = await operator.post(`/api/conversations/${visitor.conversation}/typing`, undefined);
      expect(repeat.status).toBe(202);
    }
    const repeat = await operator.post(`/api/conversations/${visitor.conversation}/typing`, undefined);
    expect(repeat.body.meta.typing).toMatchObject({ coalesced: true, expires_at: first.body.meta.typing.expires_at });
    await adminStream.waitFor(1, isTyping);
    await new Promise((r) => setTimeout(r, 300));
    expect(adminStream.messages.filter(isTyping)).toHaveLength(1);
    // The other visitor hears nothing of a conversation not theirs, and may not signal in it.
    expect(otherStream.messages.filter(isTyping)).toHaveLength(0);
    const intruder = await client(t.app, other.token).post(`/api/conversations/${visitor.conversation}/typing`, undefined);
    expect(intruder.status).toBe(404);
  });

  it('refuses unknown, foreign and closed conversations, and other methods', async () => {
    expect((await operator.post('/api/conversations/not-a-uuid/typing', undefined)).status).toBe(404);
    expect((await operator.post('/api/conversations/01a21382-caaf-73cb-8029-287cbc92e928/typing', undefined)).status).toBe(404);
    const elsewhere = await seedTenant(t, 'Elsewhere');
    const foreign = await client(t.app, elsewhere.owner.token).post('/api/conversations', resourceDocument('Conversation', {}));
    expect((await operator.post(`/api/conversations/${foreign.body.data.id}/typing`, undefined)).status).toBe(404);
    const closed = await operator.post('/api/conversations', resourceDocument('Conversation', {}));
    expect(closed.status).toBe(201);
    const closing = await operator.patch(
      `/api/conversations/${closed.body.data.id}`,
      resourceDocument('Conversation', { status: 'closed' }, closed.body.data.id),
    );
    expect(closing.status).toBe(200);
    const refused = await operator.post(`/api/conversations/${closed.body.data.id}/typing`, undefined);
    expect(refused.status).toBe(409);
    expect(errorCodes(refused)).toEqual(['conversation_closed']);
    expect((await operator.get(`/api/conversations/${closed.body.data.id}/typing`)).status).toBe(405);
    const parameter = await operator.post(`/api/conversations/${closed.body.data.id}/typing?state=on`, undefined);
    expect(parameter.status).toBe(400);
    expect(errorCodes(parameter)).toEqual(['unknown_parameter']);
    expect((await client(t.app).post(`/api/conversations/${closed.body.data.id}/typing`, undefined)).status).toBe(401);
  });

  it('is documented in the OpenAPI document', async () => {
    const document = await operator.get('/api/open_api');
    expect(document.body.paths['/api/conversations/{id}/typing'].post.operationId).toBe('signalTyping');
  });
});
