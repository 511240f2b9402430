/**
 * RTP (RFC 3550): packets in and out of one UDP socket per call, and the clock that paces the frames
 * we send. Only what a telephone call needs: version 2, no padding or extension produced (both are
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
 * The process's frame grid: one timer for every stream with the same frame period, instead of one per call.
 * Ticks are due at `origin + k * period` (from `performance.now()`), never relative to the previous tick, so
 * timer lateness does not accumulate. setTimeout only resolves to about a millisecond and fires late under
 * load, so the last `spinMs` before a due time are waited in `setImmediate` turns (a short spin that still
 * lets I/O in). With one timer per call that spin was paid per call, at every call's own phase: at 50
 * calls 50 x 2 ms of every 20 ms was spent spinning, and the calls' ticks queued behind each other's spins
 * and behind their own setTimeout callbacks. One grid spins once per period whatever the number of calls,
 * and sends every call's frame in one turn of the event loop (measured: `bench/voice.ts`,
 * docs/benchmarks.md). Ticks missed entirely (a pause of the whole process) are run back to back, each with
 * its own due time, so each stream's RTP timestamps stay whole.
 */
export class FrameGrid {
  private static readonly grids = new Map<number, FrameGrid>();
  /** The shared grid of this period (one per process). */
  static of(periodMs: number): FrameGrid {
    let grid = FrameGrid.grids.get(periodMs);
    if (!grid) {
      grid = new FrameGrid(periodMs);
      FrameGrid.grids.set(periodMs, grid);
    }
    return grid;
  }

  private readonly members = new Set<(due: number, now: number) => void>();
  private timer?: NodeJS.Timeout | NodeJS.Immediate;
  private origin = 0;
  private k = 0;

  constructor(
    readonly periodMs: number,
    /** How long before a due time to stop sleeping and start polling (ms). */
    private readonly spinMs = 2,
  ) {}

  /** Joins the grid; returns the due time of the member's first tick (the grid's next one). */
  join(onTick: (due: number, now: number) => void): number {
    if (this.members.size === 0) {
      this.origin = performance.now();
      this.k = 0;
      this.members.add(onTick);
      this.schedule();
      return this.origin;
    }
    this.members.add(onTick);
    return this.origin + this.k * this.periodMs;
  }

  leave(onTick: (due: number, now: number) => void): void {
    this.members.delete(onTick);
    if (this.members.size > 0 || !this.timer) return;
    clearTimeout(this.timer as NodeJS.Timeout);
    clearImmediate(this.timer as NodeJS.Immediate);
    this.timer = undefined;
  }

  private schedule(): void {
    this.timer = undefined;
    if (this.members.size === 0) return;
    const due = this.origin + this.k * this.periodMs;
    const wait = due - performance.now();
    if (wait > this.spinMs) this.timer = setTimeout(() => this.schedule(), wait - this.spinMs);
    else if (wait > 0) this.timer = setImmediate(() => this.schedule());
    else {
      this.k++;
      // A member that joins during this loop is not in the snapshot: its first tick is the next one.
      for (const member of [...this.members]) {
        if (!this.members.has(member)) continue;
        try {
          member(due, performance.now());
        } catch (error) {
          // One stream's failure is thrown as a timer callback's would be, after the other streams' frames.
          process.nextTick(() => {
            throw error;
          });
        }
      }
      this.schedule();
    }
  }
}

/**
 * One stream's frame clock on the process's grid (`FrameGrid`): tick `n` is due at `dueTime(n)`, exact
 * multiples of the period from the stream's first tick, whatever the lateness of earlier ticks. Ticks that
 * were missed (a long pause of the process) come back to back, each reported with its own due time, so that
 * the caller can send them or drop them, as it prefers.
 */
export class FrameClock {
  private origin = 0;
  private n = 0;
  private readonly member = (due: number, now: number) => {
    const index = this.n++;
    this.onTick({ index, due, now });
  };
  private running = false;

  constructor(
    private readonly periodMs: number,
    private readonly onTick: (tick: { index: number; due: number; now: number }) => void,
    private readonly grid = FrameGrid.of(periodMs),
  ) {}

  start(): void {
    if (this.running) return;
    this.running = true;
    this.n = 0;
    this.origin = this.grid.join(this.member);
  }

  stop(): void {
    if (!this.running) return;
    this.running = false;
    this.grid.leave(this.member);
  }

  /** When tick `n` is due, in performance.now() milliseconds. */
  dueTime(n: number): number {
    return this.origin + n * this.periodMs;
  }
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
    if (!rtp || !o.rtcp) {
      if (rtp) return { rtp };
      continue;
    }
    const port = rtp.address().port;
    const rtcp = port % 2 === 0 && port < 65535 ? await bind(port + 1) : undefined;
    if (rtcp) return { rtp, rtcp };
    rtp.close();
  }
  throw new Error(`no free RTP port on ${address}`);
}
