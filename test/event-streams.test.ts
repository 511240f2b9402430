/**
 * The event stream's credentials, caps and costs (docs/events.md "Ends" and "Caps"; docs/hardening.md, "Third
 * review: event streams"): a stream ends when its credential does (session revoked, key revoked, member removed,
 * role changed, token expired); visitors' streams cost no statement per event, however many are open; streams
 * are capped per user across credentials, per organisation and per client address; a client that never reads
 * a replay is cut. On both databases.
 */
import net from 'node:net';
import { decodeJwt } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUserInOrganisation } from '../src/auth/accounts.js';
import { createApiKey } from '../src/auth/api-keys.js';
import { signToken } from '../src/auth/tokens.js';
import { issueUserToken } from '../src/auth/user-tokens.js';
import { addressGroup } from '../src/auth/throttle.js';
import { EventHub } from '../src/events/stream.js';
import type { Role } from '../src/jsonapi/principal.js';
import { client, errorCodes, resourceDocument, type Client } from './helpers/http.js';
import { bodyOf, openSse, type SseStream } from './helpers/sse.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

let t: TestApp;
let tenant: Tenant;
let baseUrl: string;
let owner: Client;
const streams: SseStream[] = [];

beforeAll(async () => {
  t = await startTestApp({
    PUBLIC_URL: 'http://parley.test',
    EVENTS_HEARTBEAT_SECONDS: '1',
    EVENTS_STREAM_BUFFER_BYTES: '65536',
    EVENTS_STREAMS_PER_CREDENTIAL: '3',
    EVENTS_STREAMS_PER_USER: '5',
    EVENTS_STREAMS_PER_ADDRESS: '1000',
    VISITOR_SESSIONS_PER_HOUR: '1000',
    TRUST_PROXY: 'true',
  });
  await t.app.listen({ port: 0, host: '127.0.0.1' });
  baseUrl = `http://127.0.0.1:${(t.app.server.address() as net.AddressInfo).port}`;
  tenant = await seedTenant(t, 'Streams');
  owner = client(t.app, tenant.owner.token);
});
afterAll(async () => {
  for (const s of streams) s.close();
  await t?.close();
});

async function stream(token: string, path = '/api/events', headers: Record<string, string> = {}): Promise<SseStream> {
  const s = await openSse(baseUrl, path, token, headers);
  streams.push(s);
  return s;
}

/** A new member of the tenant, with a session token. */
async function member(role: Role): Promise<{ id: string; token: string }> {
  const tag = Math.random().toString(36).slice(2);
  const user = await createUserInOrganisation(t.services.records!, {
    organisationId: tenant.organisationId,
    email: `${role}.${tag}@streams.example`,
    password: `pw-${tag}`,
    fullName: `Member ${tag}`,
    role,
  });
  const { token } = await issueUserToken(t.db, t.services, { organisationId: tenant.organisationId, userId: user.id });
  return { id: user.id, token };
}

/** Resolves true if the stream ends within `ms`. */
const endsWithin = (s: SseStream, ms = 5000) =>
  Promise.race([s.closed.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), ms))]);

async function newGateway(): Promise<string> {
  const created = await owner.post(
    '/api/gateways',
    resourceDocument('Gateway', { realm: `gw-${Math.random().toString(36).slice(2)}.example.com`, username: 'acct' }),
  );
  expect(created.status).toBe(201);
  return created.body.data.id;
}

