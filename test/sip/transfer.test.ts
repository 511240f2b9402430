/**
 * Call transfer (REFER, RFC 3515; Referred-By, RFC 3892) through the SIP edge, end to end with SIPp phones:
 * a callee that transfers its call (REFER after the answer), the caller that follows it with a new INVITE
 * carrying Referred-By, a target that answers. One Call with a participant per leg, read over the API. A REFER
 * outside any dialog, or naming a foreign host or another organisation's domain, is refused (403) and nothing
 * is sent on.
 */
import dgram from 'node:dgram';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import { DOMAIN, freeUdpPort, register, sipp, sipSkipReason, startSipStack, until, type SipStack } from './harness.js';
import { branch, listener, send, tag } from './raw.js';

const skip = sipSkipReason();
if (skip) console.warn(`SIP end-to-end tests skipped: ${skip}`);

interface Org {
  tenant: Tenant;
  admin: Client;
  domain: string;
}

describe.skipIf(skip !== undefined)('call transfer (REFER) through the SIP edge', () => {
  let t: TestApp;
  let acme: Org;
  let globex: Org;
  let stack: SipStack;
  let n = 0;

  beforeAll(async () => {
    t = await startTestApp();
    const org = async (name: string): Promise<Org> => {
      const tenant = await seedTenant(t, name);
      return { tenant, admin: client(t.app, tenant.admin.token), domain: `${name.toLowerCase()}.${DOMAIN}` };
    };
    acme = await org('Acme');
    globex = await org('Globex');
    stack = await startSipStack(t);
  }, 60_000);
  afterAll(async () => {
    await stack?.stop();
    await t?.close();
  });

  async function sipUser(org: Org) {
    const name = `x${Date.now().toString(36)}${n++}`;
    const password = `pw-${name}-secret`;
    const response = await org.admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: name, sip_password: password }));
    expect(response.status).toBe(201);
    return { id: response.body.data.id as string, name, password };
  }

  /** A phone registered on its own port and then running `scenario` as the UAS. */
  async function phone(
    org: Org,
    user: { name: string; password: string },
    scenario: string,
    keys: Record<string, string> = {},
    extra: { args?: string[]; timeoutSeconds?: number } = {},
  ) {
    const port = await freeUdpPort();
    expect((await register(stack, user.name, user.password, port, undefined, org.domain)).code).toBe(0);
    const done = sipp(scenario, undefined, {
      localPort: port,
      keys: { domain: org.domain, ...keys },
      timeoutSeconds: extra.timeoutSeconds ?? 25,
      args: extra.args,
    });
    await listening(port);
    // In an object: an async function returning the promise itself would wait for the phone to finish.
    return { done };
  }

  /** Until SIPp holds `port` (the machine may be slow to start it; an INVITE sent before would go unanswered). */
  async function listening(port: number) {
    await until(
      async () => {
        const socket = dgram.createSocket('udp4');
        const taken = await new Promise<boolean>((resolve) => {
          socket.once('error', () => resolve(true));
          socket.bind(port, '127.0.0.1', () => resolve(false));
        });
        await new Promise<void>((resolve) => (taken ? resolve() : socket.close(() => resolve())));
        return taken ? true : undefined;
      },
      `SIPp listening on ${port}`,
      20_000,
    );
  }

  async function calls(org: Org, to: string) {
    const response = await org.admin.get(`/api/calls?filter[to_number]=${encodeURIComponent(to)}`);
    expect(response.status).toBe(200);
    return response.body.data as { id: string; attributes: Record<string, unknown> }[];
  }

  async function terminalCall(org: Org, to: string) {
    return until(
      async () => {
        const call = (await calls(org, to))[0];
        return call && ['completed', 'busy', 'no_answer', 'canceled', 'failed'].includes(call.attributes.status as string)
          ? call
          : undefined;
      },
      `a terminal call to ${to}`,
      20_000,
    );
  }

  it('a blind transfer: the callee REFERs the caller to a third phone; one Call, a participant for each leg', async () => {
    const alice = await sipUser(acme);
    const bob = await sipUser(acme);
    const carol = await sipUser(acme);
    const target = await phone(acme, carol, 'callee_answer');
    const transferor = await phone(acme, bob, 'callee_transfer', { target: carol.name, target_domain: acme.domain });
    const transferee = await sipp('caller_transferee', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: alice.name, domain: acme.domain },
      args: ['-s', bob.name, '-au', alice.name, '-ap', alice.password],
      timeoutSeconds: 25,
    });
    expect(transferee.errors).toBe('');
    expect(transferee.logs).toContain(`REFER received, Refer-To: <sip:${carol.name}@${acme.domain}>`);
    expect((await transferor.done).code).toBe(0);
    // The transferor has hung up; the call goes on until the transferee's call to the target ends.
    await until(async () => {
      const call = (await calls(acme, bob.name))[0];
      const legs = call ? await participantsOf(call.id) : [];
      return legs.some((l) => l.member_uuid === bob.id && l.left_at) ? true : undefined;
    }, 'the transferor leaving the call');
    expect((await calls(acme, bob.name))[0].attributes.status).toBe('in_progress');

    const following = await sipp('caller_referred', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: alice.name, domain: acme.domain, referrer: bob.name },
      args: ['-s', carol.name, '-au', alice.name, '-ap', alice.password, '-d', '1000'],
      timeoutSeconds: 25,
    });
    expect(following.errors).toBe('');
    expect((await target.done).code).toBe(0);

    const call = await terminalCall(acme, bob.name);
    expect(call.attributes).toMatchObject({ status: 'completed', direction: 'outbound', from_number: alice.name, to_number: bob.name });
    // Answer (bob) to the end of the call with carol: at least the second carol talked.
    expect(call.attributes.duration_seconds as number).toBeGreaterThanOrEqual(1);
    // The transferee's call to the target is a leg of this call, not a Call of its own.
    expect(await calls(acme, carol.name)).toEqual([]);
    const legs = await participantsOf(call.id);
    expect(legs.map((l) => [l.member_uuid, l.role])).toEqual([
      [alice.id, 'caller'],
      [bob.id, 'callee'],
      [carol.id, 'callee'],
    ]);
    for (const leg of legs) expect(leg.left_at).not.toBeNull();
    const [aliceLeg, bobLeg, carolLeg] = legs;
    // The transferor left before the target joined; everyone else left when the call ended.
    expect(Date.parse(bobLeg.left_at as string)).toBeLessThanOrEqual(Date.parse(carolLeg.joined_at as string));
    expect(aliceLeg.left_at).toBe(carolLeg.left_at);
    expect(stack.kamailioLog.join('\n')).toMatch(/call \S+ is the transfer of call \S+ to /);
  }, 90_000);

  it("an attended transfer (Replaces, RFC 3891): the caller's call to the target replaces the consultation; one Call with the legs, the consultation ended as transferred", async () => {
    const alice = await sipUser(acme);
    const bob = await sipUser(acme);
    const carol = await sipUser(acme);
    // Carol answers two calls: bob's consultation, then alice's call that replaces it.
    const target = await phone(acme, carol, 'callee_answer', {}, { args: ['-m', '2'], timeoutSeconds: 60 });
    // 1. Bob consults carol (the consultation call, a Call of its own), and stays in that call for 14 s: long
    // enough for the transfer below, and short of the 20 s carol's scenario waits for a BYE (callee_answer.xml).
    const consultation = `consult-${Date.now().toString(36)}-${n++}@${acme.domain}`;
    const consulting = sipp('caller_call', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: bob.name, domain: acme.domain },
      args: ['-s', carol.name, '-au', bob.name, '-ap', bob.password, '-d', '14000', '-cid_str', consultation],
      timeoutSeconds: 60,
    });
    // Its tags, as a Replaces header names the dialog (RFC 3891 section 3): from the dialog Kamailio keeps.
    const dialog = await until(
      async () => {
        const { rows } = await sql<{ from_tag: string; to_tag: string }>`
          SELECT from_tag, to_tag FROM sip_dialogs WHERE callid = ${consultation} AND to_tag <> ''`.execute(t.db);
        return rows[0];
      },
      'the consultation call answered',
      20_000,
    );
    const replaces = `${consultation};to-tag=${dialog.to_tag};from-tag=${dialog.from_tag}`;
    // 2. Alice calls bob; bob transfers her to carol with Replaces naming the consultation (RFC 5589 section 7).
    const transferor = await phone(acme, bob, 'callee_transfer', {
      target: carol.name,
      target_domain: `${acme.domain}?Replaces=${encodeURIComponent(replaces)}`,
    });
    const transferee = await sipp('caller_transferee', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: alice.name, domain: acme.domain },
      args: ['-s', bob.name, '-au', alice.name, '-ap', alice.password],
      timeoutSeconds: 25,
    });
    expect(transferee.errors).toBe('');
    expect(transferee.logs).toContain(`Refer-To: <sip:${carol.name}@${acme.domain}?Replaces=`);
    expect((await transferor.done).code).toBe(0);
    // 3. Alice's call to carol replaces the consultation.
    const replacing = await sipp('caller_replacing', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: alice.name, domain: acme.domain, referrer: bob.name, replaces },
      args: ['-s', carol.name, '-au', alice.name, '-ap', alice.password, '-d', '1000'],
      timeoutSeconds: 25,
    });
    expect(replacing.errors).toBe('');
    // The consultation ends (carol's SIPp does not act on Replaces: bob hangs it up, after the replacing call).
    expect((await consulting).code).toBe(0);
    expect((await target.done).code).toBe(0);

    // The transferred call: one Call with alice, bob (who left) and carol.
    const call = await terminalCall(acme, bob.name);
    expect(call.attributes).toMatchObject({ status: 'completed', from_number: alice.name, to_number: bob.name });
    const legs = await participantsOf(call.id);
    expect(legs.map((l) => [l.member_uuid, l.role])).toEqual([
      [alice.id, 'caller'],
      [bob.id, 'callee'],
      [carol.id, 'callee'],
    ]);
    for (const leg of legs) expect(leg.left_at).not.toBeNull();
    // The consultation: its own Call (bob to carol), ended as transferred; the replacing call made no Call.
    const toCarol = await until(async () => {
      const list = await calls(acme, carol.name);
      return list.length === 1 && list[0].attributes.status !== 'in_progress' ? list : undefined;
    }, 'the consultation call ended');
    expect(toCarol[0].attributes).toMatchObject({
      call_uuid: consultation,
      status: 'completed',
      end_reason: 'transferred',
      from_number: bob.name,
    });
    expect(stack.kamailioLog.join('\n')).toContain(`replaces call ${consultation} (attended transfer)`);
  }, 120_000);

  async function participantsOf(callId: string) {
    const response = await acme.admin.get(`/api/call_participants?filter[call_id]=${callId}&sort=joined_at`);
    expect(response.status).toBe(200);
    return response.body.data.map((p: { attributes: Record<string, unknown> }) => p.attributes) as Record<string, unknown>[];
  }

  for (const where of ['a foreign host', "another organisation's domain"]) {
    it(`refuses a REFER whose Refer-To names ${where} (403); the other party never sees it`, async () => {
      const alice = await sipUser(acme);
      const bob = await sipUser(acme);
      const targetDomain = where === 'a foreign host' ? 'evil.example.com' : globex.domain;
      const transferor = await phone(acme, bob, 'callee_transfer_refused', { target: 'victim', target_domain: targetDomain });
      // caller_hold fails on any request but the BYE: a REFER reaching it would be an error.
      const caller = await sipp('caller_hold', stack.port, {
        localPort: await freeUdpPort(),
        keys: { from: alice.name, domain: acme.domain },
        args: ['-s', bob.name, '-au', alice.name, '-ap', alice.password],
        timeoutSeconds: 25,
      });
      expect(caller.errors).toBe('');
      expect(caller.code).toBe(0);
      expect((await transferor.done).code).toBe(0);
      const call = await terminalCall(acme, bob.name);
      expect(call.attributes.status).toBe('completed');
      expect(stack.kamailioLog.join('\n')).toContain(`to sip:victim@${targetDomain}, outside the call's organisation: 403`);
    }, 60_000);
  }

  it('refuses a REFER outside any dialog (403), with or without a forged To-tag; nothing reaches the target', async () => {
    const target = await listener();
    try {
      for (const toTag of ['', `;tag=${tag()}`]) {
        const refer = [
          `REFER sip:victim@127.0.0.1:${target.port} SIP/2.0`,
          `Via: SIP/2.0/UDP {{local}};branch=${branch()}`,
          `Route: <sip:127.0.0.1:${stack.port};lr>`,
          'Max-Forwards: 70',
          `From: <sip:attacker@evil.example>;tag=${tag()}`,
          `To: <sip:victim@127.0.0.1:${target.port}>${toTag}`,
          `Call-ID: ${tag()}@evil.example`,
          'CSeq: 1 REFER',
          'Contact: <sip:attacker@{{local}}>',
          `Refer-To: <sip:someone@127.0.0.1:${target.port}>`,
          'Content-Length: 0',
          '',
          '',
        ].join('\r\n');
        const answers = await send(stack.port, refer, '127.0.0.5');
        expect(answers.at(-1)?.status, `To-tag "${toTag}"`).toBe(403);
      }
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect(target.received).toEqual([]);
      expect(stack.kamailioLog.join('\n')).toMatch(/REFER from 127\.0\.0\.5:\d+ .* outside any dialog: 403/);
      expect(stack.kamailioLog.join('\n')).toMatch(/REFER from 127\.0\.0\.5:\d+ .* matches no dialog of this edge: 403/);
    } finally {
      await target.close();
    }
  });
});
