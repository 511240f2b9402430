/** Settings of the SIP edge and the rendering of Kamailio's configuration from the template in `sip/`. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadMediaSettings } from '../config/media.js';
import { origins } from '../config/index.js';

/** A listen address: SIP over `udp`, `tcp`, `tls`; a WebSocket (RFC 7118) `ws` over TCP, `wss` over TLS. */
export interface SipListen<Proto = 'udp' | 'tcp' | 'tls'> {
  proto: Proto;
  host: string;
  port: number;
}

export type SipWsListen = SipListen<'ws' | 'wss'>;

/** The SIP edge's settings, as `loadSipSettings` reads them from the environment. */
export type SipSettings = ReturnType<typeof loadSipSettings>;

/**
 * Premium-rate and similar ranges that toll fraud dials (the default of SIP_OUTBOUND_DENY_PREFIXES): North
 * America 900/976, UK 09 and 0871-3, Germany 0900 and 0137, France 089, Italy 899/892, Spain 803/806/807/905,
 * Australia 190, and the international premium and satellite codes (+979, +881, +882, +883, +870).
 */
export const DEFAULT_OUTBOUND_DENY_PREFIXES =
  '+1900 +1976 +449 +44871 +44872 +44873 +49900 +49137 +3389 +39899 +39892 +34803 +34806 +34807 +34905 +61190 +979 +881 +882 +883 +870'.split(
    ' ',
  );

function prefixes(env: NodeJS.ProcessEnv): string[] {
  const raw = env.SIP_OUTBOUND_DENY_PREFIXES;
  if (raw === undefined) return DEFAULT_OUTBOUND_DENY_PREFIXES;
  const list = raw
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean);
  for (const prefix of list)
    if (!/^\+[0-9]{1,15}$/.test(prefix))
      throw new Error(`SIP_OUTBOUND_DENY_PREFIXES must list + and digits, comma-separated; got "${prefix}"`);
  return list;
}

function int(env: NodeJS.ProcessEnv, name: string, fallback: number, min = 0): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min) throw new Error(`${name} must be an integer >= ${min}, got "${raw}"`);
  return value;
}

const DOMAIN = /^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$/;

/** `name`'s comma-separated `<proto>:<IP address>:<port>` addresses (`example` shows them); an IPv6 host keeps its brackets. */
function parseListens<Proto extends string>(name: string, protos: Proto[], listen: string, example: string): SipListen<Proto>[] {
  const pattern = new RegExp(`^(${protos.join('|')}):(\\d{1,3}(\\.\\d{1,3}){3}|\\[[0-9A-Fa-f:.]+\\]):(\\d{1,5})$`);
  return listen.split(',').map((one) => {
    const match = pattern.exec(one.trim());
    if (!match || Number(match[4]) < 1 || Number(match[4]) > 65535) {
      throw new Error(`${name} must be one or more ${protos.join('|')}:<IP address>:<port>, comma-separated (${example}), got "${listen}"`);
    }
    return { proto: match[1] as Proto, host: match[2], port: Number(match[4]) };
  });
}

/** SIP_LISTEN's addresses (`udp:0.0.0.0:5060,tls:0.0.0.0:5061`). */
export const parseSipListen = (listen: string): SipListen[] =>
  parseListens('SIP_LISTEN', ['udp', 'tcp', 'tls'], listen, 'udp:0.0.0.0:5060,tls:0.0.0.0:5061');

/** SIP_WS_LISTEN's addresses (`wss:0.0.0.0:8443,ws:127.0.0.1:8080`); empty or unset: none. */
export const parseSipWsListen = (listen: string | undefined): SipWsListen[] =>
  listen ? parseListens('SIP_WS_LISTEN', ['ws', 'wss'], listen, 'wss:0.0.0.0:8443,ws:127.0.0.1:8080') : [];

/** Kamailio's socket under a WebSocket address: ws over a TCP socket, wss over a TLS one. */
const wsSocketProto = (l: SipWsListen) => (l.proto === 'ws' ? 'tcp' : 'tls');

/** Whether two addresses share a port on overlapping hosts (0.0.0.0 overlaps every IPv4 address). */
const overlaps = (a: SipListen<string>, b: SipListen<string>) =>
  a.port === b.port && (a.host === b.host || a.host === '0.0.0.0' || b.host === '0.0.0.0');

function wsOrigins(env: NodeJS.ProcessEnv): string[] {
  const raw = env.SIP_WS_ORIGINS || (env.PUBLIC_URL ? new URL(env.PUBLIC_URL).origin : undefined);
  const list = origins(raw, 'SIP_WS_ORIGINS');
  // Built into the configuration's comparisons: only the characters an origin can have.
  for (const origin of list) {
    if (!/^https?:\/\/[A-Za-z0-9.-]+(:\d{1,5})?$|^https?:\/\/\[[0-9A-Fa-f:.]+\](:\d{1,5})?$/.test(origin))
      throw new Error(`SIP_WS_ORIGINS: "${origin}" is not an origin like https://console.example.com`);
  }
  return list;
}

