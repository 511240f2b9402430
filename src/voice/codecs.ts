/**
 * Audio codecs for the voice runtime: G.711 mu-law and A-law (ITU-T G.711, by its segment tables) and
 * G.722 at 64 kbit/s (ITU-T G.722: sub-band ADPCM, a 24-tap QMF splitting 16 kHz audio into two bands),
 * plus the small resampler between the telephone rate (8 kHz) and the recogniser's rate (16 kHz).
 * All PCM here is signed 16-bit, mono, in Int16Array.
 *
 * G.722 follows the block structure of the Recommendation (blocks 1L..6L, 1H..6H and the shared
 * block 4: RECONS, PARREC, UPPOL1/2, UPZERO, DELAYA, FILTEP, FILTEZ, PREDIC), in integer arithmetic
 * as the reference code does, so that output is bit-exact between encoder and decoder states.
 * Note the RTP clock rate of G.722 is 8000 although it samples at 16 kHz (RFC 3551, section 4.5.2).
 */

// ---------------------------------------------------------------- G.711

const BIAS = 0x84;
const CLIP = 32635;

/** Linear PCM to mu-law (G.711 section 3). */
export function linearToUlaw(sample: number): number {
  const sign = sample < 0 ? 0x80 : 0;
  const s = Math.min(Math.abs(sample), CLIP) + BIAS;
  let exponent = 7;
  for (let mask = 0x4000; (s & mask) === 0 && exponent > 0; mask >>= 1) exponent--;
  const mantissa = (s >> (exponent + 3)) & 0x0f;
  return ~(sign | (exponent << 4) | mantissa) & 0xff;
}

export function ulawToLinear(byte: number): number {
  const u = ~byte & 0xff;
  const exponent = (u >> 4) & 0x07;
  const mantissa = u & 0x0f;
  const magnitude = (((mantissa << 3) + BIAS) << exponent) - BIAS;
  // 0 - m, not -m: mu-law's negative zero is the sample 0, not -0.
  return u & 0x80 ? 0 - magnitude : magnitude;
}

/** Linear PCM to A-law (G.711 section 2; even bits inverted, 0x55). */
export function linearToAlaw(sample: number): number {
  let s = sample >> 3; // A-law works on 13 bits
  let sign = 0x80;
  if (s < 0) {
    sign = 0;
    s = -s - 1;
  }
  let code: number;
  if (s < 32) code = s >> 1;
  else {
    let segment = 1;
    while (s >= 64 << (segment - 1) && segment < 7) segment++;
    code = (segment << 4) | ((s >> segment) & 0x0f);
  }
  return (sign | code) ^ 0x55;
}

export function alawToLinear(byte: number): number {
  const a = byte ^ 0x55;
  const segment = (a >> 4) & 0x07;
  let magnitude = ((a & 0x0f) << 4) + 8;
  if (segment !== 0) magnitude = (magnitude + 0x100) << (segment - 1);
  return a & 0x80 ? magnitude : 0 - magnitude;
}

const ULAW_DECODE = Int16Array.from({ length: 256 }, (_, i) => ulawToLinear(i));
const ALAW_DECODE = Int16Array.from({ length: 256 }, (_, i) => alawToLinear(i));
const ULAW_ENCODE = Uint8Array.from({ length: 65536 }, (_, i) => linearToUlaw(i - 32768));
const ALAW_ENCODE = Uint8Array.from({ length: 65536 }, (_, i) => linearToAlaw(i - 32768));

// ---------------------------------------------------------------- G.722

const clamp = (v: number, min: number, max: number) => (v > max ? max : v < min ? min : v);
const saturate = (v: number) => clamp(v, -32768, 32767);

