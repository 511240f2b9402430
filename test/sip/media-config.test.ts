/**
 * The media plane's settings, the ng protocol against a stand-in on a UDP port, the rtpengine parts of the
 * Kamailio configuration, and the WebRTC bridge's flags played against a real rtpengine: towards a browser an
 * offer becomes DTLS-SRTP with ICE and Opus, towards a phone a browser's offer becomes plain RTP/AVP with G.711.
 * Needs rtpengine for the last part (skipped, with the reason, without); no database.
 */
import { execFile } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadMediaSettings } from '../../src/config/media.js';
import { loadSipSettings, mediaListenAddress, renderKamailioConfig, TEMPLATE_PATH } from '../../src/sip/config.js';
import { haveProgram } from '../../src/sip/kamailio.js';
import {
  type Bencoded,
  ngRequest,
  probePortRange,
  rtpengineArguments,
  startRtpengine,
  type RtpengineProcess,
} from '../../src/sip/rtpengine.js';

const run = promisify(execFile);

describe('media settings', () => {
  it('defaults to RTP ports 20000-29999, no advertised address, a 60 s RTP timeout', () => {
    expect(loadMediaSettings({})).toMatchObject({
      rtpPortMin: 20000,
      rtpPortMax: 29999,
      advertisedAddress: undefined,
      listenAddress: undefined,
      timeoutSeconds: 60,
      rtpengineBinary: 'rtpengine',
    });
  });

  it('refuses bad ports, ranges and addresses, naming the variable', () => {
    expect(() => loadMediaSettings({ RTP_PORT_MIN: '80' })).toThrow(/RTP_PORT_MIN/);
    expect(() => loadMediaSettings({ RTP_PORT_MAX: '70000' })).toThrow(/RTP_PORT_MAX/);
    expect(() => loadMediaSettings({ RTP_PORT_MIN: 'x' })).toThrow(/RTP_PORT_MIN/);
    expect(() => loadMediaSettings({ RTP_PORT_MIN: '30000', RTP_PORT_MAX: '30003' })).toThrow(/at least 8 ports/);
    expect(() => loadMediaSettings({ RTP_PORT_MIN: '31000', RTP_PORT_MAX: '30000' })).toThrow(/at least 8 ports/);
    expect(() => loadMediaSettings({ MEDIA_ADVERTISED_ADDRESS: 'media.example.com' })).toThrow(/MEDIA_ADVERTISED_ADDRESS must be an IP/);
    expect(() => loadMediaSettings({ MEDIA_ADVERTISED_ADDRESS: '0.0.0.0' })).toThrow(/wildcard/);
    expect(() => loadMediaSettings({ MEDIA_LISTEN_ADDRESS: '10.0.0.300' })).toThrow(/MEDIA_LISTEN_ADDRESS/);
    expect(loadMediaSettings({ MEDIA_ADVERTISED_ADDRESS: '[2001:db8::7]' }).advertisedAddress).toBe('2001:db8::7');
  });

  it('binds media beside the first concrete SIP address, else on the host address when SIP listens on a wildcard', () => {
    expect(mediaListenAddress(loadSipSettings({ SIP_LISTEN: 'udp:127.0.0.1:5060' }))).toBe('127.0.0.1');
    expect(mediaListenAddress(loadSipSettings({ SIP_LISTEN: 'udp:127.0.0.1:5060', MEDIA_LISTEN_ADDRESS: '127.0.0.2' }))).toBe('127.0.0.2');
    const wildcard = loadSipSettings({ SIP_LISTEN: 'udp:0.0.0.0:5060' });
    const interfaces = {
      lo: [{ address: '127.0.0.1', family: 'IPv4', internal: true }],
      eth0: [{ address: '192.0.2.10', family: 'IPv4', internal: false }],
    } as unknown as ReturnType<typeof os.networkInterfaces>;
    expect(mediaListenAddress(wildcard, interfaces)).toBe('192.0.2.10');
    expect(mediaListenAddress(wildcard, {})).toBe('127.0.0.1');
  });

  it('runs rtpengine userspace-only, without Debian config file, advertising MEDIA_ADVERTISED_ADDRESS', () => {
    const args = rtpengineArguments({
      binary: 'rtpengine',
      runDir: '/tmp/x',
      listenAddress: '10.0.0.5',
      advertisedAddress: '203.0.113.7',
      portMin: 30000,
      portMax: 30099,
      timeoutSeconds: 60,
      logLevel: 5,
      ngPort: 2223,
    });
    expect(args).toEqual(
      expect.arrayContaining([
        '--config-file=none',
        '--table=-1',
        '--interface=10.0.0.5!203.0.113.7',
        '--listen-ng=127.0.0.1:2223',
        '--port-min=30000',
        '--port-max=30099',
        '--foreground',
      ]),
    );
  });
});

