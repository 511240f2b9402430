/**
 * The visitor never sees the service's notes to operators (docs/console.md, "The visitor widget"): `system`
 * items, such as a handoff's note with its internal reason, are outside a visitor's reads and event stream; so
 * is the conversation's `analysis` (docs/agents.md, "Analysis") and its `Conversation.analysed` event, and the
 * handoff's internal reason (`metadata.handoff_reason`).
 */
import type net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { systemActor } from '../src/jsonapi/actor.js';
import { client, resourceDocument } from './helpers/http.js';
import { openSse, type SseStream } from './helpers/sse.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

let t: TestApp;
let tenant: Tenant;
let baseUrl: string;
const streams: SseStream[] = [];

beforeAll(async () => {
  t = await startTestApp({ VISITOR_SESSIONS_PER_HOUR: '1000' });
  await t.app.listen({ port: 0, host: '127.0.0.1' });
  baseUrl = `http://127.0.0.1:${(t.app.server.address() as net.AddressInfo).port}`;
  tenant = await seedTenant(t, 'Notes');
});
afterAll(async () => {
  for (const s of streams) s.close();
  await t?.close();
});

describe("a visitor and the service's notes", () => {
  it('reads every item of its conversation but the system ones, and its stream carries none', async () => {
    const session = await client(t.app, tenant.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
    const id = session.body.data.id as string;
    const visitor = client(t.app, session.body.meta.token);
    const stream = await openSse(baseUrl, '/api/events?filter[type]=ConversationItem.created', session.body.meta.token);
    streams.push(stream);
    expect(stream.status).toBe(200);
    const admin = client(t.app, tenant.admin.token);
    const post = (role: string, content: string) =>
      admin.post('/api/conversation_items', resourceDocument('ConversationItem', { conversation_id: id, role, content }));
    await visitor.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: id, role: 'user', content: 'Hi' }),
    );
    const note = await post('system', 'Handed to an operator: internal routing rule 7');
    expect(note.status).toBe(201);
    await post('operator', 'Hello, I am here');
    await stream.waitFor(2);
    await new Promise((r) => setTimeout(r, 300));
    const streamed = stream.messages.map((m) => JSON.parse(m.data).data.attributes.role);
    expect(streamed).toEqual(['user', 'operator']);

    const items = await visitor.get(`/api/conversations/${id}/conversation_items?sort=content_index`);
    expect(items.status).toBe(200);
    expect(items.body.data.map((i: { attributes: { role: string } }) => i.attributes.role)).toEqual(['user', 'operator']);
    expect((await visitor.get(`/api/conversation_items/${note.body.data.id}`)).status).toBe(404);
    // Members still read the note.
    const all = await admin.get(`/api/conversations/${id}/conversation_items?sort=content_index`);
    expect(all.body.data.map((i: { attributes: { role: string } }) => i.attributes.role)).toEqual(['user', 'system', 'operator']);
  });

  it("never reads its conversation's analysis: not through the API, not in its event stream (no analysed event)", async () => {
    const session = await client(t.app, tenant.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
    const id = session.body.data.id as string;
    const publicId = session.body.data.attributes.public_id as string;
    const token = session.body.meta.token as string;
    const visitor = client(t.app, token);
    const admin = client(t.app, tenant.admin.token);
    const visitorStream = await openSse(baseUrl, '/api/events?filter[type]=Conversation.updated,Conversation.analysed', token);
    const adminStream = await openSse(baseUrl, '/api/events?filter[type]=Conversation.updated,Conversation.analysed', tenant.admin.token);
    streams.push(visitorStream, adminStream);
    expect(visitorStream.status).toBe(200);
    // The analysis, written as the agent runtime writes it (src/agents/analysis.ts): an update with its own event.
    const analysis = {
      summary: 'An unhappy customer; likely to churn.',
      success: false,
      data: { churn_risk: 'high' },
      analysed_at: new Date().toISOString(),
    };
    await t.services.records!.update(systemActor(tenant.organisationId, 'agent'), 'Conversation', id, { analysis }, { event: 'analysed' });
    // Then a change the visitor may see, so that its stream has something after the analysis.
    await t.services.records!.update(systemActor(tenant.organisationId, 'agent'), 'Conversation', id, { status: 'closed' });

    await adminStream.waitFor(3);
    expect(adminStream.messages.map((m) => m.event)).toEqual(['Conversation.updated', 'Conversation.analysed', 'Conversation.updated']);
    expect(JSON.parse(adminStream.messages[1].data).data.attributes.analysis).toEqual(analysis);
    await visitorStream.waitFor(2);
    await new Promise((r) => setTimeout(r, 300));
    expect(visitorStream.messages.map((m) => m.event)).toEqual(['Conversation.updated', 'Conversation.updated']);
    for (const m of visitorStream.messages) {
      const attributes = JSON.parse(m.data).data.attributes;
      expect(attributes.status).toBeDefined();
      expect(attributes).not.toHaveProperty('analysis');
      expect(m.data).not.toContain('churn');
    }

    // Reads: one, a list, the conversation included from its items, and a sparse fieldset naming it.
    const one = await visitor.get(`/api/conversations/${id}`);
    expect(one.status).toBe(200);
    expect(one.body.data.attributes.status).toBe('closed');
    expect(one.body.data.attributes).not.toHaveProperty('analysis');
    const list = await visitor.get(`/api/conversations?filter[public_id]=${publicId}`);
    expect(list.body.data).toHaveLength(1);
    expect(list.body.data[0].attributes).not.toHaveProperty('analysis');
    const included = await visitor.get(`/api/conversation_items?filter[conversation_id]=${id}&include=conversation`);
    expect(JSON.stringify(included.body)).not.toContain('churn');
    const sparse = await visitor.get(`/api/conversations/${id}?fields[Conversation]=analysis,status`);
    expect(sparse.body.data.attributes).toEqual({ status: 'closed' });
    // Members read it.
    expect((await admin.get(`/api/conversations/${id}`)).body.data.attributes.analysis).toEqual(analysis);
  });

  it("reads its conversation's metadata without the handoff's internal reason, through the API and its stream", async () => {
    const session = await client(t.app, tenant.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
    const id = session.body.data.id as string;
    const token = session.body.meta.token as string;
    const visitor = client(t.app, token);
    const admin = client(t.app, tenant.admin.token);
    const visitorStream = await openSse(baseUrl, '/api/events?filter[type]=Conversation.updated', token);
    streams.push(visitorStream);
    expect(visitorStream.status).toBe(200);
    // The named action the agent runtime and the console use to hand a conversation to the operators.
    const handOff = await admin.post(
      `/api/conversations/${id}/hand_off`,
      resourceDocument('Conversation', { reason: 'VIP churn risk rule 7' }, id),
    );
    expect(handOff.status).toBeLessThan(300);
    const stored = (await admin.get(`/api/conversations/${id}`)).body.data.attributes.metadata;
    expect(stored.handoff_reason).toBe('VIP churn risk rule 7');

    await visitorStream.waitFor(1);
    for (const m of visitorStream.messages) {
      expect(JSON.parse(m.data).data.attributes.metadata).toBeDefined();
      expect(m.data).not.toContain('churn risk');
    }
    const one = await visitor.get(`/api/conversations/${id}`);
    expect(one.status).toBe(200);
    expect(one.body.data.attributes.metadata).toEqual(Object.fromEntries(Object.entries(stored).filter(([k]) => k !== 'handoff_reason')));
    const included = await visitor.get(`/api/conversation_items?filter[conversation_id]=${id}&include=conversation`);
    expect(JSON.stringify(included.body)).not.toContain('churn risk');
  });

  it('cannot confirm a guess of the handoff reason with a filter on metadata: a right guess and a wrong one answer alike', async () => {
    const session = await client(t.app, tenant.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
    const id = session.body.data.id as string;
    const visitor = client(t.app, session.body.meta.token as string);
    const admin = client(t.app, tenant.admin.token);
    const reason = 'Refund above limit 42';
    const handOff = await admin.post(`/api/conversations/${id}/hand_off`, resourceDocument('Conversation', { reason }, id));
    expect(handOff.status).toBeLessThan(300);
    const stored = (await admin.get(`/api/conversations/${id}`)).body.data.attributes.metadata as Record<string, unknown>;
    const found = async (who: ReturnType<typeof client>, query: string) => {
      const response = await who.get(`/api/conversations?filter[id]=${id}&${query}`);
      expect(response.status).toBe(200);
      return (response.body.data as unknown[]).length;
    };
    const contains = (value: unknown) => `filter[metadata][contains]=${encodeURIComponent(JSON.stringify(value))}`;
    const equals = (value: unknown) => `filter[metadata]=${encodeURIComponent(JSON.stringify(value))}`;
    // A member's filter sees the reason: the guess distinguishes.
    expect(await found(admin, contains({ handoff_reason: reason }))).toBe(1);
    expect(await found(admin, contains({ handoff_reason: 'wrong guess' }))).toBe(0);
    // A visitor's does not, with containment or equality, while its other keys still filter.
    expect(await found(visitor, contains({ handoff_reason: reason }))).toBe(0);
    expect(await found(visitor, contains({ handoff_reason: 'wrong guess' }))).toBe(0);
    expect(await found(visitor, equals(stored))).toBe(0);
    const visible = Object.fromEntries(Object.entries(stored).filter(([k]) => k !== 'handoff_reason'));
    expect(await found(visitor, equals(visible))).toBe(1);
    expect(await found(visitor, contains({}))).toBe(1);
  });
});
