/**
 * The SIP edge end to end: Kamailio (run by the SIP edge as `parley sip serve` runs it) on a random port,
 * SIPp as phones, registrars and carriers, Parley's API as the observer. PostgreSQL only (Kamailio cannot
 * open the embedded database); skipped, with the reason, when Kamailio or SIPp is not installed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import { sql } from 'kysely';
import { freeUdpPort, register, sipp, sipSkipReason, startSipStack, until, type SipStack } from './harness.js';

const skip = sipSkipReason();
if (skip) console.warn(`SIP end-to-end tests skipped: ${skip}`);

describe.skipIf(skip !== undefined)('SIP edge (Kamailio + SIPp)', () => {
  let t: TestApp;
  let tenant: Tenant;
  let admin: Client;
  let stack: SipStack;
  let n = 0;

  beforeAll(async () => {
    // Five failed authentications from one address get it banned (tested below from 127.0.0.9).
    // SIPp plays the carriers on loopback addresses.
    t = await startTestApp({ SIP_ALLOW_PRIVATE_GATEWAYS: 'true' });
    tenant = await seedTenant(t, 'Voice');
    admin = client(t.app, tenant.admin.token);
    stack = await startSipStack(t, { SIP_AUTH_FAILURES: '5', SIP_BAN_SECONDS: '60' });
  }, 60_000);
  afterAll(async () => {
    await stack?.stop();
    await t?.close();
  });

  /** A SIP user through the API (password 12+ characters), optionally an operator's. */
  async function sipUser(userId?: string) {
    const name = `u${Date.now().toString(36)}${n++}`;
    const password = `pw-${name}-secret`;
    const response = await admin.post(
      '/api/sip_users',
      resourceDocument('SipUser', { sip_username: name, sip_password: password, ...(userId ? { user_id: userId } : {}) }),
    );
    expect(response.status).toBe(201);
    return { id: response.body.data.id as string, name, password };
  }

  async function registeredFlag(id: string): Promise<boolean> {
    const response = await admin.get(`/api/sip_users?filter[id]=${id}`);
    expect(response.status).toBe(200);
    return response.body.data[0].attributes.registered;
  }

  async function callOf(from: string, to: string) {
    const row = await t.db
      .selectFrom('calls')
      .select(['id'])
      .where('organisation_id', '=', tenant.organisationId)
      .where('from_number', '=', from)
      .where('to_number', '=', to)
      .orderBy('created_at', 'desc')
      .executeTakeFirst();
    return row?.id as string | undefined;
  }

  async function callWhenTerminal(from: string, to: string) {
    const id = await until(() => callOf(from, to), `the call ${from} -> ${to}`);
    return until(async () => {
      const response = await admin.get(`/api/calls/${id}`);
      expect(response.status).toBe(200);
      const status = response.body.data.attributes.status;
      return ['completed', 'busy', 'no_answer', 'canceled', 'failed'].includes(status) ? response.body.data : undefined;
    }, `a terminal status of call ${id}`);
  }

  async function participants(callId: string) {
    const response = await admin.get(`/api/call_participants?filter[call_id]=${callId}&sort=joined_at`);
    expect(response.status).toBe(200);
    return response.body.data.map((p: { attributes: Record<string, unknown> }) => p.attributes);
  }

  /** Callee registered on its own port and answering with `scenario`; the caller placing the call with `callerScenario`. */
  async function call(
    callerScenario: string,
    calleeScenario: string,
    caller: { name: string; password: string },
    callee: { name: string; password: string },
    holdMs = 500,
  ) {
    const calleePort = await freeUdpPort();
    expect((await register(stack, callee.name, callee.password, calleePort)).code).toBe(0);
    const answering = sipp(calleeScenario, undefined, { localPort: calleePort });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const placing = await sipp(callerScenario, stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name },
      args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password, '-d', String(holdMs)],
    });
    const answered = await answering;
    expect(placing.errors + answered.errors).toBe('');
    expect(placing.code).toBe(0);
    expect(answered.code).toBe(0);
  }

  describe('registrar', () => {
    it('accepts the password set through the API and shows the registration on the SIP user', async () => {
      const alice = await sipUser();
      expect(await registeredFlag(alice.id)).toBe(false);
      const result = await register(stack, alice.name, alice.password, await freeUdpPort());
      expect(result.errors).toBe('');
      expect(result.code).toBe(0);
      expect(await registeredFlag(alice.id)).toBe(true);
    });

    it('refuses a wrong password and an unknown user (403)', async () => {
      const bob = await sipUser();
      const wrong = await sipp('register_refused', stack.port, {
        localPort: await freeUdpPort(),
        args: ['-s', bob.name, '-au', bob.name, '-ap', 'not-the-password'],
      });
      expect(wrong.code).toBe(0);
      const unknown = await sipp('register_refused', stack.port, {
        localPort: await freeUdpPort(),
        args: ['-s', 'nobody-here', '-au', 'nobody-here', '-ap', 'whatever-password'],
      });
      expect(unknown.code).toBe(0);
      expect(await registeredFlag(bob.id)).toBe(false);
    });

    it('applies a rotated password on the next REGISTER, without a reload', async () => {
      const carol = await sipUser();
      expect((await register(stack, carol.name, carol.password, await freeUdpPort())).code).toBe(0);
      const rotated = 'rotated-password-123';
      const patched = await admin.patch(`/api/sip_users/${carol.id}`, {
        data: { type: 'SipUser', id: carol.id, attributes: { sip_password: rotated } },
      });
      expect(patched.status).toBe(200);
      expect((await register(stack, carol.name, rotated, await freeUdpPort())).code).toBe(0);
      const old = await sipp('register_refused', stack.port, {
        localPort: await freeUdpPort(),
        args: ['-s', carol.name, '-au', carol.name, '-ap', carol.password],
      });
      expect(old.code).toBe(0);
    });

    it('bans an address after repeated failed authentications', async () => {
      const dave = await sipUser();
      // From 127.0.0.9: five refusals, then silence, even for the right password.
      for (let i = 0; i < 5; i++) {
        const refused = await sipp('register_refused', stack.port, {
          localPort: await freeUdpPort(),
          localIp: '127.0.0.9',
          args: ['-s', dave.name, '-au', dave.name, '-ap', 'wrong-password'],
        });
        expect(refused.code).toBe(0);
      }
      const banned = await sipp('register', stack.port, {
        localPort: await freeUdpPort(),
        localIp: '127.0.0.9',
        timeoutSeconds: 3,
        args: ['-s', dave.name, '-au', dave.name, '-ap', dave.password],
      });
      expect(banned.code).not.toBe(0);
      // Other addresses are unaffected.
      expect((await register(stack, dave.name, dave.password, await freeUdpPort())).code).toBe(0);
    });
  });

  describe('calls between SIP users', () => {
    it('answered and hung up: completed, a voice conversation, two legs with joined_at and left_at', async () => {
      const caller = await sipUser();
      const callee = await sipUser();
      await call('caller_call', 'callee_answer', caller, callee, 1200);
      const record = await callWhenTerminal(caller.name, callee.name);
      expect(record.attributes).toMatchObject({
        status: 'completed',
        direction: 'outbound',
        sip_username: caller.name,
        call_source: 'sip',
        from_number: caller.name,
        to_number: callee.name,
      });
      expect(record.attributes.call_uuid).toMatch(/@127\.0\.0\.1$/);
      expect(record.attributes.ended_at).not.toBeNull();
      expect(record.attributes.duration_seconds).toBeGreaterThanOrEqual(1);
      const legs = await participants(record.id);
      expect(legs.map((l: { role: string }) => l.role)).toEqual(['caller', 'callee']);
      expect(legs.map((l: { member_uuid: string }) => l.member_uuid)).toEqual([caller.id, callee.id]);
      for (const leg of legs) {
        expect(leg.joined_at).not.toBeNull();
        expect(leg.left_at).not.toBeNull();
        expect(new Date(leg.left_at).getTime()).toBeGreaterThanOrEqual(new Date(leg.joined_at).getTime());
      }
      const conversation = await admin.get(`/api/conversations?filter[id]=${record.attributes.conversation_id}`);
      expect(conversation.body.data[0].attributes).toMatchObject({ channel: 'voice', mode: 'voice', status: 'closed' });
    });

    it('ended by the edge itself (dlg.end_dlg, as for a revoked softphone credential): completed when it ended, both legs left', async () => {
      const caller = await sipUser();
      const callee = await sipUser();
      const calleePort = await freeUdpPort();
      expect((await register(stack, callee.name, callee.password, calleePort)).code).toBe(0);
      const answering = sipp('callee_answer', undefined, { localPort: calleePort });
      await new Promise((resolve) => setTimeout(resolve, 300));
      // caller_hold ends well only on a BYE: the one the dialog module sends.
      const holding = sipp('caller_hold', stack.port, {
        localPort: await freeUdpPort(),
        keys: { from: caller.name },
        args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password],
        timeoutSeconds: 30,
      });
      const dialog = await until(
        () =>
          t.db
            .selectFrom('sip_dialogs')
            .select(['hash_entry', 'hash_id'])
            .where('from_uri', 'like', `sip:${caller.name}@%`)
            .where('state', '=', 4)
            .executeTakeFirst(),
        'the confirmed dialog',
      );
      const endedAt = Date.now();
      const answer = await stack.edge.kamailio.rpc('dlg.end_dlg', String(dialog.hash_entry), String(dialog.hash_id));
      expect(answer).not.toMatch(/^error/m);
      const [held, answered] = await Promise.all([holding, answering]);
      expect(held.errors + answered.errors).toBe('');
      expect(held.code).toBe(0);
      expect(answered.code).toBe(0);
      // Reconciliation is off in this stack (SIP_RECONCILE_INTERVAL_MS): only the call event can end the Call.
      const record = await callWhenTerminal(caller.name, callee.name);
      expect(record.attributes.status).toBe('completed');
      expect(Date.parse(record.attributes.ended_at)).toBeGreaterThanOrEqual(endedAt - 1000);
      const legs = await participants(record.id);
      expect(legs.every((l: { left_at: string | null }) => l.left_at !== null)).toBe(true);
    });

    it('busy (486): busy, the caller leg left', async () => {
      const caller = await sipUser();
      const callee = await sipUser();
      await call('caller_busy', 'callee_busy', caller, callee);
      const record = await callWhenTerminal(caller.name, callee.name);
      expect(record.attributes.status).toBe('busy');
      const legs = await participants(record.id);
      expect(legs).toHaveLength(1);
      expect(legs[0].left_at).not.toBeNull();
    });

    it('no answer within the ring timeout (408): no_answer', async () => {
      const caller = await sipUser();
      const callee = await sipUser();
      await call('caller_noanswer', 'callee_ring', caller, callee);
      const record = await callWhenTerminal(caller.name, callee.name);
      expect(record.attributes.status).toBe('no_answer');
    });

    it('cancelled by the caller while ringing: canceled', async () => {
      const caller = await sipUser();
      const callee = await sipUser();
      await call('caller_cancel', 'callee_ring', caller, callee);
      const record = await callWhenTerminal(caller.name, callee.name);
      expect(record.attributes.status).toBe('canceled');
    });

    it('an operator on a call is busy (source system), then back to their status', async () => {
      const operatorPhone = await sipUser(tenant.operator.id);
      const caller = await sipUser();
      const set = await admin.post(
        '/api/operator_statuses',
        resourceDocument('OperatorStatus', { sip_user_id: operatorPhone.id, status: 'away' }),
      );
      expect(set.status).toBe(201);
      const statusId = set.body.data.id;
      const placing = call('caller_call', 'callee_answer', caller, operatorPhone, 3000);
      const during = await until(async () => {
        const response = await admin.get(`/api/operator_statuses/${statusId}`);
        return response.body.data.attributes.status === 'busy' ? response.body.data.attributes : undefined;
      }, 'the operator to be busy');
      expect(during.source).toBe('system');
      await placing;
      await callWhenTerminal(caller.name, operatorPhone.name);
      const after = await until(async () => {
        const response = await admin.get(`/api/operator_statuses/${statusId}`);
        return response.body.data.attributes.status !== 'busy' ? response.body.data.attributes : undefined;
      }, 'the operator status to be restored');
      expect(after.status).toBe('away');
      const history = await admin.get(`/api/operator_status_events?filter[sip_user_id]=${operatorPhone.id}&sort=occurred_at`);
      expect(
        history.body.data.map((e: { attributes: Record<string, unknown> }) => [
          e.attributes.previous_status,
          e.attributes.status,
          e.attributes.source,
        ]),
      ).toEqual([
        [null, 'away', 'api'],
        ['away', 'busy', 'system'],
        ['busy', 'away', 'system'],
      ]);
    });
  });

  describe('trunks', () => {
    it('registers a gateway created while running with its credentials (digest checked by the carrier)', async () => {
      const carrierPort = await freeUdpPort();
      const carrier = sipp('trunk_registrar', undefined, { localPort: carrierPort, timeoutSeconds: 20 });
      await new Promise((resolve) => setTimeout(resolve, 300));
      const created = await admin.post(
        '/api/gateways',
        resourceDocument('Gateway', {
          realm: 'trunk.test',
          username: 'acme-trunk',
          password: 'trunk-password',
          proxy: `127.0.0.1:${carrierPort}`,
          register: true,
        }),
      );
      expect(created.status).toBe(201);
      const result = await carrier;
      expect(result.logs).toContain('trunk registration VERIFIED');
      expect(result.code).toBe(0);
    });

    it("accepts an inbound INVITE from a gateway ACL to one of that organisation's numbers, refuses others (403)", async () => {
      const callee = await sipUser();
      const did = `+4420794600${String(n++).padStart(2, '0')}`;
      const number = await admin.post('/api/phone_numbers', resourceDocument('PhoneNumber', { number: did, sip_user_id: callee.id }));
      expect(number.status).toBe(201);
      const created = await admin.post(
        '/api/gateways',
        resourceDocument('Gateway', {
          realm: 'carrier.test',
          username: 'inbound',
          register: false,
          inbound_acl: ['127.0.0.2/32'],
        }),
      );
      expect(created.status).toBe(201);
      // The reload timer applies it within SIP_RELOAD_INTERVAL_MS; asking until in sync makes sure it has.
      await until(async () => ((await stack.edge.reloadIfChanged()) ? true : undefined), 'the ACL reload');
      const calleePort = await freeUdpPort();
      expect((await register(stack, callee.name, callee.password, calleePort)).code).toBe(0);
      const answering = sipp('callee_answer', undefined, { localPort: calleePort });
      await new Promise((resolve) => setTimeout(resolve, 300));
      const inbound = await sipp('trunk_caller', stack.port, {
        localPort: await freeUdpPort(),
        localIp: '127.0.0.2',
        args: ['-s', did],
      });
      expect(inbound.errors).toBe('');
      expect(inbound.code).toBe(0);
      expect((await answering).code).toBe(0);
      const record = await callWhenTerminal('+15551234', did);
      expect(record.attributes).toMatchObject({
        status: 'completed',
        direction: 'inbound',
        call_source: 'trunk',
        sip_username: callee.name,
      });

      const refused = await sipp('trunk_refused', stack.port, {
        localPort: await freeUdpPort(),
        localIp: '127.0.0.3',
        args: ['-s', did],
      });
      expect(refused.errors).toBe('');
      expect(refused.code).toBe(0);
    });
  });

  describe('reconciliation and the call event queue', () => {
    it('ends a call whose dialog Kamailio does not hold (events lost): answered -> completed', async () => {
      const caller = await sipUser();
      const callee = await sipUser();
      const base = {
        call_id: `lost-${Date.now()}@test`,
        organisation_id: tenant.organisationId,
        direction: 'outbound' as const,
        source: 'sip' as const,
        caller_sip_user_id: caller.id,
        callee_sip_user_id: callee.id,
        from: caller.name,
        to: callee.name,
        code: 0,
      };
      await stack.edge.events.apply({ ...base, event: 'initiated', at: new Date(Date.now() - 5000) });
      await stack.edge.events.apply({ ...base, event: 'answered', code: 200, at: new Date(Date.now() - 4000) });
      expect(await stack.edge.reconcile(0)).toBeGreaterThanOrEqual(1);
      const record = await callWhenTerminal(caller.name, callee.name);
      expect(record.attributes.status).toBe('completed');
      const legs = await participants(record.id);
      expect(legs.every((l: { left_at: string | null }) => l.left_at !== null)).toBe(true);
    });

    it('holds call events in Kamailio while the database refuses them, and writes them in order when it takes them again', async () => {
      const caller = await sipUser();
      const callee = await sipUser();
      // The queue table unwritable (as with the database away), the rest of the database still there for
      // authentication: Kamailio keeps the events it cannot write and goes on relaying.
      await sql`ALTER TABLE sip_call_events RENAME TO sip_call_events_away`.execute(t.db);
      try {
        await call('caller_call', 'callee_answer', caller, callee, 500);
        await until(
          async () => (stack.kamailioLog.some((l) => l.includes('call events not written')) ? true : undefined),
          'Kamailio to report the events it holds',
        );
        expect(await callOf(caller.name, callee.name)).toBeUndefined();
      } finally {
        await sql`ALTER TABLE sip_call_events_away RENAME TO sip_call_events`.execute(t.db);
      }
      const record = await callWhenTerminal(caller.name, callee.name);
      expect(record.attributes.status).toBe('completed');
      expect((await participants(record.id)).map((l: { role: string }) => l.role)).toEqual(['caller', 'callee']);
      expect(stack.kamailioLog.some((l) => l.includes('call events written again'))).toBe(true);
    });

    it('queues call events in the database while Parley consumes none, and records the call when it is back', async () => {
      const caller = await sipUser();
      const callee = await sipUser();
      await stack.edge.queue.stop();
      try {
        // The call is set up, answered and hung up while nothing consumes: Kamailio never waits for Parley.
        await call('caller_call', 'callee_answer', caller, callee, 500);
        const queued = await until(async () => {
          const { rows } = await sql<{ body: string; call_key: string }>`SELECT body, call_key FROM sip_call_events ORDER BY id`.execute(
            t.db,
          );
          const mine = rows
            .map((r) => ({ key: r.call_key, event: JSON.parse(Buffer.from(r.body, 'base64').toString('utf8')) }))
            .filter((r) => r.event.from === caller.name);
          return mine.some((r) => r.event.event === 'ended') ? mine : undefined;
        }, 'the queued events of the call');
        // In the order Kamailio raised them; the key is the Call-ID's MD5 (what reconciliation matches on).
        expect(queued.map((r) => r.event.event).filter((e) => e !== 'ringing')).toEqual(['initiated', 'answered', 'ended']);
        const callId = queued[0].event.call_id;
        const { rows } = await sql<{ key: string }>`SELECT md5(${callId}) AS key`.execute(t.db);
        expect(queued.every((r) => r.key === rows[0].key)).toBe(true);
        expect(await callOf(caller.name, callee.name)).toBeUndefined();
      } finally {
        await stack.edge.queue.start();
      }
      const record = await callWhenTerminal(caller.name, callee.name);
      expect(record.attributes.status).toBe('completed');
      expect((await participants(record.id)).map((l: { role: string }) => l.role)).toEqual(['caller', 'callee']);
    });
  });
});