const QMF = [3, -11, 12, 32, -210, 951, 3876, -805, 362, -156, 53, -11];
const Q6 = [
  0, 35, 72, 110, 150, 190, 233, 276, 323, 370, 422, 473, 530, 587, 650, 714, 786, 858, 940, 1023, 1121, 1219, 1339, 1458, 1612, 1765, 1980,
  2195, 2557, 2919, 0, 0,
];
const ILN = [0, 63, 62, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 0];
const ILP = [0, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 0];
const WL = [-60, -30, 58, 172, 334, 538, 1198, 3042];
const RL42 = [0, 7, 6, 5, 4, 3, 2, 1, 7, 6, 5, 4, 3, 2, 1, 0];
const ILB = [
  2048, 2093, 2139, 2186, 2233, 2282, 2332, 2383, 2435, 2489, 2543, 2599, 2656, 2714, 2774, 2834, 2896, 2960, 3025, 3091, 3158, 3228, 3298,
  3371, 3444, 3520, 3597, 3676, 3756, 3838, 3922, 4008,
];
const QM4 = [0, -20456, -12896, -8968, -6288, -4240, -2584, -1200, 20456, 12896, 8968, 6288, 4240, 2584, 1200, 0];
const QM6 = [
  -136, -136, -136, -136, -24808, -21904, -19008, -16704, -14984, -13512, -12280, -11192, -10232, -9360, -8576, -7856, -7192, -6576, -6000,
  -5456, -4944, -4464, -4008, -3576, -3168, -2776, -2400, -2032, -1688, -1360, -1040, -728, 24808, 21904, 19008, 16704, 14984, 13512, 12280,
  11192, 10232, 9360, 8576, 7856, 7192, 6576, 6000, 5456, 4944, 4464, 4008, 3576, 3168, 2776, 2400, 2032, 1688, 1360, 1040, 728, 432, 136,
  -432, -136,
];
const QM2 = [-7408, -1616, 7408, 1616];
const IHN = [0, 1, 0];
const IHP = [0, 3, 2];
const WH = [0, -214, 798];
const RH2 = [2, 1, 2, 1];

/** One sub-band's adaptive predictor state (the Recommendation's block 4 variables). */
class Band {
  s = 0;
  sp = 0;
  sz = 0;
  r = [0, 0, 0];
  a = [0, 0, 0];
  ap = [0, 0, 0];
  p = [0, 0, 0];
  d = [0, 0, 0, 0, 0, 0, 0];
  b = [0, 0, 0, 0, 0, 0, 0];
  bp = [0, 0, 0, 0, 0, 0, 0];
  sg = [0, 0, 0, 0, 0, 0, 0];
  nb = 0;
  constructor(public det: number) {}

  /** Block 4: reconstruction, pole and zero predictor adaptation, prediction. */
  update(d: number): void {
    this.d[0] = d;
    this.r[0] = saturate(this.s + d);
    this.p[0] = saturate(this.sz + d);
    // UPPOL2
    for (let i = 0; i < 3; i++) this.sg[i] = this.p[i] >> 15;
    let wd1 = saturate(this.a[1] << 2);
    let wd2 = this.sg[0] === this.sg[1] ? -wd1 : wd1;
    if (wd2 > 32767) wd2 = 32767;
    let wd3 = (wd2 >> 7) + (this.sg[0] === this.sg[2] ? 128 : -128);
    this.ap[2] = clamp(wd3 + ((this.a[2] * 32512) >> 15), -12288, 12288);
    // UPPOL1 (the signs of p[0] and p[1] as UPPOL2 took them)
    wd1 = this.sg[0] === this.sg[1] ? 192 : -192;
    wd2 = (this.a[1] * 32640) >> 15;
    wd3 = saturate(15360 - this.ap[2]);
    this.ap[1] = clamp(saturate(wd1 + wd2), -wd3, wd3);
    // UPZERO
    wd1 = d === 0 ? 0 : 128;
    this.sg[0] = d >> 15;
    for (let i = 1; i < 7; i++) {
      this.sg[i] = this.d[i] >> 15;
      this.bp[i] = saturate((this.sg[i] === this.sg[0] ? wd1 : -wd1) + ((this.b[i] * 32640) >> 15));
    }
    // DELAYA
    for (let i = 6; i > 0; i--) {
      this.d[i] = this.d[i - 1];
      this.b[i] = this.bp[i];
    }
    for (let i = 2; i > 0; i--) {
      this.r[i] = this.r[i - 1];
      this.p[i] = this.p[i - 1];
      this.a[i] = this.ap[i];
    }
    // FILTEP
    this.sp = saturate(((this.a[1] * saturate(2 * this.r[1])) >> 15) + ((this.a[2] * saturate(2 * this.r[2])) >> 15));
    // FILTEZ
    let sz = 0;
    for (let i = 6; i > 0; i--) sz += (this.b[i] * saturate(2 * this.d[i])) >> 15;
    this.sz = saturate(sz);
    // PREDIC
    this.s = saturate(this.sp + this.sz);
  }