export function loadSipSettings(env: NodeJS.ProcessEnv = process.env) {
  const listen = env.SIP_LISTEN || 'udp:127.0.0.1:5060';
  const listens = parseSipListen(listen);
  const wsListens = parseSipWsListen(env.SIP_WS_LISTEN);
  for (const ws of wsListens) {
    const clash = listens.find((l) => l.proto !== 'udp' && overlaps(l, ws));
    if (clash)
      throw new Error(
        `SIP_WS_LISTEN ${ws.proto}:${ws.host}:${ws.port} shares its port with SIP_LISTEN ${clash.proto}:${clash.host}:${clash.port}`,
      );
  }
  const origins = wsListens.length ? wsOrigins(env) : [];
  if (wsListens.length && origins.length === 0) {
    throw new Error(
      "SIP_WS_LISTEN needs the console's origin, whose pages may open the SIP WebSocket: set SIP_WS_ORIGINS (https://console.example.com) or PUBLIC_URL",
    );
  }
  const tlsCert = env.SIP_TLS_CERT || undefined;
  const tlsKey = env.SIP_TLS_KEY || undefined;
  if (listens.some((l) => l.proto === 'tls') || wsListens.some((l) => l.proto === 'wss')) {
    for (const [name, file] of [
      ['SIP_TLS_CERT', tlsCert],
      ['SIP_TLS_KEY', tlsKey],
    ] as const) {
      if (!file) throw new Error(`${name} must name a PEM file when SIP_LISTEN has a tls: address or SIP_WS_LISTEN a wss: one`);
      if (!fs.existsSync(file)) throw new Error(`${name}: ${file} does not exist`);
    }
  }
  const domain = env.SIP_DOMAIN || 'parley.local';
  if (!DOMAIN.test(domain)) throw new Error(`SIP_DOMAIN must be a host name, got "${domain}"`);
  return {
    /** SIP_LISTEN as given: one or more `udp|tcp|tls:<IP address>:<port>`, comma-separated. */
    listen,
    /** Each Kamailio `listen` address. */
    listens,
    /** PEM certificate chain and private key for the TLS listen addresses (SIP_TLS_CERT, SIP_TLS_KEY). */
    tlsCert,
    tlsKey,
    /** SIP_WS_LISTEN: the WebSocket addresses browsers connect to (`wss:0.0.0.0:8443`); empty: none. */
    wsListens,
    /**
     * Origins (scheme://host[:port]) whose pages may open a SIP WebSocket: the console's (SIP_WS_ORIGINS, else
     * PUBLIC_URL's origin). A handshake with any other Origin, or none, is refused with 403.
     */
    wsOrigins: origins,
    /** The one SIP domain users register in: `<sip_username>@<domain>`. */
    domain,
    /** Ring timeout before an unanswered call ends as no_answer. */
    ringTimeoutSeconds: int(env, 'SIP_RING_TIMEOUT_SECONDS', 30, 1),
    /** Requests per 2 s from one address before it is banned (pike); 0 turns the check off. */
    floodRequests: int(env, 'SIP_FLOOD_REQUESTS', 200),
    /** Failed authentications per minute from one address before it is banned. */
    authFailures: int(env, 'SIP_AUTH_FAILURES', 20, 1),
    banSeconds: int(env, 'SIP_BAN_SECONDS', 300, 1),
    /** Kamailio worker processes. */
    children: int(env, 'SIP_CHILDREN', 4, 1),
    /** How often gateway edits are looked for (and Kamailio told to reload them) and revoked softphones' calls ended. */
    reloadIntervalMs: int(env, 'SIP_RELOAD_INTERVAL_MS', 2000, 100),
    /** How often calls whose dialog is gone are ended. */
    reconcileIntervalMs: int(env, 'SIP_RECONCILE_INTERVAL_MS', 30_000, 100),
    /**
     * In-dialog OPTIONS keep-alives to both parties every this many seconds (the dialog module's minimum is 30):
     * a phone that vanished without BYE ends its call about 15 s after the first unanswered one.
     */
    keepaliveSeconds: int(env, 'SIP_KEEPALIVE_SECONDS', 30, 30),
    /** Call events Kamailio holds in memory while the database cannot take them (the oldest go first). */
    eventQueueSize: int(env, 'SIP_EVENT_QUEUE_SIZE', 100_000, 100),
    kamailioBinary: env.KAMAILIO_BIN || 'kamailio',
    kamcmdBinary: env.KAMCMD_BIN || 'kamcmd',
    /** Kamailio's log level (-5..3); 1 (notices, warnings, errors) by default. */
    kamailioDebug: int(env, 'SIP_KAMAILIO_DEBUG', 1, 0),
    /** E.164 prefixes (`+` and digits) no outbound call may dial: premium-rate ranges by default (toll fraud). */
    outboundDenyPrefixes: prefixes(env),
    /** Outbound calls one organisation may have at once through its gateway. */
    outboundMaxCalls: int(env, 'SIP_OUTBOUND_MAX_CALLS', 10, 0),
    /** rtpengine, the media plane (RTP_PORT_MIN/MAX, MEDIA_ADVERTISED_ADDRESS; src/config/media.ts). */
    media: loadMediaSettings(env),
    /**
     * Where calls to AI agents go: the voice runtime's SIP address, `host:port` (VOICE_SIP_HOST, VOICE_SIP_PORT;
     * VOICE_ADVERTISED_ADDRESS when the runtime listens on every address).
     */
    voiceAddress: voiceAddress(env),
  };
}