describe('the ng protocol (bencode through the `bencode` package)', () => {
  /** A stand-in rtpengine on a loopback UDP port: what it received, and the answer it sends (the cookie echoed). */
  async function fakeRtpengine(answer: (request: Buffer) => Buffer) {
    const socket = dgram.createSocket('udp4');
    const received: Buffer[] = [];
    socket.on('message', (message, from) => {
      const space = message.indexOf(0x20);
      received.push(message.subarray(space + 1));
      socket.send(Buffer.concat([message.subarray(0, space + 1), answer(message.subarray(space + 1))]), from.port, from.address);
    });
    await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
    return { port: socket.address().port, received, close: () => socket.close() };
  }

  it('sends a command as a bencoded dictionary, keys sorted, and reads the answer with UTF-8 text', async () => {
    const sdp = 'v=0\r\ns=é\r\n';
    const rtpengine = await fakeRtpengine(() => Buffer.from(`d6:result2:ok3:sdp${Buffer.byteLength(sdp)}:${sdp}5:countli-3eee`));
    try {
      const command: Bencoded = { command: 'offer', flags: ['trust-address'], 'call-id': 'é@x', n: -3, nested: { b: [1, 'a'], a: '' } };
      const answer = await ngRequest('127.0.0.1', rtpengine.port, command as Record<string, Bencoded>);
      expect(rtpengine.received[0].toString('utf8')).toBe(
        'd7:call-id4:é@x7:command5:offer5:flagsl13:trust-addresse1:ni-3e6:nestedd1:a0:1:bli1e1:aeee',
      );
      expect(answer).toEqual({ result: 'ok', sdp, count: [-3] });
    } finally {
      rtpengine.close();
    }
  });

  it('refuses an answer that is not a dictionary or not bencode', async () => {
    for (const body of ['l2:oke', '2:ok', '', 'd3:abc']) {
      const rtpengine = await fakeRtpengine(() => Buffer.from(body));
      try {
        await expect(ngRequest('127.0.0.1', rtpengine.port, { command: 'ping' }, 1000)).rejects.toThrow();
      } finally {
        rtpengine.close();
      }
    }
  });
});

