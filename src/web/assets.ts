/**
 * The browser side, served by `serve`: the operator console (a single-page application under /console) and
 * the visitor chat widget (/widget.js). Both are built by `npm run build:web` (Vite) into dist/public when the
 * package is installed; nothing is fetched from elsewhere at run time.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import fastifyStatic from '@fastify/static';
import type { FastifyInstance, FastifyReply } from 'fastify';

/** dist/public at the package root, whether this file runs from src/web (tsx) or dist/web (built). */
export const PUBLIC_DIR = fileURLToPath(new URL('../../dist/public/', import.meta.url));

/**
 * The console's own pages allow scripts, styles and connections from this origin only, and no framing
 * (clickjacking); the sign-in token lives in sessionStorage, so it never leaves with a Referer either. The one
 * other connection allowed is the softphone's WebSocket to the SIP edge (SIP_WS_URL), when there is one.
 */
export function consoleHeaders(sipWsUrl?: string): Record<string, string> {
  const connect = ["'self'", ...(sipWsUrl ? [new URL(sipWsUrl).origin] : [])].join(' ');
  return {
    'Content-Security-Policy': `default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src ${connect}; frame-ancestors 'none'; base-uri 'none'; form-action 'none'`,
    'Referrer-Policy': 'no-referrer',
    'X-Content-Type-Options': 'nosniff',
  };
}

function missing(reply: FastifyReply) {
  return reply
    .code(503)
    .type('text/plain; charset=utf-8')
    .send('The console has not been built: run `npm run build:web` (npm install runs it).\n');
}

export async function registerWebAssets(app: FastifyInstance, sipWsUrl: string | undefined): Promise<void> {
  const CONSOLE_HEADERS = consoleHeaders(sipWsUrl);
  const config = { public: true };
  await app.register(fastifyStatic, {
    root: `${PUBLIC_DIR}console`,
    prefix: '/console/',
    index: false,
    wildcard: true,
    serve: true,
    // Cache-Control is set per file below, not by send's max-age default.
    cacheControl: false,
    // Vite names assets by content hash, so they never change; the page itself is always revalidated.
    // (@fastify/static hands the raw Node response here.)
    setHeaders: (response, file) => {
      for (const [name, value] of Object.entries(CONSOLE_HEADERS)) response.setHeader(name, value);
      response.setHeader('Cache-Control', /[\\/]assets[\\/]/.test(file) ? 'public, max-age=31536000, immutable' : 'no-cache');
    },
  });
  // The link printed by the command line is /console#key=...; the fragment never reaches the server.
  app.get('/console', { config }, async (_request, reply) => {
    if (!existsSync(`${PUBLIC_DIR}console/index.html`)) return missing(reply);
    return reply.headers({ ...CONSOLE_HEADERS, 'Cache-Control': 'no-cache' }).sendFile('index.html', `${PUBLIC_DIR}console`);
  });
  app.get('/widget.js', { config }, async (_request, reply) => {
    if (!existsSync(`${PUBLIC_DIR}widget.js`)) return missing(reply);
    // Embedded by other sites: readable from any origin, revalidated so that fixes reach them.
    return reply
      .headers({ 'Cache-Control': 'no-cache', 'Cross-Origin-Resource-Policy': 'cross-origin', 'X-Content-Type-Options': 'nosniff' })
      .type('text/javascript; charset=utf-8')
      .sendFile('widget.js', PUBLIC_DIR);
  });
}