/**
 * The local address rtpengine binds RTP on: MEDIA_LISTEN_ADDRESS; else the first concrete SIP_LISTEN address
 * (media beside signalling); else, when SIP listens on a wildcard, the host's first non-internal IPv4 address
 * (rtpengine writes the address it binds into SDP, and a wildcard names no host), loopback as the last resort.
 */
export function mediaListenAddress(settings: SipSettings, interfaces = os.networkInterfaces()): string {
  if (settings.media.listenAddress) return settings.media.listenAddress;
  const concrete = settings.listens.map((l) => l.host.replace(/^\[|\]$/g, '')).find((h) => h !== '0.0.0.0' && h !== '::');
  if (concrete) return concrete;
  for (const list of Object.values(interfaces)) {
    const found = list?.find((i) => i.family === 'IPv4' && !i.internal);
    if (found) return found.address;
  }
  return '127.0.0.1';
}

/** The voice runtime's address as the edge sends to it: an IPv4 address (a wildcard is reached on loopback). */
function voiceAddress(env: NodeJS.ProcessEnv): string {
  const listen = env.VOICE_SIP_HOST || '127.0.0.1';
  const host = listen === '0.0.0.0' ? env.VOICE_ADVERTISED_ADDRESS || '127.0.0.1' : listen;
  if (!/^\d{1,3}(\.\d{1,3}){3}$/.test(host))
    throw new Error(`VOICE_SIP_HOST (or VOICE_ADVERTISED_ADDRESS) must be an IPv4 address for the SIP edge, got "${host}"`);
  return `${host}:${int(env, 'VOICE_SIP_PORT', 5070, 1)}`;
}

/** The address trunk registrations give as Contact: the first UDP listen address (else the first), `host:port`. */
export function contactAddress(listens: SipListen[]): string {
  const first = listens.find((l) => l.proto === 'udp') ?? listens[0];
  return `${first.host}:${first.port}${first.proto === 'udp' ? '' : `;transport=${first.proto}`}`;
}

/**
 * Kamailio's db_postgres takes `postgres://user:password@host:port/database` and nothing else:
 * query parameters are dropped, the port made explicit.
 */
export function kamailioDatabaseUrl(databaseUrl: string): string {
  const url = new URL(databaseUrl);
  if (url.protocol !== 'postgres:' && url.protocol !== 'postgresql:') {
    throw new Error('DATABASE_URL must be a postgres:// URL for the SIP edge');
  }
  const auth = url.username ? `${url.username}${url.password ? `:${url.password}` : ''}@` : '';
  return `postgres://${auth}${url.hostname || '127.0.0.1'}:${url.port || '5432'}${url.pathname}`;
}

/** The template ships beside `src/` and `dist/` (both two levels below the package root). */
export const TEMPLATE_PATH = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../sip/kamailio.cfg');

/** Placeholders that are whole expressions of the configuration language, with strings of their own. */
const QUOTED = new Set(['WS_SOCKETS', 'WS_ORIGINS']);

/**
 * A condition true for an HTTP request (a WebSocket handshake) or a SIP message received on one of the
 * WebSocket sockets: its local port, transport and (unless it listens on every address) local address.
 */
export function wsSocketsCondition(listens: SipWsListen[]): string {
  if (listens.length === 0) return '0';
  return listens
    .map((l) => {
      const parts = [`$Rp == ${l.port}`, `$pr == "${wsSocketProto(l)}"`];
      if (l.host !== '0.0.0.0' && l.host !== '[::]') parts.push(`$Ri == "${l.host.replace(/^\[|\]$/g, '')}"`);
      return `(${parts.join(' && ')})`;
    })
    .join(' || ');
}

export interface RenderInput {
  settings: SipSettings;
  databaseUrl: string;
  runDir: string;
  /**
   * rtpengine's ng control socket (`udp:127.0.0.1:<port>`): with it every call's media is anchored
   * (WITH_MEDIA in the template); without it (a benchmark's bare Kamailio) SDP passes untouched.
   */
  rtpengineSocket?: string;
}