  /**
   * Blocks 2L/2H (the inverse quantiser's difference `d`, read at the old scale), 3L/3H (the log scale factor
   * and the quantiser scale) and 4L/4H; returns `d`.
   */
  adapt(qm: number, wdelta: number, max: number, shift: number): number {
    const d = (this.det * qm) >> 15;
    const nb = clamp(((this.nb * 127) >> 7) + wdelta, 0, max);
    this.nb = nb;
    const wd1 = (nb >> 6) & 31;
    const wd2 = shift - (nb >> 11);
    const wd3 = wd2 < 0 ? ILB[wd1] << -wd2 : ILB[wd1] >> wd2;
    this.det = wd3 << 2;
    this.update(d);
    return d;
  }
}

/** The low band's adaptation from its code's upper four bits (the same at both ends). */
const adaptLow = (low: Band, ilow: number) => low.adapt(QM4[ilow >> 2], WL[RL42[ilow >> 2]], 18432, 8);
const adaptHigh = (high: Band, ihigh: number) => high.adapt(QM2[ihigh], WH[RH2[ihigh]], 22528, 10);

/** The 24-tap QMF (both ends): shifts two samples into the delay line `x`; its odd and even sums. */
function qmf(x: Int32Array, a: number, b: number): [number, number] {
  x.copyWithin(0, 2);
  x[22] = a;
  x[23] = b;
  let odd = 0;
  let even = 0;
  for (let i = 0; i < 12; i++) {
    odd += x[2 * i] * QMF[i];
    even += x[2 * i + 1] * QMF[11 - i];
  }
  return [odd, even];
}

/** Blocks 6L/6H LIMIT of the decoder. */
const limit = (v: number) => clamp(v, -16384, 16383);

export class G722Encoder {
  private readonly x = new Int32Array(24);
  private readonly low = new Band(32);
  private readonly high = new Band(8);

  /** 16 kHz PCM (an even number of samples) to G.722 bytes, one per two samples. */
  encode(pcm: Int16Array): Uint8Array {
    const out = new Uint8Array(pcm.length >> 1);
    const { x, low, high } = this;
    for (let j = 0, k = 0; k < out.length; k++) {
      const [sumodd, sumeven] = qmf(x, pcm[j++], pcm[j++]);
      const xlow = (sumeven + sumodd) >> 14;
      const xhigh = (sumeven - sumodd) >> 14;
      // 1L SUBTRA, QUANTL
      const el = saturate(xlow - low.s);
      let wd = el >= 0 ? el : -(el + 1);
      let i = 1;
      for (; i < 30; i++) if (wd < (Q6[i] * low.det) >> 12) break;
      const ilow = el < 0 ? ILN[i] : ILP[i];
      adaptLow(low, ilow);
      // 1H SUBTRA, QUANTH
      const eh = saturate(xhigh - high.s);
      wd = eh >= 0 ? eh : -(eh + 1);
      const mih = wd >= (564 * high.det) >> 12 ? 2 : 1;
      const ihigh = eh < 0 ? IHN[mih] : IHP[mih];
      adaptHigh(high, ihigh);
      out[k] = (ihigh << 6) | ilow;
    }
    return out;
  }
}

