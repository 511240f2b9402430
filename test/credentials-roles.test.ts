/**
 * The third review's credential and role findings, each performed as the attack it was: a key outliving its
 * issuer's role, admins cutting owners' keys off, and security changes missing from the outbox.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, resourceDocument as doc, type Client } from './helpers/http.js';

let t: TestApp;
let tenant: Tenant;
let owner: Client;
let admin: Client;
let operator: Client;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Creds');
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
      await owner.post('/api/users', doc('User', { email: 'climber@creds.example', role: 'operator', password: 'climber-pass-1' }))
    ).body.data.id;
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
