import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, pointers, resourceDocument, type Client } from './helpers/http.js';
import { insertAgent, insertCall, insertParticipant, insertTranscript } from './helpers/telephony.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let admin: Client;
let operator: Client;
let stranger: Client;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Telco');
  other = await seedTenant(t, 'Rival');
  admin = client(t.app, tenant.admin.token);
  operator = client(t.app, tenant.operator.token);
  stranger = client(t.app, other.admin.token);
});
afterAll(async () => t?.close());

const ids = (response: { body: { data: { id: string }[] } }) => response.body.data.map((r) => r.id);

describe('gateways', () => {
  const gateway = (attributes: Record<string, unknown>) => resourceDocument('Gateway', attributes);

  it('creates with a derived name and never returns the password', async () => {
    const response = await admin.post(
      '/api/gateways',
      gateway({
        realm: 'sip.example.com',
        username: 'trunk1',
        password: 's3cret-pass',
        proxy: 'proxy.example.com:5060',
        inbound_acl: ['203.0.113.0/24', '2001:db8::/32'],
      }),
    );
    expect(response.status).toBe(201);
    const attributes = response.body.data.attributes;
    expect(attributes).toMatchObject({ name: 'trunk1@sip.example.com', provider: 'generic', register: true, from_domain: null });
    expect(attributes).not.toHaveProperty('password');
    expect(JSON.stringify(response.body)).not.toContain('s3cret-pass');
    const stored = await t.db.selectFrom('gateways').select('password').where('id', '=', response.body.data.id).executeTakeFirstOrThrow();
    expect(stored.password).toBe('s3cret-pass');
  });

  it('updates, re-deriving the name, and refuses duplicates with 409', async () => {
    const first = (await admin.post('/api/gateways', gateway({ realm: 'a.example.com', username: 'u1' }))).body.data;
    await admin.post('/api/gateways', gateway({ realm: 'b.example.com', username: 'u1' }));
    const renamed = await admin.patch(
      `/api/gateways/${first.id}`,
      resourceDocument('Gateway', { realm: 'c.example.com', provider: 'twilio', register: false }, first.id),
    );
    expect(renamed.status).toBe(200);
    expect(renamed.body.data.attributes).toMatchObject({ name: 'u1@c.example.com', provider: 'twilio', register: false });
    const clash = await admin.patch(`/api/gateways/${first.id}`, resourceDocument('Gateway', { realm: 'b.example.com' }, first.id));
    expect(clash.status).toBe(409);
    const duplicate = await admin.post('/api/gateways', gateway({ realm: 'b.example.com', username: 'u1' }));
    expect(duplicate.status).toBe(409);
    expect(pointers(duplicate)).toEqual(['/data/attributes/name']);
    // The realm is a host name (case-insensitive); the SIP user part is case-sensitive.
    expect((await admin.post('/api/gateways', gateway({ realm: 'B.Example.COM', username: 'u1' }))).status).toBe(409);
    expect((await admin.post('/api/gateways', gateway({ realm: 'b.example.com', username: 'U1' }))).status).toBe(201);
    const elsewhere = await stranger.post('/api/gateways', gateway({ realm: 'b.example.com', username: 'u1' }));
    expect(elsewhere.status).toBe(201);
  });

  it('validates the create payload', async () => {
    const response = await admin.post(
      '/api/gateways',
      gateway({ provider: 'acme', inbound_acl: ['10.0.0.0/33'], proxy: 'bad host', name: 'x' }),
    );
    expect(response.status).toBe(422);
    expect(pointers(response).sort()).toEqual(
      ['inbound_acl', 'name', 'provider', 'proxy', 'realm', 'username'].map((n) => `/data/attributes/${n}`).sort(),
    );
  });

  it('refuses ACL blocks with host bits set, naming the block meant', async () => {
    for (const [block, meant] of [
      ['10.0.0.1/8', '10.0.0.0/8'],
      ['2001:db8::1/32', '2001:db8::/32'],
    ]) {
      const response = await admin.post(
        '/api/gateways',
        gateway({ realm: 'acl.example.com', username: 'acl', inbound_acl: ['192.0.2.0/24', block] }),
      );
      expect(response.status, block).toBe(422);
      expect(pointers(response)).toEqual(['/data/attributes/inbound_acl']);
      expect(response.body.errors[0].detail).toContain(meant);
    }
  });

  it('is for admins only, and invisible across organisations', async () => {
    expect((await operator.post('/api/gateways', gateway({ realm: 'x.example.com', username: 'op' }))).status).toBe(403);
    const mine = (await admin.post('/api/gateways', gateway({ realm: 'mine.example.com', username: 'me' }))).body.data;
    expect((await operator.patch(`/api/gateways/${mine.id}`, resourceDocument('Gateway', { register: false }, mine.id))).status).toBe(403);
    expect((await stranger.patch(`/api/gateways/${mine.id}`, resourceDocument('Gateway', { register: false }, mine.id))).status).toBe(404);
  });
});

