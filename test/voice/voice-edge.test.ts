/**
 * Agent calls through the SIP edge, end to end: SIPp -> Kamailio (as `sip serve` runs it) -> the voice
 * runtime. A registered phone dials `agent-<id>@<its organisation's domain>` and hears the greeting; a carrier
 * calls a number routed to the agent; another organisation's agent is 404, an unpublished one 480; the
 * runtime refuses requests that do not come from the edge. The records over the API are one Call per Call-ID
 * with the caller's leg, the agent's leg and the transcripts.
 */
import dgram from 'node:dgram';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import pino from 'pino';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentRuntime } from '../../src/agents/runtime.js';
import type { Config } from '../../src/config/index.js';
import { systemActor } from '../../src/jsonapi/actor.js';
import { edgeSources, parseSipListen } from '../../src/sip/config.js';
import { NO_OPERATOR_TEXT, VoiceRuntime } from '../../src/voice/runtime.js';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { startModelServer, type ModelServer } from '../helpers/model-server.js';
import { DOMAIN, freeUdpPort, register, sipp, sipSkipReason, startSipStack, until, type SipStack } from '../sip/harness.js';
import { branch, tag } from '../sip/raw.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import { haveProgram, recognise, startRecorder } from './harness.js';

const skip = sipSkipReason() ?? (haveProgram('text2wave') ? undefined : 'festival (text2wave) not installed');
if (skip) console.warn(`voice edge tests skipped: ${skip}`);

const GREETING = 'Good morning. This is the order desk.';
const GOODBYE = 'Goodbye.';

interface Org {
  tenant: Tenant;
  admin: Client;
  domain: string;
}

