/**
 * SDP (RFC 4566) offer/answer (RFC 3264) for one audio stream: read the offer's connection address, port and
 * payload types (the `sdp-transform` package parses it), choose one codec (G.722 first: the recogniser's model
 * is wideband; then PCMU, PCMA) plus telephone-event (RFC 4733) when offered, and write the answer.
 */
import { parse } from 'sdp-transform';
import type { CodecName } from './codecs.js';

export interface SdpOffer {
  address: string;
  port: number;
  /** Payload type number -> encoding name (upper case) and clock rate, from rtpmap or the static table. */
  formats: { pt: number; name: string; rate: number }[];
  /** `a=sendrecv` and friends, for the stream (session level when the stream has none). */
  direction: 'sendrecv' | 'sendonly' | 'recvonly' | 'inactive';
}

/** Static payload types (RFC 3551 table 4) that may appear without an rtpmap. */
const STATIC: Record<number, { name: string; rate: number }> = {
  0: { name: 'PCMU', rate: 8000 },
  8: { name: 'PCMA', rate: 8000 },
  9: { name: 'G722', rate: 8000 },
};

export class SdpError extends Error {}

/** Parses the first audio stream of an offer (sdp-transform reads the lines); throws SdpError for what cannot be answered. */
export function parseOffer(body: string): SdpOffer {
  // Spaces around a line, and runs of them between the words of `m=`, are tolerated.
  const sdp = parse(body.replace(/^[^\S\r\n]+|[^\S\r\n]+$/gm, '').replace(/^m=.*/gm, (m) => m.split(/\s+/).join(' ')));
  const media = sdp.media.find((m) => m.type === 'audio' && /^RTP\/AVP$/i.test(m.protocol));
  if (!media) throw new SdpError('no RTP/AVP audio stream in the offer');
  // `c=IN IP4 address/ttl`: the address alone.
  const address = String(media.connection?.ip || sdp.connection?.ip || '').split('/')[0];
  if (!address) throw new SdpError('no connection address in the offer');
  if (!Number.isInteger(media.port) || media.port < 0 || media.port > 65535) throw new SdpError('bad media port');
  const digits = (v: unknown) => /^\d+$/.test(String(v));
  const rtpmap = new Map(
    media.rtp
      .filter((r) => digits(r.payload) && digits(r.rate))
      .map((r) => [Number(r.payload), { name: String(r.codec).toUpperCase(), rate: Number(r.rate) }]),
  );
  const pts = String(media.payloads ?? '')
    .split(/\s+/)
    .filter(Boolean)
    .map(Number);
  const formats = pts.flatMap((pt) => {
    const f = Number.isInteger(pt) && pt >= 0 && pt < 128 ? (rtpmap.get(pt) ?? STATIC[pt]) : undefined;
    return f ? [{ pt, ...f }] : [];
  });
  return { address, port: media.port, formats, direction: media.direction ?? sdp.direction ?? 'sendrecv' };
}

export interface Negotiated {
  codec: CodecName;
  pt: number;
  /** The offer's telephone-event payload type at 8000 Hz, if any. */
  dtmfPt?: number;
}

/** Our preference: G.722 (wideband, what the recogniser wants), then G.711 mu-law, then A-law. */
export const CODEC_PREFERENCE: CodecName[] = ['G722', 'PCMU', 'PCMA'];

/** Chooses a codec from the offer, or undefined when none is acceptable (the caller answers 488). */
export function negotiate(offer: SdpOffer, preference: CodecName[] = CODEC_PREFERENCE): Negotiated | undefined {
  for (const codec of preference) {
    // G.722's RTP clock rate is 8000 by RFC 3551's historical error; both rates are G.722 8 kHz-clocked.
    const f = offer.formats.find((x) => x.name === codec && x.rate === 8000);
    if (f) {
      const dtmf = offer.formats.find((x) => x.name === 'TELEPHONE-EVENT' && x.rate === 8000);
      return { codec, pt: f.pt, dtmfPt: dtmf?.pt };
    }
  }
  return undefined;
}

/** The answer (RFC 3264 6): the chosen codec and telephone-event, same payload numbers as offered. */
export function buildAnswer(o: {
  address: string;
  port: number;
  sessionId: string;
  negotiated: Negotiated;
  direction: SdpOffer['direction'];
}): string {
  const { negotiated: n } = o;
  const ip = o.address.includes(':') ? 'IP6' : 'IP4';
  const pts = [n.pt, ...(n.dtmfPt !== undefined ? [n.dtmfPt] : [])];
  // Our direction mirrors the offer's (RFC 3264 6.1): sendonly -> recvonly, and so on.
  const mirror = { sendrecv: 'sendrecv', sendonly: 'recvonly', recvonly: 'sendonly', inactive: 'inactive' }[o.direction];
  const lines = [
    'v=0',
    `o=parley ${o.sessionId} ${o.sessionId} IN ${ip} ${o.address}`,
    's=parley',
    `c=IN ${ip} ${o.address}`,
    't=0 0',
    `m=audio ${o.port} RTP/AVP ${pts.join(' ')}`,
    `a=rtpmap:${n.pt} ${n.codec}/8000`,
    ...(n.dtmfPt !== undefined ? [`a=rtpmap:${n.dtmfPt} telephone-event/8000`, `a=fmtp:${n.dtmfPt} 0-16`] : []),
    'a=ptime:20',
    `a=${mirror}`,
  ];
  return `${lines.join('\r\n')}\r\n`;
}