describe('SIP users', () => {
  it('creates with a generated password, lists, updates the password only', async () => {
    const created = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'desk.100' }));
    expect(created.status).toBe(201);
    expect(created.body.data.attributes.sip_password).toMatch(/^.{12,128}$/);
    expect(created.body.data.attributes.user_id).toBeNull();
    const id = created.body.data.id;
    const updated = await admin.patch(`/api/sip_users/${id}`, resourceDocument('SipUser', { sip_password: 'new-password-123' }, id));
    expect(updated.body.data.attributes.sip_password).toBe('new-password-123');
    const renamed = await admin.patch(`/api/sip_users/${id}`, resourceDocument('SipUser', { sip_username: 'other' }, id));
    expect(renamed.status).toBe(422);
    expect(errorCodes(renamed)).toEqual(['unknown_attribute']);
    const duplicate = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'desk.100' }));
    expect(duplicate.status).toBe(409);
    const short = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'ab', sip_password: 'short' }));
    expect(pointers(short).sort()).toEqual(['/data/attributes/sip_password', '/data/attributes/sip_username']);
  });

  it('links a member user once; operators see only their own', async () => {
    const mine = await admin.post(
      '/api/sip_users?include=user',
      resourceDocument('SipUser', { sip_username: 'op.1', user_id: tenant.operator.id }),
    );
    expect(mine.status).toBe(201);
    expect(mine.body.included[0]).toMatchObject({ type: 'User', id: tenant.operator.id });
    const twice = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'op.2', user_id: tenant.operator.id }));
    expect(twice.status).toBe(409);
    const foreignUser = await admin.post(
      '/api/sip_users',
      resourceDocument('SipUser', { sip_username: 'op.3', user_id: other.operator.id }),
    );
    expect(foreignUser.status).toBe(422);
    const seen = await operator.get('/api/sip_users');
    expect(ids(seen)).toEqual([mine.body.data.id]);
    expect(
      (
        await operator.patch(
          `/api/sip_users/${mine.body.data.id}`,
          resourceDocument('SipUser', { sip_password: 'abcdefghijklmnop' }, mine.body.data.id),
        )
      ).status,
    ).toBe(403);
    expect((await stranger.get('/api/sip_users')).body.data.every((r: { id: string }) => r.id !== mine.body.data.id)).toBe(true);
  });

  it('sorts and filters by the spec keys', async () => {
    const response = await admin.get('/api/sip_users?sort=-sip_username&filter[sip_username][contains]=op');
    expect(response.status).toBe(200);
    const names = response.body.data.map((r: { attributes: { sip_username: string } }) => r.attributes.sip_username);
    expect(names).toEqual([...names].sort().reverse());
  });
});

