import pino, { type DestinationStream, type Logger } from 'pino';
import type { Config } from '../config/index.js';

/** Paths that may hold a secret; pino replaces their values before anything is written. */
const REDACT = [
  'req.headers.authorization',
  'req.headers.cookie',
  'headers.authorization',
  '*.password',
  '*.token',
  '*.sip_password',
  '*.secret',
  '*.publishable_key',
  '*.secret_key',
];

/** JSON lines on stdout (or `destination`), never carrying credentials or passwords. */
export function createLogger(config: Config, destination?: DestinationStream): Logger {
  return pino(
    {
      level: config.logLevel,
      redact: { paths: REDACT, censor: '[redacted]' },
      serializers: {
        // Only what identifies a request: no headers, no query string (cursors, filters may be sensitive).
        req: (req: { method: string; url: string; id: string }) => ({ id: req.id, method: req.method, path: req.url.split('?')[0] }),
        res: (res: { statusCode: number }) => ({ statusCode: res.statusCode }),
      },
    },
    destination,
  );
}