async function visitorSession(): Promise<{ token: string; conversation: string }> {
  const session = await client(t.app, tenant.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
  expect(session.status).toBe(201);
  return { token: session.body.meta.token as string, conversation: session.body.data.id as string };
}

describe('a stream ends with its credential', () => {
  it('ends when the session is revoked with revoke_tokens, and sends nothing after', async () => {
    const admin = await member('admin');
    const s = await stream(admin.token, '/api/events?filter[type]=Gateway.created');
    expect(s.status).toBe(200);
    await newGateway();
    await s.waitFor(1);
    expect((await owner.patch(`/api/users/${admin.id}`, resourceDocument('User', { revoke_tokens: true }, admin.id))).status).toBe(200);
    expect(await endsWithin(s)).toBe(true);
    await newGateway();
    expect(s.messages).toHaveLength(1);
    expect(s.comments).toContain('closed: credential no longer valid');
    // Its reconnection is refused.
    const again = await stream(admin.token);
    expect(again.status).toBe(401);
  });

  it('ends when the API key is revoked', async () => {
    const admin = await member('admin');
    const key = await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: admin.id,
      keyType: 'secret',
      name: 'k',
    });
    const s = await stream(key.token);
    expect(s.status).toBe(200);
    const id = decodeJwt(key.token).jti!;
    const revoked = await owner.patch(`/api/api_keys/${id}`, resourceDocument('ApiKey', { revoked_at: new Date().toISOString() }, id));
    expect(revoked.status).toBe(200);
    expect(await endsWithin(s)).toBe(true);
  });

  it('ends when the member is removed', async () => {
    const admin = await member('admin');
    const s = await stream(admin.token);
    expect(s.status).toBe(200);
    expect((await owner.delete(`/api/users/${admin.id}`)).status).toBe(200);
    expect(await endsWithin(s)).toBe(true);
  });

  it('ends when the role is lowered, before the old role sees another admin-only event', async () => {
    const admin = await member('admin');
    const s = await stream(admin.token, '/api/events?filter[type]=Gateway.created');
    expect(s.status).toBe(200);
    expect((await owner.patch(`/api/users/${admin.id}`, resourceDocument('User', { role: 'operator' }, admin.id))).status).toBe(200);
    expect(await endsWithin(s)).toBe(true);
    await newGateway();
    expect(s.messages).toHaveLength(0);
    // Reopened, the stream has the new role: operators get no Gateway events.
    const again = await stream(admin.token, '/api/events?filter[type]=Gateway.created,Conversation.created');
    expect(again.status).toBe(200);
    await newGateway();
    await owner.post('/api/conversations', resourceDocument('Conversation', {}));
    await again.waitFor(1);
    expect(again.messages.map((m) => m.event)).toEqual(['Conversation.created']);
    again.close();
  });

  it("ends a visitor's stream at its token's expiry", async () => {
    const { conversation } = await visitorSession();
    const publishableKeyId = decodeJwt(tenant.publishableKey).jti!;
    // On a whole second (a token's exp is in seconds), 4 s ahead: room for a slow machine to open the stream first.
    const expiresAt = new Date(Math.ceil((Date.now() + 4000) / 1000) * 1000);
    const token = await signToken(
      { typ: 'visitor', sub: crypto.randomUUID(), org: tenant.organisationId, jti: publishableKeyId, cnv: conversation },
      t.services.signingKey,
      expiresAt,
    );
    const s = await stream(token);
    expect(s.status).toBe(200);
    // Open until shortly before its expiry, whenever the stream got going; ended soon after it.
    const before = expiresAt.getTime() - Date.now() - 300;
    if (before > 0) expect(await endsWithin(s, before)).toBe(false);
    expect(await endsWithin(s, 6000)).toBe(true);
    expect(Date.now()).toBeGreaterThanOrEqual(expiresAt.getTime() - 5);
    expect(s.comments).toContain('closed: credential expired');
  });

  it("ends visitors' streams when the publishable key that issued them is revoked, and only theirs", async () => {
    const extra = await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.owner.id,
      keyType: 'publishable',
      name: 'second widget',
    });
    const session = await client(t.app, extra.token).post('/api/visitor_sessions', resourceDocument('Conversation', {}));
    const doomed = await stream(session.body.meta.token);
    const kept = await stream((await visitorSession()).token);
    expect([doomed.status, kept.status]).toEqual([200, 200]);
    const id = decodeJwt(extra.token).jti!;
    await owner.patch(`/api/api_keys/${id}`, resourceDocument('ApiKey', { revoked_at: new Date().toISOString() }, id));
    expect(await endsWithin(doomed)).toBe(true);
    expect(await endsWithin(kept, 500)).toBe(false);
    kept.close();
  });
});

