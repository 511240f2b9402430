/**
 * SDP (RFC 4566) offer/answer (RFC 3264) for one audio stream: read the offer's connection address,
 * port and payload types, choose one codec (G.722 first: the recogniser's model is wideband; then
 * PCMU, PCMA) plus telephone-event (RFC 4733) when offered, and write the answer.
 */
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

/** Parses the first audio stream of an offer; throws SdpError for what cannot be answered. */
export function parseOffer(body: string): SdpOffer {
  const lines = body
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter(Boolean);
  let sessionAddress: string | undefined;
  let sessionDirection: SdpOffer['direction'] | undefined;
  let media: { port: number; pts: number[]; address?: string; direction?: SdpOffer['direction'] } | undefined;
  const rtpmap = new Map<number, { name: string; rate: number }>();
  let inAudio = false;
  let seenMedia = false;
  for (const line of lines) {
    const type = line[0];
    const value = line.slice(2);
    if (line[1] !== '=') continue;
    if (type === 'm') {
      seenMedia = true;
      const [kind, port, proto, ...pts] = value.split(/\s+/);
      inAudio = kind === 'audio' && media === undefined && /^RTP\/AVP$/i.test(proto ?? '');
      if (inAudio) media = { port: Number(port), pts: pts.map(Number).filter((n) => Number.isInteger(n) && n >= 0 && n < 128) };
    } else if (type === 'c') {
      const m = /^IN IP[46] ([^\s/]+)/.exec(value);
      if (!m) continue;
      if (!seenMedia) sessionAddress = m[1];
      else if (inAudio && media) media.address = m[1];
    } else if (type === 'a') {
      const dir = /^(sendrecv|sendonly|recvonly|inactive)$/.exec(value)?.[1] as SdpOffer['direction'] | undefined;
      const map = /^rtpmap:(\d+) ([^/\s]+)\/(\d+)/.exec(value);
      if (dir && !seenMedia) sessionDirection = dir;
      else if (dir && inAudio && media) media.direction = dir;
      else if (map && inAudio) rtpmap.set(Number(map[1]), { name: map[2].toUpperCase(), rate: Number(map[3]) });
    }
  }
  if (!media) throw new SdpError('no RTP/AVP audio stream in the offer');
  const address = media.address ?? sessionAddress;
  if (!address) throw new SdpError('no connection address in the offer');
  if (!Number.isInteger(media.port) || media.port < 0 || media.port > 65535) throw new SdpError('bad media port');
  const formats = media.pts.flatMap((pt) => {
    const f = rtpmap.get(pt) ?? STATIC[pt];
    return f ? [{ pt, ...f }] : [];
  });
  return { address, port: media.port, formats, direction: media.direction ?? sessionDirection ?? 'sendrecv' };
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