describe('operator statuses and their events', () => {
  let sipUserId: string;
  beforeAll(async () => {
    const created = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'agent.7', user_id: tenant.admin.id }));
    sipUserId = created.body.data.id;
  });

  it('upserts: 201 first, 200 after; an event only when the status changes', async () => {
    const status = (attributes: Record<string, unknown>) => resourceDocument('OperatorStatus', { sip_user_id: sipUserId, ...attributes });
    const first = await admin.post('/api/operator_statuses', status({ status: 'available', source: 'widget' }));
    expect(first.status).toBe(201);
    expect(first.body.data.attributes).toMatchObject({
      status: 'available',
      source: 'widget',
      changed_by_user_id: tenant.admin.id,
      agent_name: tenant.admin.fullName,
    });
    const same = await admin.post('/api/operator_statuses', status({ status: 'available' }));
    expect(same.status).toBe(200);
    expect(same.body.data.id).toBe(first.body.data.id);
    const busy = await admin.post('/api/operator_statuses', status({ status: 'busy' }));
    expect(busy.body.data.attributes.status).toBe('busy');
    const got = await operator.get(`/api/operator_statuses/${first.body.data.id}?include=sip_user,changed_by_user`);
    expect(got.body.data.attributes.status).toBe('busy');

    const events = await operator.get(`/api/operator_status_events?filter[sip_user_id]=${sipUserId}&sort=occurred_at`);
    expect(
      events.body.data.map((e: { attributes: { status: string; previous_status: string | null } }) => [
        e.attributes.previous_status,
        e.attributes.status,
      ]),
    ).toEqual([
      [null, 'available'],
      ['available', 'busy'],
    ]);
    const one = await operator.get(`/api/operator_status_events/${events.body.data[1].id}`);
    expect(one.body.data.attributes.occurred_at).toMatch(/Z$/);
  });

  it('lets operators set only their own SIP user', async () => {
    const own = (await operator.get('/api/sip_users')).body.data[0].id;
    expect(
      (await operator.post('/api/operator_statuses', resourceDocument('OperatorStatus', { sip_user_id: own, status: 'away' }))).status,
    ).toBe(201);
    expect(
      (await operator.post('/api/operator_statuses', resourceDocument('OperatorStatus', { sip_user_id: sipUserId, status: 'away' })))
        .status,
    ).toBe(403);
    const foreign = await stranger.post(
      '/api/operator_statuses',
      resourceDocument('OperatorStatus', { sip_user_id: sipUserId, status: 'away' }),
    );
    expect(foreign.status).toBe(422);
    expect(pointers(foreign)).toEqual(['/data/attributes/sip_user_id']);
    expect((await stranger.get(`/api/operator_status_events?filter[sip_user_id]=${sipUserId}`)).body.data).toEqual([]);
  });

  it('refuses bad values and leaves nothing behind', async () => {
    const before = await t.db
      .selectFrom('operator_status_events')
      .select((eb) => eb.fn.countAll().as('n'))
      .executeTakeFirstOrThrow();
    const response = await admin.post(
      '/api/operator_statuses',
      resourceDocument('OperatorStatus', { sip_user_id: sipUserId, status: 'asleep', source: 'pager', agent_name: 'x' }),
    );
    expect(response.status).toBe(422);
    expect(pointers(response).sort()).toEqual(['/data/attributes/agent_name', '/data/attributes/source', '/data/attributes/status']);
    const after = await t.db
      .selectFrom('operator_status_events')
      .select((eb) => eb.fn.countAll().as('n'))
      .executeTakeFirstOrThrow();
    expect(after.n).toEqual(before.n);
  });
});