describe('what streams cost', () => {
  /** Statements the server runs outside write transactions (the hub's reads, visibility checks) while `work` runs. */
  async function statementsDuring(work: () => Promise<void>): Promise<number> {
    const executor = t.db.getExecutor();
    const original = executor.executeQuery.bind(executor);
    let count = 0;
    executor.executeQuery = ((...args: Parameters<typeof original>) => {
      // Not counted: the credential epoch's freshness read (PostgreSQL, at most one per request, shared by
      // concurrent ones; src/auth/plugin.ts), which is what a request costs, not what a stream does.
      if (!/^SELECT n::text AS n FROM credential_epoch$/.test(args[0].sql.trim())) count++;
      return original(...args);
    }) as typeof executor.executeQuery;
    try {
      await work();
    } finally {
      executor.executeQuery = original;
    }
    return count;
  }

  /** `events` items on a conversation no visitor holds, seen through to the admin's stream. */
  async function writeAndSee(events: number): Promise<void> {
    const watcher = await stream(tenant.admin.token, '/api/events?filter[type]=ConversationItem.created');
    const elsewhere = (await owner.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
    for (let i = 0; i < events; i++) {
      await owner.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: elsewhere, role: 'user', content: `m${i}` }),
      );
    }
    await watcher.waitFor(events, undefined, 10_000);
    // Time for every stream to have judged every event.
    await new Promise((r) => setTimeout(r, 300));
    watcher.close();
  }

  it("costs no statement per event for visitors' streams: the count does not grow with the streams", async () => {
    const events = 10;
    const held: SseStream[] = [await stream((await visitorSession()).token)];
    const few = await statementsDuring(() => writeAndSee(events));
    for (let i = 0; i < 40; i++) held.push(await stream((await visitorSession()).token));
    expect(held.every((s) => s.status === 200)).toBe(true);
    const many = await statementsDuring(() => writeAndSee(events));
    // 40 more streams, 10 events: 400 more statements if each stream judged each event with a query.
    expect(many).toBeLessThanOrEqual(few + events);
    for (const s of held) s.close();
  });

  it('opens a burst of streams with a few reads, and each gets every later event once, in order', async () => {
    const conversation = (await owner.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
    // Twenty members (the caps are per user); their credentials verified once (kept by the credential cache),
    // and the organisation's hub state made by a first stream.
    const members = await Promise.all(Array.from({ length: 20 }, () => member('operator')));
    for (const m of members) expect((await client(t.app, m.token).get('/api/users/me')).status).toBe(200);
    const first = await stream(tenant.admin.token, '/api/events?filter[type]=ConversationItem.created');
    let burst: SseStream[] = [];
    const statements = await statementsDuring(async () => {
      burst = await Promise.all(members.map((m) => stream(m.token, '/api/events?filter[type]=ConversationItem.created')));
    });
    expect(burst.every((s) => s.status === 200)).toBe(true);
    // At most one read of the last event id per stream, and no replay read without Last-Event-ID (before: 40).
    expect(statements).toBeLessThanOrEqual(20);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await owner.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: conversation, role: 'user', content: `b${i}` }),
      );
      ids.push(r.body.data.id);
    }
    for (const s of [first, ...burst]) {
      await s.waitFor(3);
      expect(s.messages.map((m) => JSON.parse(m.data).data.id)).toEqual(ids);
      s.close();
    }
  });

  it('shares one read of the last event id among streams subscribing at once', async () => {
    const hub = new EventHub(t.database);
    try {
      const offered: string[][] = Array.from({ length: 21 }, () => []);
      const listener = (i: number) => ({ offer: (row: { id: string }) => offered[i].push(row.id) });
      await hub.subscribe(tenant.organisationId, listener(0));
      let subscriptions: { cursor: string | undefined }[] = [];
      const statements = await statementsDuring(async () => {
        subscriptions = await Promise.all(Array.from({ length: 20 }, (_, i) => hub.subscribe(tenant.organisationId, listener(i + 1))));
      });
      expect(statements).toBeLessThanOrEqual(2);
      expect(new Set(subscriptions.map((s) => s.cursor)).size).toBe(1);
    } finally {
      await hub.close();
    }
  });

  it("still shows a visitor its own conversation's events, and an operator only its own keys", async () => {
    const visitor = await visitorSession();
    const s = await stream(visitor.token);
    const op = await stream(tenant.operator.token, '/api/events?filter[type]=ApiKey.created');
    await owner.post(
      '/api/conversation_items',
      resourceDocument('ConversationItem', { conversation_id: visitor.conversation, role: 'operator', content: 'hi' }),
    );
    await s.waitFor(1);
    expect(JSON.parse(s.messages[0].data).data.attributes.conversation_id).toBe(visitor.conversation);
    await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.admin.id,
      keyType: 'secret',
      name: 'not the operator',
    });
    await createApiKey(t.services.records!, {
      organisationId: tenant.organisationId,
      userId: tenant.operator.id,
      keyType: 'secret',
      name: 'the operator',
    });
    await op.waitFor(1);
    await new Promise((r) => setTimeout(r, 200));
    expect(op.messages.map((m) => JSON.parse(m.data).data.attributes.name)).toEqual(['the operator']);
    s.close();
    op.close();
  });
});

describe('caps', () => {
  it('caps streams per user across all of their credentials', async () => {
    const operator = await member('operator');
    const second = await issueUserToken(t.db, t.services, { organisationId: tenant.organisationId, userId: operator.id });
    const third = await issueUserToken(t.db, t.services, { organisationId: tenant.organisationId, userId: operator.id });
    const held = [
      await stream(operator.token),
      await stream(operator.token),
      await stream(operator.token),
      await stream(second.token),
      await stream(second.token),
    ];
    expect(held.map((s) => s.status)).toEqual([200, 200, 200, 200, 200]);
    // The per-credential cap (3) is not reached by the third token, the per-user cap (5) is.
    const refused = await stream(third.token);
    expect(refused.status).toBe(429);
    expect(errorCodes({ status: 429, headers: {}, body: await bodyOf(refused) })).toEqual(['too_many_streams']);
    expect(refused.body).toContain('This user');
    held[0].close();
    await expect
      .poll(async () => {
        const s = await stream(third.token);
        s.close();
        return s.status;
      })
      .toBe(200);
    for (const s of held) s.close();
  });

  it('groups client addresses: IPv4 alone, IPv6 by /64', () => {
    expect(addressGroup('203.0.113.7', 32)).toBe('203.0.113.7');
    expect(addressGroup('::ffff:203.0.113.7', 32)).toBe('203.0.113.7');
    expect(addressGroup('2001:db8:0:1::1', 32)).toBe('2001:db8:0:1::/64');
    expect(addressGroup('2001:0db8:0000:0001:aaaa:bbbb:cccc:dddd', 32)).toBe('2001:db8:0:1::/64');
    expect(addressGroup('2001:db8::2', 32)).toBe('2001:db8:0:0::/64');
    expect(addressGroup('::1', 32)).toBe('0:0:0:0::/64');
  });
});