/** Fills every `{{NAME}}` of the template; a name left unfilled is a bug in this function, so it throws. */
export function renderKamailioConfig(input: RenderInput, template = fs.readFileSync(TEMPLATE_PATH, 'utf8')): string {
  const { settings } = input;
  const values: Record<string, string> = {
    DB_URL: kamailioDatabaseUrl(input.databaseUrl),
    SIP_DOMAIN: settings.domain,
    LOG_LEVEL: String(settings.kamailioDebug),
    LOG_PREFIX: 'kamailio ',
    CHILDREN: String(settings.children),
    LISTENS: [
      ...settings.listens.map((l) => `listen=${l.proto}:${l.host}:${l.port}`),
      ...settings.wsListens.map((l) => `listen=${wsSocketProto(l)}:${l.host}:${l.port}`),
    ].join('\n'),
    DISABLE_TCP: settings.listens.some((l) => l.proto !== 'udp') || settings.wsListens.length ? 'no' : 'yes',
    // TLS (RFC 3261 section 26.2) is Kamailio's tls module, loaded only when a tls: or wss: address is listened on.
    TLS_DEFINE:
      settings.listens.some((l) => l.proto === 'tls') || settings.wsListens.some((l) => l.proto === 'wss') ? '#!define WITH_TLS' : '',
    // SIP over WebSocket (RFC 7118): the xhttp and websocket modules, loaded only with SIP_WS_LISTEN.
    WS_DEFINE: settings.wsListens.length ? '#!define WITH_WS' : '',
    WS_SOCKETS: wsSocketsCondition(settings.wsListens),
    WS_ORIGINS: settings.wsOrigins.length ? settings.wsOrigins.map((o) => `$hdr(Origin) == "${o}"`).join(' || ') : '0',
    TLS_CERT: settings.tlsCert ?? '',
    TLS_KEY: settings.tlsKey ?? '',
    RUN_DIR: input.runDir,
    RING_TIMEOUT_MS: String(settings.ringTimeoutSeconds * 1000),
    BAN_SECONDS: String(settings.banSeconds),
    AUTH_FAILURES: String(settings.authFailures),
    PIKE_DENSITY: String(settings.floodRequests),
    PIKE_PARAM: String(Math.max(1, settings.floodRequests)),
    CONTACT_ADDR: contactAddress(settings.listens),
    // A regular expression over the E.164 number; an empty list matches nothing (no E.164 number starts with +0).
    OUTBOUND_DENY: settings.outboundDenyPrefixes.length
      ? `^[+](${settings.outboundDenyPrefixes.map((p) => p.slice(1)).join('|')})`
      : '^[+]0',
    OUTBOUND_MAX_CALLS: String(settings.outboundMaxCalls),
    KEEPALIVE_SECONDS: String(settings.keepaliveSeconds),
    EVENT_QUEUE_SIZE: String(settings.eventQueueSize),
    MEDIA_DEFINE: input.rtpengineSocket ? '#!define WITH_MEDIA' : '',
    RTPENGINE_SOCK: input.rtpengineSocket ?? '',
    VOICE_ADDR: settings.voiceAddress,
  };
  for (const [name, value] of Object.entries(values)) {
    // Values land inside double-quoted strings of the configuration language: refuse what would end one.
    // The listen lines are one per address, each built from validated parts above.
    // The WebSocket conditions quote validated origins and addresses themselves.
    if ((/["]/.test(value) && !QUOTED.has(name)) || /\r/.test(value) || (name !== 'LISTENS' && value.includes('\n'))) {
      throw new Error(`${name} must not contain quotes or line breaks`);
    }
  }
  return template.replace(/\{\{([A-Z_]+)\}\}/g, (whole, name: string) => {
    if (values[name] === undefined) throw new Error(`unknown placeholder ${whole} in the Kamailio template`);
    return values[name];
  });
}

/**
 * The sources the voice runtime takes requests from when `sip serve` runs it: each of Kamailio's UDP listen
 * addresses, `address:port` (Kamailio sends from its listen socket); a wildcard listen address sends from
 * whichever address routes to the runtime, so then loopback with that port too.
 */
export function edgeSources(listens: SipListen[]): string[] {
  return listens
    .filter((l) => l.proto === 'udp')
    .flatMap((l) =>
      l.host === '0.0.0.0' ? [`127.0.0.1:${l.port}`, ...localAddresses().map((a) => `${a}:${l.port}`)] : [`${l.host}:${l.port}`],
    );
}

function localAddresses(): string[] {
  return Object.values(os.networkInterfaces())
    .flat()
    .filter((i) => i && i.family === 'IPv4')
    .map((i) => i!.address);
}
