/**
 * Webhook targets and server-side request forgery (OWASP SSRF prevention): a receiver must be an https URL
 * on a public address. Checked when an endpoint is saved (422) and again on every connection the delivery
 * worker opens (the address actually connected to is the one checked, so a DNS answer that changes after
 * the check, "DNS rebinding", cannot reach an internal service). `WEBHOOK_ALLOW_PRIVATE_URLS=true` lifts both
 * rules for development and tests.
 */
import dns from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';
import { Webhook } from 'standardwebhooks';

/** Only globally routed unicast: no loopback, private (RFC 1918, RFC 4193), link-local, CGNAT, multicast, reserved or documentation ranges. */
export function isPublicAddress(address: string): boolean {
  if (!ipaddr.isValid(address)) return false;
  // process(): an IPv4-mapped IPv6 address (::ffff:127.0.0.1) is judged as the IPv4 address it is.
  const parsed = ipaddr.process(address);
  // ::/8 is reserved by IANA; ipaddr.js calls most of it unicast, among it the deprecated IPv4-compatible
  // addresses (::/96, RFC 4291 section 2.5.5.1: ::7f00:1 is 127.0.0.1), which some stacks still route.
  if (parsed.kind() === 'ipv6' && (parsed as ipaddr.IPv6).parts[0] <= 0x00ff) return false;
  return parsed.range() === 'unicast';
}

/** A `lookup` for node:http(s) that refuses non-public answers (used by the delivery worker). */
export function publicOnlyLookup(allowPrivate: boolean): NonNullable<import('node:net').TcpNetConnectOpts['lookup']> {
  return (hostname, options, callback) => {
    dns.lookup(hostname, { ...options, all: true }, (error, addresses) => {
      if (error) return callback(error, '', 4);
      const list = addresses as dns.LookupAddress[];
      const bad = allowPrivate ? undefined : list.find((a) => !isPublicAddress(a.address));
      if (bad || list.length === 0) {
        return callback(new Error(`${hostname} resolves to ${bad?.address ?? 'nothing'}, which is not a public address`), '', 4);
      }
      if ((options as { all?: boolean }).all) return (callback as unknown as (e: null, a: dns.LookupAddress[]) => void)(null, list);
      callback(null, list[0].address, list[0].family);
    });
  };
}

const LOOKUP_TIMEOUT_MS = 3000;

function resolveAll(hostname: string): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('timeout')), LOOKUP_TIMEOUT_MS);
    dns.lookup(hostname, { all: true }, (error, addresses) => {
      clearTimeout(timer);
      if (error) reject(error);
      else resolve(addresses.map((a) => a.address));
    });
  });
}

/** Why `value` cannot be a URL Parley posts to (a webhook's, an agent tool's), by its form alone, or undefined. */
export function urlFormProblem(value: string, allowPrivate: boolean, example: string): string | undefined {
  if (!URL.canParse(value)) return `must be an absolute URL, such as ${example}`;
  const url = new URL(value);
  if (url.protocol !== 'https:' && !(allowPrivate && url.protocol === 'http:')) return 'must be an https URL';
  if (url.username || url.password) return 'must not carry a user name or password';
  if (url.hash) return 'must not have a fragment';
  return undefined;
}

/** Why `value` cannot be a webhook URL, or undefined. Resolves the host name (every address must be public). */
export async function webhookUrlProblem(value: string, allowPrivate: boolean): Promise<string | undefined> {
  const problem = urlFormProblem(value, allowPrivate, 'https://example.com/webhooks');
  if (problem || allowPrivate) return problem;
  const url = new URL(value);
  const host = url.hostname.replace(/^\[|\]$/g, '');
  if (isIP(host)) return isPublicAddress(host) ? undefined : `names ${host}, which is not a public address`;
  let addresses: string[];
  try {
    addresses = await resolveAll(host);
  } catch {
    return `names ${host}, which does not resolve`;
  }
  const bad = addresses.find((a) => !isPublicAddress(a));
  return bad ? `names ${host}, which resolves to ${bad}, not a public address` : undefined;
}

