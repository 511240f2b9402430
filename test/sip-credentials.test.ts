import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { issueUserToken } from '../src/auth/user-tokens.js';
import { client, errorCodes, resourceDocument, type Client } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

/**
 * The softphone's short-lived SIP credential (POST /api/sip_users/credential, docs/sip.md "Softphone
 * credentials"): who may get one, and that Kamailio's view of credentials (sip_subscriber, which auth_db reads
 * on every REGISTER and INVITE) holds it exactly while it stands.
 */
let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let admin: Client;
let operator: Client;
let operatorSipId: string;
let deskSipId: string;

const WS = 'wss://sip.example.test:8443';
const ask = (as: Client, sipUserId?: string) =>
  as.post(
    '/api/sip_users/credential?fields[SipUser]=sip_username,sip_uri,user_id',
    resourceDocument('SipUser', sipUserId ? { sip_user_id: sipUserId } : {}),
  );

/** The rows Kamailio's auth_db would find for a digest username. */
async function subscriber(username: string) {
  const { rows } = await sql<{
    username: string;
    domain: string;
    password: string;
    sip_user_id: string;
    sip_username: string;
    org_domain: string;
  }>`
    SELECT username, domain, password, sip_user_id, sip_username, org_domain FROM sip_subscriber WHERE username = ${username}`.execute(
    t.db,
  );
  return rows;
}

beforeAll(async () => {
  t = await startTestApp({ SIP_WS_URL: WS, SIP_CREDENTIAL_TTL_SECONDS: '300' });
  tenant = await seedTenant(t, 'Phones');
  other = await seedTenant(t, 'Elsewhere');
  admin = client(t.app, tenant.admin.token);
  operator = client(t.app, tenant.operator.token);
  const mine = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'ana.desk', user_id: tenant.operator.id }));
  operatorSipId = mine.body.data.id;
  const desk = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'front.desk' }));
  deskSipId = desk.body.data.id;
});
afterAll(async () => t?.close());