describe.skipIf(skip !== undefined)('agent calls through the SIP edge (SIPp -> Kamailio -> voice runtime)', () => {
  let t: TestApp;
  let acme: Org;
  let globex: Org;
  let stack: SipStack;
  let agents: AgentRuntime;
  let voice: VoiceRuntime;
  let voicePort: number;
  let agentId: string;
  let model: ModelServer;
  let n = 0;

  beforeAll(async () => {
    // Private tool URLs: the fake tool receiver listens on the loopback (docs/agents.md, "The call").
    t = await startTestApp({ SIP_ALLOW_PRIVATE_GATEWAYS: 'true', AGENT_RUNTIME: 'false', WEBHOOK_ALLOW_PRIVATE_URLS: 'true' });
    model = await startModelServer();
    // Analyses of the calls' conversations (every one closed here is analysed): a record_analysis answer;
    // turns the tests do not script are echoed.
    model.always((req) =>
      (req.body.tools ?? []).some((tool) => tool.function.name === 'record_analysis')
        ? {
            toolCalls: [
              {
                name: 'record_analysis',
                arguments: { summary: 'The caller asked about an order.', success: true, data: { topic: 'shipping' } },
              },
            ],
          }
        : { text: `You said: ${[...req.body.messages].reverse().find((m) => m.role === 'user')?.content ?? ''}` },
    );
    const org = async (name: string): Promise<Org> => {
      const tenant = await seedTenant(t, name);
      return { tenant, admin: client(t.app, tenant.admin.token), domain: `${name.toLowerCase()}.${DOMAIN}` };
    };
    acme = await org('Acme');
    globex = await org('Globex');
    const agent = await t.services.records!.create(systemActor(acme.tenant.organisationId, 'test'), 'AiAgent', {
      name: 'Desk',
      published: true,
      languages: ['en'],
      workflow: {
        steps: [
          { type: 'message', text: GREETING },
          { type: 'end', text: GOODBYE, close: true },
        ],
      },
    });
    agentId = agent.id;
    voicePort = await freeUdpPort();
    stack = await startSipStack(t, { VOICE_SIP_PORT: String(voicePort) });
    const config: Config = {
      ...t.config,
      agentPollMs: 50,
      llmBaseUrl: model.url,
      llmApiKey: 'test-key',
      llmModel: 'test-model',
      llmMaxRetries: 0,
      llmTimeoutMs: 20_000,
      voice: {
        ...t.config.voice,
        sipHost: '127.0.0.1',
        sipPort: voicePort,
        rtpPortMin: 0,
        rtpPortMax: 0,
        silenceTimeoutMs: 30_000,
        // As `sip serve` sets it: Kamailio's listen address is the only source taken.
        sipTrusted: edgeSources(parseSipListen(`udp:127.0.0.1:${stack.port}`)),
      },
    };
    agents = new AgentRuntime({ db: t.db, services: t.services, config });
    agents.start();
    voice = new VoiceRuntime({
      db: t.db,
      services: t.services,
      config,
      agents,
      callEvents: stack.edge.events,
      listen: (channel, onNotify, onResumed) => t.database.listen(channel, onNotify, onResumed),
      // VOICE_TEST_LOG=debug (and VOICE_TEST_LOG_FILE=path) shows the runtime's log.
      logger: pino(
        { level: process.env.VOICE_TEST_LOG ?? 'silent' },
        process.env.VOICE_TEST_LOG_FILE ? pino.destination(process.env.VOICE_TEST_LOG_FILE) : undefined,
      ),
    });
    await voice.start();
  }, 90_000);

  afterAll(async () => {
    await voice?.stop();
    await agents?.stop();
    await stack?.stop();
    await model?.close();
    await t?.close();
  });

  async function sipUser(org: Org) {
    const name = `u${Date.now().toString(36)}${n++}`;
    const password = `pw-${name}-secret`;
    const response = await org.admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: name, sip_password: password }));
    expect(response.status).toBe(201);
    return { id: response.body.data.id as string, name, password };
  }

  /** The only Call to `to` in `org`, once it is terminal (more than one fails the test: one Call per call). */
  async function terminalCall(org: Org, to: string) {
    return until(
      async () => {
        const response = await org.admin.get(`/api/calls?filter[to_number]=${encodeURIComponent(to)}`);
        expect(response.status).toBe(200);
        expect(response.body.data.length).toBeLessThanOrEqual(1);
        const call = response.body.data[0];
        return call && ['completed', 'busy', 'no_answer', 'canceled', 'failed'].includes(call.attributes.status) ? call : undefined;
      },
      `a terminal call to ${to}`,
      20_000,
    );
  }

  async function legs(org: Org, callId: string) {
    const response = await org.admin.get(`/api/call_participants?filter[call_id]=${callId}&sort=joined_at`);
    return (response.body.data as { attributes: Record<string, unknown> }[]).map((p) => p.attributes);
  }

  async function lines(org: Org, callId: string) {
    const response = await org.admin.get(`/api/call_transcripts?filter[call_id]=${callId}&sort=content_index`);
    expect(response.status).toBe(200);
    return (response.body.data as { attributes: { speaker: string; content: string } }[]).map((l) => l.attributes);
  }

  /** SIPp's errors, but its watchdog's overload warnings (the machine is loaded; the call itself went as scripted). */
  function realErrors(errors: string): string {
    const lines = errors.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('The following events occurred:'));
    return lines.every((l) => l.includes('Overload warning: the minor watchdog timer')) ? '' : errors;
  }

  /** Decoded audio's RMS level, to tell speech from the encoded silence sent between replies. */
  function rms(pcm: Int16Array): number {
    let sum = 0;
    for (const s of pcm) sum += s * s;
    return Math.sqrt(sum / Math.max(1, pcm.length));
  }

  /** 20 ms frames (16 kHz) louder than -40 dBFS. */
  function loudFrames(pcm: Int16Array): number {
    let count = 0;
    for (let i = 0; i + 320 <= pcm.length; i += 320) if (rms(pcm.subarray(i, i + 320)) > 330) count++;
    return count;
  }

  it('a registered phone dials agent-<id>@<domain>: the greeting is heard, and the API shows one completed Call', async () => {
    const caller = await sipUser(acme);
    const port = await freeUdpPort();
    expect((await register(stack, caller.name, caller.password, port, undefined, acme.domain)).code).toBe(0);
    const recorder = await startRecorder();
    const target = `agent-${agentId}`;
    const placing = await sipp('agent_caller', stack.port, {
      localPort: port,
      keys: { from: caller.name, domain: acme.domain, rtp: String(recorder.port) },
      args: ['-s', target, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 60,
    });
    await recorder.close();
    expect(placing.errors, placing.errors).toBe('');
    expect(placing.code).toBe(0);

    // RTP reached the caller (through SDP that passed the edge unchanged) and carried speech, G.722 first.
    expect(recorder.packets.length).toBeGreaterThan(50);
    const heard = recorder.audio('G722');
    // At least a second of it is speech (20 ms frames well above the encoded silence between replies): the
    // greeting and goodbye as festival speaks them last about 3 s.
    expect(loudFrames(heard)).toBeGreaterThan(50);
    // What the local recogniser makes of it, for the log: through G.722 it misses words, and on a loaded
    // machine sometimes most of them, so it is not asserted (test/voice/voice-call.test.ts checks words).
    if (process.env.VOICE_TEST_LOG) console.info('heard:', await recognise(heard));

    const call = await terminalCall(acme, target);
    expect(call.attributes).toMatchObject({
      status: 'completed',
      direction: 'outbound',
      call_source: 'sip',
      from_number: caller.name,
      to_number: target,
    });
    const parties = await legs(acme, call.id);
    expect(parties.map((p) => [p.role, p.member_uuid])).toEqual([
      ['caller', caller.id],
      ['agent', agentId],
    ]);
    expect(parties.every((p) => p.left_at)).toBe(true);
    const transcript = await lines(acme, call.id);
    expect(transcript.length).toBeGreaterThanOrEqual(1);
    expect(transcript[0].speaker).toBe('agent');
    expect(transcript[0].content).toContain(GREETING);

    // The call's conversation is the agent's voice conversation, closed with the call.
    const conversation = await acme.admin.get(`/api/conversations/${call.attributes.conversation_id}`);
    expect(conversation.status).toBe(200);
    expect(conversation.body.data.attributes).toMatchObject({ mode: 'voice', ai_agent_id: agentId, status: 'closed' });
    // One Call for this Call-ID in the database (the runtime's and the edge's records agree).
    const rows = await t.db.selectFrom('calls').select('id').where('call_uuid', '=', call.attributes.call_uuid).execute();
    expect(rows).toHaveLength(1);
  }, 90_000);

  it('a carrier calls a number routed to the agent: inbound, the caller number as from_number, answered by the agent', async () => {
    const response = await acme.admin.post(
      '/api/gateways',
      resourceDocument('Gateway', { realm: 'carrier.test', username: `in${n++}`, register: false, inbound_acl: ['127.0.0.30/32'] }),
    );
    expect(response.status).toBe(201);
    await until(async () => {
      await stack.edge.reloadIfChanged();
      const dump = await stack.edge.kamailio.rpc('permissions.addressDump').catch(() => '');
      return dump.includes('127.0.0.30') ? true : undefined;
    }, 'the ACL reload');
    const number = '+442079460777';
    const created = await acme.admin.post('/api/phone_numbers', resourceDocument('PhoneNumber', { number, ai_agent_id: agentId }));
    expect(created.status).toBe(201);

    const recorder = await startRecorder();
    const placing = await sipp('trunk_agent_caller', stack.port, {
      localPort: await freeUdpPort(),
      localIp: '127.0.0.30',
      keys: { rtp: String(recorder.port), domain: acme.domain },
      args: ['-s', number],
      timeoutSeconds: 60,
    });
    await recorder.close();
    expect(placing.errors, placing.errors).toBe('');
    expect(loudFrames(recorder.audio('G722'))).toBeGreaterThan(50);

    const call = await terminalCall(acme, number);
    expect(call.attributes).toMatchObject({
      status: 'completed',
      direction: 'inbound',
      call_source: 'trunk',
      from_number: '+15551234',
      to_number: number,
    });
    const parties = await legs(acme, call.id);
    expect(parties.map((p) => [p.role, p.member_uuid])).toEqual([
      ['caller', 'sip:+15551234'],
      ['agent', agentId],
    ]);
    expect((await lines(acme, call.id))[0]).toMatchObject({ speaker: 'agent' });
  }, 90_000);

  it("a registered phone dials its organisation's number routed to the agent: answered by the agent", async () => {
    const number = '+442079460778';
    expect((await acme.admin.post('/api/phone_numbers', resourceDocument('PhoneNumber', { number, ai_agent_id: agentId }))).status).toBe(
      201,
    );
    const caller = await sipUser(acme);
    const port = await freeUdpPort();
    expect((await register(stack, caller.name, caller.password, port, undefined, acme.domain)).code).toBe(0);
    const recorder = await startRecorder();
    const placing = await sipp('agent_caller', stack.port, {
      localPort: port,
      keys: { from: caller.name, domain: acme.domain, rtp: String(recorder.port) },
      args: ['-s', number, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 60,
    });
    await recorder.close();
    expect(placing.errors, placing.errors).toBe('');
    expect(loudFrames(recorder.audio('G722'))).toBeGreaterThan(50);
    const call = await terminalCall(acme, number);
    expect(call.attributes).toMatchObject({ status: 'completed', direction: 'outbound', from_number: caller.name, to_number: number });
    expect((await legs(acme, call.id)).map((p) => p.role)).toEqual(['caller', 'agent']);
  }, 90_000);

  it("another organisation's agent is 404 (never reached), an unpublished agent 480", async () => {
    const stranger = await sipUser(globex);
    const port = await freeUdpPort();
    expect((await register(stack, stranger.name, stranger.password, port, undefined, globex.domain)).code).toBe(0);
    const target = `agent-${agentId}`;
    const refused = await sipp('caller_refused_404', stack.port, {
      localPort: port,
      keys: { from: stranger.name, domain: globex.domain },
      args: ['-s', target, '-au', stranger.name, '-ap', stranger.password],
    });
    expect(refused.errors, refused.errors).toBe('');
    const foreign = await terminalCall(globex, target);
    expect(foreign.attributes).toMatchObject({ status: 'failed', sip_code: 404 });
    // Nothing of it in the agent's organisation.
    expect((await acme.admin.get(`/api/calls?filter[call_uuid]=${encodeURIComponent(foreign.attributes.call_uuid)}`)).body.data).toEqual(
      [],
    );

    const draft = await t.services.records!.create(systemActor(acme.tenant.organisationId, 'test'), 'AiAgent', {
      name: 'Draft',
      published: false,
    });
    const caller = await sipUser(acme);
    const callerPort = await freeUdpPort();
    expect((await register(stack, caller.name, caller.password, callerPort, undefined, acme.domain)).code).toBe(0);
    const unpublished = await sipp('caller_refused', stack.port, {
      localPort: callerPort,
      keys: { from: caller.name, domain: acme.domain },
      args: ['-s', `agent-${draft.id}`, '-au', caller.name, '-ap', caller.password],
    });
    expect(unpublished.errors, unpublished.errors).toBe('');
    const call = await terminalCall(acme, `agent-${draft.id}`);
    expect(call.attributes).toMatchObject({ status: 'no_answer', sip_code: 480 });
  }, 90_000);

  it("a handoff transfers the caller to the operator's phone: REFER through the edge, the operator rings and answers, joins the Call and goes busy", async () => {
    const records = t.services.records!;
    const actor = systemActor(acme.tenant.organisationId, 'test');
    const handing = await records.create(actor, 'AiAgent', {
      name: 'Handing',
      published: true,
      languages: ['en'],
      workflow: {
        steps: [
          { type: 'message', text: 'One moment please.' },
          { type: 'handoff', reason: 'The caller asked for a person.' },
        ],
      },
    });
    // The operator: a SIP user of the tenant's operator, available, registered and answering.
    const opName = `op${Date.now().toString(36)}`;
    const opPassword = `pw-${opName}-secret`;
    const op = await acme.admin.post(
      '/api/sip_users',
      resourceDocument('SipUser', { sip_username: opName, sip_password: opPassword, user_id: acme.tenant.operator.id }),
    );
    expect(op.status).toBe(201);
    const opSipUserId = op.body.data.id as string;
    const status = await records.create(actor, 'OperatorStatus', { sip_user_id: opSipUserId, status: 'available', source: 'widget' });
    const opPort = await freeUdpPort();
    expect((await register(stack, opName, opPassword, opPort, undefined, acme.domain)).code).toBe(0);
    const operatorPhone = sipp('callee_answer', undefined, { localPort: opPort, keys: { domain: acme.domain }, timeoutSeconds: 60 });

    const caller = await sipUser(acme);
    const callerPort = await freeUdpPort();
    expect((await register(stack, caller.name, caller.password, callerPort, undefined, acme.domain)).code).toBe(0);
    const recorder = await startRecorder();
    const target = `agent-${handing.id}`;
    const transferee = sipp('agent_transfer_caller', stack.port, {
      localPort: callerPort,
      keys: { from: caller.name, domain: acme.domain, rtp: String(recorder.port) },
      args: ['-s', target, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 90,
    });
    // The agent said its line and REFERred the caller to the operator's phone.
    let ended: { errors: string } | undefined;
    void transferee.then((r) => (ended = r));
    const transfer = await until(
      async () => {
        if (ended) throw new Error(`the caller ended before the REFER: ${ended.errors}`);
        return voice.transfers()[0];
      },
      'the REFER',
      40_000,
    );
    expect(transfer.target).toBe(`sip:${opName}@${acme.domain}`);
    // The caller follows the REFER: a new call to the Refer-To target, through the edge (the same SIP user).
    const followed = await sipp('caller_call', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain: acme.domain },
      args: ['-s', opName, '-au', caller.name, '-ap', caller.password, '-d', '1500'],
      timeoutSeconds: 30,
    });
    expect(followed.errors, followed.errors).toBe('');
    const first = await transferee;
    await recorder.close();
    expect(first.errors, first.errors).toBe('');
    expect(first.logs).toContain(`user: ${opName}`);
    expect((await operatorPhone).code).toBe(0);
    expect(loudFrames(recorder.audio('G722'))).toBeGreaterThan(10);

    // The agent's Call: completed when the operator's leg ended, with the operator's leg; the conversation handed
    // off to the operator.
    const call = await terminalCall(acme, target);
    expect(call.attributes.status).toBe('completed');
    const parties = await legs(acme, call.id);
    expect(parties.map((p) => [p.role, p.member_uuid])).toEqual([
      ['caller', caller.id],
      ['agent', handing.id],
      ['callee', opSipUserId],
    ]);
    const conversation = await acme.admin.get(`/api/conversations/${call.attributes.conversation_id}`);
    expect(conversation.body.data.attributes.status).toBe('pending');
    expect(conversation.body.data.attributes.metadata.assigned_operator).toBe(acme.tenant.operator.id);
    // The operator went busy (a system change) when the transfer was answered.
    const events = await t.db
      .selectFrom('operator_status_events')
      .select(['status', 'source'])
      .where('operator_status_id', '=', status.id)
      .orderBy('occurred_at')
      .execute();
    expect(events).toContainEqual({ status: 'busy', source: 'system' });
    // The caller's call to the operator is a leg of the same Call (the edge links a REFER's new call: docs/sip.md,
    // "Transfers"), not a Call of its own; every leg has left when the call ended.
    expect(parties.every((p) => p.left_at)).toBe(true);
    const own = await acme.admin.get(`/api/calls?filter[to_number]=${opName}`);
    expect(own.status).toBe(200);
    expect(own.body.data).toEqual([]);
  }, 150_000);

  it('a handoff with no operator available: the agent says so and hangs up; the conversation stays queued', async () => {
    const actor = systemActor(globex.tenant.organisationId, 'test');
    const lonely = await t.services.records!.create(actor, 'AiAgent', {
      name: 'Lonely',
      published: true,
      languages: ['en'],
      workflow: { steps: [{ type: 'handoff', reason: 'Always a person.' }] },
    });
    const caller = await sipUser(globex);
    const port = await freeUdpPort();
    expect((await register(stack, caller.name, caller.password, port, undefined, globex.domain)).code).toBe(0);
    const recorder = await startRecorder();
    const target = `agent-${lonely.id}`;
    const placing = await sipp('agent_caller', stack.port, {
      localPort: port,
      keys: { from: caller.name, domain: globex.domain, rtp: String(recorder.port) },
      args: ['-s', target, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 60,
    });
    await recorder.close();
    expect(placing.errors, placing.errors).toBe('');
    expect(voice.transfers()).toEqual([]);
    const call = await terminalCall(globex, target);
    expect(call.attributes.status).toBe('completed');
    const said = (await lines(globex, call.id)).map((l) => l.content);
    expect(said).toContain(NO_OPERATOR_TEXT);
    const conversation = await globex.admin.get(`/api/conversations/${call.attributes.conversation_id}`);
    expect(conversation.body.data.attributes.status).toBe('pending');
  }, 90_000);

  it('an agent acts on a call: search_knowledge answers, a signed tool request runs while its say_while_waiting line is spoken, the call is analysed when it ends', async () => {
    // The organisation's tool secret, shown once; the fake tool receiver checks each request with it, and answers
    // after 2.5 s (a slow system: the caller hears the waiting line meanwhile).
    const made = await acme.admin.post('/api/organisations/tool_secret', { data: { type: 'Organisation', attributes: {} } });
    expect(made.status).toBe(200);
    const secret = made.body.meta.tool_secret as string;
    const received: { body: string; verified: boolean; headers: http.IncomingHttpHeaders }[] = [];
    const receiver = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        let verified = false;
        try {
          new Webhook(secret).verify(body, req.headers as Record<string, string>);
          verified = true;
        } catch {}
        received.push({ body, verified, headers: req.headers });
        setTimeout(
          () => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ status: 'shipped', eta: '2 days' })),
          2500,
        );
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    const WAITING = 'One moment while I look up your order.';
    try {
      const created = await acme.admin.post(
        '/api/ai_agents',
        resourceDocument('AiAgent', {
          name: 'Orders',
          published: true,
          languages: ['en'],
          workflow: {
            tools: [
              {
                name: 'lookup_order',
                description: 'Look up an order by its number.',
                parameters: { type: 'object', properties: { order: { type: 'string' } }, required: ['order'], additionalProperties: false },
                url: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/tools/lookup`,
                timeout_ms: 15_000,
                say_while_waiting: WAITING,
              },
            ],
            knowledge: { mode: 'tool' },
            analysis: {
              schema: { type: 'object', required: ['topic'], properties: { topic: { enum: ['refund', 'shipping', 'other'] } } },
              success_criteria: 'The caller learnt where the order is.',
            },
          },
        }),
      );
      expect(created.status).toBe(201);
      const ordersId = created.body.data.id as string;
      const doc = await acme.admin.post(
        '/api/knowledge_documents',
        resourceDocument('KnowledgeDocument', {
          ai_agent_id: ordersId,
          title: 'Returns',
          content: 'Refunds are paid within five working days of the parcel reaching the warehouse.',
        }),
      );
      expect(doc.status).toBe(201);
      const seen = model.requests.length;
      // The call's opening turn: a search, the order lookup, then the answer and the end of the call.
      model.script(
        { toolCalls: [{ name: 'search_knowledge', arguments: { query: 'how long do refunds take' } }] },
        { toolCalls: [{ name: 'lookup_order', arguments: { order: '42' } }] },
        {
          text: 'Order 42 has shipped. Goodbye.',
          toolCalls: [{ name: 'end_conversation', arguments: { reason: 'answered' } }],
        },
      );

      const caller = await sipUser(acme);
      const port = await freeUdpPort();
      expect((await register(stack, caller.name, caller.password, port, undefined, acme.domain)).code).toBe(0);
      const recorder = await startRecorder();
      const target = `agent-${ordersId}`;
      const placing = await sipp('agent_caller_long', stack.port, {
        localPort: port,
        keys: { from: caller.name, domain: acme.domain, rtp: String(recorder.port) },
        args: ['-s', target, '-au', caller.name, '-ap', caller.password],
        timeoutSeconds: 100,
      });
      await recorder.close();
      expect(realErrors(placing.errors), placing.errors).toBe('');
      expect(loudFrames(recorder.audio('G722'))).toBeGreaterThan(50);

      // The tool request: one, signed with the organisation's tool secret, the model's arguments as its body.
      expect(received).toHaveLength(1);
      expect(received[0].verified).toBe(true);
      expect(JSON.parse(received[0].body)).toEqual({ order: '42' });
      expect(received[0].headers['parley-tool']).toBe('lookup_order');
      // What the model was given back: the passage (with its document id), then the tool's answer.
      const turnRequests = model.requests
        .slice(seen)
        .filter((r) => !(r.body.tools ?? []).some((x) => x.function.name === 'record_analysis'));
      expect(turnRequests.length).toBeGreaterThanOrEqual(3);
      const toolResults = turnRequests[2].body.messages.filter((m) => m.role === 'tool').map((m) => m.content);
      expect(toolResults[0]).toContain(doc.body.data.id);
      expect(toolResults[0]).toContain('five working days');
      expect(JSON.parse(toolResults[1])).toEqual({ status: 'shipped', eta: '2 days' });
      // The tools are on the offer of a call: transfer_call among the built-in ones.
      expect(turnRequests[0].body.tools!.map((x) => x.function.name)).toEqual(
        expect.arrayContaining(['lookup_order', 'search_knowledge', 'transfer_call', 'end_conversation']),
      );

      const call = await terminalCall(acme, target);
      expect(call.attributes.status).toBe('completed');
      // The waiting line was said (an agent transcript line marked with its tool) before the reply.
      const said = await t.db
        .selectFrom('call_transcripts')
        .select(['speaker', 'content', 'metadata', 'content_index'])
        .where('call_id', '=', call.id)
        .orderBy('content_index')
        .execute();
      const waiting = said.find((l) => l.content === WAITING);
      expect(waiting, JSON.stringify(said)).toBeDefined();
      expect(waiting).toMatchObject({ speaker: 'agent', metadata: { say_while_waiting: 'lookup_order', spoken: true } });
      const reply = said.find((l) => l.content === 'Order 42 has shipped. Goodbye.');
      expect(reply).toBeDefined();
      expect(reply!.content_index).toBeGreaterThan(waiting!.content_index);

      // The conversation: tool items, the reply citing the document, closed by end_conversation, then analysed.
      const conversationId = call.attributes.conversation_id as string;
      const items = await acme.admin.get(`/api/conversations/${conversationId}/conversation_items?sort=content_index`);
      expect(items.status, JSON.stringify(items.body)).toBe(200);
      const rows = items.body.data.map((i: { attributes: Record<string, unknown> }) => i.attributes) as {
        role: string;
        content: string;
        metadata: Record<string, unknown>;
      }[];
      expect(rows.filter((i) => i.role === 'tool').map((i) => (i.metadata.tool as { name: string; ok: boolean }).name)).toEqual([
        'search_knowledge',
        'lookup_order',
        'end_conversation',
      ]);
      const answer = rows.find((i) => i.role === 'assistant')!;
      expect(answer.metadata.sources).toEqual([{ document_id: doc.body.data.id, title: 'Returns', chunk: 0 }]);
      const analysed = await until(
        async () => {
          const c = await acme.admin.get(`/api/conversations/${conversationId}`);
          return c.body.data.attributes.analysis ? c.body.data.attributes : undefined;
        },
        'the analysis of the call',
        30_000,
      );
      expect(analysed.status).toBe('closed');
      expect(analysed.analysis).toMatchObject({ summary: 'The caller asked about an order.', success: true, data: { topic: 'shipping' } });
      // The analysis request carried the call's transcript and the workflow's schema.
      const analysisRequest = model.requests
        .slice(seen)
        .find(
          (r) =>
            r.body.messages.some((m) => m.content?.includes('Order 42 has shipped')) &&
            (r.body.tools ?? []).some((x) => x.function.name === 'record_analysis'),
        );
      expect(analysisRequest).toBeDefined();
      expect(JSON.stringify(analysisRequest!.body.tools)).toContain('"shipping"');
    } finally {
      receiver.closeAllConnections();
      await new Promise<void>((resolve) => receiver.close(() => resolve()));
    }
  }, 150_000);

  it('transfer_call sends the caller to a SIP user of the organisation: REFER through the edge, the phone rings and answers, the Call has its leg', async () => {
    const created = await acme.admin.post(
      '/api/ai_agents',
      resourceDocument('AiAgent', { name: 'Switchboard', published: true, languages: ['en'] }),
    );
    expect(created.status).toBe(201);
    const switchboardId = created.body.data.id as string;
    // The target: a SIP user of the organisation (no operator), registered and answering.
    const sales = await sipUser(acme);
    const salesPort = await freeUdpPort();
    expect((await register(stack, sales.name, sales.password, salesPort, undefined, acme.domain)).code).toBe(0);
    const phone = sipp('callee_answer', undefined, { localPort: salesPort, keys: { domain: acme.domain }, timeoutSeconds: 60 });
    model.script({
      text: 'Putting you through to sales.',
      toolCalls: [{ name: 'transfer_call', arguments: { to: sales.name, reason: 'A sales question.' } }],
    });

    const caller = await sipUser(acme);
    const callerPort = await freeUdpPort();
    expect((await register(stack, caller.name, caller.password, callerPort, undefined, acme.domain)).code).toBe(0);
    const recorder = await startRecorder();
    const target = `agent-${switchboardId}`;
    const transferee = sipp('agent_transfer_caller', stack.port, {
      localPort: callerPort,
      keys: { from: caller.name, domain: acme.domain, rtp: String(recorder.port) },
      args: ['-s', target, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 90,
    });
    let ended: { errors: string } | undefined;
    void transferee.then((r) => (ended = r));
    const referTo = `sip:${sales.name}@${acme.domain}`;
    await until(
      async () => {
        if (ended) throw new Error(`the caller ended before the REFER: ${ended.errors}`);
        return voice.transfers().find((x) => x.target === referTo);
      },
      'the REFER',
      40_000,
    );
    // The caller follows the REFER: its new call to the Refer-To target goes through the edge.
    const followed = await sipp('caller_call', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, domain: acme.domain },
      args: ['-s', sales.name, '-au', caller.name, '-ap', caller.password, '-d', '1500'],
      timeoutSeconds: 30,
    });
    expect(followed.errors, followed.errors).toBe('');
    const first = await transferee;
    await recorder.close();
    expect(first.errors, first.errors).toBe('');
    expect(first.logs).toContain(`user: ${sales.name}`);
    expect((await phone).code).toBe(0);

    // One Call: the caller, the agent (who left after the REFER), and the SIP user the call was transferred to.
    const call = await terminalCall(acme, target);
    expect(call.attributes.status).toBe('completed');
    const parties = await legs(acme, call.id);
    expect(parties.map((p) => [p.role, p.member_uuid])).toEqual([
      ['caller', caller.id],
      ['agent', switchboardId],
      ['callee', sales.id],
    ]);
    expect(parties.every((p) => p.left_at)).toBe(true);
    // The conversation records the call (its target on the tool item), and closed with the Call: no operator queue.
    const conversationId = call.attributes.conversation_id as string;
    const tool = await t.db
      .selectFrom('conversation_items')
      .select('metadata')
      .where('conversation_id', '=', conversationId)
      .where('role', '=', 'tool')
      .executeTakeFirstOrThrow();
    expect(tool.metadata).toMatchObject({
      tool: {
        name: 'transfer_call',
        ok: true,
        transfer: { kind: 'sip_user', to: sales.name, sip_user_id: sales.id, reason: 'A sales question.' },
      },
    });
    const conversation = await acme.admin.get(`/api/conversations/${conversationId}`);
    expect(conversation.body.data.attributes.status).toBe('closed');
    const queued = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM agent_handoffs WHERE conversation_id = ${conversationId}`.execute(t.db);
    expect(queued.rows[0].n).toBe(0);
    const said = (await lines(acme, call.id)).map((l) => l.content);
    expect(said).toContain('Putting you through to sales.');
    // The end of the call closed the conversation, which queued its analysis.
    const analysed = await until(
      async () => (await acme.admin.get(`/api/conversations/${conversationId}`)).body.data.attributes.analysis ?? undefined,
      'the analysis of the transferred call',
      30_000,
    );
    expect(analysed).toMatchObject({ summary: 'The caller asked about an order.', success: true, data: { topic: 'shipping' } });
  }, 150_000);

  it('a transfer_call whose target does not answer hands the call off (transfer_failed); with no operator the agent says so and hangs up', async () => {
    // Globex has no operator available (the handoff that follows finds no one to REFER the caller to).
    const busy = await sipUser(globex);
    const created = await globex.admin.post(
      '/api/ai_agents',
      resourceDocument('AiAgent', { name: 'Relay', published: true, languages: ['en'] }),
    );
    expect(created.status).toBe(201);
    model.script({ text: 'Transferring you.', toolCalls: [{ name: 'transfer_call', arguments: { to: busy.name } }] });
    const caller = await sipUser(globex);
    const port = await freeUdpPort();
    expect((await register(stack, caller.name, caller.password, port, undefined, globex.domain)).code).toBe(0);
    const recorder = await startRecorder();
    const target = `agent-${created.body.data.id}`;
    const placing = await sipp('agent_transfer_failed_caller', stack.port, {
      localPort: port,
      keys: { from: caller.name, domain: globex.domain, rtp: String(recorder.port) },
      args: ['-s', target, '-au', caller.name, '-ap', caller.password],
      timeoutSeconds: 90,
    });
    await recorder.close();
    expect(realErrors(placing.errors), placing.errors).toBe('');
    expect(placing.logs).toContain(`user: ${busy.name}`);

    // The Call ends with the agent's BYE: the caller's NOTIFY told the edge the transfer failed, so it awaits no other
    // (reconciliation, which would end it too, is off in these tests: SIP_RECONCILE_INTERVAL_MS).
    const call = await until(
      async () => {
        const found = (await globex.admin.get(`/api/calls?filter[to_number]=${encodeURIComponent(target)}`)).body.data[0];
        return found?.attributes.status === 'completed' ? found : undefined;
      },
      `the call to ${target} completed`,
      20_000,
    );
    // No leg for the target: its call never happened.
    expect((await legs(globex, call.id)).map((p) => p.role)).toEqual(['caller', 'agent']);
    const said = (await lines(globex, call.id)).map((l) => l.content);
    expect(said).toContain('Transferring you.');
    expect(said).toContain(NO_OPERATOR_TEXT);
    // Queued for an operator, saying which transfer failed.
    const conversationId = call.attributes.conversation_id as string;
    const conversation = await globex.admin.get(`/api/conversations/${conversationId}`);
    expect(conversation.body.data.attributes.status).toBe('pending');
    const note = await t.db
      .selectFrom('conversation_items')
      .select(['content', 'metadata'])
      .where('conversation_id', '=', conversationId)
      .where('role', '=', 'system')
      .executeTakeFirstOrThrow();
    expect(note.content).toBe(`Handed to an operator: The transfer to ${busy.name} did not go through.`);
    expect(note.metadata).toMatchObject({ handoff: { rule: 'transfer_failed', transfer: { kind: 'sip_user', to: busy.name } } });
  }, 150_000);

  it('the runtime answers no one but the edge: an INVITE sent to it directly gets 403', async () => {
    const socket = dgram.createSocket('udp4');
    await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
    const local = `127.0.0.1:${socket.address().port}`;
    const sdp = 'v=0\r\no=x 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n';
    const invite = [
      `INVITE sip:agent-${agentId}@127.0.0.1:${voicePort} SIP/2.0`,
      `Via: SIP/2.0/UDP ${local};branch=${branch()};rport`,
      'Max-Forwards: 70',
      `From: <sip:intruder@${local}>;tag=${tag()}`,
      `To: <sip:agent-${agentId}@127.0.0.1>`,
      `Call-ID: ${tag()}@intruder`,
      'CSeq: 1 INVITE',
      `Contact: <sip:intruder@${local}>`,
      'Content-Type: application/sdp',
      `Content-Length: ${sdp.length}`,
      '',
      sdp,
    ].join('\r\n');
    const answer = await new Promise<string>((resolve) => {
      const timer = setTimeout(() => resolve(''), 3000);
      socket.on('message', (data) => {
        clearTimeout(timer);
        resolve(data.toString('utf8'));
      });
      socket.send(invite, voicePort, '127.0.0.1');
    });
    await new Promise<void>((resolve) => socket.close(() => resolve()));
    expect(answer).toMatch(/^SIP\/2\.0 403 /);
    expect(voice.activeCalls).toBe(0);
  });
});