describe('calls, participants and transcripts', () => {
  let callId: string;
  let participantIds: string[];
  beforeAll(async () => {
    callId = await insertCall(t.db, tenant.organisationId, { status: 'completed', ended_at: new Date(), duration_seconds: 42 });
    participantIds = [
      await insertParticipant(t.db, tenant.organisationId, callId, { role: 'caller' }),
      await insertParticipant(t.db, tenant.organisationId, callId, { role: 'agent', left_at: new Date('2026-01-01T10:05:00Z') }),
    ];
    for (let i = 2; i >= 0; i--) await insertTranscript(t.db, tenant.organisationId, callId, i);
  });

  it('reads a call', async () => {
    const response = await operator.get(`/api/calls/${callId}?include=organisation`);
    expect(response.body.data.attributes).toMatchObject({ status: 'completed', duration_seconds: 42, direction: 'inbound' });
    expect(response.body.included[0].type).toBe('Organisation');
    expect((await stranger.get(`/api/calls/${callId}`)).status).toBe(404);
  });

  it('lists participants with whole-second timestamps and sorts nulls', async () => {
    const response = await operator.get(`/api/call_participants?filter[call_id]=${callId}&sort=left_at`);
    expect(ids(response)).toEqual([participantIds[1], participantIds[0]]);
    expect(response.body.data[0].attributes.joined_at).toBe('2026-01-01T10:00:00Z');
    const nullsFirst = await operator.get(`/api/call_participants?filter[call_id]=${callId}&sort=++left_at`);
    expect(ids(nullsFirst)).toEqual([participantIds[0], participantIds[1]]);
    const descNullsFirst = await operator.get(`/api/call_participants?filter[call_id]=${callId}&sort=-left_at`);
    expect(ids(descNullsFirst)).toEqual([participantIds[0], participantIds[1]]);
    const descNullsLast = await operator.get(`/api/call_participants?filter[call_id]=${callId}&sort=--left_at`);
    expect(ids(descNullsLast)).toEqual([participantIds[1], participantIds[0]]);
  });

  it('sets left_at, never before joined_at, admins only', async () => {
    const id = participantIds[0];
    const early = await admin.patch(
      `/api/call_participants/${id}`,
      resourceDocument('CallParticipant', { left_at: '2026-01-01T09:00:00Z' }, id),
    );
    expect(early.status).toBe(422);
    expect(pointers(early)).toEqual(['/data/attributes/left_at']);
    const ok = await admin.patch(
      `/api/call_participants/${id}`,
      resourceDocument('CallParticipant', { left_at: '2026-01-01T11:30:15.789+01:00' }, id),
    );
    expect(ok.status).toBe(200);
    expect(ok.body.data.attributes.left_at).toBe('2026-01-01T10:30:15Z');
    const role = await admin.patch(`/api/call_participants/${id}`, resourceDocument('CallParticipant', { role: 'agent' }, id));
    expect(role.status).toBe(422);
    expect((await operator.patch(`/api/call_participants/${id}`, resourceDocument('CallParticipant', { left_at: null }, id))).status).toBe(
      403,
    );
  });

  it('lists transcripts in content_index order by default', async () => {
    const response = await operator.get(`/api/call_transcripts?filter[call_id]=${callId}&include=call`);
    expect(response.body.data.map((r: { attributes: { content_index: number } }) => r.attributes.content_index)).toEqual([0, 1, 2]);
    expect(response.body.included.map((r: { id: string }) => r.id)).toEqual([callId]);
    const sorted = await operator.get(
      `/api/call_transcripts?filter[call_id]=${callId}&sort=-content_index&filter[occurred_at][greater_than]=2026-01-01T10:00:00Z`,
    );
    expect(sorted.body.data.map((r: { attributes: { content_index: number } }) => r.attributes.content_index)).toEqual([2, 1]);
  });
});

describe('AI agents', () => {
  it('are updated by admins with validated values', async () => {
    const id = await insertAgent(t.db, tenant.organisationId, 'Max');
    const ok = await admin.patch(
      `/api/ai_agents/${id}`,
      resourceDocument(
        'AiAgent',
        {
          name: 'Maxine',
          languages: ['en-GB', 'fr'],
          published: true,
          workflow: { steps: [] },
          voice: 'alloy',
          tone: 'warm',
          system_prompt: 'Be kind.',
          safety_guardrails: 'No PII.',
        },
        id,
      ),
    );
    expect(ok.status).toBe(200);
    expect(ok.body.data.attributes).toMatchObject({ name: 'Maxine', languages: ['en-GB', 'fr'], published: true });
    const bad = await admin.patch(`/api/ai_agents/${id}`, resourceDocument('AiAgent', { name: '', languages: [], published: 'yes' }, id));
    expect(pointers(bad).sort()).toEqual(['/data/attributes/languages', '/data/attributes/name', '/data/attributes/published']);
    expect((await operator.patch(`/api/ai_agents/${id}`, resourceDocument('AiAgent', { name: 'Op' }, id))).status).toBe(403);
    expect((await stranger.patch(`/api/ai_agents/${id}`, resourceDocument('AiAgent', { name: 'Op' }, id))).status).toBe(404);
  });
});
