/**
 * RTP (RFC 3550): packets in and out of one UDP socket per call, and the clock that paces the frames
 * we send. Only what a telephone call needs: version 2, no padding or extension produced (both are
 * skipped when received), one synchronisation source per direction, RFC 4733 telephone-events.
 */
import { randomBytes } from 'node:crypto';

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
 * A drift-free frame clock. Each tick is scheduled against the absolute time the stream started
 * (`start + n * period`, from `performance.now()`), not relative to the previous tick, so timer lateness
 * never accumulates: a tick that fires late is followed by one that comes early enough to catch up.
 * setTimeout only resolves to about a millisecond and may fire late under load, so the last stretch
 * before a due time is waited with `setImmediate` turns (a short, bounded spin on the event loop that
 * still lets I/O in). Ticks that were missed entirely (a long pause of the process) are reported as
 * `late` so that the caller can send them back to back or drop them, as it prefers.
 */
export class FrameClock {
  private timer?: NodeJS.Timeout | NodeJS.Immediate;
  private running = false;
  private origin = 0;
  private n = 0;

  constructor(
    private readonly periodMs: number,
    private readonly onTick: (tick: { index: number; due: number; now: number }) => void,
    /** How long before a due time to stop sleeping and start polling (ms). */
    private readonly spinMs = 2,
  ) {}

  start(): void {
    if (this.running) return;
    this.running = true;
    this.origin = performance.now();
    this.n = 0;
    this.schedule();
  }

  stop(): void {
    this.running = false;
    if (this.timer) {
      clearTimeout(this.timer as NodeJS.Timeout);
      clearImmediate(this.timer as NodeJS.Immediate);
    }
    this.timer = undefined;
  }

  /** When tick `n` is due, in performance.now() milliseconds. */
  dueTime(n: number): number {
    return this.origin + n * this.periodMs;
  }

  private schedule(): void {
    if (!this.running) return;
    const due = this.dueTime(this.n);
    const wait = due - performance.now();
    if (wait > this.spinMs) this.timer = setTimeout(() => this.schedule(), wait - this.spinMs);
    else if (wait > 0) this.timer = setImmediate(() => this.schedule());
    else {
      const index = this.n++;
      this.onTick({ index, due, now: performance.now() });
      this.schedule();
    }
  }
}
