/**
 * Managing the organisation over HTTP: every record readable by its links.self, created and removed where
 * users expect, API keys issued and revoked, members added, re-roled and removed, passwords changed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, pointers, resourceDocument as doc, type Client } from './helpers/http.js';
import { insertCall, insertParticipant, insertTranscript } from './helpers/telephony.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let owner: Client;
let admin: Client;
let operator: Client;
let publishable: Client;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Manage');
  other = await seedTenant(t, 'Elsewhere');
  owner = client(t.app, tenant.owner.token);
  admin = client(t.app, tenant.admin.token);
  operator = client(t.app, tenant.operator.token);
  publishable = client(t.app, tenant.publishableKey);
});
afterAll(async () => t?.close());

const login = async (email: string, password: string) => publishable.post('/api/users/login', doc('User', { email, password }));

/** A member joins by invitation: `as` invites, the person accepts with a new account's password; the acceptance's response. */
const join = async (as: Client, email: string, role: string, password: string) => {
  const invitation = await as.post('/api/invitations', doc('Invitation', { email, role }));
  expect(invitation.status).toBe(201);
  const accepted = await publishable.post(
    '/api/users/accept_invitation',
    doc('User', { invitation_token: invitation.body.data.attributes.token, email, password }),
  );
  expect(accepted.status).toBe(201);
  return accepted;
};

