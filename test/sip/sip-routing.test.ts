/**
 * The SIP edge, carrier grade (issue 21), end to end: closed relay, one namespace per organisation, numbers
 * (DIDs) routed to SIP users, operators and agents, replayed digests, carriers' addresses never banned.
 * Kamailio as `sip serve` runs it, SIPp as phones and carriers, a hand-written UDP client as the attacker.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import { DOMAIN, freeUdpPort, freeUdpTcpPort, register, sipp, sipSkipReason, startSipStack, until, type SipStack } from './harness.js';
import { authorization, branch, listener, send, tag } from './raw.js';

const skip = sipSkipReason();
if (skip) console.warn(`SIP end-to-end tests skipped: ${skip}`);

interface Org {
  tenant: Tenant;
  admin: Client;
  domain: string;
}

describe.skipIf(skip !== undefined)('SIP edge routing (Kamailio + SIPp)', () => {
  let t: TestApp;
  let acme: Org;
  let globex: Org;
  let stack: SipStack;
  let n = 0;

  beforeAll(async () => {
    t = await startTestApp({ SIP_ALLOW_PRIVATE_GATEWAYS: 'true' });
    const org = async (name: string): Promise<Org> => {
      const tenant = await seedTenant(t, name);
      return { tenant, admin: client(t.app, tenant.admin.token), domain: `${name.toLowerCase()}.${DOMAIN}` };
    };
    acme = await org('Acme');
    globex = await org('Globex');
    // Five failed authentications ban an address (not a carrier's: tested below).
    stack = await startSipStack(t, {
      SIP_AUTH_FAILURES: '5',
      SIP_BAN_SECONDS: '60',
      SIP_LISTEN: 'udp:127.0.0.1:PORT,tcp:127.0.0.1:PORT',
      // One outbound call per organisation at a time (tested with two).
      SIP_OUTBOUND_MAX_CALLS: '1',
    });
  }, 60_000);
  afterAll(async () => {
    await stack?.stop();
    await t?.close();
  });

  async function sipUser(org: Org, name = `u${Date.now().toString(36)}${n++}`, userId?: string) {
    const password = `pw-${name}-secret`;
    const response = await org.admin.post(
      '/api/sip_users',
      resourceDocument('SipUser', { sip_username: name, sip_password: password, ...(userId ? { user_id: userId } : {}) }),
    );
    expect(response.status).toBe(201);
    return { id: response.body.data.id as string, name, password, attributes: response.body.data.attributes };
  }

  async function phoneNumber(org: Org, attributes: Record<string, unknown>) {
    const number = `+44207946${String(n++).padStart(4, '0')}`;
    const response = await org.admin.post('/api/phone_numbers', resourceDocument('PhoneNumber', { number, ...attributes }));
    expect(response.status).toBe(201);
    return number;
  }

  async function gateway(org: Org, acl: string) {
    const response = await org.admin.post(
      '/api/gateways',
      resourceDocument('Gateway', { realm: 'carrier.test', username: `in${n++}`, register: false, inbound_acl: [acl] }),
    );
    expect(response.status).toBe(201);
    // Loaded when Kamailio's own table lists the address (a reload refused as too soon is retried).
    const ip = acl.split('/')[0];
    await until(async () => {
      await stack.edge.reloadIfChanged();
      const dump = await stack.edge.kamailio.rpc('permissions.addressDump').catch(() => '');
      return dump.includes(ip) ? true : undefined;
    }, `the ACL reload (${acl})`);
  }

  async function terminalCall(org: Org, to: string) {
    return until(async () => {
      const response = await org.admin.get(`/api/calls?filter[to_number]=${encodeURIComponent(to)}`);
      expect(response.status).toBe(200);
      const call = response.body.data[0];
      return call && ['completed', 'busy', 'no_answer', 'canceled', 'failed'].includes(call.attributes.status) ? call : undefined;
    }, `a terminal call to ${to}`);
  }

  async function participants(org: Org, callId: string) {
    const response = await org.admin.get(`/api/call_participants?filter[call_id]=${callId}&sort=joined_at`);
    return response.body.data.map((p: { attributes: Record<string, unknown> }) => p.attributes);
  }

  /**
   * A phone registered (awaited) and then answering (or ringing with `callee_ring`) on its own port; `done` is
   * its SIPp run.
   */
  async function phoneThen(org: Org, user: { name: string; password: string }, scenario = 'callee_answer') {
    const port = await freeUdpPort();
    expect((await register(stack, user.name, user.password, port, undefined, org.domain)).code).toBe(0);
    const done = sipp(scenario, undefined, { localPort: port, keys: { domain: org.domain }, timeoutSeconds: 20 });
    await new Promise((resolve) => setTimeout(resolve, 300));
    return { done };
  }

  /** A carrier at `ip` calling `number`. */
  function carrierCall(ip: string, number: string, scenario = 'trunk_caller') {
    return freeUdpPort().then((port) => sipp(scenario, stack.port, { localPort: port, localIp: ip, args: ['-s', number] }));
  }

  describe('closed relay', () => {
    const forged = (method: string, target: number) =>
      [
        `${method} sip:victim@127.0.0.1:${target} SIP/2.0`,
        `Via: SIP/2.0/UDP {{local}};branch=${branch()}`,
        `Route: <sip:127.0.0.1:${stack.port};lr>`,
        'Max-Forwards: 70',
        `From: <sip:attacker@evil.example>;tag=${tag()}`,
        `To: <sip:victim@127.0.0.1:${target}>;tag=${tag()}`,
        `Call-ID: ${tag()}@evil.example`,
        `CSeq: 1 ${method}`,
        'Contact: <sip:attacker@{{local}}>',
        method === 'MESSAGE' ? 'Content-Type: text/plain' : '',
        `Content-Length: ${method === 'MESSAGE' ? 5 : 0}`,
        '',
        method === 'MESSAGE' ? 'hello' : '',
      ]
        .filter((line, i, all) => line !== '' || i >= all.length - 2)
        .join('\r\n');

    for (const method of ['INVITE', 'MESSAGE']) {
      it(`refuses a ${method} with a forged To-tag and a preloaded Route (404); nothing reaches the target`, async () => {
        const target = await listener();
        try {
          const answers = await send(stack.port, forged(method, target.port), '127.0.0.5');
          expect(answers.at(-1)?.status).toBe(404);
          await new Promise((resolve) => setTimeout(resolve, 500));
          expect(target.received).toEqual([]);
          expect(stack.kamailioLog.join('\n')).toMatch(new RegExp(`in-dialog ${method} from 127\\.0\\.0\\.5:\\d+ .* matches no dialog`));
        } finally {
          await target.close();
        }
      });
    }

    it('refuses an initial INVITE from a stranger with a preloaded Route to another host (403); nothing reaches it', async () => {
      const target = await listener();
      try {
        const message = forged('INVITE', target.port).replace(/^(To: .*);tag=\w+$/m, '$1');
        const answers = await send(stack.port, message, '127.0.0.5');
        expect(answers.at(-1)?.status).toBe(403);
        await new Promise((resolve) => setTimeout(resolve, 500));
        expect(target.received).toEqual([]);
      } finally {
        await target.close();
      }
    });

    it("relays an authenticated user's INVITE only inside its own domain: another host or organisation is 403", async () => {
      const alice = await sipUser(acme);
      const target = await listener();
      try {
        for (const uri of [`sip:victim@127.0.0.1:${target.port}`, `sip:${alice.name}@${globex.domain}`]) {
          const callId = `${tag()}@acme`;
          const fromTag = tag();
          const invite = (cseq: number, auth?: string) =>
            [
              `INVITE ${uri} SIP/2.0`,
              `Via: SIP/2.0/UDP {{local}};branch=${branch()}`,
              'Max-Forwards: 70',
              `From: <sip:${alice.name}@${acme.domain}>;tag=${fromTag}`,
              `To: <${uri}>`,
              `Call-ID: ${callId}`,
              `CSeq: ${cseq} INVITE`,
              `Contact: <sip:${alice.name}@{{local}}>`,
              ...(auth ? [`Proxy-Authorization: ${auth}`] : []),
              'Content-Length: 0',
              '',
              '',
            ].join('\r\n');
          const challenge = await send(stack.port, invite(1));
          expect(challenge.at(-1)?.status).toBe(407);
          const auth = authorization(challenge.at(-1)!.header('Proxy-Authenticate')!, 'INVITE', uri, alice.name, alice.password);
          const answers = await send(stack.port, invite(2, auth));
          expect(answers.at(-1)?.status).toBe(403);
        }
        await new Promise((resolve) => setTimeout(resolve, 300));
        expect(target.received).toEqual([]);
      } finally {
        await target.close();
      }
    });
  });

  describe('one namespace per organisation', () => {
    it('shows each organisation its SIP domain and each SIP user its sip_uri', async () => {
      const org = await acme.admin.get(`/api/organisations/${acme.tenant.organisationId}`);
      expect(org.body.data.attributes).toMatchObject({ slug: 'acme', sip_domain: acme.domain });
      const user = await sipUser(acme);
      expect(user.attributes.sip_uri).toBe(`sip:${user.name}@${acme.domain}`);
    });

    it('two organisations with the same sip_username both register and are called, each on its own phone', async () => {
      const name = `frontdesk${n++}`;
      for (const org of [acme, globex]) {
        const desk = await sipUser(org, name);
        const caller = await sipUser(org);
        const answering = await phoneThen(org, desk);
        const placing = await sipp('caller_call', stack.port, {
          localPort: await freeUdpPort(),
          keys: { from: caller.name, domain: org.domain },
          args: ['-s', name, '-au', caller.name, '-ap', caller.password, '-d', '300'],
        });
        expect(placing.errors).toBe('');
        expect(placing.code).toBe(0);
        expect((await answering.done).code).toBe(0);
        const call = await terminalCall(org, name);
        expect(call.attributes).toMatchObject({ status: 'completed', from_number: caller.name, sip_username: caller.name });
        const legs = await participants(org, call.id);
        expect(legs.map((l: { member_uuid: string }) => l.member_uuid)).toEqual([caller.id, desk.id]);
        const registered = await org.admin.get(`/api/sip_users/${desk.id}`);
        expect(registered.body.data.attributes.registered).toBe(true);
      }
    });
  });

  describe('digest hardening', () => {
    it('refuses a captured Authorization replayed with another Contact, from another address or the same one', async () => {
      const bob = await sipUser(acme);
      const uri = `sip:${acme.domain}`;
      const callId = `${tag()}@phone`;
      const fromTag = tag();
      const registerMessage = (cseq: number, contact: string, auth?: string) =>
        [
          `REGISTER ${uri} SIP/2.0`,
          `Via: SIP/2.0/UDP {{local}};branch=${branch()}`,
          'Max-Forwards: 70',
          `From: <sip:${bob.name}@${acme.domain}>;tag=${fromTag}`,
          `To: <sip:${bob.name}@${acme.domain}>`,
          `Call-ID: ${callId}`,
          `CSeq: ${cseq} REGISTER`,
          `Contact: <sip:${bob.name}@${contact}>`,
          ...(auth ? [`Authorization: ${auth}`] : []),
          'Expires: 300',
          'Content-Length: 0',
          '',
          '',
        ].join('\r\n');
      const challenge = await send(stack.port, registerMessage(1, '{{local}}'));
      expect(challenge.at(-1)?.status).toBe(401);
      const auth = authorization(challenge.at(-1)!.header('WWW-Authenticate')!, 'REGISTER', uri, bob.name, bob.password);
      const ok = await send(stack.port, registerMessage(2, '127.0.0.1:5999', auth));
      expect(ok.at(-1)?.status).toBe(200);
      // The attacker's copy: same Authorization, its own Contact, from elsewhere and from the same address.
      for (const ip of ['127.0.0.6', '127.0.0.1']) {
        const replay = await send(stack.port, registerMessage(3, `${ip}:6666`, auth), ip);
        expect(replay.at(-1)?.status).toBe(401);
      }
      const rows = await t.db.selectFrom('sip_locations').select('contact').where('username', '=', bob.name).execute();
      expect(rows.map((r) => r.contact)).toEqual([`sip:${bob.name}@127.0.0.1:5999`]);
    });
  });

  describe('numbers (DIDs) from carriers', () => {
    it('two organisations sharing a carrier address each receive their own numbers', async () => {
      await gateway(acme, '127.0.0.2/32');
      await gateway(globex, '127.0.0.2/32');
      for (const org of [acme, globex]) {
        const desk = await sipUser(org);
        const did = await phoneNumber(org, { sip_user_id: desk.id });
        const answering = await phoneThen(org, desk);
        const inbound = await carrierCall('127.0.0.2', did);
        expect(inbound.errors).toBe('');
        expect((await answering.done).code).toBe(0);
        const call = await terminalCall(org, did);
        expect(call.attributes).toMatchObject({ status: 'completed', direction: 'inbound', call_source: 'trunk', to_number: did });
      }
      // A number of neither organisation from the shared address: 404, no call.
      const unknown = await carrierCall('127.0.0.2', '+4420790000000', 'trunk_refused_404');
      expect(unknown.errors).toBe('');
    });

    it("never bans a carrier's address for failed authentications: its calls still arrive", async () => {
      await gateway(acme, '127.0.0.7/32');
      const desk = await sipUser(acme);
      const did = await phoneNumber(acme, { sip_user_id: desk.id });
      for (let i = 0; i < 6; i++) {
        const refused = await sipp('register_refused', stack.port, {
          localPort: await freeUdpPort(),
          localIp: '127.0.0.7',
          keys: { domain: acme.domain },
          timeoutSeconds: 3,
          args: ['-s', desk.name, '-au', desk.name, '-ap', 'wrong-password'],
        });
        if (i < 5) expect(refused.code).toBe(0);
      }
      const answering = await phoneThen(acme, desk);
      const inbound = await carrierCall('127.0.0.7', did);
      expect(inbound.errors).toBe('');
      expect((await answering.done).code).toBe(0);
      expect(stack.kamailioLog.join('\n')).toContain('from gateway address 127.0.0.7: not banned');
    });

    it('rings every available operator at once; the first to answer takes the call', async () => {
      const first = await sipUser(acme, undefined, acme.tenant.operator.id);
      const second = await sipUser(acme, undefined, acme.tenant.admin.id);
      for (const op of [first, second]) {
        const set = await acme.admin.post(
          '/api/operator_statuses',
          resourceDocument('OperatorStatus', { sip_user_id: op.id, status: 'available' }),
        );
        expect(set.status).toBe(201);
      }
      await gateway(acme, '127.0.0.8/32');
      const did = await phoneNumber(acme, {});
      const ringing = await phoneThen(acme, first, 'callee_ring');
      const answering = await phoneThen(acme, second, 'callee_answer');
      const inbound = await carrierCall('127.0.0.8', did);
      expect(inbound.errors).toBe('');
      expect((await answering.done).code).toBe(0);
      expect((await ringing.done).code).toBe(0);
      const call = await terminalCall(acme, did);
      expect(call.attributes.status).toBe('completed');
      const legs = await participants(acme, call.id);
      expect(legs.map((l: { role: string; member_uuid: string }) => [l.role, l.member_uuid])).toEqual([
        ['caller', 'sip:+15551234'],
        ['callee', second.id],
      ]);
    });

    it('with no operator available: 480, recorded as no_answer with the reason', async () => {
      const other = await seedTenant(t, 'Initech');
      const initech: Org = { tenant: other, admin: client(t.app, other.admin.token), domain: `initech.${DOMAIN}` };
      await gateway(initech, '127.0.0.9/32');
      const did = await phoneNumber(initech, {});
      const refused = await carrierCall('127.0.0.9', did, 'trunk_refused_480');
      expect(refused.errors).toBe('');
      const call = await terminalCall(initech, did);
      expect(call.attributes).toMatchObject({
        status: 'no_answer',
        sip_code: 480,
        end_reason: 'no operator available',
        direction: 'inbound',
      });
    });

    it('to an AI agent while no voice runtime runs: 480, recorded as failed with the reason', async () => {
      const agent = await acme.admin.post('/api/ai_agents', resourceDocument('AiAgent', { name: 'Receptionist' }));
      expect(agent.status).toBe(201);
      await gateway(acme, '127.0.0.10/32');
      const did = await phoneNumber(acme, { ai_agent_id: agent.body.data.id });
      const refused = await carrierCall('127.0.0.10', did, 'trunk_refused_480');
      expect(refused.errors).toBe('');
      const call = await terminalCall(acme, did);
      expect(call.attributes).toMatchObject({ status: 'failed', sip_code: 480, end_reason: 'voice runtime unavailable' });
    });
  });

  describe('calls from registered phones', () => {
    it('a call to an unregistered user is recorded: no_answer, 480, to_number as dialled', async () => {
      const caller = await sipUser(acme);
      const absent = await sipUser(acme);
      const placing = await sipp('caller_refused', stack.port, {
        localPort: await freeUdpPort(),
        keys: { from: caller.name, domain: acme.domain },
        args: ['-s', absent.name, '-au', caller.name, '-ap', caller.password],
      });
      expect(placing.errors).toBe('');
      const call = await terminalCall(acme, absent.name);
      expect(call.attributes).toMatchObject({ status: 'no_answer', sip_code: 480, end_reason: 'not registered', from_number: caller.name });
    });

    it('dials one of its organisation numbers and sip:agent-<id>: routed like a carrier call', async () => {
      const caller = await sipUser(acme);
      const desk = await sipUser(acme);
      const did = await phoneNumber(acme, { sip_user_id: desk.id });
      const answering = await phoneThen(acme, desk);
      const placing = await sipp('caller_call', stack.port, {
        localPort: await freeUdpPort(),
        keys: { from: caller.name, domain: acme.domain },
        args: ['-s', did, '-au', caller.name, '-ap', caller.password, '-d', '300'],
      });
      expect(placing.errors).toBe('');
      expect((await answering.done).code).toBe(0);
      const call = await terminalCall(acme, did);
      expect(call.attributes.status).toBe('completed');

      const agent = await acme.admin.post('/api/ai_agents', resourceDocument('AiAgent', { name: 'Sales' }));
      const target = `agent-${agent.body.data.id}`;
      const refused = await sipp('caller_refused', stack.port, {
        localPort: await freeUdpPort(),
        keys: { from: caller.name, domain: acme.domain },
        args: ['-s', target, '-au', caller.name, '-ap', caller.password],
      });
      expect(refused.errors).toBe('');
      const agentCall = await terminalCall(acme, target);
      expect(agentCall.attributes).toMatchObject({ status: 'failed', sip_code: 480, end_reason: 'voice runtime unavailable' });
    });
  });

  describe('outbound calls through the trunk', () => {
    it("go out through the organisation's gateway with its credentials and From; refused without one, over the limit or to premium rate", async () => {
      const other = await seedTenant(t, 'Outco');
      const outco: Org = { tenant: other, admin: client(t.app, other.admin.token), domain: `outco.${DOMAIN}` };
      const caller = await sipUser(outco);
      const dial = (scenario: string, number: string, holdMs = 300) =>
        freeUdpPort().then((port) =>
          sipp(scenario, stack.port, {
            localPort: port,
            keys: { from: caller.name, domain: outco.domain },
            args: ['-s', number, '-au', caller.name, '-ap', caller.password, '-d', String(holdMs)],
          }),
        );

      // No gateway yet: 403 with the reason, recorded.
      const noGateway = await dial('caller_refused_403', '+442079461111');
      expect(noGateway.errors).toBe('');
      expect((await terminalCall(outco, '+442079461111')).attributes).toMatchObject({
        status: 'failed',
        sip_code: 403,
        end_reason: 'no gateway for outbound calls',
        direction: 'outbound',
      });

      const carrierPort = await freeUdpPort();
      const created = await outco.admin.post(
        '/api/gateways',
        resourceDocument('Gateway', {
          realm: 'carrier.test',
          username: 'out-trunk',
          password: 'out-trunk-password',
          proxy: `127.0.0.1:${carrierPort}`,
          register: false,
          from_user: 'outco-main',
          from_domain: 'outco.example',
        }),
      );
      expect(created.status).toBe(201);
      const country = await outco.admin.patch(
        `/api/organisations/${other.organisationId}`,
        resourceDocument('Organisation', { default_country: 'GB' }, other.organisationId),
      );
      expect(country.status).toBe(200);

      // A national number, read as GB's, out through the gateway; the carrier checks the digest.
      const carrier = sipp('carrier_outbound', undefined, { localPort: carrierPort, timeoutSeconds: 20 });
      await new Promise((resolve) => setTimeout(resolve, 300));
      const placing = dial('caller_call', '02079462222', 2500);
      // While it is up, a second outbound call of the organisation is over SIP_OUTBOUND_MAX_CALLS (1).
      await until(async () => {
        const up = await outco.admin.get('/api/calls?filter[to_number]=%2B442079462222&filter[status]=in_progress');
        return up.body.data.length ? true : undefined;
      }, 'the outbound call to be answered');
      const second = await dial('caller_refused_403', '+442079463333');
      expect(second.errors).toBe('');
      expect((await terminalCall(outco, '+442079463333')).attributes).toMatchObject({
        status: 'failed',
        sip_code: 403,
        end_reason: 'too many outbound calls',
      });
      const placed = await placing;
      const taken = await carrier;
      expect(placed.errors + taken.errors).toBe('');
      expect(taken.logs).toContain('outbound call VERIFIED');
      expect(taken.logs).toContain('carrier got INVITE sip:+442079462222@carrier.test from');
      expect(taken.logs).toMatch(/from\s+<sip:outco-main@outco\.example>;tag=/);
      const call = await terminalCall(outco, '+442079462222');
      expect(call.attributes).toMatchObject({
        status: 'completed',
        direction: 'outbound',
        call_source: 'trunk',
        from_number: caller.name,
        sip_username: caller.name,
      });

      // Premium rate (UK 09): refused before anything is sent, recorded.
      const premium = await dial('caller_refused_403', '+449098790000');
      expect(premium.errors).toBe('');
      expect((await terminalCall(outco, '+449098790000')).attributes).toMatchObject({
        status: 'failed',
        sip_code: 403,
        end_reason: 'destination not allowed',
      });
    });
  });

  describe('transports', () => {
    it('registers and calls over TCP as over UDP (SIP_LISTEN lists both)', async () => {
      const caller = await sipUser(acme);
      const callee = await sipUser(acme);
      const overTcp = await sipp('register', stack.port, {
        localPort: await freeUdpTcpPort(), // SIPp binds this number for TCP (-t t1)
        keys: { domain: acme.domain },
        args: ['-t', 't1', '-s', caller.name, '-au', caller.name, '-ap', caller.password],
      });
      expect(overTcp.errors).toBe('');
      expect(overTcp.code).toBe(0);
      const registered = await acme.admin.get(`/api/sip_users/${caller.id}`);
      expect(registered.body.data.attributes.registered).toBe(true);
      const answering = await phoneThen(acme, callee);
      const placing = await sipp('caller_call', stack.port, {
        localPort: await freeUdpTcpPort(), // SIPp binds this number for TCP (-t t1)
        keys: { from: caller.name, domain: acme.domain },
        args: ['-t', 't1', '-s', callee.name, '-au', caller.name, '-ap', caller.password, '-d', '300'],
      });
      expect(placing.errors).toBe('');
      expect((await answering.done).code).toBe(0);
      expect((await terminalCall(acme, callee.name)).attributes.status).toBe('completed');
    });
  });

  describe('accounting and bad input', () => {
    it('a number deleted while its call is up: the call goes on and is recorded to the end', async () => {
      await gateway(acme, '127.0.0.11/32');
      const desk = await sipUser(acme);
      const did = await phoneNumber(acme, { sip_user_id: desk.id });
      const id = (await acme.admin.get(`/api/phone_numbers?filter[number]=${encodeURIComponent(did)}`)).body.data[0].id;
      const answering = await phoneThen(acme, desk);
      const inbound = carrierCall('127.0.0.11', did);
      await until(async () => {
        const calls = await acme.admin.get(`/api/calls?filter[to_number]=${encodeURIComponent(did)}&filter[status]=in_progress`);
        return calls.body.data.length ? true : undefined;
      }, 'the call to be answered');
      expect((await acme.admin.delete(`/api/phone_numbers/${id}`)).status).toBe(200);
      expect((await inbound).errors).toBe('');
      expect((await answering.done).code).toBe(0);
      expect((await terminalCall(acme, did)).attributes.status).toBe('completed');
    });

    it('duration_seconds is answer to hang-up rounded to the nearest second, from millisecond times', async () => {
      const callId = `rounding-${Date.now()}@test`;
      const base = {
        call_id: callId,
        organisation_id: acme.tenant.organisationId,
        direction: 'outbound' as const,
        source: 'sip' as const,
        caller_sip_user_id: '',
        callee_sip_user_id: '',
        from: 'a',
        to: callId,
        code: 0,
      };
      const t0 = Date.now() - 60_000;
      await stack.edge.events.apply({ ...base, event: 'initiated', at: new Date(t0) });
      await stack.edge.events.apply({ ...base, event: 'answered', code: 200, at: new Date(t0 + 1_000) });
      await stack.edge.events.apply({ ...base, event: 'ended', at: new Date(t0 + 6_430) });
      expect((await terminalCall(acme, callId)).attributes).toMatchObject({
        status: 'completed',
        answered_at: new Date(t0 + 1_000).toISOString(),
        duration_seconds: 5,
      });
    });

    it('answers a REGISTER for a domain that is not ours with 404, and drops garbage and oversized datagrams', async () => {
      const unknown = [
        'REGISTER sip:elsewhere.example SIP/2.0',
        `Via: SIP/2.0/UDP {{local}};branch=${branch()}`,
        'Max-Forwards: 70',
        `From: <sip:alice@elsewhere.example>;tag=${tag()}`,
        '<sip:alice@elsewhere.example>'.replace(/^/, 'To: '),
        `Call-ID: ${tag()}@x`,
        'CSeq: 1 REGISTER',
        'Contact: <sip:alice@{{local}}>',
        'Content-Length: 0',
        '',
        '',
      ].join('\r\n');
      expect((await send(stack.port, unknown)).at(-1)?.status).toBe(404);
      expect(await send(stack.port, 'INVITE garbage\r\n\r\n', '127.0.0.12', 700)).toEqual([]);
      const oversized = `OPTIONS sip:${acme.domain} SIP/2.0\r\nVia: SIP/2.0/UDP {{local}};branch=${branch()}\r\nX-Pad: ${'a'.repeat(60_000)}\r\n\r\n`;
      expect(await send(stack.port, oversized, '127.0.0.12', 700)).toEqual([]);
      // Still answering after them.
      expect((await send(stack.port, unknown)).at(-1)?.status).toBe(404);
    });
  });
});
