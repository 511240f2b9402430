/**
 * A hand-written SIP client over TLS (RFC 3261 section 26.2), since Debian's SIPp is built without TLS: one
 * connection, messages framed by Content-Length (section 18.3, mandatory on stream transports), and a
 * self-signed certificate for the edge made with openssl at test time.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';

export interface SipMessage {
  /** The status of a response, 0 for a request. */
  status: number;
  /** The method of a request (`OPTIONS`), empty for a response. */
  method: string;
  text: string;
  header(name: string): string | undefined;
  headers(name: string): string[];
}

function parse(text: string): SipMessage {
  const status = Number(/^SIP\/2\.0 (\d{3})/.exec(text)?.[1] ?? 0);
  const head = text.split('\r\n\r\n')[0];
  const all = (name: string) =>
    [...head.matchAll(new RegExp(`^${name}:\\s*(.*)$`, 'gim'))].flatMap((m) => m[1].split(/,(?=\s*<)/).map((v) => v.trim()));
  return {
    status,
    method: status ? '' : (/^([A-Z]+) /.exec(text)?.[1] ?? ''),
    text,
    header: (name) => all(name)[0],
    headers: all,
  };
}

/** A self-signed certificate for 127.0.0.1 and its key, in a new temporary folder (the caller removes it). */
export function selfSignedCertificate(): { dir: string; cert: string; key: string; pem: string } {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-tls-'));
  const cert = path.join(dir, 'cert.pem');
  const key = path.join(dir, 'key.pem');
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-days',
      '1',
      '-subj',
      '/CN=127.0.0.1',
      '-addext',
      'subjectAltName=IP:127.0.0.1',
      '-keyout',
      key,
      '-out',
      cert,
    ],
    { stdio: 'ignore' },
  );
  return { dir, cert, key, pem: fs.readFileSync(cert, 'utf8') };
}

export interface TlsPhone {
  /** `127.0.0.1:<port>` of this end of the connection (for Via and Contact). */
  local: string;
  send(message: string): void;
  /** The next message received that `accept` takes (others are dropped), or an error after `timeoutMs`. */
  next(accept?: (m: SipMessage) => boolean, timeoutMs?: number): Promise<SipMessage>;
  /** The TLS protocol negotiated (`TLSv1.3`). */
  protocol: string | null;
  close(): void;
}

/** Connects to the edge's TLS address, checking its certificate against `ca` (the self-signed one). */
export async function connectTls(port: number, ca: string): Promise<TlsPhone> {
  const socket = tls.connect({ host: '127.0.0.1', port, ca, servername: undefined });
  await new Promise<void>((resolve, reject) => {
    socket.once('secureConnect', resolve);
    socket.once('error', reject);
  });
  let buffer = Buffer.alloc(0);
  const queue: SipMessage[] = [];
  let waiter: (() => void) | undefined;
  socket.on('data', (data: Buffer) => {
    buffer = Buffer.concat([buffer, data]);
    for (;;) {
      const end = buffer.indexOf('\r\n\r\n');
      if (end < 0) break;
      const head = buffer.subarray(0, end).toString('utf8');
      const length = Number(/^(?:Content-Length|l):\s*(\d+)/im.exec(head)?.[1] ?? 0);
      if (buffer.length < end + 4 + length) break;
      const text = buffer.subarray(0, end + 4 + length).toString('utf8');
      buffer = buffer.subarray(end + 4 + length);
      // Keep-alive CRLFs (RFC 5626 section 3.5.1) may precede a message.
      const message = text.replace(/^(\r\n)+/, '');
      if (message) queue.push(parse(message));
    }
    waiter?.();
  });
  return {
    local: `127.0.0.1:${socket.localPort}`,
    protocol: socket.getProtocol(),
    send: (message) => socket.write(message),
    async next(accept = () => true, timeoutMs = 5000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        while (queue.length) {
          const message = queue.shift()!;
          if (accept(message)) return message;
        }
        const left = deadline - Date.now();
        if (left <= 0) throw new Error('no SIP message over TLS in time');
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, left);
          waiter = () => {
            clearTimeout(timer);
            resolve();
          };
        });
      }
    },
    close: () => socket.destroy(),
  };
}
