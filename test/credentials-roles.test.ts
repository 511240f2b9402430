/**
 * The third review's credential and role findings, each performed as the attack it was: a key outliving its
 * issuer's role, admins cutting owners' keys off, and security changes missing from the outbox.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUserInOrganisation } from '../src/auth/accounts.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, resourceDocument as doc, type Client } from './helpers/http.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let owner: Client;
let admin: Client;
let operator: Client;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Creds');
  other = await seedTenant(t, 'Victim');
  owner = client(t.app, tenant.owner.token);
  admin = client(t.app, tenant.admin.token);
  operator = client(t.app, tenant.operator.token);
});
afterAll(async () => t?.close());

const patchUser = (as: Client, id: string, attributes: Record<string, unknown>) =>
  as.patch(`/api/users/${id}`, doc('User', attributes, id));

describe('the key ceiling', () => {
  it('keeps a key an admin issued for an operator at admin when the operator is made an owner', async () => {
    const climber = (
      await createUserInOrganisation(t.services.records!, {
        organisationId: tenant.organisationId,
        email: 'climber@creds.example',
        password: 'climber-pass-1',
        fullName: 'Climber',
        role: 'operator',
      })
    ).id;
    const issued = await admin.post('/api/api_keys', doc('ApiKey', { name: 'for the operator', key_type: 'secret', user_id: climber }));
    expect(issued.status).toBe(201);
    expect(issued.body.data.attributes.role_ceiling).toBe('admin');
    const adminsCopy = client(t.app, issued.body.data.attributes.token);

    expect((await patchUser(owner, climber, { role: 'owner' })).body.data.attributes.role).toBe('owner');
    // The attack: the admin's copy of the key demotes the original owner. It acts as an admin at most.
    const demote = await patchUser(adminsCopy, tenant.owner.id, { role: 'admin' });
    expect(demote.status).toBe(403);
    expect((await owner.get(`/api/users/${tenant.owner.id}`)).body.data.attributes.role).toBe('owner');
    // An admin's powers it keeps; an owner may issue the member a key that acts as an owner.
    expect((await adminsCopy.get('/api/gateways')).status).toBe(200);
    const ownersKey = await owner.post('/api/api_keys', doc('ApiKey', { name: 'owner-made', key_type: 'secret', user_id: climber }));
    expect(ownersKey.body.data.attributes.role_ceiling).toBe('owner');
    const asOwner = client(t.app, ownersKey.body.data.attributes.token);
    expect((await patchUser(asOwner, tenant.admin.id, { role: 'operator' })).status).toBe(200);
    expect((await patchUser(owner, tenant.admin.id, { role: 'admin' })).status).toBe(200);
    // The ceiling caps, it never raises: demoted to operator, the owner-made key is an operator's.
    expect((await patchUser(owner, climber, { role: 'operator' })).status).toBe(200);
    expect((await asOwner.get('/api/gateways')).status).toBe(403);
  });

  it('gives keys the command line issues no ceiling', async () => {
    const keys = (await owner.get(`/api/api_keys?filter[user_id]=${tenant.owner.id}`)).body.data;
    expect(keys.length).toBeGreaterThan(0);
    for (const key of keys) expect(key.attributes.role_ceiling).toBeNull();
  });
});

describe("owners' keys", () => {
  it('are not revoked, renamed or deleted by admins (the publishable key included); owners and their own keys are', async () => {
    const keys = (await admin.get(`/api/api_keys?filter[user_id]=${tenant.owner.id}`)).body.data as {
      id: string;
      attributes: { key_type: string };
    }[];
    const publishable = keys.find((k) => k.attributes.key_type === 'publishable')!;
    expect(publishable).toBeDefined();
    const id = publishable.id;
    const revoke = await admin.patch(`/api/api_keys/${id}`, doc('ApiKey', { revoked_at: new Date().toISOString() }, id));
    expect(revoke.status).toBe(403);
    expect(revoke.body.errors[0].detail).toMatch(/owner's key/);
    expect((await admin.patch(`/api/api_keys/${id}`, doc('ApiKey', { name: 'renamed' }, id))).status).toBe(403);
    expect((await admin.delete(`/api/api_keys/${id}`)).status).toBe(403);
    // Untouched: the publishable key still signs users in.
    const login = await client(t.app, tenant.publishableKey).post(
      '/api/users/login',
      doc('User', { email: tenant.operator.email, password: tenant.operator.password }),
    );
    expect(login.status).toBe(200);
    const stored = (await owner.get(`/api/api_keys/${id}`)).body.data.attributes;
    expect(stored).toMatchObject({ revoked_at: null, name: 'widget' });

    // Admins manage the other members' keys and their own; owners every key.
    const operatorsKey = (await admin.post('/api/api_keys', doc('ApiKey', { name: 'op', key_type: 'secret', user_id: tenant.operator.id })))
      .body.data.id;
    expect((await admin.patch(`/api/api_keys/${operatorsKey}`, doc('ApiKey', { name: 'op2' }, operatorsKey))).status).toBe(200);
    expect((await admin.delete(`/api/api_keys/${operatorsKey}`)).status).toBe(200);
    const spare = (await owner.post('/api/api_keys', doc('ApiKey', { name: 'spare', key_type: 'secret' }))).body.data.id;
    expect((await owner.patch(`/api/api_keys/${spare}`, doc('ApiKey', { name: 'spare2' }, spare))).status).toBe(200);
    expect((await owner.delete(`/api/api_keys/${spare}`)).status).toBe(200);
    expect((await operator.delete(`/api/api_keys/${id}`)).status).toBe(404);
  });
});

describe('adding an account of another organisation', () => {
  const invite = (email: string, role = 'operator') => admin.post('/api/invitations', doc('Invitation', { email, role }));
  const accept = (token: string, email: string, password: string, full_name?: string) =>
    client(t.app, tenant.publishableKey).post(
      '/api/users/accept_invitation',
      doc('User', { invitation_token: token, email, password, ...(full_name ? { full_name } : {}) }),
    );

  it('answers alike for an address with an account and one without, reveals no name, and adds no one', async () => {
    // The attack: POST /api/users answered 409 or 201 by whether the address had an account, and added the
    // account at once, with its name. Adding a member is now an invitation, which never looks at accounts.
    expect((await admin.post('/api/users', doc('User', { email: other.owner.email, role: 'operator' }))).status).toBe(405);
    const known = await invite(other.owner.email);
    const unknown = await invite('nobody.yet@creds.example');
    expect(known.status).toBe(201);
    expect(unknown.status).toBe(201);
    const shape = (r: typeof known) => ({
      keys: Object.keys(r.body.data.attributes).sort(),
      relationships: Object.keys(r.body.data.relationships ?? {}).sort(),
      meta: r.body.meta,
      nulls: Object.entries(r.body.data.attributes)
        .filter(([, v]) => v === null)
        .map(([k]) => k)
        .sort(),
    });
    expect(shape(known)).toEqual(shape(unknown));
    expect(JSON.stringify(known.body)).not.toContain(other.owner.fullName);
    expect(JSON.stringify(known.body)).not.toContain(other.owner.id);
    expect(known.body.data.attributes).toMatchObject({ role: 'operator', accepted_at: null, user_id: null });
    // No membership before acceptance: not listed, cannot sign in here.
    expect((await admin.get('/api/users')).body.data.map((u: { id: string }) => u.id)).not.toContain(other.owner.id);
    const login = await client(t.app, tenant.publishableKey).post(
      '/api/users/login',
      doc('User', { email: other.owner.email, password: other.owner.password }),
    );
    expect(login.status).toBe(401);
  });

  it('makes the membership only when the person accepts, with their own password, once', async () => {
    const invitation = await invite(other.admin.email, 'admin');
    const token = invitation.body.data.attributes.token;
    expect(token).toMatch(/^inv_/);
    expect((await admin.get(`/api/invitations/${invitation.body.data.id}`)).body.data.attributes.token).toBeNull();
    // Someone holding the token but not the account's password joins no one.
    const wrong = await accept(token, other.admin.email, 'guessed-password');
    expect(wrong.status).toBe(401);
    // The token is for its address only.
    expect((await accept(token, other.operator.email, other.operator.password)).status).toBe(422);
    const accepted = await accept(token, other.admin.email, other.admin.password);
    expect(accepted.status).toBe(201);
    expect(accepted.body.data).toMatchObject({ id: other.admin.id, attributes: { role: 'admin', full_name: other.admin.fullName } });
    const session = client(t.app, accepted.body.meta.token);
    expect((await session.get('/api/users/me')).body.data.attributes.role).toBe('admin');
    expect((await admin.get(`/api/invitations/${invitation.body.data.id}`)).body.data.attributes).toMatchObject({
      user_id: other.admin.id,
      accepted_at: expect.stringMatching(/Z$/),
    });
    const again = await accept(token, other.admin.email, other.admin.password);
    expect(again.status).toBe(422);
    expect(again.body.errors[0].source.pointer).toBe('/data/attributes/invitation_token');
  });

  it('creates the account of an address without one on acceptance; expired or withdrawn invitations are refused', async () => {
    const fresh = await invite('brand.new@creds.example');
    const short = await accept(fresh.body.data.attributes.token, 'brand.new@creds.example', 'short');
    expect(short.status).toBe(422);
    expect(short.body.errors[0].source.pointer).toBe('/data/attributes/password');
    const made = await accept(fresh.body.data.attributes.token, 'Brand.New@creds.example', 'brand-new-pass', 'Brand New');
    expect(made.status).toBe(201);
    expect(made.body.data.attributes).toMatchObject({ email: 'brand.new@creds.example', full_name: 'Brand New', role: 'operator' });

    const withdrawn = await invite('withdrawn@creds.example');
    expect((await admin.delete(`/api/invitations/${withdrawn.body.data.id}`)).status).toBe(200);
    expect((await accept(withdrawn.body.data.attributes.token, 'withdrawn@creds.example', 'withdrawn-pass')).status).toBe(422);
    const expired = await invite('late@creds.example');
    await t.db
      .updateTable('invitations')
      .set({ expires_at: new Date(Date.now() - 1000) })
      .where('id', '=', expired.body.data.id)
      .execute();
    expect((await accept(expired.body.data.attributes.token, 'late@creds.example', 'late-pass-1')).status).toBe(422);
    // Invitations of another organisation are not this one's.
    const elsewhere = await client(t.app, other.owner.token).post(
      '/api/invitations',
      doc('Invitation', { email: 'x@creds.example', role: 'operator' }),
    );
    expect((await accept(elsewhere.body.data.attributes.token, 'x@creds.example', 'elsewhere-pass')).status).toBe(422);
    expect((await admin.get(`/api/invitations/${elsewhere.body.data.id}`)).status).toBe(404);
  });
});

describe('security changes in the outbox', () => {
  const eventsOf = async (type: string, userId: string) =>
    (
      await t.db
        .selectFrom('events')
        .select(['type', 'data'])
        .where('organisation_id', '=', tenant.organisationId)
        .where('type', '=', type)
        .orderBy('id')
        .execute()
    )
      .map((e) => e.data as { id: string; attributes: { role: string } })
      .filter((d) => d.id === userId);

  it('records a role change as User.updated and a removal as User.deleted', async () => {
    const member = await createUserInOrganisation(t.services.records!, {
      organisationId: tenant.organisationId,
      email: 'audited@creds.example',
      password: 'audited-pass-1',
      fullName: 'Audited',
      role: 'operator',
    });
    expect((await patchUser(admin, member.id, { role: 'admin' })).status).toBe(200);
    const updated = await eventsOf('User.updated', member.id);
    expect(updated.map((d) => d.attributes.role)).toEqual(['admin']);
    // The same role again changes nothing: no event.
    expect((await patchUser(admin, member.id, { role: 'admin' })).status).toBe(200);
    expect(await eventsOf('User.updated', member.id)).toHaveLength(1);

    expect((await admin.delete(`/api/users/${member.id}`)).status).toBe(200);
    const deleted = await eventsOf('User.deleted', member.id);
    expect(deleted).toHaveLength(1);
    expect(deleted[0].attributes.role).toBe('admin');
  });
});

describe("event ids and other organisations' writes", () => {
  /** The 40 bits after rand_b's order bits: before the fix, the installation-wide sequence number itself. */
  const low40 = (id: string) => BigInt(`0x${id.replace(/-/g, '').slice(-16)}`) & ((1n << 40n) - 1n);
  const lastEventId = async (organisationId: string) =>
    (
      await t.db
        .selectFrom('events')
        .select('id')
        .where('organisation_id', '=', organisationId)
        .orderBy('id', 'desc')
        .limit(1)
        .executeTakeFirstOrThrow()
    ).id;

  it("do not count another organisation's events, and still sort in commit order", async () => {
    const observer = client(t.app, other.admin.token);
    const ids: string[] = [];
    const gaps: bigint[] = [];
    for (const between of [3, 11, 25]) {
      expect((await observer.post('/api/conversations', doc('Conversation', {}))).status).toBe(201);
      const before = await lastEventId(other.organisationId);
      for (let i = 0; i < between; i += 1) expect((await admin.post('/api/conversations', doc('Conversation', {}))).status).toBe(201);
      expect((await observer.post('/api/conversations', doc('Conversation', {}))).status).toBe(201);
      const after = await lastEventId(other.organisationId);
      ids.push(before, after);
      // The attack: subtract the two ids' sequence bits to count the events written elsewhere (between + 1).
      gaps.push(low40(after) - low40(before) - 1n);
    }
    expect(gaps).not.toEqual([3n, 11n, 25n]);
    for (const gap of gaps) expect([3n, 11n, 25n]).not.toContain(gap);
    expect([...ids].sort()).toEqual(ids);
    // Ids stay unique (the masked sequence numbers are a permutation).
    const rows = await t.db
      .selectFrom('events')
      .select(['id', 'type'])
      .where('organisation_id', '=', other.organisationId)
      .orderBy('id')
      .execute();
    expect(new Set(rows.map((r) => r.id)).size).toBe(rows.length);
  });
});
