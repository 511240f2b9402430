/**
 * Availability for every operator (docs/api.md, "OperatorStatus"): an operator without a SIP user sets their
 * status by `user_id`, one current status per operator however it is named, and routing hands a conversation
 * to them; `sip_user_id` requests behave as before.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUserInOrganisation } from '../src/auth/accounts.js';
import { assignQueued, handOff } from '../src/agents/routing.js';
import { inTransaction } from '../src/db/connection.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { createRecords } from '../src/jsonapi/records.js';
import { buildRegistry } from '../src/jsonapi/routes.js';
import { resources } from '../src/resources/index.js';
import { client, pointers, resourceDocument, type Client } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

let t: TestApp;
let tenant: Tenant;
let owner: Client;
let operator: Client;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Availability');
  owner = client(t.app, tenant.owner.token);
  operator = client(t.app, tenant.operator.token);
});
afterAll(async () => {
  await t?.close();
});

const status = (attributes: Record<string, unknown>, as: Client = operator) =>
  as.post('/api/operator_statuses', resourceDocument('OperatorStatus', attributes));

describe('OperatorStatus by user', () => {
  it('a chat-only operator sets, reads and changes their status; one row, a history event per change', async () => {
    const first = await status({ user_id: tenant.operator.id, status: 'available', source: 'widget' });
    expect(first.status).toBe(201);
    expect(first.body.data.attributes).toMatchObject({
      user_id: tenant.operator.id,
      sip_user_id: null,
      status: 'available',
      source: 'widget',
      agent_name: 'Availability Operator',
      changed_by_user_id: tenant.operator.id,
    });
    expect(first.body.data.relationships.user.data).toMatchObject({ type: 'User', id: tenant.operator.id });
    const again = await status({ user_id: tenant.operator.id, status: 'available', source: 'widget' });
    expect(again.status).toBe(200);
    expect(again.body.data.id).toBe(first.body.data.id);
    const away = await status({ user_id: tenant.operator.id, status: 'away' });
    expect(away.status).toBe(200);
    expect(away.body.data.attributes.status).toBe('away');

    const list = await operator.get(`/api/operator_statuses?filter[user_id]=${tenant.operator.id}`);
    expect(list.status).toBe(200);
    expect(list.body.data.map((s: { id: string }) => s.id)).toEqual([first.body.data.id]);
    const history = await operator.get(`/api/operator_status_events?filter[user_id]=${tenant.operator.id}&sort=occurred_at`);
    expect(
      history.body.data.map((e: { attributes: Record<string, unknown> }) => [e.attributes.previous_status, e.attributes.status]),
    ).toEqual([
      [null, 'available'],
      ['available', 'away'],
    ]);
  });

  it('refuses neither or both names, and a user of another organisation, at the pointer', async () => {
    const neither = await status({ status: 'available' });
    expect(neither.status).toBe(422);
    expect(pointers(neither)).toEqual(['/data/attributes/sip_user_id']);
    const sip = await owner.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'avail-both', user_id: tenant.admin.id }));
    expect(sip.status).toBe(201);
    const both = await status({ status: 'available', user_id: tenant.admin.id, sip_user_id: sip.body.data.id }, owner);
    expect(both.status).toBe(422);
    expect(pointers(both)).toEqual(['/data/attributes/user_id']);
    const other = await seedTenant(t, 'Elsewhere');
    const foreign = await status({ status: 'available', user_id: other.operator.id });
    expect(foreign.status).toBe(422);
    expect(pointers(foreign)).toEqual(['/data/attributes/user_id']);
    // An operator sets their own availability only, as with SIP users; an admin sets anyone's.
    expect((await status({ status: 'available', user_id: tenant.admin.id })).status).toBe(403);
    const notUuid = await status({ status: 'available', user_id: 'me' });
    expect(notUuid.status).toBe(422);
    expect(pointers(notUuid)).toEqual(['/data/attributes/user_id']);
  });

  it('a SIP user and its user share one current status: by sip_user_id as before, and it names the user', async () => {
    const sip = await owner.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'avail-owner', user_id: tenant.owner.id }));
    const bySip = await status({ sip_user_id: sip.body.data.id, status: 'available', source: 'widget' }, owner);
    expect(bySip.status).toBe(201);
    expect(bySip.body.data.attributes).toMatchObject({
      sip_user_id: sip.body.data.id,
      user_id: tenant.owner.id,
      agent_name: 'Availability Owner',
    });
    const byUser = await status({ user_id: tenant.owner.id, status: 'busy' }, owner);
    expect(byUser.status).toBe(200);
    expect(byUser.body.data.id).toBe(bySip.body.data.id);
    expect(byUser.body.data.attributes).toMatchObject({ sip_user_id: sip.body.data.id, status: 'busy' });
    await status({ user_id: tenant.owner.id, status: 'offline' }, owner);
  });

  it('a chat-only status is joined by the SIP user the operator gets later', async () => {
    const chat = await status({ user_id: tenant.admin.id, status: 'away' }, owner);
    // avail-both (the previous test) already belongs to the admin: the status by user found it.
    expect(chat.body.data.attributes.sip_user_id).not.toBeNull();
    const member = await seedMember();
    const alone = await status({ user_id: member, status: 'away' }, owner);
    expect(alone.status).toBe(201);
    expect(alone.body.data.attributes.sip_user_id).toBeNull();
    const sip = await owner.post('/api/sip_users', resourceDocument('SipUser', { sip_username: 'avail-later', user_id: member }));
    const bySip = await status({ sip_user_id: sip.body.data.id, status: 'available' }, owner);
    expect(bySip.status).toBe(200);
    expect(bySip.body.data.id).toBe(alone.body.data.id);
    expect(bySip.body.data.attributes).toMatchObject({ sip_user_id: sip.body.data.id, user_id: member, status: 'available' });
    await status({ sip_user_id: sip.body.data.id, status: 'offline' }, owner);
    // Removing the member leaves the SIP user's status without a user; nothing refuses the removal.
    const removed = await owner.delete(`/api/users/${member}`);
    expect(removed.status).toBe(200);
    const after = await owner.get(`/api/operator_statuses/${alone.body.data.id}`);
    expect(after.body.data.attributes).toMatchObject({ sip_user_id: sip.body.data.id, user_id: null });
  });

  it('removing a chat-only member removes their status and its history', async () => {
    const member = await seedMember();
    const set = await status({ user_id: member, status: 'available' }, owner);
    expect(set.status).toBe(201);
    const removed = await owner.delete(`/api/users/${member}`);
    expect(removed.status).toBe(200);
    expect(removed.body.meta.removed).toEqual({ User: 1, OperatorStatus: 1, OperatorStatusEvent: 1 });
    expect((await owner.get(`/api/operator_statuses/${set.body.data.id}`)).status).toBe(404);
  });
});

let memberCount = 0;
async function seedMember(): Promise<string> {
  const user = await createUserInOrganisation(t.services.records!, {
    organisationId: tenant.organisationId,
    email: `member${memberCount++}.${Date.now()}@availability.example`,
    password: 'a long enough password',
    fullName: '',
    role: 'operator',
  });
  return user.id;
}

describe('routing', () => {
  it('hands a conversation to a chat-only operator who is available', async () => {
    const routed = await seedTenant(t, 'Routing');
    const asOperator = client(t.app, routed.operator.token);
    const registry = buildRegistry(resources);
    const makeRecords = (db: typeof t.db) => createRecords({ db, registry, services: t.services });
    const conversation = await t.services.records!.create(systemActor(routed.organisationId, 'test'), 'Conversation', {});
    await inTransaction(t.db, async (trx) => {
      await handOff(
        makeRecords(trx),
        { id: conversation.id, organisation_id: routed.organisationId },
        'The visitor asked for a person.',
        'handoff_test',
        { rule: 'test' },
      );
    });
    // Nobody is available: the conversation waits.
    expect(await assignQueued(t.db, makeRecords)).toBe(0);
    const set = await asOperator.post(
      '/api/operator_statuses',
      resourceDocument('OperatorStatus', { user_id: routed.operator.id, status: 'available', source: 'widget' }),
    );
    expect(set.status).toBe(201);
    expect(await assignQueued(t.db, makeRecords)).toBe(1);
    const { rows } = await sql<{ status: string; metadata: Record<string, unknown> }>`
      SELECT status, metadata FROM conversations WHERE id = ${conversation.id}`.execute(t.db);
    expect(rows[0].status).toBe('pending');
    expect(rows[0].metadata.assigned_operator).toBe(routed.operator.id);
  });
});
