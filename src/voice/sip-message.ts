/**
 * A small SIP message parser and writer (RFC 3261 section 7), for the user agent server in
 * sip-endpoint.ts: start line, headers (with the compact forms of 7.3.3, folded lines of 7.3.1 and
 * comma-separated values kept in order), and a body whose length Content-Length gives (18.3: on UDP
 * the datagram ends the message, and a body shorter than Content-Length makes the message invalid).
 */

export interface SipMessage {
  /** Request: method and URI; response: status. */
  method?: string;
  uri?: string;
  status?: number;
  /** Header values by lower-case long name; each occurrence (and each comma-separated Via) in order. */
  headers: Map<string, string[]>;
  body: string;
}

const COMPACT: Record<string, string> = {
  v: 'via',
  f: 'from',
  t: 'to',
  i: 'call-id',
  m: 'contact',
  l: 'content-length',
  c: 'content-type',
  k: 'supported',
  s: 'subject',
  e: 'content-encoding',
};

/** Headers whose values may be comma-separated lists that mean several headers (7.3.1). */
const LISTS = new Set(['via', 'route', 'record-route']);

export class SipParseError extends Error {}

export function parseSip(data: Buffer | string): SipMessage {
  const text = typeof data === 'string' ? data : data.toString('utf8');
  const split = text.indexOf('\r\n\r\n');
  const head = split === -1 ? text : text.slice(0, split);
  let body = split === -1 ? '' : text.slice(split + 4);
  const rawLines = head.split(/\r\n/);
  const start = rawLines.shift() ?? '';
  // Unfold continuation lines (a line starting with whitespace continues the previous header).
  const lines: string[] = [];
  for (const line of rawLines) {
    if (/^[ \t]/.test(line) && lines.length > 0) lines[lines.length - 1] += ` ${line.trim()}`;
    else if (line !== '') lines.push(line);
  }
  const msg: SipMessage = { headers: new Map(), body: '' };
  const response = /^SIP\/2\.0 (\d{3}) ?(.*)$/.exec(start);
  const request = /^([A-Z]+) (\S+) SIP\/2\.0$/.exec(start);
  if (response) msg.status = Number(response[1]);
  else if (request) {
    msg.method = request[1];
    msg.uri = request[2];
  } else throw new SipParseError('bad start line');
  for (const line of lines) {
    const colon = line.indexOf(':');
    if (colon <= 0) throw new SipParseError('bad header line');
    let name = line.slice(0, colon).trim().toLowerCase();
    name = COMPACT[name] ?? name;
    const value = line.slice(colon + 1).trim();
    msg.headers.set(name, [...(msg.headers.get(name) ?? []), ...(LISTS.has(name) ? splitList(value) : [value])]);
  }
  const lengthHeader = msg.headers.get('content-length')?.[0];
  if (lengthHeader !== undefined) {
    const length = Number(lengthHeader);
    if (!Number.isInteger(length) || length < 0) throw new SipParseError('bad Content-Length');
    const bytes = Buffer.from(body, 'utf8');
    if (bytes.length < length) throw new SipParseError('body shorter than Content-Length');
    body = bytes.subarray(0, length).toString('utf8');
  }
  msg.body = body;
  for (const required of ['via', 'from', 'to', 'call-id', 'cseq']) {
    if (!msg.headers.get(required)?.length) throw new SipParseError(`missing ${required}`);
  }
  return msg;
}

/** Splits on commas outside quotes and angle brackets. */
function splitList(value: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let quoted = false;
  let start = 0;
  for (let i = 0; i < value.length; i++) {
    const ch = value[i];
    if (ch === '"' && value[i - 1] !== '\\') quoted = !quoted;
    else if (!quoted && ch === '<') depth++;
    else if (!quoted && ch === '>') depth--;
    else if (!quoted && depth === 0 && ch === ',') {
      out.push(value.slice(start, i).trim());
      start = i + 1;
    }
  }
  out.push(value.slice(start).trim());
  return out.filter(Boolean);
}

export function header(msg: SipMessage, name: string): string | undefined {
  return msg.headers.get(name)?.[0];
}

/** The `tag` parameter of a From or To value. */
export function tagOf(value: string | undefined): string | undefined {
  if (!value) return undefined;
  const afterUri = value.includes('>') ? value.slice(value.lastIndexOf('>')) : value;
  return /;\s*tag=([^;\s]+)/i.exec(afterUri)?.[1];
}

/** The URI inside a name-addr (`"Name" <sip:x@y>;tag=1`) or an addr-spec. */
export function uriOf(value: string): string {
  const m = /<([^>]*)>/.exec(value);
  return (m ? m[1] : value.split(';')[0]).trim();
}

/** The user part of a SIP URI (`sip:agent-1@host` -> `agent-1`). */
export function userOf(uri: string): string | undefined {
  const m = /^sips?:([^@;>]+)@/i.exec(uri);
  return m ? decodeURIComponent(m[1]) : undefined;
}

export function cseqOf(msg: SipMessage): { seq: number; method: string } {
  const [seq, method] = (header(msg, 'cseq') ?? '').split(/\s+/);
  return { seq: Number(seq), method: method ?? '' };
}

export function serialize(start: string, headers: [string, string | string[]][], body = ''): Buffer {
  const lines = [start];
  for (const [name, value] of headers) for (const v of Array.isArray(value) ? value : [value]) lines.push(`${name}: ${v}`);
  lines.push(`Content-Length: ${Buffer.byteLength(body)}`);
  return Buffer.from(`${lines.join('\r\n')}\r\n\r\n${body}`);
}