export class G722Decoder {
  private readonly x = new Int32Array(24);
  private readonly low = new Band(32);
  private readonly high = new Band(8);

  /** G.722 bytes to 16 kHz PCM, two samples per byte. */
  decode(data: Uint8Array): Int16Array {
    const out = new Int16Array(data.length * 2);
    const { x, low, high } = this;
    for (let j = 0, k = 0; j < data.length; j++) {
      const ilow = data[j] & 0x3f;
      const ihigh = data[j] >> 6;
      // 5L INVQBL, RECONS, 6L LIMIT; 5H RECONS adds the prediction from before the adaptation (read first)
      const rlow = limit(low.s + ((low.det * QM6[ilow]) >> 15));
      adaptLow(low, ilow);
      const rhigh = limit(high.s + adaptHigh(high, ihigh));
      // Receive QMF
      const [xout2, xout1] = qmf(x, rlow + rhigh, rlow - rhigh);
      out[k++] = saturate(xout1 >> 11);
      out[k++] = saturate(xout2 >> 11);
    }
    return out;
  }
}

// ---------------------------------------------------------------- codecs by RTP payload

export type CodecName = 'G722' | 'PCMU' | 'PCMA';

/** Samples of one 20 ms frame at 16 kHz. */
export const FRAME_SAMPLES = 320;
export const FRAME_MS = 20;

/**
 * A codec as a call uses it: each 20 ms frame of 16 kHz PCM (320 samples) in, one RTP payload out, and
 * back. G.711 runs at 8 kHz, so its frames are resampled (halved on the way out, doubled on the way in).
 */
export interface FrameCodec {
  name: CodecName;
  /** RTP timestamp units per 20 ms frame (160 for all three: G.722's RTP clock is 8000, RFC 3551). */
  timestampStep: number;
  encode(pcm16k: Int16Array): Uint8Array;
  decode(payload: Uint8Array): Int16Array;
}

export function createCodec(name: CodecName): FrameCodec {
  if (name === 'G722') {
    const enc = new G722Encoder();
    const dec = new G722Decoder();
    return { name, timestampStep: 160, encode: (pcm) => enc.encode(pcm), decode: (p) => dec.decode(p) };
  }
  const [encodeTable, decodeTable] = name === 'PCMU' ? [ULAW_ENCODE, ULAW_DECODE] : [ALAW_ENCODE, ALAW_DECODE];
  const down = new Downsampler();
  const up = new Upsampler();
  return {
    name,
    timestampStep: 160,
    encode(pcm16k) {
      const pcm8k = down.process(pcm16k);
      const out = new Uint8Array(pcm8k.length);
      for (let i = 0; i < pcm8k.length; i++) out[i] = encodeTable[pcm8k[i] + 32768];
      return out;
    },
    decode(payload) {
      const pcm8k = new Int16Array(payload.length);
      for (let i = 0; i < payload.length; i++) pcm8k[i] = decodeTable[payload[i]];
      return up.process(pcm8k);
    },
  };
}

// ---------------------------------------------------------------- resampling

/**
 * 16 kHz to 8 kHz: a short symmetric low-pass (a 5-tap [1 4 6 4 1]/16 binomial kernel, about -6 dB at
 * 2.7 kHz, nothing above 4 kHz passes unattenuated) before taking every other sample. Telephone band
 * speech (300-3400 Hz) keeps its intelligibility; the state carries across frames, so frame edges
 * leave no clicks.
 */
export class Downsampler {
  /** The two samples before the current pair. */
  private readonly hist = [0, 0];
  process(input: Int16Array): Int16Array {
    const out = new Int16Array(input.length >> 1);
    const h = this.hist;
    for (let i = 0, o = 0; i + 1 < input.length; i += 2, o++) {
      const a = input[i];
      const b = input[i + 1];
      out[o] = saturate((h[0] + 4 * h[1] + 6 * a + 4 * b + (i + 2 < input.length ? input[i + 2] : b)) >> 4);
      h[0] = a;
      h[1] = b;
    }
    return out;
  }
}