export interface SignedPostOutcome {
  ok: boolean;
  status?: number;
  error?: string;
  /** The answer's body, at most `maxResponseBytes` of it (only when asked for). */
  body?: Buffer;
  /** The answer was longer than `maxResponseBytes`: the rest was not read. */
  cut?: boolean;
}

/**
 * POSTs `body` (JSON) signed as the Standard Webhooks specification says (standardwebhooks.com: `webhook-id`,
 * `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256>`), under the address rules above: https
 * only, and the address connected to must be public (checked after the name is resolved, on every request)
 * unless `allowPrivate`. At most `maxResponseBytes` of the answer are read; redirects are not followed. The
 * webhook worker (src/events/webhooks.ts) and the agents' tools (src/agents/tools.ts) both send through it.
 * Never throws: the outcome says what happened.
 */
export function signedPost(
  url: string,
  secret: string,
  messageId: string,
  body: string,
  options: {
    timeoutMs: number;
    allowPrivate: boolean;
    maxResponseBytes: number;
    keepBody?: boolean;
    userAgent: string;
    headers?: Record<string, string>;
  },
): Promise<SignedPostOutcome> {
  return new Promise((resolve) => {
    let settled = false;
    // Declared before `done`, which may run before the request is made (a refused URL) and clears it.
    let timer: NodeJS.Timeout | undefined;
    const done = (outcome: SignedPostOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(outcome);
    };
    if (!URL.canParse(url)) return done({ ok: false, error: 'The URL is not valid.' });
    const target = new URL(url);
    // Node connects to an IP literal without calling `lookup`, so the check there never sees it: check it here,
    // on every attempt (the URL may have been saved under other rules).
    const literal = target.hostname.replace(/^\[|\]$/g, '');
    if (!options.allowPrivate && isIP(literal) && !isPublicAddress(literal))
      return done({ ok: false, error: `${literal} is not a public address.` });
    const timestamp = new Date();
    const signature = new Webhook(secret).sign(messageId, timestamp, body);
    const client = target.protocol === 'https:' ? https : target.protocol === 'http:' && options.allowPrivate ? http : undefined;
    if (!client) return done({ ok: false, error: 'The URL is not https.' });
    const request = client.request(target, {
      method: 'POST',
      headers: {
        ...options.headers,
        'Content-Type': 'application/json',
        'Content-Length': Buffer.byteLength(body),
        'User-Agent': options.userAgent,
        'webhook-id': messageId,
        'webhook-timestamp': String(Math.floor(timestamp.getTime() / 1000)),
        'webhook-signature': signature,
      },
      // The address connected to is checked (no loopback, private or link-local target), each time.
      lookup: publicOnlyLookup(options.allowPrivate),
    });
    timer = setTimeout(() => {
      request.destroy(new Error(`No answer within ${options.timeoutMs} ms.`));
    }, options.timeoutMs);
    request.on('error', (error) => done({ ok: false, error: error.message.slice(0, 500) }));
    request.on('response', (response) => {
      const status = response.statusCode ?? 0;
      const chunks: Buffer[] = [];
      let read = 0;
      const finish = (cut: boolean) => {
        const ok = status >= 200 && status < 300;
        const error = ok
          ? undefined
          : status >= 300 && status < 400
            ? `Answered ${status} (redirects are not followed).`
            : `Answered ${status}.`;
        const kept = options.keepBody ? Buffer.concat(chunks).subarray(0, options.maxResponseBytes) : undefined;
        done({ ok, status, error, ...(kept ? { body: kept } : {}), ...(cut ? { cut } : {}) });
        response.destroy();
      };
      response.on('data', (chunk: Buffer) => {
        read += chunk.length;
        if (options.keepBody) chunks.push(chunk);
        // Past the bound the rest of the answer is not read.
        if (read > options.maxResponseBytes) finish(true);
      });
      response.on('end', () => finish(false));
      response.on('error', () => finish(false));
    });
    request.end(body);
  });
}