describe('POST /api/sip_users/credential', () => {
  it("gives an operator a credential for their own SIP user, never the stored password, that Kamailio's view accepts", async () => {
    const before = Date.now();
    const response = await ask(operator);
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({ type: 'SipUser', id: operatorSipId });
    expect(response.body.data.attributes).not.toHaveProperty('sip_password');
    const credential = response.body.meta.sip_credential;
    const stored = await t.db.selectFrom('sip_users').select(['sip_password']).where('id', '=', operatorSipId).executeTakeFirstOrThrow();
    expect(JSON.stringify(response.body)).not.toContain(stored.sip_password);
    expect(credential.username).toMatch(/^ana\.desk~[A-Za-z0-9_-]{12}$/);
    expect(credential.password).toMatch(/^[A-Za-z0-9_-]{32}$/);
    expect(credential.ws_uri).toBe(WS);
    expect(credential.uri).toBe(`sip:ana.desk@${credential.domain}`);
    expect(credential.domain).toMatch(/^phones\./);
    const expires = Date.parse(credential.expires_at);
    expect(expires).toBeGreaterThanOrEqual(before + 299_000 - 1000);
    expect(expires).toBeLessThanOrEqual(Date.now() + 300_000);
    const rows = await subscriber(credential.username);
    expect(rows).toEqual([
      {
        username: credential.username,
        domain: credential.domain,
        password: credential.password,
        sip_user_id: operatorSipId,
        sip_username: 'ana.desk',
        org_domain: credential.domain,
      },
    ]);
    // The SIP user's own row names itself.
    const own = await subscriber('ana.desk');
    expect(own.map((r) => [r.sip_username, r.password])).toEqual([['ana.desk', stored.sip_password]]);
  });

  it('gives every request a new credential (one per browser tab)', async () => {
    const a = (await ask(operator)).body.meta.sip_credential;
    const b = (await ask(operator)).body.meta.sip_credential;
    expect(a.username).not.toBe(b.username);
    expect(a.password).not.toBe(b.password);
    expect(await subscriber(a.username)).toHaveLength(1);
    expect(await subscriber(b.username)).toHaveLength(1);
  });

  it("refuses an operator another SIP user (422), and one without a SIP user (422); admins get any of their organisation's", async () => {
    const others = await ask(operator, deskSipId);
    expect(others.status).toBe(422);
    expect(errorCodes(others)).toEqual(['invalid_attribute']);
    const none = await ask(admin);
    expect(none.status).toBe(422);
    expect(none.body.errors[0].detail).toMatch(/no SIP user/);
    const desk = await ask(admin, deskSipId);
    expect(desk.status).toBe(200);
    expect(desk.body.meta.sip_credential.username).toMatch(/^front\.desk~/);
    const owner = await ask(client(t.app, tenant.owner.token), operatorSipId);
    expect(owner.status).toBe(200);
  });

  it("refuses another organisation's SIP user (422), a publishable key (403), no credential (401) and a bad id (422)", async () => {
    const stranger = await ask(client(t.app, other.admin.token), operatorSipId);
    expect(stranger.status).toBe(422);
    expect((await ask(client(t.app, tenant.publishableKey))).status).toBe(403);
    expect((await ask(client(t.app))).status).toBe(401);
    const bad = await ask(admin, 'not-a-uuid');
    expect(bad.status).toBe(422);
    const unknown = await operator.post('/api/sip_users/credential', resourceDocument('SipUser', { sip_password: 'x' }));
    expect(unknown.status).toBe(422);
    expect(errorCodes(unknown)).toEqual(['unknown_attribute']);
  });

  it('stops working when it expires', async () => {
    const credential = (await ask(operator)).body.meta.sip_credential;
    expect(await subscriber(credential.username)).toHaveLength(1);
    await sql`UPDATE sip_credentials SET expires_at = now() - interval '1 second' WHERE username = ${credential.username}`.execute(t.db);
    expect(await subscriber(credential.username)).toEqual([]);
  });

  it('stops working when the session that asked is revoked, and the member signed in elsewhere keeps theirs', async () => {
    const second = await issueUserToken(t.db, t.services, { organisationId: tenant.organisationId, userId: tenant.operator.id });
    const kept = (await ask(client(t.app, second.token))).body.meta.sip_credential;
    const credential = (await ask(operator)).body.meta.sip_credential;
    // The operator signs out their other sessions (the one behind `kept` is the one asking, so it stays).
    const revoke = await client(t.app, second.token).patch(
      `/api/users/${tenant.operator.id}`,
      resourceDocument('User', { revoke_tokens: true }, tenant.operator.id),
    );
    expect(revoke.status).toBe(200);
    expect(await subscriber(credential.username)).toEqual([]);
    expect(await subscriber(kept.username)).toHaveLength(1);
    operator = client(t.app, second.token);
  });

  it('stops working when the SIP user is no longer the operator’s, or the member leaves', async () => {
    const credential = (await ask(operator)).body.meta.sip_credential;
    // The API changes only sip_password of a SIP user (CONTRACT section 2); a reassignment is made in the database.
    await sql`UPDATE sip_users SET user_id = NULL WHERE id = ${operatorSipId}`.execute(t.db);
    expect(await subscriber(credential.username)).toEqual([]);
    await sql`UPDATE sip_users SET user_id = ${tenant.operator.id} WHERE id = ${operatorSipId}`.execute(t.db);
    expect(await subscriber(credential.username)).toHaveLength(1);
    const removed = await admin.delete(`/api/users/${tenant.operator.id}`);
    expect(removed.status).toBe(200);
    expect(await subscriber(credential.username)).toEqual([]);
  });

  it('answers 409 when the server has no SIP WebSocket address', async () => {
    const bare = await startTestApp();
    try {
      const org = await seedTenant(bare, 'Bare');
      const owner = client(bare.app, org.owner.token);
      const sipUser = await owner.post(
        '/api/sip_users',
        resourceDocument('SipUser', { sip_username: 'bare.phone', user_id: org.owner.id }),
      );
      expect(sipUser.status).toBe(201);
      const response = await owner.post('/api/sip_users/credential', resourceDocument('SipUser', {}));
      expect(response.status).toBe(409);
      expect(response.body.errors[0].detail).toMatch(/SIP_WS_URL/);
    } finally {
      await bare.close();
    }
  });
});