describe('the Kamailio configuration with the media plane', () => {
  const base = {
    settings: loadSipSettings({ SIP_LISTEN: 'udp:127.0.0.1:25999' }),
    databaseUrl: 'postgres://postgres@127.0.0.1:5432/parley',
    runDir: '/tmp/parley-media-test',
  };

  it('loads the rtpengine module with the ng socket only when one is given', () => {
    const anchored = renderKamailioConfig({ ...base, rtpengineSocket: 'udp:127.0.0.1:22999' });
    expect(anchored).toMatch(/^#!define WITH_MEDIA$/m);
    expect(anchored).toContain('modparam("rtpengine", "rtpengine_sock", "udp:127.0.0.1:22999")');
    const bare = renderKamailioConfig(base);
    expect(bare).not.toMatch(/^#!define WITH_MEDIA$/m);
  });

  it('hooks offer, answer and delete into the call flow in named routes', () => {
    const template = fs.readFileSync(TEMPLATE_PATH, 'utf8');
    for (const name of [
      'route[MEDIA_OFFER]',
      'route[MEDIA_ANSWER]',
      'route[MEDIA_DELETE]',
      'branch_route[MEDIA_BRANCH]',
      'route[MEDIA_FLAGS]',
    ])
      expect(template).toContain(`${name} {`);
    // Offer per branch of an initial INVITE; answer in the reply route; delete on BYE, CANCEL and failure.
    expect(template).toMatch(/t_on_branch\("MEDIA_BRANCH"\);\n\troute\(RELAY\);/);
    expect(template).toMatch(/onreply_route\[REPLY\] \{[^}]*route\(MEDIA_ANSWER\);/);
    expect(template).toMatch(/if \(is_method\("BYE"\)\) route\(MEDIA_DELETE\);/);
    expect(template).toMatch(/is_method\("CANCEL"\)\) \{\n\t\tif \(t_check_trans\(\)\) \{\n\t\t\troute\(MEDIA_DELETE\);/);
    expect(template).toMatch(/failure_route\[FAILED\] \{[\s\S]*route\(MEDIA_DELETE\);[\s\S]*\n\}/);
  });

  it.skipIf(!haveProgram('kamailio'))('is accepted by Kamailio with and without the media plane (kamailio -c)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-mediacfg-'));
    try {
      for (const rtpengineSocket of ['udp:127.0.0.1:22999', undefined]) {
        const file = path.join(dir, 'kamailio.cfg');
        fs.writeFileSync(file, renderKamailioConfig({ ...base, runDir: dir, rtpengineSocket }));
        const { stderr, stdout } = await run('kamailio', ['-c', '-f', file]);
        expect(stdout + stderr).toContain('config file ok');
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

/**
 * The flags route[MEDIA_FLAGS] (and route[MEDIA_OFFER]'s codec extras) give for a side, read from the template,
 * turned into the ng dictionary the way Kamailio's rtpengine module does: `key=value` words are entries,
 * `replace-`, `rtcp-mux-`, `SDES-` words are lists under their prefix, `codec-<op>-<codec>` under `codec`, and
 * every other word goes into `flags`.
 */
function profile(webrtc: boolean, senderNatOrBrowser: boolean, extra: string): Record<string, Bencoded> {
  const template = fs.readFileSync(TEMPLATE_PATH, 'utf8');
  const block = /route\[MEDIA_FLAGS\] \{([\s\S]*?)\n\}/.exec(template)![1];
  const quoted = [...block.matchAll(/"([^"]*)"/g)].map((m) => m[1]);
  const base = quoted[0];
  const nat = quoted.find((q) => q.includes(senderNatOrBrowser ? 'SIP-source-address' : 'trust-address'))!;
  const transport = quoted.find((q) => q.includes(webrtc ? 'SAVPF' : 'RTP/AVP'))!;
  const words = `${base}${nat}${transport}${extra}`.split(/\s+/).filter(Boolean);
  const dict: Record<string, Bencoded> = {};
  const codecs: Record<string, Bencoded[]> = {};
  const push = (key: string, value: string) => {
    dict[key] = [...((dict[key] as Bencoded[] | undefined) ?? []), value];
  };
  for (const word of words) {
    const codec = /^codec-(transcode|mask|strip|offer|except)-(.+)$/.exec(word);
    if (codec) {
      codecs[codec[1]] = [...(codecs[codec[1]] ?? []), codec[2]];
      dict.codec = codecs;
    } else if (word.includes('=')) {
      const [key, value] = word.split('=');
      dict[key] = value;
    } else {
      const listed = /^(replace|rtcp-mux|SDES)-(.+)$/.exec(word);
      if (listed) push(listed[1], listed[2]);
      else push('flags', word);
    }
  }
  return dict;
}

const rtpengineSkip = haveProgram('rtpengine') ? undefined : 'rtpengine not installed (Debian: rtpengine-daemon)';

describe.skipIf(rtpengineSkip !== undefined)('the WebRTC bridge flags against rtpengine', () => {
  let engine: RtpengineProcess;
  let runDir: string;

  beforeAll(async () => {
    runDir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-rtpengine-'));
    const min = 20000 + 2 * Math.floor(Math.random() * 4900);
    expect((await probePortRange('127.0.0.1', min, min + 99)).free).toBeGreaterThan(8);
    engine = await startRtpengine({
      binary: 'rtpengine',
      runDir,
      listenAddress: '127.0.0.1',
      portMin: min,
      portMax: min + 99,
      timeoutSeconds: 60,
      logLevel: 4,
    });
  }, 30_000);
  afterAll(async () => {
    await engine?.stop();
    fs.rmSync(runDir, { recursive: true, force: true });
  });

  const phoneSdp = [
    'v=0',
    'o=phone 1 1 IN IP4 127.0.0.1',
    's=-',
    'c=IN IP4 127.0.0.1',
    't=0 0',
    'm=audio 4000 RTP/AVP 9 0 8 101',
    'a=rtpmap:9 G722/8000',
    'a=rtpmap:0 PCMU/8000',
    'a=rtpmap:8 PCMA/8000',
    'a=rtpmap:101 telephone-event/8000',
    'a=sendrecv',
    '',
  ].join('\r\n');
  const fingerprint = Array.from({ length: 32 }, (_, i) => (i * 7 + 16).toString(16).padStart(2, '0').toUpperCase()).join(':');
  const browserSdp = (codecs: 'opus' | 'all', setup: string) =>
    [
      'v=0',
      'o=- 4611731400430051336 2 IN IP4 127.0.0.1',
      's=-',
      't=0 0',
      'a=group:BUNDLE 0',
      // SIP clients in browsers (JsSIP, SIP.js) send their offer once ICE gathering is done, so c= and m= name
      // the default candidate (no trickle ICE over SIP).
      `m=audio 4100 UDP/TLS/RTP/SAVPF ${codecs === 'opus' ? '111' : '111 0 8'}`,
      'c=IN IP4 127.0.0.1',
      'a=rtcp:4100 IN IP4 127.0.0.1',
      'a=candidate:1 1 udp 2122260223 127.0.0.1 4100 typ host generation 0',
      'a=ice-ufrag:Wb4k',
      'a=ice-pwd:u3fFf0pnRs6IoL4Z0BvEd3hA',
      `a=fingerprint:sha-256 ${fingerprint}`,
      `a=setup:${setup}`,
      'a=mid:0',
      'a=sendrecv',
      'a=rtcp-mux',
      'a=rtpmap:111 opus/48000/2',
      'a=fmtp:111 minptime=10;useinbandfec=1',
      ...(codecs === 'all' ? ['a=rtpmap:0 PCMU/8000', 'a=rtpmap:8 PCMA/8000'] : []),
      '',
    ].join('\r\n');

  it('a phone calling a browser: the browser is offered DTLS-SRTP with ICE, rtcp-mux and Opus; the phone gets plain RTP back', async () => {
    const callId = `webrtc-a-${Date.now()}`;
    const offer = await engine.ng('offer', {
      'call-id': callId,
      'from-tag': 'phone',
      sdp: phoneSdp,
      ...profile(true, false, ' codec-transcode-opus'),
    });
    expect(offer.result, JSON.stringify(offer)).toBe('ok');
    const toBrowser = String(offer.sdp);
    expect(toBrowser).toMatch(/^m=audio \d+ UDP\/TLS\/RTP\/SAVPF /m);
    expect(toBrowser).toMatch(/^a=ice-ufrag:/m);
    expect(toBrowser).toMatch(/^a=candidate:.* 127\.0\.0\.1 \d+ typ host/m);
    expect(toBrowser).toMatch(/^a=fingerprint:sha-256 /m);
    expect(toBrowser).toMatch(/^a=setup:actpass/m);
    expect(toBrowser).toMatch(/^a=rtcp-mux/m);
    expect(toBrowser).toMatch(/^a=rtpmap:\d+ opus\/48000/m);
    expect(toBrowser).toMatch(/^a=rtpmap:0 PCMU\/8000/m);
    expect(toBrowser).not.toMatch(/^a=crypto:/m);

    // The browser answers with Opus only: rtpengine transcodes, and the phone is answered with its own codec.
    const answer = await engine.ng('answer', {
      'call-id': callId,
      'from-tag': 'phone',
      'to-tag': 'browser',
      sdp: browserSdp('opus', 'active'),
      // What Kamailio's module adds to every command: the address the SIP message came from.
      'received-from': ['IP4', '127.0.0.1'],
      ...profile(false, true, ''),
    });
    expect(answer.result, JSON.stringify(answer)).toBe('ok');
    const toPhone = String(answer.sdp);
    expect(toPhone).toMatch(/^m=audio \d+ RTP\/AVP (9|0|8)\b/m);
    expect(toPhone).not.toMatch(/ice-ufrag|fingerprint|a=candidate|opus/);
    // Media both ways (a browser's address is taken from where its SIP came: SIP-source-address).
    expect(toPhone).toMatch(/^c=IN IP4 127\.0\.0\.1/m);
    expect(toPhone).toMatch(/^a=sendrecv/m);
    await engine.ng('delete', { 'call-id': callId, 'from-tag': 'phone' });
  });

  it('a browser calling a phone: the phone is offered plain RTP/AVP with G.711 even when the browser offered only Opus', async () => {
    const callId = `webrtc-b-${Date.now()}`;
    const offer = await engine.ng('offer', {
      'call-id': callId,
      'from-tag': 'browser',
      sdp: browserSdp('opus', 'actpass'),
      'received-from': ['IP4', '127.0.0.1'],
      ...profile(false, true, ' codec-transcode-PCMU codec-transcode-PCMA'),
    });
    expect(offer.result, JSON.stringify(offer)).toBe('ok');
    const toPhone = String(offer.sdp);
    expect(toPhone).toMatch(/^m=audio \d+ RTP\/AVP /m);
    expect(toPhone).toMatch(/^a=rtpmap:0 PCMU\/8000/m);
    expect(toPhone).toMatch(/^a=rtpmap:8 PCMA\/8000/m);
    expect(toPhone).not.toMatch(/ice-ufrag|fingerprint|a=candidate|a=setup/);
    expect(toPhone).toMatch(/^a=sendrecv/m);

    // The phone answers PCMU: the browser gets DTLS-SRTP, ICE and (transcoded) Opus.
    const phoneAnswer = phoneSdp
      .replace('m=audio 4000 RTP/AVP 9 0 8 101', 'm=audio 4000 RTP/AVP 0')
      .replace(/a=rtpmap:(9|8|101) [^\r]*\r\n/g, '');
    const answer = await engine.ng('answer', {
      'call-id': callId,
      'from-tag': 'browser',
      'to-tag': 'phone',
      sdp: phoneAnswer,
      ...profile(true, false, ''),
    });
    expect(answer.result, JSON.stringify(answer)).toBe('ok');
    const toBrowser = String(answer.sdp);
    expect(toBrowser).toMatch(/^m=audio \d+ UDP\/TLS\/RTP\/SAVPF 111/m);
    expect(toBrowser).toMatch(/^a=ice-ufrag:/m);
    expect(toBrowser).toMatch(/^a=fingerprint:sha-256 /m);
    expect(toBrowser).toMatch(/^a=setup:(active|passive)/m);
    expect(toBrowser).toMatch(/^a=rtcp-mux/m);
    await engine.ng('delete', { 'call-id': callId, 'from-tag': 'browser' });
  });
});