describe('every type is readable at its links.self', () => {
  it('answers GET on the self link of a record of each of the 13 types', async () => {
    const conversation = (await admin.post('/api/conversations', doc('Conversation', {}))).body.data;
    const item = (
      await admin.post(
        '/api/conversation_items',
        doc('ConversationItem', { content: 'hi', role: 'user', conversation_id: conversation.id }),
      )
    ).body.data;
    const agent = (await admin.post('/api/ai_agents', doc('AiAgent', { name: 'Self agent' }))).body.data;
    const gateway = (await admin.post('/api/gateways', doc('Gateway', { realm: 'self.example.com', username: 'self' }))).body.data;
    const sipUser = (await admin.post('/api/sip_users', doc('SipUser', { sip_username: 'self.one' }))).body.data;
    const status = (await admin.post('/api/operator_statuses', doc('OperatorStatus', { sip_user_id: sipUser.id, status: 'away' }))).body
      .data;
    const event = (await admin.get(`/api/operator_status_events?filter[sip_user_id]=${sipUser.id}`)).body.data[0];
    const call = await insertCall(t.db, tenant.organisationId);
    const participant = await insertParticipant(t.db, tenant.organisationId, call);
    const transcript = await insertTranscript(t.db, tenant.organisationId, call, 0);
    const key = (await admin.get('/api/api_keys')).body.data[0];
    const me = (await admin.get('/api/users/me?include=organisation')).body;
    const records = [
      conversation,
      item,
      agent,
      gateway,
      sipUser,
      status,
      event,
      key,
      me.data,
      me.included[0],
      (await admin.get(`/api/calls/${call}`)).body.data,
      (await admin.get(`/api/call_participants?filter[id]=${participant}`)).body.data[0],
      (await admin.get(`/api/call_transcripts?filter[id]=${transcript}`)).body.data[0],
    ];
    expect(new Set(records.map((r) => r.type)).size).toBe(13);
    for (const record of records) {
      const self = new URL(record.links.self);
      const response = await admin.get(self.pathname);
      expect(response.status, `${record.type} ${self.pathname}`).toBe(200);
      expect(response.body.data).toMatchObject({ id: record.id, type: record.type });
      expect(response.body.data.attributes.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      expect(response.body.data.attributes.updated_at).toMatch(/Z$/);
    }
  });
});

describe('AI agents', () => {
  it('are created, listed, read and deleted by owners and admins; operators read them', async () => {
    expect((await operator.post('/api/ai_agents', doc('AiAgent', { name: 'Nope' }))).status).toBe(403);
    const created = await admin.post(
      '/api/ai_agents',
      doc('AiAgent', { name: 'Helper', languages: ['en', 'de'], workflow: { steps: [{ type: 'message', text: 'Hello' }] } }),
    );
    expect(created.status).toBe(201);
    expect(created.headers.location).toBe(created.body.data.links.self);
    expect(created.body.data.attributes).toMatchObject({ name: 'Helper', published: false, languages: ['en', 'de'] });
    const bad = await admin.post('/api/ai_agents', doc('AiAgent', { name: 'Bad', workflow: { steps: [{ type: 'nope' }] } }));
    expect(bad.status).toBe(422);
    expect(pointers(bad)[0]).toMatch(/^\/data\/attributes\/workflow/);
    const listed = await operator.get('/api/ai_agents?filter[name]=Helper&sort=-created_at');
    expect(listed.body.data.map((a: { id: string }) => a.id)).toEqual([created.body.data.id]);
    expect((await operator.get(`/api/ai_agents/${created.body.data.id}`)).status).toBe(200);
    expect((await operator.delete(`/api/ai_agents/${created.body.data.id}`)).status).toBe(403);
    expect((await client(t.app, other.admin.token).delete(`/api/ai_agents/${created.body.data.id}`)).status).toBe(404);
    const removed = await admin.delete(`/api/ai_agents/${created.body.data.id}`);
    expect(removed.status).toBe(200);
    expect(removed.body).toEqual({ meta: { removed: { AiAgent: 1 } }, jsonapi: { version: '1.0' } });
    expect((await admin.get(`/api/ai_agents/${created.body.data.id}`)).status).toBe(404);
  });

  it('refuses to delete an agent that conversations name, with the count', async () => {
    const agent = (await admin.post('/api/ai_agents', doc('AiAgent', { name: 'Busy' }))).body.data.id;
    for (let i = 0; i < 2; i += 1) await admin.post('/api/conversations', doc('Conversation', { ai_agent_id: agent }));
    const refused = await admin.delete(`/api/ai_agents/${agent}`);
    expect(refused.status).toBe(409);
    expect(refused.body.errors).toHaveLength(1);
    expect(refused.body.errors[0].meta).toEqual({ referenced_by: 'Conversation', count: 2 });
    expect((await admin.get(`/api/ai_agents/${agent}`)).status).toBe(200);
  });
});

describe('gateways', () => {
  it('are listed, read and deleted by owners and admins only', async () => {
    const gateway = (
      await admin.post('/api/gateways', doc('Gateway', { realm: 'trunk.example.com', username: 'acct', password: 'trunk-secret-1' }))
    ).body.data.id;
    const listed = await admin.get('/api/gateways?filter[realm]=trunk.example.com');
    expect(listed.body.data.map((g: { id: string }) => g.id)).toEqual([gateway]);
    expect(JSON.stringify(listed.body)).not.toContain('trunk-secret-1');
    expect((await operator.get('/api/gateways')).status).toBe(403);
    expect((await operator.get(`/api/gateways/${gateway}`)).status).toBe(403);
    expect((await operator.delete(`/api/gateways/${gateway}`)).status).toBe(403);
    const removed = await admin.delete(`/api/gateways/${gateway}`);
    expect(removed.body.meta.removed).toEqual({ Gateway: 1 });
    expect((await admin.get(`/api/gateways/${gateway}`)).status).toBe(404);
    expect((await admin.delete(`/api/gateways/${gateway}`)).status).toBe(404);
  });
});

describe('SIP users and operator statuses', () => {
  it('lets an operator read their own SIP user only, and lists who is available', async () => {
    const own = (await admin.post('/api/sip_users', doc('SipUser', { sip_username: 'op.own', user_id: tenant.operator.id }))).body.data.id;
    const desk = (await admin.post('/api/sip_users', doc('SipUser', { sip_username: 'desk.phone' }))).body.data.id;
    expect((await operator.get(`/api/sip_users/${own}`)).status).toBe(200);
    expect((await operator.get(`/api/sip_users/${desk}`)).status).toBe(404);
    await operator.post('/api/operator_statuses', doc('OperatorStatus', { sip_user_id: own, status: 'available' }));
    await admin.post('/api/operator_statuses', doc('OperatorStatus', { sip_user_id: desk, status: 'offline' }));
    const available = await operator.get('/api/operator_statuses?filter[status]=available&sort=updated_at');
    expect(available.status).toBe(200);
    expect(available.body.data.map((s: { attributes: { sip_user_id: string } }) => s.attributes.sip_user_id)).toContain(own);
    for (const s of available.body.data) expect(s.attributes.status).toBe('available');
  });

  it('deletes a SIP user with its status and status history, and says exactly how many', async () => {
    const sipUser = (await admin.post('/api/sip_users', doc('SipUser', { sip_username: 'going.away' }))).body.data.id;
    for (const status of ['available', 'busy', 'busy', 'away'])
      await admin.post('/api/operator_statuses', doc('OperatorStatus', { sip_user_id: sipUser, status }));
    expect((await operator.delete(`/api/sip_users/${sipUser}`)).status).toBe(404);
    const removed = await admin.delete(`/api/sip_users/${sipUser}`);
    expect(removed.status).toBe(200);
    // Three changes (the repeated busy is no change): three events, one current status, the SIP user.
    expect(removed.body.meta.removed).toEqual({ SipUser: 1, OperatorStatus: 1, OperatorStatusEvent: 3 });
    expect((await admin.get(`/api/operator_status_events?filter[sip_user_id]=${sipUser}`)).body.data).toEqual([]);
  });
});

describe('calls', () => {
  it("are listed with filters on status, time and a participant's SIP user", async () => {
    const sipUser = (await admin.post('/api/sip_users', doc('SipUser', { sip_username: 'caller.one' }))).body.data.id;
    const early = await insertCall(t.db, tenant.organisationId, { status: 'completed', started_at: new Date('2026-03-01T10:00:00Z') });
    const late = await insertCall(t.db, tenant.organisationId, { status: 'completed', started_at: new Date('2026-03-02T10:00:00Z') });
    await insertCall(t.db, tenant.organisationId, { status: 'failed', started_at: new Date('2026-03-02T11:00:00Z') });
    await insertParticipant(t.db, tenant.organisationId, late, { member_uuid: sipUser });
    const ids = (response: { body: { data: { id: string }[] } }) => response.body.data.map((c) => c.id);
    const range = 'filter[started_at][greater_than_or_equal]=2026-03-01T00:00:00Z&filter[started_at][less_than]=2026-03-03T00:00:00Z';
    expect(ids(await operator.get(`/api/calls?filter[status]=completed&${range}&sort=started_at`))).toEqual([early, late]);
    const mine = await operator.get(`/api/calls?filter[participant_sip_user_ids][contains]=${sipUser}`);
    expect(ids(mine)).toEqual([late]);
    expect(mine.body.data[0].attributes.participant_sip_user_ids).toEqual([sipUser]);
    expect((await client(t.app, other.admin.token).get(`/api/calls?filter[id]=${late}`)).body.data).toEqual([]);
    const bad = await operator.get('/api/calls?filter[status]=ringing_loudly');
    expect(bad.status).toBe(400);
    expect(errorCodes(bad)).toEqual(['invalid_filter']);
  });
});

describe('API keys', () => {
  it('are issued by owners and admins with the token once, and refused at once when revoked', async () => {
    expect((await operator.post('/api/api_keys', doc('ApiKey', { name: 'mine', key_type: 'secret' }))).status).toBe(403);
    // An admin may not issue a key that would act as an owner.
    expect((await admin.post('/api/api_keys', doc('ApiKey', { name: 'x', key_type: 'secret', user_id: tenant.owner.id }))).status).toBe(
      403,
    );
    const created = await admin.post(
      '/api/api_keys',
      doc('ApiKey', { name: 'for the operator', key_type: 'secret', user_id: tenant.operator.id }),
    );
    expect(created.status).toBe(201);
    const { token } = created.body.data.attributes;
    expect(token).toMatch(/^ey/);
    expect(created.body.data.attributes.revoked_at).toBeNull();
    const read = await admin.get(`/api/api_keys/${created.body.data.id}`);
    expect(read.body.data.attributes.token).toBeNull();
    const asKey = client(t.app, token);
    expect((await asKey.get('/api/users/me')).body.data.id).toBe(tenant.operator.id);

    const revoked = await operator.patch(
      `/api/api_keys/${created.body.data.id}`,
      doc('ApiKey', { revoked_at: new Date().toISOString() }, created.body.data.id),
    );
    expect(revoked.status).toBe(200);
    const revokedAt = revoked.body.data.attributes.revoked_at;
    expect(revokedAt).toMatch(/Z$/);
    expect((await asKey.get('/api/users/me')).status).toBe(401);
    // Revocation is final, and repeating it keeps the first time.
    const again = await admin.patch(
      `/api/api_keys/${created.body.data.id}`,
      doc('ApiKey', { revoked_at: '2020-01-01T00:00:00Z' }, created.body.data.id),
    );
    expect(again.body.data.attributes.revoked_at).toBe(revokedAt);
    const undo = await admin.patch(`/api/api_keys/${created.body.data.id}`, doc('ApiKey', { revoked_at: null }, created.body.data.id));
    expect(undo.status).toBe(422);
    expect(errorCodes(undo)).toEqual(['invalid_transition']);
    const future = await admin.post('/api/api_keys', doc('ApiKey', { name: 'later', key_type: 'publishable' }));
    const scheduled = await admin.patch(
      `/api/api_keys/${future.body.data.id}`,
      doc('ApiKey', { revoked_at: '2999-01-01T00:00:00Z' }, future.body.data.id),
    );
    expect(scheduled.status).toBe(422);
    expect(pointers(scheduled)).toEqual(['/data/attributes/revoked_at']);
    expect((await admin.get('/api/api_keys?filter[revoked_at][is_nil]=false')).body.data.map((k: { id: string }) => k.id)).toContain(
      created.body.data.id,
    );
  });

  it('are deleted by their owner or an admin, and stop working at once', async () => {
    const created = await admin.post(
      '/api/api_keys',
      doc('ApiKey', { name: 'short-lived', key_type: 'secret', user_id: tenant.operator.id }),
    );
    const asKey = client(t.app, created.body.data.attributes.token);
    expect((await asKey.get('/api/conversations')).status).toBe(200);
    const adminsOwn = (await admin.post('/api/api_keys', doc('ApiKey', { name: 'admin own', key_type: 'secret' }))).body.data.id;
    expect((await operator.delete(`/api/api_keys/${adminsOwn}`)).status).toBe(404);
    const removed = await operator.delete(`/api/api_keys/${created.body.data.id}`);
    expect(removed.body.meta.removed).toEqual({ ApiKey: 1 });
    expect((await asKey.get('/api/conversations')).status).toBe(401);
    expect((await admin.get(`/api/api_keys/${created.body.data.id}`)).status).toBe(404);
  });
});

describe('users and memberships', () => {
  it("lists the organisation's members with their roles, and the caller's own record", async () => {
    const members = await operator.get('/api/users?sort=email&page[count]=true');
    expect(members.body.meta.page.total).toBe(3);
    const roles = Object.fromEntries(members.body.data.map((u: { id: string; attributes: { role: string } }) => [u.id, u.attributes.role]));
    expect(roles).toEqual({ [tenant.owner.id]: 'owner', [tenant.admin.id]: 'admin', [tenant.operator.id]: 'operator' });
    expect((await operator.get('/api/users?filter[role]=owner')).body.data.map((u: { id: string }) => u.id)).toEqual([tenant.owner.id]);
    const me = await operator.get('/api/users/me');
    expect(me.body.data).toMatchObject({ id: tenant.operator.id, attributes: { email: tenant.operator.email, role: 'operator' } });
    expect(me.body.data.attributes).not.toHaveProperty('password');
    expect((await operator.get(`/api/users/${other.owner.id}`)).status).toBe(404);
    expect((await client(t.app, other.admin.token).get('/api/users')).body.data.map((u: { id: string }) => u.id)).not.toContain(
      tenant.owner.id,
    );
  });

  it('adds members by invitation: a new address makes an account on acceptance, an existing one joins with its own password', async () => {
    expect((await admin.post('/api/users', doc('User', { email: 'x@manage.example', role: 'operator' }))).status).toBe(405);
    expect((await operator.post('/api/invitations', doc('Invitation', { email: 'x@manage.example', role: 'operator' }))).status).toBe(403);
    expect((await admin.post('/api/invitations', doc('Invitation', { email: 'boss@manage.example', role: 'owner' }))).status).toBe(403);
    const joined = await join(admin, 'New.Member@manage.example', 'operator', 'new-member-pass');
    expect(joined.body.data.attributes).toMatchObject({ email: 'New.Member@manage.example', role: 'operator' });
    expect((await client(t.app, joined.body.meta.token).get('/api/users/me')).body.data.id).toBe(joined.body.data.id);
    expect((await login('new.member@manage.example', 'new-member-pass')).status).toBe(200);
    const duplicate = await admin.post('/api/invitations', doc('Invitation', { email: 'new.member@MANAGE.example', role: 'admin' }));
    expect(duplicate.status).toBe(409);
    expect(pointers(duplicate)).toEqual(['/data/attributes/email']);

    // A user of another organisation joins with their own password; nobody sets it for them.
    const invitation = await admin.post('/api/invitations', doc('Invitation', { email: other.operator.email, role: 'admin' }));
    const accept = (password: string) =>
      publishable.post(
        '/api/users/accept_invitation',
        doc('User', { invitation_token: invitation.body.data.attributes.token, email: other.operator.email, password }),
      );
    expect((await accept('not-theirs-123')).status).toBe(401);
    const accepted = await accept(other.operator.password);
    expect(accepted.status).toBe(201);
    expect(accepted.body.data).toMatchObject({ id: other.operator.id, attributes: { role: 'admin' } });
    expect((await login(other.operator.email, other.operator.password)).status).toBe(200);
    // In their first organisation they are still an operator.
    expect((await client(t.app, other.operator.token).get('/api/users/me')).body.data.attributes.role).toBe('operator');
  });

  it('changes roles (owners only for owners) and never leaves the organisation without an owner', async () => {
    const member = (await join(admin, 'climber@manage.example', 'operator', 'climber-pass-1')).body.data.id;
    const patch = (as: Client, id: string, attributes: Record<string, unknown>) =>
      as.patch(`/api/users/${id}`, doc('User', attributes, id));
    expect((await patch(operator, member, { role: 'admin' })).status).toBe(403);
    expect((await patch(admin, member, { role: 'admin' })).body.data.attributes.role).toBe('admin');
    expect((await patch(admin, member, { role: 'owner' })).status).toBe(403);
    expect((await patch(admin, tenant.owner.id, { role: 'admin' })).status).toBe(403);
    const lastOwner = await patch(owner, tenant.owner.id, { role: 'admin' });
    expect(lastOwner.status).toBe(409);
    expect(pointers(lastOwner)).toEqual(['/data/attributes/role']);
    expect((await admin.delete(`/api/users/${tenant.owner.id}`)).status).toBe(403);
    const removeLast = await owner.delete(`/api/users/${tenant.owner.id}`);
    expect(removeLast.status).toBe(409);
    // With a second owner, the first may step down.
    expect((await patch(owner, member, { role: 'owner' })).body.data.attributes.role).toBe('owner');
    const climber = client(t.app, (await login('climber@manage.example', 'climber-pass-1')).body.meta.token);
    expect((await patch(climber, tenant.owner.id, { role: 'admin' })).body.data.attributes.role).toBe('admin');
    expect((await patch(climber, member, { role: 'operator' })).status).toBe(409);
    expect((await patch(climber, tenant.owner.id, { role: 'owner' })).status).toBe(200);
  });

  it('removes a member: their keys go, their tokens and keys are refused at once, the count is exact', async () => {
    const created = await join(admin, 'leaver@manage.example', 'operator', 'leaver-pass-1');
    const id = created.body.data.id;
    const session = client(t.app, (await login('leaver@manage.example', 'leaver-pass-1')).body.meta.token);
    const keys = [];
    for (const name of ['one', 'two'])
      keys.push((await admin.post('/api/api_keys', doc('ApiKey', { name, key_type: 'secret', user_id: id }))).body.data.attributes.token);
    const sipUser = (await admin.post('/api/sip_users', doc('SipUser', { sip_username: 'leaver.phone', user_id: id }))).body.data.id;
    expect((await session.get('/api/users/me')).status).toBe(200);
    expect((await operator.delete(`/api/users/${id}`)).status).toBe(403);
    const removed = await admin.delete(`/api/users/${id}`);
    expect(removed.status).toBe(200);
    expect(removed.body.meta.removed).toEqual({ User: 1, ApiKey: 2 });
    expect((await session.get('/api/users/me')).status).toBe(401);
    for (const key of keys) expect((await client(t.app, key).get('/api/users/me')).status).toBe(401);
    expect((await admin.get(`/api/users/${id}`)).status).toBe(404);
    expect((await admin.get(`/api/sip_users/${sipUser}`)).body.data.attributes.user_id).toBeNull();
    expect((await login('leaver@manage.example', 'leaver-pass-1')).status).toBe(401);
  });

  it('keeps an owner when two owners demote or remove each other at the same time', async () => {
    for (let round = 0; round < 6; round += 1) {
      // Exactly two owners: the seeded one and a new one (other owners step down first).
      for (const other of (await admin.get('/api/users?filter[role]=owner')).body.data) {
        if (other.id !== tenant.owner.id)
          expect((await owner.patch(`/api/users/${other.id}`, doc('User', { role: 'admin' }, other.id))).status).toBe(200);
      }
      const email = `co.owner.${round}@manage.example`;
      const second = (await join(owner, email, 'owner', 'co-owner-pass-1')).body.data.id;
      const coOwner = client(t.app, (await login(email, 'co-owner-pass-1')).body.meta.token);
      const [a, b] = await Promise.all([
        round % 2 === 0
          ? owner.patch(`/api/users/${second}`, doc('User', { role: 'admin' }, second))
          : owner.delete(`/api/users/${second}`),
        coOwner.patch(`/api/users/${tenant.owner.id}`, doc('User', { role: 'admin' }, tenant.owner.id)),
      ]);
      // One of the two may win, or neither (the first change ends the other's owner rights): never both.
      expect([a.status, b.status].filter((status) => status === 200).length, `round ${round}`).toBeLessThanOrEqual(1);
      // The other's token is refused (401) once they are no longer a member.
      for (const response of [a, b]) expect([200, 401, 403, 409], `round ${round}`).toContain(response.status);
      const owners = (await admin.get('/api/users?filter[role]=owner')).body.data.map((u: { id: string }) => u.id);
      expect(owners.length, `round ${round}`).toBe([a, b].some((r) => r.status === 200) ? 1 : 2);
      // Restore the seeded owner for the rounds and tests after this one.
      if (!owners.includes(tenant.owner.id))
        expect((await coOwner.patch(`/api/users/${tenant.owner.id}`, doc('User', { role: 'owner' }, tenant.owner.id))).status).toBe(200);
    }
  });

  it('lets every user change their own name and password (current one required; other sessions end)', async () => {
    const created = await join(admin, 'mover@manage.example', 'operator', 'mover-pass-1');
    const id = created.body.data.id;
    const first = client(t.app, (await login('mover@manage.example', 'mover-pass-1')).body.meta.token);
    const second = client(t.app, (await login('mover@manage.example', 'mover-pass-1')).body.meta.token);
    const patch = (as: Client, attributes: Record<string, unknown>, target = id) =>
      as.patch(`/api/users/${target}`, doc('User', attributes, target));
    expect((await patch(operator, { full_name: 'Not mine' })).status).toBe(403);
    expect((await patch(admin, { password: 'admin-chosen-1', current_password: 'mover-pass-1' })).status).toBe(403);
    expect((await patch(first, { full_name: 'Mover Renamed' })).body.data.attributes.full_name).toBe('Mover Renamed');
    const missing = await patch(first, { password: 'mover-pass-2' });
    expect(missing.status).toBe(422);
    expect(pointers(missing)).toEqual(['/data/attributes/current_password']);
    const wrong = await patch(first, { password: 'mover-pass-2', current_password: 'guess-guess' });
    expect(wrong.status).toBe(422);
    expect(pointers(wrong)).toEqual(['/data/attributes/current_password']);
    const short = await patch(first, { password: 'short', current_password: 'mover-pass-1' });
    expect(pointers(short)).toEqual(['/data/attributes/password']);
    const changed = await patch(first, { password: 'mover-pass-2', current_password: 'mover-pass-1' });
    expect(changed.status).toBe(200);
    expect(JSON.stringify(changed.body)).not.toContain('mover-pass');
    expect((await first.get('/api/users/me')).status).toBe(200);
    expect((await second.get('/api/users/me')).status).toBe(401);
    expect((await login('mover@manage.example', 'mover-pass-1')).status).toBe(401);
    expect((await login('mover@manage.example', 'mover-pass-2')).status).toBe(200);
  });
});

describe('signing a member out', () => {
  it("ends the member's sessions at once (owners and admins, or the member for their other sessions)", async () => {
    const id = (await join(admin, 'signed.out@manage.example', 'operator', 'signed-out-1')).body.data.id;
    const first = client(t.app, (await login('signed.out@manage.example', 'signed-out-1')).body.meta.token);
    const second = client(t.app, (await login('signed.out@manage.example', 'signed-out-1')).body.meta.token);
    const signOut = (as: Client) => as.patch(`/api/users/${id}`, doc('User', { revoke_tokens: true }, id));
    expect((await signOut(operator)).status).toBe(403);
    expect((await admin.patch(`/api/users/${tenant.owner.id}`, doc('User', { revoke_tokens: true }, tenant.owner.id))).status).toBe(403);
    // Themselves: the other session ends, this one stays.
    expect((await signOut(first)).status).toBe(200);
    expect((await first.get('/api/users/me')).status).toBe(200);
    expect((await second.get('/api/users/me')).status).toBe(401);
    // An admin: every session of theirs.
    expect((await signOut(admin)).status).toBe(200);
    expect((await first.get('/api/users/me')).status).toBe(401);
    expect((await login('signed.out@manage.example', 'signed-out-1')).status).toBe(200);
  });
});

describe('timestamps', () => {
  it('are on every type, sortable and filterable', async () => {
    const before = new Date(Date.now() - 1000).toISOString();
    const conversation = (await admin.post('/api/conversations', doc('Conversation', {}))).body.data;
    expect(conversation.attributes.created_at).toBe(conversation.attributes.updated_at);
    await new Promise((resolve) => setTimeout(resolve, 5));
    const updated = (
      await admin.patch(`/api/conversations/${conversation.id}`, doc('Conversation', { status: 'pending' }, conversation.id))
    ).body.data;
    expect(updated.attributes.created_at).toBe(conversation.attributes.created_at);
    expect(updated.attributes.updated_at > conversation.attributes.updated_at).toBe(true);
    const recent = await admin.get(`/api/conversations?filter[updated_at][greater_than_or_equal]=${before}&sort=-updated_at`);
    expect(recent.body.data[0].id).toBe(conversation.id);
    for (const list of [
      '/api/api_keys',
      '/api/users',
      '/api/ai_agents',
      '/api/gateways',
      '/api/sip_users',
      '/api/operator_statuses',
      '/api/operator_status_events',
      '/api/calls',
      '/api/call_participants',
      '/api/call_transcripts',
      '/api/organisations',
    ]) {
      const response = await admin.get(`${list}?sort=-created_at,updated_at&filter[created_at][less_than_or_equal]=2999-01-01T00:00:00Z`);
      expect(response.status, list).toBe(200);
    }
    expect(
      (await admin.patch(`/api/conversations/${conversation.id}`, doc('Conversation', { created_at: before }, conversation.id))).status,
    ).toBe(422);
  });
});

describe('visitors', () => {
  it('read their own conversation at its links.self, and nothing else', async () => {
    const session = await publishable.post('/api/visitor_sessions', doc('Conversation', {}));
    const visitor = client(t.app, session.body.meta.token);
    const own = await visitor.get(new URL(session.body.data.links.self).pathname);
    expect(own.status).toBe(200);
    expect(own.body.data.id).toBe(session.body.data.id);
    const someoneElses = (await admin.post('/api/conversations', doc('Conversation', {}))).body.data.id;
    expect((await visitor.get(`/api/conversations/${someoneElses}`)).status).toBe(404);
    expect((await visitor.get('/api/users/me')).status).toBe(403);
  });
});

describe('organisations', () => {
  it('shows the caller the organisations their user belongs to', async () => {
    const mine = await owner.get('/api/organisations');
    expect(mine.body.data.map((o: { id: string }) => o.id)).toEqual([tenant.organisationId]);
    expect((await owner.get(`/api/organisations/${other.organisationId}`)).status).toBe(404);
  });
});
