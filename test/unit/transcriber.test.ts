/**
 * The transcriber's choice of codec for a forked leg (src/voice/transcriber.ts, `forkCodec`): rtpengine's
 * `subscribe request` offer lists what the party sends first, then what was added for transcoding.
 */
import { describe, expect, it } from 'vitest';
import { parseOffer } from '../../src/voice/sdp.js';
import { forkCodec } from '../../src/voice/transcriber.js';

const offer = (pts: string, maps: string[]) =>
  parseOffer(
    [
      'v=0',
      'o=- 1 1 IN IP4 127.0.0.1',
      's=-',
      'c=IN IP4 127.0.0.1',
      't=0 0',
      `m=audio 30000 RTP/AVP ${pts}`,
      ...maps,
      'a=sendonly',
      '',
    ].join('\r\n'),
  );

describe('forkCodec', () => {
  it('takes what the party sends (listed first) when it is decodable, so rtpengine passes it through', () => {
    expect(forkCodec(offer('0 9 101', ['a=rtpmap:0 PCMU/8000', 'a=rtpmap:9 G722/8000', 'a=rtpmap:101 telephone-event/8000']))).toEqual({
      codec: 'PCMU',
      pt: 0,
      dtmfPt: 101,
    });
    expect(forkCodec(offer('9', ['a=rtpmap:9 G722/8000']))).toEqual({ codec: 'G722', pt: 9, dtmfPt: undefined });
    expect(forkCodec(offer('8 9', ['a=rtpmap:8 PCMA/8000', 'a=rtpmap:9 G722/8000']))?.codec).toBe('PCMA');
  });

  it('takes G.722 (added for transcoding) when the party sends a codec it cannot decode (a browser Opus)', () => {
    expect(forkCodec(offer('111 0 9', ['a=rtpmap:111 opus/48000/2', 'a=rtpmap:0 PCMU/8000', 'a=rtpmap:9 G722/8000']))).toEqual({
      codec: 'G722',
      pt: 9,
      dtmfPt: undefined,
    });
  });

  it('finds nothing when nothing decodable is offered', () => {
    expect(forkCodec(offer('111 18', ['a=rtpmap:111 opus/48000/2', 'a=rtpmap:18 G729/8000']))).toBeUndefined();
  });
});
