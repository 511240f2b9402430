/**
 * RTP (RFC 3550): packets in and out of one UDP socket per call (paced by the media worker, media.ts). Only what a telephone call needs: version 2, no padding or extension produced (both are
 * skipped when received), one synchronisation source per direction, RFC 4733 telephone-events.
 */
import { randomBytes } from 'node:crypto';
import { createSocket, type Socket } from 'node:dgram';

export interface RtpPacket {
  payloadType: number;
  marker: boolean;
  sequence: number;
  timestamp: number;
  ssrc: number;
  payload: Uint8Array;
}

/** Parses a packet; undefined for anything that is not RTP version 2 with a whole header (RFC 3550 5.1). */
export function parseRtp(buf: Uint8Array): RtpPacket | undefined {
  if (buf.length < 12) return undefined;
  const b0 = buf[0];
  if (b0 >> 6 !== 2) return undefined;
  const csrcCount = b0 & 0x0f;
  let offset = 12 + csrcCount * 4;
  if (b0 & 0x10) {
    // Header extension (5.3.1): 16-bit profile, 16-bit length in 32-bit words.
    if (buf.length < offset + 4) return undefined;
    offset += 4 + ((buf[offset + 2] << 8) | buf[offset + 3]) * 4;
  }
  let end = buf.length;
  if (b0 & 0x20) end -= buf[buf.length - 1]; // padding count in the last octet
  if (end < offset) return undefined;
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const payloadType = buf[1] & 0x7f;
  // 72..76 would be RTCP packet types 200..204 sent on the RTP port (RFC 5761 4): not media.
  if (payloadType >= 72 && payloadType <= 76) return undefined;
  return {
    payloadType,
    marker: (buf[1] & 0x80) !== 0,
    sequence: view.getUint16(2),
    timestamp: view.getUint32(4),
    ssrc: view.getUint32(8),
    payload: buf.subarray(offset, end),
  };
}

export function buildRtp(p: RtpPacket): Buffer {
  const out = Buffer.alloc(12 + p.payload.length);
  out[0] = 0x80;
  out[1] = (p.marker ? 0x80 : 0) | (p.payloadType & 0x7f);
  out.writeUInt16BE(p.sequence & 0xffff, 2);
  out.writeUInt32BE(p.timestamp >>> 0, 4);
  out.writeUInt32BE(p.ssrc >>> 0, 8);
  out.set(p.payload, 12);
  return out;
}

/**
 * The sending side of one stream: random initial sequence number, timestamp and SSRC (RFC 3550 5.1,
 * against known-plaintext attacks), a timestamp that advances by the frame's sampling instants even
 * across silence (so the receiver's jitter buffer sees the gap), and the marker bit on the first
 * packet of each talkspurt (RFC 3551 4.1).
 */
export class RtpSender {
  readonly ssrc = randomBytes(4).readUInt32BE(0);
  private sequence = randomBytes(2).readUInt16BE(0);
  private timestamp = randomBytes(4).readUInt32BE(0);
  private talkspurt = true;

  constructor(private readonly payloadType: number) {}

  /** A media packet for the frame at the current timestamp; the timestamp then advances by `step`. */
  next(payload: Uint8Array, step: number): Buffer {
    const packet = buildRtp({
      payloadType: this.payloadType,
      marker: this.talkspurt,
      sequence: this.sequence,
      timestamp: this.timestamp,
      ssrc: this.ssrc,
      payload,
    });
    this.talkspurt = false;
    this.sequence = (this.sequence + 1) & 0xffff;
    this.timestamp = (this.timestamp + step) >>> 0;
    return packet;
  }

  /** Nothing sent for one frame time (silence suppression): the clock still runs, the next packet marks a talkspurt. */
  skip(step: number): void {
    this.timestamp = (this.timestamp + step) >>> 0;
    this.talkspurt = true;
  }
}

/** A received RFC 4733 telephone-event payload: event 0-9 = digits, 10 = *, 11 = #, 12-15 = A-D. */
export function parseTelephoneEvent(payload: Uint8Array): { digit: string; end: boolean; duration: number } | undefined {
  if (payload.length < 4) return undefined;
  const event = payload[0];
  if (event > 15) return undefined;
  return { digit: '0123456789*#ABCD'[event], end: (payload[1] & 0x80) !== 0, duration: (payload[2] << 8) | payload[3] };
}

/**
 * Binds RTP on `address`: an even port of `min..max` (RFC 3550 section 11: RTP on even ports), tried from `first`
 * round the range, or the kernel's choice when `min` is 0 (tests, and hosts where any port is reachable); with
 * `rtcp`, the odd port above it as well (RTCP's, section 11), an even one then being needed from the kernel too.
 */
export async function bindRtp(
  address: string,
  o: { min: number; max: number; first?: number; rtcp?: boolean },
): Promise<{ rtp: Socket; rtcp?: Socket }> {
  const bind = (port: number) =>
    new Promise<Socket | undefined>((resolve) => {
      const socket = createSocket(address.includes(':') ? 'udp6' : 'udp4');
      socket.once('error', () => {
        socket.close();
        resolve(undefined);
      });
      socket.bind(port, address, () => resolve(socket));
    });
  const base = o.min + (o.min % 2);
  const span = o.min === 0 ? 50 : Math.floor((o.max - base) / 2) + 1;
  const from = ((o.first ?? base) - base) / 2;
  for (let i = 0; i < span; i++) {
    const rtp = await bind(o.min === 0 ? 0 : base + ((from + i) % span) * 2);
    if (!rtp) continue;
    if (!o.rtcp) return { rtp };
    const port = rtp.address().port;
    const rtcp = port % 2 === 0 && port < 65535 ? await bind(port + 1) : undefined;
    if (rtcp) return { rtp, rtcp };
    rtp.close();
  }
  throw new Error(`no free RTP port on ${address}`);
}