/** 8 kHz to 16 kHz by linear interpolation (the state carries the last sample across frames). */
export class Upsampler {
  private last = 0;
  process(input: Int16Array): Int16Array {
    const out = new Int16Array(input.length * 2);
    for (let i = 0; i < input.length; i++) {
      out[2 * i] = (this.last + input[i]) >> 1;
      out[2 * i + 1] = input[i];
      this.last = input[i];
    }
    return out;
  }
}

/** Any rate to 16 kHz (text-to-speech output), linear interpolation; averaging when decimating. */
export function resampleTo16k(pcm: Int16Array, rate: number): Int16Array {
  if (rate === 16000) return pcm;
  const ratio = rate / 16000;
  const out = new Int16Array(Math.floor(pcm.length / ratio));
  for (let o = 0; o < out.length; o++) {
    const pos = o * ratio;
    if (ratio > 1) {
      // Average the input samples this output sample covers (a box filter against aliasing).
      const start = Math.floor(pos);
      const end = Math.min(pcm.length, Math.max(start + 1, Math.floor(pos + ratio)));
      let sum = 0;
      for (let i = start; i < end; i++) sum += pcm[i];
      out[o] = Math.round(sum / (end - start));
    } else {
      const i = Math.floor(pos);
      const f = pos - i;
      const a = pcm[i] ?? 0;
      const b = pcm[i + 1] ?? a;
      out[o] = Math.round(a + (b - a) * f);
    }
  }
  return out;
}

/** Reads a RIFF/WAVE file of 16-bit PCM (mono, or the first channel), as speech engines write them. */
export function parseWav(buf: Buffer): { rate: number; pcm: Int16Array } {
  if (buf.length < 12 || buf.toString('ascii', 0, 4) !== 'RIFF' || buf.toString('ascii', 8, 12) !== 'WAVE')
    throw new Error('not a WAVE file');
  let offset = 12;
  let rate = 0;
  let channels = 1;
  while (offset + 8 <= buf.length) {
    const id = buf.toString('ascii', offset, offset + 4);
    let size = buf.readUInt32LE(offset + 4);
    const body = offset + 8;
    if (id === 'fmt ') {
      const format = buf.readUInt16LE(body);
      channels = buf.readUInt16LE(body + 2);
      rate = buf.readUInt32LE(body + 4);
      if ((format !== 1 && format !== 0xfffe) || buf.readUInt16LE(body + 14) !== 16) throw new Error('WAVE is not 16-bit PCM');
    } else if (id === 'data') {
      // Streaming writers leave the size at 0 or 0xffffffff: take what is there.
      if (size === 0 || size === 0xffffffff || body + size > buf.length) size = buf.length - body;
      const frames = Math.floor(size / (2 * channels));
      const pcm = new Int16Array(frames);
      for (let i = 0; i < frames; i++) pcm[i] = buf.readInt16LE(body + i * 2 * channels);
      if (!rate) throw new Error('WAVE data before fmt');
      return { rate, pcm };
    }
    offset = body + size + (size & 1);
  }
  throw new Error('WAVE without data');
}

/** A 16-bit mono WAVE file (for speech-to-text engines that take files). */
export function toWav(pcm: Int16Array, rate: number): Buffer {
  const data = Buffer.from(pcm.buffer, pcm.byteOffset, pcm.byteLength);
  const header = Buffer.alloc(44);
  header.write('RIFF', 0, 'ascii');
  header.writeUInt32LE(36 + data.length, 4);
  header.write('WAVEfmt ', 8, 'ascii');
  header.writeUInt32LE(16, 16);
  header.writeUInt16LE(1, 20);
  header.writeUInt16LE(1, 22);
  header.writeUInt32LE(rate, 24);
  header.writeUInt32LE(rate * 2, 28);
  header.writeUInt16LE(2, 32);
  header.writeUInt16LE(16, 34);
  header.write('data', 36, 'ascii');
  header.writeUInt32LE(data.length, 40);
  return Buffer.concat([header, data]);
}
