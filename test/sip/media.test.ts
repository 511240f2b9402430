/**
 * The media plane end to end: rtpengine run by the SIP edge, Kamailio anchoring a call between two registered
 * SIPp phones, RTP sent and received by sockets of this test (named in each phone's SDP), the session deleted
 * at BYE, supervision (kill -9 of `sip serve` and of rtpengine) and a taken RTP range. PostgreSQL, Kamailio,
 * SIPp and rtpengine (skipped, with the reason, without).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NgAnswer } from '../../src/sip/rtpengine.js';
import { client, resourceDocument, type Client } from '../helpers/http.js';
import { startTestApp, type TestApp } from '../support/app.js';
import { seedTenant, type Tenant } from '../support/seed.js';
import { DOMAIN, freeUdpPort, register, type SipStack, sipp, sipSkipReason, startSipStack, until } from './harness.js';

const skip = sipSkipReason();
if (skip) console.warn(`media plane tests skipped: ${skip}`);

const ADVERTISED = '203.0.113.7';

/** A UDP socket standing for a phone's audio: every datagram with the address it came from. */
async function mediaSocket() {
  const socket = dgram.createSocket('udp4');
  const received: { data: Buffer; address: string; port: number }[] = [];
  socket.on('message', (data, rinfo) => received.push({ data, address: rinfo.address, port: rinfo.port }));
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  return {
    socket,
    port: socket.address().port,
    received,
    close: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}

/** One RTP packet (RFC 3550): PCMU (payload type 0), 160 bytes of `fill`. */
function rtp(seq: number, ssrc: number, fill: number): Buffer {
  const packet = Buffer.alloc(12 + 160, fill);
  packet[0] = 0x80;
  packet[1] = 0;
  packet.writeUInt16BE(seq & 0xffff, 2);
  packet.writeUInt32BE(seq * 160, 4);
  packet.writeUInt32BE(ssrc, 8);
  return packet;
}

function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

interface Stream {
  localPort: number;
  endpointPort: number | undefined;
}

/** Every stream of rtpengine's session for `callId` (ng `query`): its local port and the endpoint it faces. */
function streamsOf(answer: NgAnswer): Stream[] {
  const streams: Stream[] = [];
  const tags = (answer.tags ?? {}) as Record<string, { medias?: { streams?: Record<string, unknown>[] }[] }>;
  for (const tag of Object.values(tags)) {
    for (const media of tag.medias ?? []) {
      for (const stream of media.streams ?? []) {
        const endpoint = stream.endpoint as { port?: number } | undefined;
        streams.push({ localPort: Number(stream['local port']), endpointPort: endpoint?.port });
      }
    }
  }
  return streams;
}

describe.skipIf(skip !== undefined)('media plane (rtpengine, Kamailio, SIPp)', () => {
  let t: TestApp;
  let tenant: Tenant;
  let admin: Client;
  let stack: SipStack;
  let n = 0;
  const cleanup: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    t = await startTestApp();
    tenant = await seedTenant(t, 'Media');
    admin = client(t.app, tenant.admin.token);
    stack = await startSipStack(t, { MEDIA_ADVERTISED_ADDRESS: ADVERTISED });
  }, 60_000);
  afterAll(async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
    await stack?.stop();
    await t?.close();
  });

  async function sipUser() {
    const name = `m${Date.now().toString(36)}${n++}`;
    const password = `pw-${name}-secret`;
    const response = await admin.post('/api/sip_users', resourceDocument('SipUser', { sip_username: name, sip_password: password }));
    expect(response.status).toBe(201);
    return { id: response.body.data.id as string, name, password };
  }

  async function callRow(from: string) {
    return t.db
      .selectFrom('calls')
      .select(['id', 'status', 'call_uuid'])
      .where('organisation_id', '=', tenant.organisationId)
      .where('from_number', '=', from)
      .executeTakeFirst();
  }

  it.each([
    ['media_caller', 'an offer in the INVITE, the answer in the 200', 'answer-sdp', 'offer-sdp'],
    ['media_caller_late', 'a late offer: the offer in the 200, the answer in the ACK', 'offer-sdp', 'answer-sdp'],
  ])(
    'anchors a call between two registered phones (%s: %s): each SDP names rtpengine, RTP flows through it, the session ends at BYE',
    async (scenario, _what, callerSees, calleeSees) => {
      const caller = await sipUser();
      const callee = await sipUser();
      const callerAudio = await mediaSocket();
      const calleeAudio = await mediaSocket();
      cleanup.push(callerAudio.close, calleeAudio.close);
      const calleePort = await freeUdpPort();
      expect((await register(stack, callee.name, callee.password, calleePort)).code).toBe(0);
      const answering = sipp('media_callee', undefined, {
        localPort: calleePort,
        keys: { mport: String(calleeAudio.port) },
        timeoutSeconds: 40,
      });
      await new Promise((resolve) => setTimeout(resolve, 300));
      const placing = sipp(scenario, stack.port, {
        localPort: await freeUdpPort(),
        keys: { from: caller.name, mport: String(callerAudio.port) },
        timeoutSeconds: 40,
        args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password, '-d', '5000'],
      });

      const call = await until(async () => {
        const row = await callRow(caller.name);
        return row?.status === 'in_progress' ? row : undefined;
      }, 'the call to be answered');
      const callId = call.call_uuid as string;

      // rtpengine holds the session: one stream faces the caller's audio socket, one the callee's.
      const session = await stack.edge.rtpengine.ng('query', { 'call-id': callId });
      expect(session.result).toBe('ok');
      const streams = streamsOf(session);
      const facingCaller = streams.find((s) => s.endpointPort === callerAudio.port);
      const facingCallee = streams.find((s) => s.endpointPort === calleeAudio.port);
      expect(facingCaller, JSON.stringify(session)).toBeDefined();
      expect(facingCallee, JSON.stringify(session)).toBeDefined();
      const { min, max } = stack.edge.rtpengine.media;
      for (const s of [facingCaller!, facingCallee!]) {
        expect(s.localPort).toBeGreaterThanOrEqual(min);
        expect(s.localPort).toBeLessThanOrEqual(max);
      }

      // Each phone sends 50 packets (1 s of PCMU) to the port its SDP named; the other receives them from
      // rtpengine's port facing it, never from the sender's own socket.
      for (let i = 0; i < 50; i++) {
        callerAudio.socket.send(rtp(i, 0x1111, 0x11), facingCaller!.localPort, '127.0.0.1');
        calleeAudio.socket.send(rtp(i, 0x2222, 0x22), facingCallee!.localPort, '127.0.0.1');
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      await until(
        async () => (calleeAudio.received.length >= 45 && callerAudio.received.length >= 45 ? true : undefined),
        'RTP through rtpengine',
        5000,
      );
      for (const [receiver, sender, facing, fill] of [
        [calleeAudio, callerAudio, facingCallee!, 0x11],
        [callerAudio, calleeAudio, facingCaller!, 0x22],
      ] as const) {
        for (const packet of receiver.received) {
          expect(packet.address).toBe('127.0.0.1');
          expect(packet.port).toBe(facing.localPort);
          expect(packet.port).not.toBe(sender.port);
          // PCMU on both sides: passed through, payload untouched.
          expect(packet.data.subarray(12).every((byte) => byte === fill)).toBe(true);
        }
      }

      const [placed, answered] = await Promise.all([placing, answering]);
      expect(placed.errors + answered.errors).toBe('');
      expect(placed.code).toBe(0);
      expect(answered.code).toBe(0);
      // The SDP each phone received names rtpengine (the advertised address) and its port facing that phone.
      expect(placed.logs).toContain(`${callerSees} ${ADVERTISED} ${facingCaller!.localPort} RTP/AVP`);
      expect(answered.logs).toContain(`${calleeSees} ${ADVERTISED} ${facingCallee!.localPort} RTP/AVP`);

      // BYE deleted the session.
      const after = await until(
        async () => {
          const answer = await stack.edge.rtpengine.ng('query', { 'call-id': callId });
          return answer.result === 'error' ? answer : undefined;
        },
        'the session to be deleted',
        5000,
      );
      expect(String(after['error-reason'])).toMatch(/unknown call-id/i);
      const list = await stack.edge.rtpengine.ng('list');
      expect(list.calls as string[]).not.toContain(callId);
      const ended = await until(async () => {
        const row = await callRow(caller.name);
        return row?.status === 'completed' ? row : undefined;
      }, 'the call to be completed');
      expect(ended.status).toBe('completed');
    },
    90_000,
  );

  it('a re-INVITE moving the caller to another port is offered to rtpengine: the audio follows the caller', async () => {
    const caller = await sipUser();
    const callee = await sipUser();
    const first = await mediaSocket();
    const second = await mediaSocket();
    const calleeAudio = await mediaSocket();
    cleanup.push(first.close, second.close, calleeAudio.close);
    const calleePort = await freeUdpPort();
    expect((await register(stack, callee.name, callee.password, calleePort)).code).toBe(0);
    const answering = sipp('media_callee_reinvite', undefined, {
      localPort: calleePort,
      keys: { mport: String(calleeAudio.port) },
      timeoutSeconds: 40,
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const placing = sipp('media_caller_reinvite', stack.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name, mport: String(first.port), mport2: String(second.port) },
      timeoutSeconds: 40,
      args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password, '-d', '4000'],
    });
    const call = await until(async () => {
      const row = await callRow(caller.name);
      return row?.status === 'in_progress' ? row : undefined;
    }, 'the call to be answered');
    // After the re-INVITE, rtpengine's stream facing the caller points at its second socket.
    const moved = await until(
      async () => {
        const streams = streamsOf(await stack.edge.rtpengine.ng('query', { 'call-id': call.call_uuid as string }));
        return streams.some((s) => s.endpointPort === second.port) ? streams : undefined;
      },
      'the re-INVITE to reach rtpengine',
      10_000,
    );
    const facingCallee = moved.find((s) => s.endpointPort === calleeAudio.port)!;
    expect(facingCallee).toBeDefined();
    for (let i = 0; i < 10; i++) {
      calleeAudio.socket.send(rtp(i, 0x5555, 0x55), facingCallee.localPort, '127.0.0.1');
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await until(async () => (second.received.length >= 8 ? true : undefined), 'the callee heard on the new port', 5000);
    const [placed, answered] = await Promise.all([placing, answering]);
    expect(placed.errors + answered.errors).toBe('');
    expect(placed.code).toBe(0);
    expect(answered.code).toBe(0);
    // The callee was offered rtpengine's address again, with the port rtpengine now faces it from (the
    // re-offer may move it, RFC 3264 section 8); neither phone saw the other's address.
    const reoffered = /reoffer-sdp (\S+) (\d+)/.exec(answered.logs)!;
    expect(reoffered[1]).toBe(ADVERTISED);
    expect(reoffered[2]).toBe(String(facingCallee.localPort));
    expect(placed.logs).toMatch(new RegExp(`reanswer-sdp ${ADVERTISED.replaceAll('.', '\\.')} \\d+ RTP/AVP`));
    expect(answered.logs).not.toContain(String(second.port));
  }, 90_000);

  it('phones behind NAT: reached at the address they send from (RFC 3581), their media sent where their SIP came from, not to their private SDP address', async () => {
    const caller = await sipUser();
    const callee = await sipUser();
    const callerAudio = await mediaSocket();
    const calleeAudio = await mediaSocket();
    cleanup.push(callerAudio.close, calleeAudio.close);
    // Both phones claim 192.168.1.50:5060 in Via, Contact and SDP; their packets come from 127.0.0.1.
    const keys = { private: '192.168.1.50' };
    const calleePort = await freeUdpPort();
    const registered = await sipp('register_nat', stack.port, {
      localPort: calleePort,
      keys,
      args: ['-s', callee.name, '-au', callee.name, '-ap', callee.password],
    });
    expect(registered.errors).toBe('');
    expect(registered.code).toBe(0);
    const answering = sipp('media_callee_nat', undefined, {
      localPort: calleePort,
      keys: { ...keys, mport: String(calleeAudio.port) },
      timeoutSeconds: 40,
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const placing = sipp('media_caller_nat', stack.port, {
      localPort: await freeUdpPort(),
      keys: { ...keys, from: caller.name, mport: String(callerAudio.port) },
      timeoutSeconds: 40,
      args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password, '-d', '4000'],
    });
    // The INVITE reached the callee (its registration's source address, not 192.168.1.50) and it answered.
    const call = await until(async () => {
      const row = await callRow(caller.name);
      return row?.status === 'in_progress' ? row : undefined;
    }, 'the call to be answered');
    const session = await stack.edge.rtpengine.ng('query', { 'call-id': call.call_uuid as string });
    const streams = streamsOf(session);
    // rtpengine took each phone's media address from where its SIP came (SIP-source-address): 127.0.0.1 and
    // the SDP's port, not 192.168.1.50.
    const facingCaller = streams.find((s) => s.endpointPort === callerAudio.port);
    const facingCallee = streams.find((s) => s.endpointPort === calleeAudio.port);
    expect(facingCaller, JSON.stringify(session)).toBeDefined();
    expect(facingCallee, JSON.stringify(session)).toBeDefined();
    expect(JSON.stringify(session)).not.toContain('192.168.1.50');
    // The callee talks first: the caller hears it before sending a packet itself (nothing to learn from yet).
    for (let i = 0; i < 10; i++) {
      calleeAudio.socket.send(rtp(i, 0x3333, 0x33), facingCallee!.localPort, '127.0.0.1');
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await until(async () => (callerAudio.received.length >= 8 ? true : undefined), 'the callee heard by the caller', 5000);
    for (let i = 0; i < 10; i++) {
      callerAudio.socket.send(rtp(i, 0x4444, 0x44), facingCaller!.localPort, '127.0.0.1');
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await until(async () => (calleeAudio.received.length >= 8 ? true : undefined), 'the caller heard by the callee', 5000);
    expect(callerAudio.received.every((p) => p.port === facingCaller!.localPort)).toBe(true);
    expect(calleeAudio.received.every((p) => p.port === facingCallee!.localPort)).toBe(true);
    // In-dialog requests (the ACK, the BYE) reached the callee too: the call ends normally.
    const [placed, answered] = await Promise.all([placing, answering]);
    expect(placed.errors + answered.errors).toBe('');
    expect(placed.code).toBe(0);
    expect(answered.code).toBe(0);
    expect(placed.logs).toContain(`answer-sdp ${ADVERTISED} ${facingCaller!.localPort} RTP/AVP`);
    await until(async () => ((await callRow(caller.name))?.status === 'completed' ? true : undefined), 'the call to be completed');
  }, 90_000);

  it('refuses calls with 503 (recorded failed) while rtpengine does not answer: never relayed unanchored', async () => {
    const own = await startSipStack(t);
    cleanup.push(() => own.stop());
    const caller = await sipUser();
    const callee = await sipUser();
    const calleePort = await freeUdpPort();
    expect((await register(own, callee.name, callee.password, calleePort)).code).toBe(0);
    // The callee's phone (its registered port): nothing may reach it.
    const reached: string[] = [];
    const calleeSocket = dgram.createSocket('udp4');
    calleeSocket.on('message', (m) => reached.push(m.toString('utf8')));
    await new Promise<void>((resolve) => calleeSocket.bind(calleePort, '127.0.0.1', resolve));
    cleanup.push(async () => calleeSocket.close());

    const pid = own.edge.rtpengine.pid()!;
    process.kill(pid, 'SIGKILL');
    await own.edge.rtpengine.exited;
    const refused = await sipp('caller_refused_503', own.port, {
      localPort: await freeUdpPort(),
      keys: { from: caller.name },
      timeoutSeconds: 30,
      args: ['-s', callee.name, '-au', caller.name, '-ap', caller.password],
    });
    expect(refused.errors).toBe('');
    expect(refused.code).toBe(0);
    expect(reached.filter((m) => m.startsWith('INVITE'))).toEqual([]);
    const row = await until(async () => {
      const found = await t.db
        .selectFrom('calls')
        .select(['status', 'sip_code'])
        .where('organisation_id', '=', tenant.organisationId)
        .where('from_number', '=', caller.name)
        .executeTakeFirst();
      return found?.status === 'failed' ? found : undefined;
    }, 'the refused call to be recorded');
    expect(row.sip_code).toBe(503);
  }, 90_000);

  it('refuses to start, saying so, when the RTP port range is taken', async () => {
    const min = 20000 + 2 * Math.floor(Math.random() * 4900);
    const holders: dgram.Socket[] = [];
    try {
      for (let port = min; port < min + 8; port++) {
        const holder = dgram.createSocket('udp4');
        await new Promise<void>((resolve, reject) => {
          holder.once('error', reject);
          holder.bind(port, '127.0.0.1', resolve);
        });
        holders.push(holder);
      }
      await expect(startSipStack(t, { RTP_PORT_MIN: String(min), RTP_PORT_MAX: String(min + 7) })).rejects.toThrow(
        new RegExp(`RTP port range 127\\.0\\.0\\.1:${min}-${min + 7} \\(RTP_PORT_MIN\\.\\.RTP_PORT_MAX\\) is taken: 8 of 8 ports`),
      );
    } finally {
      for (const holder of holders) holder.close();
    }
    // Free again: the same range starts.
    const started = await startSipStack(t, { RTP_PORT_MIN: String(min), RTP_PORT_MAX: String(min + 7) });
    expect((await started.edge.rtpengine.ng('ping')).result).toBe('pong');
    await started.stop();
  }, 60_000);

  it('kill -9 of `sip serve` takes rtpengine with it; kill -9 of rtpengine ends `sip serve` (status 1) and Kamailio', async () => {
    const serve = async (runDir: string, port: number) => {
      const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', path.resolve('src/cli/main.ts'), 'sip', 'serve'], {
        env: {
          ...process.env,
          DATABASE_URL: t.config.databaseUrl,
          SIP_LISTEN: `udp:127.0.0.1:${port}`,
          SIP_DOMAIN: DOMAIN,
          SIP_RUN_DIR: runDir,
          SIP_CHILDREN: '2',
          RTP_PORT_MIN: String(20000 + 2 * Math.floor(Math.random() * 4900)),
          RTP_PORT_MAX: '29999',
          LOG_LEVEL: 'silent',
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      cleanup.push(async () => child.kill('SIGKILL'));
      let output = '';
      child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      await new Promise<void>((resolve, reject) => {
        child.stdout!.on('data', (chunk: Buffer) => {
          if (chunk.toString().includes('Parley SIP edge:')) resolve();
        });
        void exited.then((code) => reject(new Error(`sip serve exited (${code}): ${output}`)));
      });
      const pid = (name: string) => Number(fs.readFileSync(path.join(runDir, `${name}.pid`), 'utf8'));
      return { child, exited, rtpengine: pid('rtpengine'), kamailio: pid('kamailio'), output: () => output };
    };
    const dir = () => {
      const runDir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-media-serve-'));
      cleanup.push(async () => fs.rmSync(runDir, { recursive: true, force: true }));
      return runDir;
    };

    // sip serve killed: its supervisors see their pipes close; rtpengine and Kamailio (whole groups) end.
    const first = await serve(dir(), await freeUdpPort());
    expect(groupAlive(first.rtpengine)).toBe(true);
    first.child.kill('SIGKILL');
    await until(async () => (groupAlive(first.rtpengine) ? undefined : true), 'rtpengine to end with sip serve', 15_000);
    await until(async () => (groupAlive(first.kamailio) ? undefined : true), 'Kamailio to end with sip serve', 15_000);

    // rtpengine killed: sip serve stops Kamailio and exits with status 1 (its service manager restarts the edge).
    const second = await serve(dir(), await freeUdpPort());
    process.kill(second.rtpengine, 'SIGKILL');
    expect(await second.exited).toBe(1);
    expect(second.output()).toContain('rtpengine exited');
    await until(async () => (groupAlive(second.kamailio) ? undefined : true), 'Kamailio to end with sip serve', 15_000);
    expect(groupAlive(second.rtpengine)).toBe(false);
  }, 120_000);
});