describe('caps per organisation and per address', () => {
  let small: TestApp;
  let smallUrl: string;
  let other: Tenant;
  beforeAll(async () => {
    small = await startTestApp({
      EVENTS_STREAMS_PER_ORGANISATION: '4',
      EVENTS_STREAMS_PER_ADDRESS: '3',
      VISITOR_SESSIONS_PER_HOUR: '1000',
      TRUST_PROXY: 'true',
    });
    await small.app.listen({ port: 0, host: '127.0.0.1' });
    smallUrl = `http://127.0.0.1:${(small.app.server.address() as net.AddressInfo).port}`;
    other = await seedTenant(small, 'Capped');
  });
  afterAll(async () => {
    for (const s of streams) s.close();
    await small?.close();
  });
  const open = async (token: string, address: string) => {
    const s = await openSse(smallUrl, '/api/events', token, { 'x-forwarded-for': address });
    streams.push(s);
    return s;
  };
  const visitor = async (address: string) =>
    (
      await client(small.app, other.publishableKey).post('/api/visitor_sessions', resourceDocument('Conversation', {}), {
        'x-forwarded-for': address,
      })
    ).body.meta.token as string;

  it('caps streams per client address, whoever holds them (visitors included), IPv6 by /64', async () => {
    const address = '2001:db8:5::1';
    const held = [
      await open(await visitor(address), address),
      await open(await visitor(address), '2001:db8:5::2'),
      await open(other.admin.token, '2001:db8:5::3'),
    ];
    expect(held.map((s) => s.status)).toEqual([200, 200, 200]);
    const refused = await open(await visitor('198.51.100.1'), '2001:db8:5:0:ffff::9');
    expect(refused.status).toBe(429);
    expect(refused.body).toContain('This client address');
    const elsewhere = await open(other.operator.token, '2001:db8:6::1');
    expect(elsewhere.status).toBe(200);
    // Organisation: 4 streams held now.
    const fifth = await open(other.owner.token, '198.51.100.2');
    expect(fifth.status).toBe(429);
    expect(fifth.body).toContain('This organisation');
    for (const s of [...held, elsewhere]) s.close();
  });
});

describe('a replay to a client that never reads', () => {
  it('is cut, and what it held is freed', async () => {
    const conversation = (await owner.post('/api/conversations', resourceDocument('Conversation', {}))).body.data.id;
    const [last] = await t.db
      .selectFrom('events')
      .select('id')
      .where('organisation_id', '=', tenant.organisationId)
      .orderBy('id', 'desc')
      .limit(1)
      .execute();
    const after = last.id;
    const big = 'x'.repeat(30_000);
    // 200 items of 30 kB: 6 MB to replay, more than the socket buffers take without the client reading.
    for (let i = 0; i < 200; i++) {
      await owner.post(
        '/api/conversation_items',
        resourceDocument('ConversationItem', { conversation_id: conversation, role: 'user', content: big }),
      );
    }
    const socket = net.connect((t.app.server.address() as net.AddressInfo).port, '127.0.0.1');
    socket.write(
      `GET /api/events?filter[type]=ConversationItem.created HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${tenant.owner.token}\r\nLast-Event-ID: ${after}\r\n\r\n`,
    );
    await new Promise((r) => socket.once('data', r));
    socket.pause();
    // The server gives up on it after a heartbeat interval (1 s here) in which it took nothing; a paused client
    // sees the end only once it reads what was sent before it.
    await new Promise((r) => setTimeout(r, 3000));
    let received = 0;
    const closed = new Promise<void>((r) => socket.once('close', () => r()));
    socket.on('data', (chunk: Buffer) => (received += chunk.length));
    socket.resume();
    const cut = await Promise.race([closed.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 5000))]);
    socket.destroy();
    expect(cut).toBe(true);
    expect(received).toBeLessThan(200 * 30_000);
    // Its slot is free again.
    await expect
      .poll(async () => {
        const s = await stream(tenant.owner.token);
        s.close();
        return s.status;
      })
      .toBe(200);
  }, 60_000);
});
