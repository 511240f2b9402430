/**
 * The voice runtime's media pieces on their own: G.711 against sox's codec, G.722 by round trip,
 * RTP packets and pacing, SDP negotiation, voice activity detection, and the SIP parser.
 */
import { execFileSync } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  alawToLinear,
  createCodec,
  G722Decoder,
  G722Encoder,
  linearToAlaw,
  linearToUlaw,
  parseWav,
  resampleTo16k,
  toWav,
  ulawToLinear,
} from '../../src/voice/codecs.js';
import { FrameGrid, MediaWorker } from '../../src/voice/media.js';
import { buildRtp, parseRtp, parseTelephoneEvent, type RtpPacket, RtpSender } from '../../src/voice/rtp.js';
import { buildAnswer, negotiate, parseOffer, SdpError } from '../../src/voice/sdp.js';
import { latencyOf, unspokenRest } from '../../src/voice/session.js';
import { cseqOf, parseSip, SipParseError, tagOf, uriOf, userOf } from '../../src/voice/sip-message.js';
import { Vad } from '../../src/voice/vad.js';

const haveSox = (() => {
  try {
    execFileSync('sox', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

function tone(n: number, rate: number, parts: [number, number][]): Int16Array {
  const out = new Int16Array(n);
  for (let i = 0; i < n; i++) out[i] = Math.round(parts.reduce((s, [f, a]) => s + a * Math.sin((2 * Math.PI * f * i) / rate), 0));
  return out;
}

/**
 * Signal-to-noise ratio (dB) of `decoded` against `original`, at the best alignment up to `maxDelay`;
 * with `fitGain`, after the best overall gain (a filter's passband loss is not noise).
 */
function snr(original: Int16Array, decoded: Int16Array, maxDelay: number, skip = 400, fitGain = false): { db: number; delay: number } {
  let best = { db: Number.NEGATIVE_INFINITY, delay: 0 };
  for (let d = 0; d <= maxDelay; d++) {
    let s = 0;
    let e = 0;
    let xy = 0;
    let yy = 0;
    for (let i = skip; i < original.length - maxDelay; i++) {
      xy += original[i] * decoded[i + d];
      yy += decoded[i + d] ** 2;
    }
    const gain = fitGain && yy > 0 ? xy / yy : 1;
    for (let i = skip; i < original.length - maxDelay; i++) {
      s += original[i] ** 2;
      e += (original[i] - gain * decoded[i + d]) ** 2;
    }
    const db = 10 * Math.log10(s / Math.max(1, e));
    if (db > best.db) best = { db, delay: d };
  }
  return best;
}

describe('G.711', () => {
  it('decodes every code as sox does (the tables of ITU-T G.711)', { skip: !haveSox }, () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-g711-'));
    try {
      const codes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
      for (const [kind, decode] of [
        ['ul', ulawToLinear],
        ['al', alawToLinear],
      ] as const) {
        fs.writeFileSync(path.join(dir, `codes.${kind}`), codes);
        execFileSync('sox', ['-r', '8000', '-c', '1', path.join(dir, `codes.${kind}`), '-b', '16', path.join(dir, `${kind}.wav`)]);
        const { pcm } = parseWav(fs.readFileSync(path.join(dir, `${kind}.wav`)));
        expect(Array.from(pcm)).toEqual(Array.from(codes, (c) => decode(c)));
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('encodes within one quantisation step of sox, and every code decodes back to itself', { skip: !haveSox }, () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-g711-'));
    try {
      const ramp = Int16Array.from({ length: 65536 / 4 }, (_, i) => -32768 + i * 4);
      fs.writeFileSync(path.join(dir, 'ramp.wav'), toWav(ramp, 8000));
      for (const [kind, encode, decode] of [
        ['ul', linearToUlaw, ulawToLinear],
        ['al', linearToAlaw, alawToLinear],
      ] as const) {
        execFileSync('sox', ['-D', path.join(dir, 'ramp.wav'), '-t', kind, path.join(dir, `ramp.${kind}`)]);
        const sox = fs.readFileSync(path.join(dir, `ramp.${kind}`));
        let same = 0;
        for (let i = 0; i < ramp.length; i++) {
          const ours = decode(encode(ramp[i]));
          const theirs = decode(sox[i]);
          if (ours === theirs) same++;
          // Rounding at a step boundary may differ (sox rounds to 14 bits, G.711 truncates): never by more.
          const step = Math.max(16, Math.abs(theirs) >> 3);
          expect(Math.abs(ours - theirs), `sample ${ramp[i]}`).toBeLessThanOrEqual(step);
        }
        expect(same / ramp.length).toBeGreaterThan(0.95);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
    for (let c = 0; c < 256; c++) {
      // 0x7f/0xff and 0xd5/0x55 are mu-law's and A-law's two zeros: the same sample.
      expect(ulawToLinear(linearToUlaw(ulawToLinear(c)))).toBe(ulawToLinear(c));
      expect(linearToAlaw(alawToLinear(c))).toBe(c);
    }
  });
});

describe('G.722', () => {
  it('round-trips speech-band tones with high fidelity (about 39 dB) and the QMF delay of 22 samples', () => {
    const pcm = tone(16000, 16000, [
      [440, 8000],
      [1900, 3000],
      [5200, 1500],
    ]);
    const decoded = new G722Decoder().decode(new G722Encoder().encode(pcm));
    expect(decoded.length).toBe(pcm.length);
    const { db, delay } = snr(pcm, decoded, 60);
    expect(delay).toBe(22);
    expect(db).toBeGreaterThan(30);
  });

  it('keeps its state across frames: 20 ms frames give the same bytes as one block', () => {
    const pcm = tone(3200, 16000, [[700, 10000]]);
    const whole = new G722Encoder().encode(pcm);
    const enc = new G722Encoder();
    const framed = Buffer.concat(Array.from({ length: 10 }, (_, i) => enc.encode(pcm.subarray(i * 320, i * 320 + 320))));
    expect(Buffer.from(whole).equals(framed)).toBe(true);
    expect(whole.length).toBe(1600);
  });

  it('silence stays silence and a full-scale square wave does not overflow', () => {
    const zero = new G722Decoder().decode(new G722Encoder().encode(new Int16Array(640)));
    expect(Math.max(...zero.map(Math.abs))).toBeLessThan(8);
    const square = Int16Array.from({ length: 1600 }, (_, i) => (Math.floor(i / 20) % 2 ? 32767 : -32768));
    const out = new G722Decoder().decode(new G722Encoder().encode(square));
    expect(out.every((v) => v >= -32768 && v <= 32767)).toBe(true);
    expect(snr(square, out, 40).db).toBeGreaterThan(10);
  });
});

describe('frame codecs and resampling', () => {
  it('turns a 20 ms frame into one payload per codec (160 bytes) and back into 320 samples at 16 kHz', () => {
    const frame = tone(320, 16000, [[1000, 6000]]);
    for (const name of ['G722', 'PCMU', 'PCMA'] as const) {
      const codec = createCodec(name);
      const payload = codec.encode(frame);
      expect(payload.length).toBe(160);
      expect(codec.decode(payload).length).toBe(320);
      expect(codec.timestampStep).toBe(160);
    }
  });

  it('narrowband codecs keep telephone-band speech (1 kHz tone through PCMU at > 25 dB)', () => {
    const pcm = tone(16000, 16000, [[1000, 8000]]);
    const codec = createCodec('PCMU');
    const out = new Int16Array(pcm.length);
    for (let i = 0; i < pcm.length; i += 320) out.set(codec.decode(codec.encode(pcm.subarray(i, i + 320))), i);
    expect(snr(pcm, out, 10, 400, true).db).toBeGreaterThan(25);
  });

  it('resamples 22050 Hz (espeak-ng) and 24000 Hz (provider) audio to 16 kHz keeping the pitch', () => {
    for (const rate of [22050, 24000, 8000]) {
      const src = tone(rate, rate, [[500, 8000]]);
      const out = resampleTo16k(src, rate);
      expect(Math.abs(out.length - 16000)).toBeLessThanOrEqual(1);
      expect(snr(tone(out.length, 16000, [[500, 8000]]), out, 4, 100).db).toBeGreaterThan(20);
    }
  });

  it('reads the WAVE files speech engines write (streamed ones with a zero data size too)', () => {
    const pcm = Int16Array.from([1, -2, 3, -4]);
    const wav = toWav(pcm, 16000);
    expect(parseWav(wav)).toEqual({ rate: 16000, pcm });
    const streamed = Buffer.from(wav);
    streamed.writeUInt32LE(0, 40);
    expect(parseWav(streamed).pcm).toEqual(pcm);
    expect(() => parseWav(Buffer.from('garbage that is not a wave file'))).toThrow(/WAVE/);
  });
});

describe('RTP', () => {
  it('builds and parses packets, skipping CSRCs, extensions and padding (RFC 3550 5.1, 5.3)', () => {
    const packet = buildRtp({
      payloadType: 9,
      marker: true,
      sequence: 65535,
      timestamp: 4294967295,
      ssrc: 0x01020304,
      payload: Uint8Array.of(1, 2, 3),
    });
    const parsed = parseRtp(packet)!;
    expect({ ...parsed, payload: Array.from(parsed.payload) }).toEqual({
      payloadType: 9,
      marker: true,
      sequence: 65535,
      timestamp: 4294967295,
      ssrc: 0x01020304,
      payload: [1, 2, 3],
    });
    // One CSRC, a one-word extension, two bytes of padding.
    const complex = Buffer.from([0xb1, 0x00, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 9, 9, 9, 9, 0xbe, 0xde, 0, 1, 7, 7, 7, 7, 0xaa, 0xbb, 0, 2]);
    expect(Array.from(parseRtp(complex)!.payload)).toEqual([0xaa, 0xbb]);
    expect(parseRtp(Buffer.from([0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]))).toBeUndefined(); // version 1
    expect(parseRtp(Buffer.alloc(8))).toBeUndefined();
    expect(parseRtp(Buffer.from([0x80, 200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]))).toBeUndefined(); // RTCP SR on the RTP port
  });

  it('sends consecutive sequence numbers and timestamps 160 apart, marking only the start of a talkspurt', () => {
    const sender = new RtpSender(0);
    const a = parseRtp(sender.next(new Uint8Array(160), 160))!;
    const b = parseRtp(sender.next(new Uint8Array(160), 160))!;
    sender.skip(160);
    const c = parseRtp(sender.next(new Uint8Array(160), 160))!;
    expect(a.marker).toBe(true);
    expect(b.marker).toBe(false);
    expect((b.sequence - a.sequence + 65536) % 65536).toBe(1);
    expect((b.timestamp - a.timestamp) >>> 0).toBe(160);
    expect(c.marker).toBe(true);
    expect((c.timestamp - b.timestamp) >>> 0).toBe(320);
    expect(a.ssrc).toBe(c.ssrc);
  });

  it('reads RFC 4733 telephone-events', () => {
    expect(parseTelephoneEvent(Uint8Array.of(11, 0x8a, 0x03, 0x20))).toEqual({ digit: '#', end: true, duration: 800 });
    expect(parseTelephoneEvent(Uint8Array.of(5, 0x0a, 0, 160))).toEqual({ digit: '5', end: false, duration: 160 });
    expect(parseTelephoneEvent(Uint8Array.of(40, 0, 0, 0))).toBeUndefined();
  });

  it('paces ticks against the start time: due times are exact multiples of 20 ms, late ticks do not shift later ones', async () => {
    const grid = new FrameGrid(20);
    const ticks: { due: number; now: number }[] = [];
    const member = (due: number, now: number) => {
      ticks.push({ due, now });
      if (ticks.length === 4) {
        const until = performance.now() + 45; // a stall of two frames
        while (performance.now() < until) {}
      }
    };
    const origin = grid.join(member);
    // Until 13 ticks have run (about 260 ms; longer on a loaded machine: the property holds either way).
    for (let waited = 0; ticks.length < 13 && waited < 5000; waited += 20) await new Promise((r) => setTimeout(r, 20));
    grid.leave(member);
    expect(ticks.length).toBeGreaterThanOrEqual(13);
    ticks.forEach((t, i) => {
      // After the stall the grid catches up: tick 12 is due at origin + 240 whatever happened before.
      expect(t.due).toBeCloseTo(origin + i * 20, 6);
      expect(t.now).toBeGreaterThanOrEqual(t.due);
    });
  });

  it('puts every stream on one grid: members joined apart tick in the same turn, on multiples of 20 ms from each other', async () => {
    const grid = new FrameGrid(20);
    const seen: { member: number; due: number }[] = [];
    const a = (due: number) => seen.push({ member: 0, due });
    const b = (due: number) => seen.push({ member: 1, due });
    const originA = grid.join(a);
    await new Promise((r) => setTimeout(r, 30));
    const offset = grid.join(b) - originA;
    expect(offset).toBeGreaterThan(0);
    expect(offset / 20).toBeCloseTo(Math.round(offset / 20), 6);
    for (let waited = 0; seen.filter((s) => s.member === 1).length < 5 && waited < 5000; waited += 20)
      await new Promise((r) => setTimeout(r, 20));
    grid.leave(a);
    grid.leave(b);
    // Each tick of b comes with a's tick of the same due time (one timer for both).
    for (const t of seen.filter((s) => s.member === 1)) expect(seen.some((s) => s.member === 0 && s.due === t.due)).toBe(true);
    // Members that left are not ticked any more.
    const count = seen.length;
    await new Promise((r) => setTimeout(r, 60));
    expect(seen.length).toBe(count);
  });

  it('sends from the media worker: silence, then a queued prompt whole and on time while the main thread is stalled, flushed at once', async () => {
    const phone = dgram.createSocket('udp4');
    await new Promise<void>((r) => phone.bind(0, '127.0.0.1', r));
    const heard: RtpPacket[] = [];
    phone.on('message', (data) => heard.push(parseRtp(data)!));
    const stream = await MediaWorker.get().open('127.0.0.1', { min: 0, max: 0 });
    const sent: { at: number; due: number }[] = [];
    stream.onSent = (at, due) => sent.push({ at, due });
    const received: Uint8Array[] = [];
    stream.onPacket = (data) => received.push(data);
    phone.send(Uint8Array.of(1, 2, 3), stream.port, '127.0.0.1');
    const silence = new Uint8Array(160).fill(0xff);
    stream.start({ remote: { address: '127.0.0.1', port: phone.address().port }, pt: 0, step: 160, silence });
    await new Promise((r) => setTimeout(r, 100));
    // 10 frames of 160 bytes, each filled with its index.
    const frames = new Uint8Array(1600).map((_, i) => Math.floor(i / 160));
    const asked = performance.now();
    const played = stream.play(frames, 160);
    // The main thread is busy for 120 ms: the worker's sends go on meanwhile.
    const until = performance.now() + 120;
    while (performance.now() < until) {}
    const result = await played;
    expect(result).toMatchObject({ frames: 10, interrupted: false });
    expect(result.firstAt).toBeGreaterThan(asked);
    // A second prompt, flushed after about three frames: it ends interrupted, with what was sent.
    const second = stream.play(new Uint8Array(16000).fill(7), 160);
    await new Promise((r) => setTimeout(r, 60));
    stream.flush();
    const cut = await second;
    expect(cut.interrupted).toBe(true);
    expect(cut.frames).toBeGreaterThan(0);
    expect(cut.frames).toBeLessThan(100);
    // The worker reports its sends 50 at a time: wait for the first report (a second of packets).
    for (let waited = 0; sent.length < 50 && waited < 5000; waited += 20) await new Promise((r) => setTimeout(r, 20));
    stream.close();
    phone.close();
    // Packets left during the main thread's stall (six are due in it; fewer only if the worker was not scheduled).
    expect(sent.filter((s) => s.at > asked && s.at < until).length).toBeGreaterThanOrEqual(2);
    expect(received.map((d) => [...d])).toEqual([[1, 2, 3]]);
    // One stream: consecutive sequence numbers and timestamps; silence, the 10 frames in order, silence, the cut prompt.
    const payloads = heard.map((p) => p.payload[0]);
    const start = payloads.indexOf(0);
    expect(payloads.slice(start, start + 10)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(payloads.filter((p) => p === 7).length).toBeGreaterThanOrEqual(cut.frames);
    heard.slice(1).forEach((p, i) => {
      expect((p.sequence - heard[i].sequence) & 0xffff).toBe(1);
      expect((p.timestamp - heard[i].timestamp) >>> 0).toBe(160);
    });
  });
});

describe('SDP offer/answer', () => {
  const offer = (m: string, extra = '') =>
    `v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP ${m}\r\n${extra}`;

  it('prefers G.722, then PCMU, then PCMA, whatever the offer order, and keeps the offered telephone-event number', () => {
    const o = parseOffer(offer('0 8 9 96', 'a=rtpmap:96 telephone-event/8000\r\na=sendrecv\r\n'));
    expect(o).toMatchObject({ address: '10.0.0.1', port: 4000, direction: 'sendrecv' });
    expect(negotiate(o)).toEqual({ codec: 'G722', pt: 9, dtmfPt: 96 });
    expect(negotiate(parseOffer(offer('8 0')))).toEqual({ codec: 'PCMU', pt: 0, dtmfPt: undefined });
    expect(negotiate(parseOffer(offer('8')))).toEqual({ codec: 'PCMA', pt: 8, dtmfPt: undefined });
    // A dynamic payload number for G.722 counts by its rtpmap.
    expect(negotiate(parseOffer(offer('100', 'a=rtpmap:100 G722/8000\r\n')))?.codec).toBe('G722');
  });

  it('finds no codec in an offer of others (the endpoint answers 488)', () => {
    expect(negotiate(parseOffer(offer('18 3 111', 'a=rtpmap:111 opus/48000/2\r\n')))).toBeUndefined();
  });

  it('reads an encoding name made of digits as a name, not a number (the parser gives those as numbers)', () => {
    const o = parseOffer(offer('9 96', 'a=rtpmap:9 G722/8000\r\na=rtpmap:96 22/8000\r\n'));
    expect(o.formats).toEqual([
      { pt: 9, name: 'G722', rate: 8000 },
      { pt: 96, name: '22', rate: 8000 },
    ]);
  });

  it('refuses offers it cannot answer: no audio stream, no address', () => {
    expect(() => parseOffer('v=0\r\nm=video 4000 RTP/AVP 96\r\nc=IN IP4 1.2.3.4\r\n')).toThrow(SdpError);
    expect(() => parseOffer('v=0\r\nm=audio 4000 RTP/AVP 0\r\n')).toThrow(SdpError);
    expect(() => parseOffer('')).toThrow(SdpError);
  });

  it('answers with the chosen codec, telephone-event, ptime and the mirrored direction (RFC 3264 6.1)', () => {
    const answer = buildAnswer({
      address: '127.0.0.1',
      port: 5000,
      sessionId: '7',
      negotiated: { codec: 'PCMU', pt: 0, dtmfPt: 101 },
      direction: 'sendonly',
    });
    expect(answer).toContain('m=audio 5000 RTP/AVP 0 101\r\n');
    expect(answer).toContain('a=rtpmap:101 telephone-event/8000');
    expect(answer).toContain('a=recvonly');
    const back = parseOffer(answer);
    expect(back.formats.map((f) => f.name)).toEqual(['PCMU', 'TELEPHONE-EVENT']);
  });
});

describe('voice activity detection', () => {
  const frames = (pcm: Int16Array) => Array.from({ length: Math.floor(pcm.length / 320) }, (_, i) => pcm.subarray(i * 320, i * 320 + 320));
  const noise = (n: number, amp: number) => Int16Array.from({ length: n }, () => Math.round((Math.random() * 2 - 1) * amp));

  it('finds an utterance in line noise, ending where the speech stopped, with a pre-roll', () => {
    const vad = new Vad({ hangoverMs: 400 });
    const input = [...frames(noise(16000, 30)), ...frames(tone(16000, 16000, [[300, 6000]])), ...frames(noise(16000, 30))];
    const events = input.flatMap((f) => vad.push(f));
    expect(events.map((e) => e.type)).toEqual(['speech_start', 'speech_end']);
    const [start, end] = events as unknown as [{ atFrame: number }, { atFrame: number; audio: Int16Array; reason: string }];
    expect(start.atFrame).toBe(50);
    expect(end.atFrame).toBe(100); // the first quiet frame: the caller stopped there, not 400 ms later
    expect(end.reason).toBe('silence');
    expect(end.audio.length).toBeGreaterThanOrEqual(50 * 320);
  });

  it('keeps a short pause inside the utterance and ignores a click', () => {
    const vad = new Vad({ hangoverMs: 400 });
    const word = frames(tone(8000, 16000, [[250, 5000]]));
    const pause = frames(new Int16Array(320 * 10)); // 200 ms
    const click = frames(tone(640, 16000, [[1000, 20000]])); // 40 ms: shorter than 3 frames
    const quiet = frames(new Int16Array(320 * 50));
    expect([...quiet, ...click, ...quiet].flatMap((f) => vad.push(f))).toEqual([]);
    const events = [...word, ...pause, ...word, ...quiet].flatMap((f) => vad.push(f));
    expect(events.map((e) => e.type)).toEqual(['speech_start', 'speech_end']);
  });

  it('cuts a caller who never stops at the maximum utterance length', () => {
    const vad = new Vad({ maxUtteranceMs: 1000 });
    const events = frames(tone(16000 * 3, 16000, [[200, 6000]])).flatMap((f) => vad.push(f));
    const ends = events.filter((e) => e.type === 'speech_end');
    // 3 s of talk in utterances of at most 1 s (each restarts after the three frames that start speech).
    expect(ends.length).toBe(3);
    for (const e of ends) {
      expect(e.type === 'speech_end' && e.reason).toBe('max_length');
      expect(e.type === 'speech_end' && e.audio.length).toBeLessThanOrEqual(16000);
    }
  });
});

describe('SIP messages (RFC 3261 7)', () => {
  const invite = [
    'INVITE sip:agent-1@127.0.0.1:5070 SIP/2.0',
    'v: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK1, SIP/2.0/UDP 10.0.0.2;branch=z9hG4bK2',
    'f: "A, B" <sip:a@x>;tag=abc',
    't: <sip:agent-1@127.0.0.1>',
    'i: call-1',
    'CSeq: 1 INVITE',
    'Subject: folded',
    '  header',
    'l: 4',
    '',
    'body and more',
  ].join('\r\n');

  it('reads compact forms, folded lines, Via lists and the body by Content-Length', () => {
    const msg = parseSip(invite);
    expect(msg.method).toBe('INVITE');
    expect(msg.headers.get('via')).toHaveLength(2);
    expect(msg.headers.get('subject')).toEqual(['folded header']);
    expect(msg.body).toBe('body');
    expect(tagOf(msg.headers.get('from')![0])).toBe('abc');
    expect(tagOf(msg.headers.get('to')![0])).toBeUndefined();
    expect(userOf(uriOf('<sip:agent-1@127.0.0.1>'))).toBe('agent-1');
    expect(cseqOf(msg)).toEqual({ seq: 1, method: 'INVITE' });
  });

  it('refuses broken messages instead of guessing', () => {
    expect(() => parseSip('HELLO\r\n\r\n')).toThrow(SipParseError);
    expect(() => parseSip(invite.replace('i: call-1\r\n', ''))).toThrow(/call-id/);
    expect(() => parseSip(invite.replace('l: 4', 'l: 400'))).toThrow(/Content-Length/);
  });
});

describe('turn bookkeeping', () => {
  it('measures each stage of the latency budget from the end of the caller speech', () => {
    expect(latencyOf({ speechEndAt: 100, transcriptAt: 400, replyAt: 450, firstAudioAt: 520 })).toEqual({
      speech_end_to_transcript: 300,
      transcript_to_reply: 50,
      reply_to_first_audio: 70,
      voice_to_voice: 420,
    });
  });

  it('marks the words after the barge-in point as not spoken', () => {
    expect(unspokenRest('one two three four', 0.5)).toBe('three four');
    expect(unspokenRest('one two', 0)).toBe('one two');
    expect(unspokenRest('one two', 1)).toBe('');
  });
});
