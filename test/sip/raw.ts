/**
 * A hand-written SIP client over UDP for the attacks SIPp cannot play: forged in-dialog requests, a captured
 * Authorization sent again. Digest responses per RFC 2617 section 3.2.2 (MD5, no qop, as the edge challenges).
 */
import { createHash, randomBytes } from 'node:crypto';
import dgram from 'node:dgram';

const md5 = (text: string) => createHash('md5').update(text).digest('hex');

export interface SipResponse {
  status: number;
  text: string;
  header(name: string): string | undefined;
}

function parse(text: string): SipResponse {
  const status = Number(/^SIP\/2\.0 (\d{3})/.exec(text)?.[1] ?? 0);
  return {
    status,
    text,
    header(name) {
      const match = new RegExp(`^${name}:\\s*(.*)$`, 'im').exec(text);
      return match?.[1].trim();
    },
  };
}

/** A UDP endpoint on `ip` (a port of the kernel's choice) that records every datagram it receives. */
export async function listener(ip = '127.0.0.1') {
  const socket = dgram.createSocket('udp4');
  const received: string[] = [];
  socket.on('message', (message) => received.push(message.toString('utf8')));
  await new Promise<void>((resolve) => socket.bind(0, ip, resolve));
  return { port: socket.address().port, received, close: () => new Promise<void>((resolve) => socket.close(() => resolve())) };
}

/** Sends `message` from `ip` to the edge and collects answers until a final one (>= 200) or `waitMs`. */
export async function send(edgePort: number, message: string, ip = '127.0.0.1', waitMs = 2000): Promise<SipResponse[]> {
  const socket = dgram.createSocket('udp4');
  await new Promise<void>((resolve) => socket.bind(0, ip, resolve));
  const port = socket.address().port;
  const answers: SipResponse[] = [];
  const text = message.replaceAll('{{local}}', `${ip}:${port}`);
  await new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, waitMs);
    socket.on('message', (data) => {
      const response = parse(data.toString('utf8'));
      answers.push(response);
      if (response.status >= 200) {
        clearTimeout(timer);
        resolve();
      }
    });
    socket.send(text, edgePort, '127.0.0.1');
  });
  await new Promise<void>((resolve) => socket.close(() => resolve()));
  return answers;
}

/** The digest Authorization for a challenge (`WWW-Authenticate`/`Proxy-Authenticate` value). */
export function authorization(challenge: string, method: string, uri: string, user: string, password: string): string {
  const realm = /realm="([^"]*)"/.exec(challenge)![1];
  const nonce = /nonce="([^"]*)"/.exec(challenge)![1];
  const response = md5(`${md5(`${user}:${realm}:${password}`)}:${nonce}:${md5(`${method}:${uri}`)}`);
  return `Digest username="${user}", realm="${realm}", nonce="${nonce}", uri="${uri}", response="${response}", algorithm=MD5`;
}

export const branch = () => `z9hG4bK${randomBytes(8).toString('hex')}`;
export const tag = () => randomBytes(6).toString('hex');
