/**
 * The PhoneNumber resource and the telephony fields of issue 21 over the API, on PGlite and PostgreSQL:
 * E.164 normalisation, unique in the installation, at most one target, references inside the organisation,
 * roles; Organisation slug, sip_domain and default_country; SipUser sip_uri; gateway destinations that are
 * not public addresses.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { client, pointers, resourceDocument, type Client } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { e164 } from '../src/resources/phone-number.js';
import { slugBase } from '../src/resources/organisation.js';

let t: TestApp;
let tenant: Tenant;
let other: Tenant;
let admin: Client;
let operator: Client;
let rival: Client;
let n = 0;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Numbers Inc.');
  other = await seedTenant(t, 'Numbers Inc');
  admin = client(t.app, tenant.admin.token);
  operator = client(t.app, tenant.operator.token);
  rival = client(t.app, other.admin.token);
});
afterAll(async () => t?.close());

const number = (attributes: Record<string, unknown>) => resourceDocument('PhoneNumber', attributes);
const next = () => `+4420794600${String(n++).padStart(2, '0')}`;

async function sipUser(c: Client) {
  const response = await c.post('/api/sip_users', resourceDocument('SipUser', { sip_username: `phone${n++}` }));
  expect(response.status).toBe(201);
  return response.body.data;
}

async function agent(c: Client) {
  const response = await c.post('/api/ai_agents', resourceDocument('AiAgent', { name: `Agent ${n++}` }));
  expect(response.status).toBe(201);
  return response.body.data;
}

describe('E.164 normalisation', () => {
  it('reads international numbers with + or 00, national ones only with a country, and refuses the rest', () => {
    expect(e164('+44 20 7946 0018')).toBe('+442079460018');
    expect(e164('0044 (20) 7946-0018')).toBe('+442079460018');
    expect(e164('020 7946 0018')).toBeUndefined();
    expect(e164('020 7946 0018', 'GB')).toBe('+442079460018');
    expect(e164('(212) 555-0123', 'US')).toBe('+12125550123');
    for (const bad of ['', '+', '+44', 'call me', '+44 20 7946 0018 9999 9999', '1-800-FLOWERS', '+0123456'])
      expect(e164(bad, 'GB')).toBeUndefined();
  });
});

describe('phone numbers', () => {
  it('creates with the number normalised, routed to the available operators by default; every member reads', async () => {
    const created = await admin.post('/api/phone_numbers', number({ number: '+44 (0)20 7946 0999'.replace('(0)', '') }));
    expect(created.status).toBe(201);
    expect(created.body.data.attributes).toMatchObject({ number: '+442079460999', gateway_id: null, ai_agent_id: null, sip_user_id: null });
    const read = await operator.get(`/api/phone_numbers/${created.body.data.id}`);
    expect(read.status).toBe(200);
    const filtered = await operator.get('/api/phone_numbers?filter[number]=%2B442079460999');
    expect(filtered.body.data.map((r: { id: string }) => r.id)).toEqual([created.body.data.id]);
  });

  it('is written by owners and admins only (403 for operators)', async () => {
    const refused = await operator.post('/api/phone_numbers', number({ number: next() }));
    expect(refused.status).toBe(403);
  });

  it('refuses a number that is not E.164, with the pointer (422)', async () => {
    for (const bad of ['12345', 'not a number', '020 7946 0018']) {
      const response = await admin.post('/api/phone_numbers', number({ number: bad }));
      expect(response.status).toBe(422);
      expect(pointers(response)).toEqual(['/data/attributes/number']);
    }
  });

  it('is unique in the installation: another organisation gets 409 for the same number, however written', async () => {
    const value = next();
    expect((await admin.post('/api/phone_numbers', number({ number: value }))).status).toBe(201);
    const again = await rival.post('/api/phone_numbers', number({ number: `00${value.slice(1)}` }));
    expect(again.status).toBe(409);
    expect(pointers(again)).toEqual(['/data/attributes/number']);
  });

  it('routes to one SIP user or one AI agent, never both (422 on the pointer)', async () => {
    const user = await sipUser(admin);
    const bot = await agent(admin);
    const both = await admin.post('/api/phone_numbers', number({ number: next(), sip_user_id: user.id, ai_agent_id: bot.id }));
    expect(both.status).toBe(422);
    expect(pointers(both)).toEqual(['/data/attributes/sip_user_id']);
    const toUser = await admin.post('/api/phone_numbers', number({ number: next(), sip_user_id: user.id }));
    expect(toUser.status).toBe(201);
    const id = toUser.body.data.id;
    const addAgent = await admin.patch(`/api/phone_numbers/${id}`, resourceDocument('PhoneNumber', { ai_agent_id: bot.id }, id));
    expect(addAgent.status).toBe(422);
    expect(pointers(addAgent)).toEqual(['/data/attributes/ai_agent_id']);
    const moved = await admin.patch(
      `/api/phone_numbers/${id}`,
      resourceDocument('PhoneNumber', { ai_agent_id: bot.id, sip_user_id: null }, id),
    );
    expect(moved.status).toBe(200);
    expect(moved.body.data.attributes).toMatchObject({ ai_agent_id: bot.id, sip_user_id: null });
  });

  it("refuses another organisation's SIP user, agent or gateway (422 on the pointer)", async () => {
    const theirUser = await sipUser(rival);
    const theirAgent = await agent(rival);
    const theirGateway = await rival.post('/api/gateways', resourceDocument('Gateway', { realm: 'carrier.example.com', username: 'x' }));
    expect(theirGateway.status).toBe(201);
    for (const [attribute, id] of [
      ['sip_user_id', theirUser.id],
      ['ai_agent_id', theirAgent.id],
      ['gateway_id', theirGateway.body.data.id],
    ]) {
      const response = await admin.post('/api/phone_numbers', number({ number: next(), [attribute]: id }));
      expect(response.status).toBe(422);
      expect(pointers(response)).toEqual([`/data/attributes/${attribute}`]);
    }
  });

  it("reads national numbers with the organisation's default_country, which owners and admins set", async () => {
    const orgId = tenant.organisationId;
    expect(
      (await operator.patch(`/api/organisations/${orgId}`, resourceDocument('Organisation', { default_country: 'GB' }, orgId))).status,
    ).toBe(403);
    const bad = await admin.patch(`/api/organisations/${orgId}`, resourceDocument('Organisation', { default_country: 'XX' }, orgId));
    expect(bad.status).toBe(422);
    expect(pointers(bad)).toEqual(['/data/attributes/default_country']);
    const set = await admin.patch(`/api/organisations/${orgId}`, resourceDocument('Organisation', { default_country: 'GB' }, orgId));
    expect(set.status).toBe(200);
    expect(set.body.data.attributes.default_country).toBe('GB');
    // Another organisation, even one the same user could see, is not changed through this credential.
    const elsewhere = await admin.patch(
      `/api/organisations/${other.organisationId}`,
      resourceDocument('Organisation', { default_country: 'US' }, other.organisationId),
    );
    expect(elsewhere.status).toBe(404);
    const national = await admin.post('/api/phone_numbers', number({ number: '020 7946 0777' }));
    expect(national.status).toBe(201);
    expect(national.body.data.attributes.number).toBe('+442079460777');
  });

  it('deletes (200 with the count); calls keep their numbers', async () => {
    const created = await admin.post('/api/phone_numbers', number({ number: next() }));
    const removed = await admin.delete(`/api/phone_numbers/${created.body.data.id}`);
    expect(removed.status).toBe(200);
    expect(removed.body.meta.removed).toEqual({ PhoneNumber: 1 });
    expect((await admin.get(`/api/phone_numbers/${created.body.data.id}`)).status).toBe(404);
    expect((await rival.get(`/api/phone_numbers/${created.body.data.id}`)).status).toBe(404);
  });
});

describe('SIP domains', () => {
  it('gives each organisation a stable slug and SIP domain, and each SIP user a sip_uri in it', async () => {
    const mine = await admin.get(`/api/organisations/${tenant.organisationId}`);
    const theirs = await rival.get(`/api/organisations/${other.organisationId}`);
    // Both names make the slug numbers-inc: the second keeps it unique with its id.
    expect(mine.body.data.attributes).toMatchObject({ slug: 'numbers-inc', sip_domain: 'numbers-inc.parley.local' });
    expect(theirs.body.data.attributes.slug).toBe(`numbers-inc-${other.organisationId.slice(0, 8)}`);
    const user = await sipUser(admin);
    expect(user.attributes.sip_uri).toBe(`sip:${user.attributes.sip_username}@numbers-inc.parley.local`);
    expect(slugBase('  Été & Co.  ')).toBe('t-co');
    expect(slugBase('!!!')).toBe('org');
  });
});

describe('gateway destinations', () => {
  it('refuses a proxy (or, without one, a realm) on a loopback, private or link-local address (422 on the pointer)', async () => {
    for (const [attributes, pointer] of [
      [{ proxy: '127.0.0.1:5060' }, '/data/attributes/proxy'],
      [{ proxy: '10.1.2.3' }, '/data/attributes/proxy'],
      [{ proxy: '[fe80::1]:5060' }, '/data/attributes/proxy'],
      [{ proxy: 'localhost:5060' }, '/data/attributes/proxy'],
      [{ realm: '192.168.1.1' }, '/data/attributes/realm'],
    ] as const) {
      const response = await admin.post(
        '/api/gateways',
        resourceDocument('Gateway', { realm: 'carrier.example.com', username: `g${n++}`, ...attributes }),
      );
      expect(response.status).toBe(422);
      expect(pointers(response)).toEqual([pointer]);
    }
    const ok = await admin.post(
      '/api/gateways',
      resourceDocument('Gateway', { realm: 'carrier.example.com', username: `g${n++}`, proxy: '185.45.12.10:5060' }),
    );
    expect(ok.status).toBe(201);
    const id = ok.body.data.id;
    const patched = await admin.patch(`/api/gateways/${id}`, resourceDocument('Gateway', { proxy: '172.16.0.1' }, id));
    expect(patched.status).toBe(422);
    expect(pointers(patched)).toEqual(['/data/attributes/proxy']);
  });

  it('accepts them with SIP_ALLOW_PRIVATE_GATEWAYS=true', async () => {
    const dev = await startTestApp({ SIP_ALLOW_PRIVATE_GATEWAYS: 'true' });
    try {
      const devTenant = await seedTenant(dev, 'Dev');
      const response = await client(dev.app, devTenant.admin.token).post(
        '/api/gateways',
        resourceDocument('Gateway', { realm: 'carrier.example.com', username: 'dev', proxy: '127.0.0.1:5060' }),
      );
      expect(response.status).toBe(201);
    } finally {
      await dev.close();
    }
  });
});
