import os from 'node:os';
import path from 'node:path';

/** Every setting Parley reads: the value `loadConfig` returns. */
export type Config = ReturnType<typeof loadConfig>;
export type VoiceConfig = Config['voice'];

/** TRUST_PROXY: unset/false, true (one hop: the nearest proxy), a hop count, or proxy addresses. */
function trustProxy(raw: string | undefined): boolean | number | string {
  if (raw === undefined || raw === 'false' || raw === '0') return false;
  if (raw === 'true') return 1;
  if (/^\d+$/.test(raw)) return Number(raw);
  return raw;
}

function int(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 0) throw new Error(`${name} must be a non-negative integer, got "${raw}"`);
  return value;
}

function text(env: NodeJS.ProcessEnv, name: string): string | undefined {
  const raw = env[name];
  return raw === undefined || raw === '' ? undefined : raw;
}

/** `memory://` keeps the embedded database in memory (tests); anything else is a folder. */
function dataDir(raw: string | undefined): string {
  return raw?.startsWith('memory://') ? raw : path.resolve(raw ?? 'data');
}

/** SIP_WS_URL: a ws:// or wss:// URL (the SIP edge's WebSocket, RFC 7118), or unset. */
function wsUrl(raw: string | undefined): string | undefined {
  if (!raw) return undefined;
  const parsed = URL.canParse(raw) ? new URL(raw) : undefined;
  if (!parsed || !/^wss?:$/.test(parsed.protocol) || parsed.username || parsed.password || parsed.search || parsed.hash) {
    throw new Error(`SIP_WS_URL: "${raw}" is not a WebSocket URL like wss://sip.example.com:8443`);
  }
  return raw;
}

/** A comma-separated list of origins; each must be scheme://host[:port] (an origin as browsers send it, RFC 6454). */
export function origins(raw: string | undefined, name = 'CORS_ALLOWED_ORIGINS'): string[] {
  if (!raw) return [];
  return raw.split(',').map((entry) => {
    const origin = entry.trim().replace(/\/+$/, '');
    const parsed = URL.canParse(origin) ? new URL(origin) : undefined;
    if (!parsed || !/^https?:$/.test(parsed.protocol) || parsed.origin !== origin) {
      throw new Error(`${name}: "${entry.trim()}" is not an origin like https://www.example.com`);
    }
    return origin;
  });
}

/**
 * log2 of scrypt's N for password hashes: 15 (32 MiB per hash) unless PASSWORD_HASH_COST_LOG2 lowers it, e.g.
 * for tests (min 10). Read at each hash, not with the rest, since hashing needs no Config.
 */
export const passwordHashCostLog2 = (env: NodeJS.ProcessEnv = process.env) => Math.max(10, Number(env.PASSWORD_HASH_COST_LOG2 ?? 15) || 15);

/** Where the server is reached, for links the command line prints: PUBLIC_URL, else the local port. */
export const publicBaseUrl = (config: Config) => config.publicUrl ?? `http://127.0.0.1:${config.port}`;

/** Every setting Parley reads, with its default. Documented in the README. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env) {
  const databaseUrl = text(env, 'DATABASE_URL');
  const signingSecret = text(env, 'SIGNING_SECRET');
  if (signingSecret !== undefined && signingSecret.length < 32) {
    throw new Error('SIGNING_SECRET must be at least 32 characters');
  }
  return {
    port: int(env, 'PORT', 8080),
    host: text(env, 'HOST') ?? '0.0.0.0',
    /** PostgreSQL URL; when absent the embedded PGlite database in `dataDir` is used. */
    databaseUrl,
    dataDir: dataDir(text(env, 'DATA_DIR')),
    /** Base for absolute links and `Location`; when absent, taken from the request's Host. */
    publicUrl: text(env, 'PUBLIC_URL')?.replace(/\/+$/, ''),
    /** HS256 secret for every JWT; generated and stored in the database when absent. */
    signingSecret,
    logLevel: text(env, 'LOG_LEVEL') ?? 'info',
    userTokenTtlSeconds: int(env, 'USER_TOKEN_TTL_SECONDS', 12 * 3600),
    /**
     * How long a verified API key or user token (its key or session and membership) is kept in memory, in
     * milliseconds; 0 reads them on every request. Any change to those records drops the cache at once.
     */
    credentialCacheMs: int(env, 'CREDENTIAL_CACHE_MS', 5000),
    /**
     * Bearer token that `GET /metrics` requires from any client; unset, metrics are served only to clients on
     * this host's loopback (the counters describe every tenant's traffic).
     */
    metricsToken: text(env, 'METRICS_TOKEN'),
    /** Upper bound for one database statement and for acquiring a connection. */
    databaseTimeoutMs: int(env, 'DATABASE_TIMEOUT_MS', 5000),
    databasePoolSize: int(env, 'DATABASE_POOL_SIZE', 10),
    bodyLimitBytes: int(env, 'BODY_LIMIT_BYTES', 1024 * 1024),
    /** What `include` may add to one response: records, and bytes of their JSON; beyond, 400 invalid_includes. */
    includeMaxRecords: int(env, 'INCLUDE_MAX_RECORDS', 1000),
    includeMaxBytes: int(env, 'INCLUDE_MAX_BYTES', 8 * 1024 * 1024),
    rateLimitPerMinute: int(env, 'RATE_LIMIT_PER_MINUTE', 1200),
    loginFailuresPerWindow: int(env, 'LOGIN_FAILURES_PER_WINDOW', 10),
    loginWindowSeconds: int(env, 'LOGIN_WINDOW_SECONDS', 15 * 60),
    /** Password checks for e-mails with no account, per organisation and login window; beyond, 401 with no check. */
    loginUnknownPerOrganisation: int(env, 'LOGIN_UNKNOWN_PER_ORGANISATION', 100),
    redisUrl: text(env, 'REDIS_URL'),
    /** Seed the demo organisation on first start of an empty embedded database. */
    demoOnFirstStart: (text(env, 'DEMO_ON_FIRST_START') ?? 'true') !== 'false',
    /**
     * Password checks running at once during login, and waiting for a slot; beyond both, 503. A check is a core's
     * work for about 100 ms and 32 MiB (scrypt, N = 2^15): more checks at once than cores finish no sooner, and
     * each holds its memory meanwhile. At most 4, libuv's threads.
     */
    loginHashConcurrency: Math.max(1, int(env, 'LOGIN_HASH_CONCURRENCY', Math.min(4, os.availableParallelism()))),
    loginHashQueue: int(env, 'LOGIN_HASH_QUEUE', 32),
    /**
     * Reverse proxies in front of the service: false (none), a number of hops (the client address is that many
     * entries from the right of X-Forwarded-For), or a comma-separated list of proxy addresses/CIDRs.
     */
    trustProxy: trustProxy(text(env, 'TRUST_PROXY')),
    /** Origins (scheme://host[:port]) whose pages may call the API from a browser (CORS); none by default. */
    corsAllowedOrigins: origins(text(env, 'CORS_ALLOWED_ORIGINS')),
    /**
     * Accept gateway `proxy` (or `realm`, when there is no proxy) naming a loopback, private or link-local
     * address or `localhost`: the SIP edge sends REGISTERs and calls there (development and tests only).
     */
    sipAllowPrivateGateways: text(env, 'SIP_ALLOW_PRIVATE_GATEWAYS') === 'true',
    /**
     * The SIP edge's WebSocket address the browser softphone connects to (`wss://sip.example.com:8443`, one of
     * `parley sip serve`'s SIP_WS_LISTEN addresses as browsers reach it); unset: no softphone credentials.
     */
    sipWsUrl: wsUrl(text(env, 'SIP_WS_URL')),
    /** Lifetime of a softphone's SIP credential, in seconds (docs/sip.md, "Softphone credentials"). */
    sipCredentialTtlSeconds: Math.max(60, int(env, 'SIP_CREDENTIAL_TTL_SECONDS', 600)),
    /** The folder `parley sip serve` renders Kamailio's configuration and control sockets into (SIP_RUN_DIR); unset: a new temporary one. */
    sipRunDir: text(env, 'SIP_RUN_DIR'),
    /** Lifetime of a visitor credential (the chat widget's), in seconds. */
    visitorTokenTtlSeconds: int(env, 'VISITOR_TOKEN_TTL_SECONDS', 2 * 3600),
    /** Requests per minute one visitor credential may make. */
    visitorRateLimitPerMinute: int(env, 'VISITOR_RATE_LIMIT_PER_MINUTE', 60),
    /** Requests per minute all visitor credentials together may make from one client address. */
    visitorAddressRateLimitPerMinute: int(env, 'VISITOR_ADDRESS_RATE_LIMIT_PER_MINUTE', 600),
    /** Visitor sessions (new widget conversations) one client address may open per hour. */
    visitorSessionsPerHour: int(env, 'VISITOR_SESSIONS_PER_HOUR', 30),
    /** The agents' model: any OpenAI-compatible Chat Completions endpoint; no base URL and no key means scripted steps only. */
    llmBaseUrl: text(env, 'LLM_BASE_URL')?.replace(/\/+$/, ''),
    llmApiKey: text(env, 'LLM_API_KEY'),
    llmModel: text(env, 'LLM_MODEL') ?? 'gpt-4o-mini',
    /** One model request's deadline (the whole stream). */
    llmTimeoutMs: int(env, 'LLM_TIMEOUT_MS', 30_000),
    /** Retries of a failed, timed-out, rate-limited or empty model answer before the turn hands off. */
    llmMaxRetries: int(env, 'LLM_MAX_RETRIES', 2),
    /** Token budget of the conversation history sent with a model turn (estimated as 4 characters a token). */
    llmHistoryTokens: int(env, 'LLM_HISTORY_TOKENS', 4000),
    /** Run the agent runtime inside `serve` (the `worker` command always runs it). */
    agentRuntime: (text(env, 'AGENT_RUNTIME') ?? 'true') !== 'false',
    /** The runtime's safety-net poll (commits announced on `parley_events` and in-process writes wake it at once). */
    agentPollMs: int(env, 'AGENT_POLL_MS', 5000),
    /** How long a claimed turn is held; a worker that dies mid-turn loses it after this long. */
    agentLeaseMs: int(env, 'AGENT_LEASE_MS', 60_000),
    /** Turns one runtime runs at once (different conversations). */
    agentConcurrency: int(env, 'AGENT_CONCURRENCY', 8),
    /** Attempts (leases) at one user item whose turn fails to store; then it is handed to an operator. */
    agentMaxAttempts: Math.max(1, int(env, 'AGENT_MAX_ATTEMPTS', 3)),
    /** Tool calls one turn may make (custom and built-in); past it the loop is cut and the turn handed off. */
    agentMaxToolCalls: Math.min(50, Math.max(1, int(env, 'AGENT_MAX_TOOL_CALLS', 5))),
    /** Largest knowledge document (`content`, bytes of UTF-8); larger ones are refused with 422. */
    knowledgeMaxBytes: int(env, 'KNOWLEDGE_MAX_BYTES', 512 * 1024),
    /** Attempts at one conversation's analysis (model failures and answers that do not fit the schema). */
    analysisMaxAttempts: Math.max(1, int(env, 'ANALYSIS_MAX_ATTEMPTS', 3)),
    /** Wait before an analysis whose model failed is tried again; doubled after each failure. */
    analysisRetryMs: int(env, 'ANALYSIS_RETRY_MS', 30_000),
    /** The voice runtime (docs/voice.md): the SIP endpoint for agent calls, its media ports and speech engines. */
    voice: {
      /** Where the SIP user agent for agent calls listens (UDP). */
      sipHost: text(env, 'VOICE_SIP_HOST') ?? '127.0.0.1',
      sipPort: int(env, 'VOICE_SIP_PORT', 5070),
      /** The address written into SDP and Contact (default: sipHost). */
      advertisedAddress: text(env, 'VOICE_ADVERTISED_ADDRESS'),
      rtpPortMin: int(env, 'VOICE_RTP_PORT_MIN', 40000),
      rtpPortMax: int(env, 'VOICE_RTP_PORT_MAX', 40999),
      /** Concurrent agent calls; more get 486 Busy Here. */
      maxCalls: Math.max(1, int(env, 'VOICE_MAX_CALLS', 20)),
      /**
       * Who may send SIP requests to the endpoint (VOICE_SIP_TRUSTED): `address` or `address:port` entries. The
       * endpoint answers anyone else 403: it is not a public SIP server, the edge in front is. Empty: `sip serve`
       * fills in its Kamailio's listen addresses.
       */
      sipTrusted: (text(env, 'VOICE_SIP_TRUSTED') ?? '')
        .split(',')
        .map((a) => a.trim())
        .filter(Boolean),
      /** `parley sip serve` starts the voice runtime beside Kamailio (VOICE_RUNTIME, default true). */
      runtime: (text(env, 'VOICE_RUNTIME') ?? 'true') !== 'false',
      /** Caller silence before the agent prompts (ms); the same again, and it hangs up. */
      silenceTimeoutMs: Math.max(1000, int(env, 'VOICE_SILENCE_TIMEOUT_MS', 10_000)),
      /** An utterance is cut (and answered) after this long (ms). */
      maxUtteranceMs: Math.max(1000, int(env, 'VOICE_MAX_UTTERANCE_MS', 15_000)),
      /** Quiet after speech that ends an utterance (ms). */
      endpointMs: Math.max(100, int(env, 'VOICE_ENDPOINT_MS', 600)),
      /** OpenAI-compatible speech-to-text (POST /v1/audio/transcriptions); unset: local pocketsphinx. */
      sttBaseUrl: text(env, 'STT_BASE_URL')?.replace(/\/+$/, ''),
      sttApiKey: text(env, 'STT_API_KEY'),
      sttModel: text(env, 'STT_MODEL') ?? 'whisper-1',
      /** OpenAI-compatible text-to-speech (POST /v1/audio/speech); unset: local festival (espeak-ng without it). */
      ttsBaseUrl: text(env, 'TTS_BASE_URL')?.replace(/\/+$/, ''),
      ttsApiKey: text(env, 'TTS_API_KEY'),
      ttsModel: text(env, 'TTS_MODEL') ?? 'tts-1',
      /** Per request to a speech provider, and retries after the first attempt. */
      speechTimeoutMs: Math.max(100, int(env, 'SPEECH_TIMEOUT_MS', 10_000)),
      speechMaxRetries: Math.max(0, int(env, 'SPEECH_MAX_RETRIES', 1)),
    },
    /** Live events: the outbox, GET /api/events and webhooks (docs/events.md). */
    events: {
      /** Days events are kept (and may be replayed); older ones are pruned in the background. */
      retentionDays: Math.max(1, int(env, 'EVENTS_RETENTION_DAYS', 7)),
      /** Seconds between comment lines on an idle event stream (keeps proxies from closing it). */
      heartbeatSeconds: Math.max(1, int(env, 'EVENTS_HEARTBEAT_SECONDS', 15)),
      /** Event streams one credential may hold open at once; beyond, 429. */
      streamsPerCredential: Math.max(1, int(env, 'EVENTS_STREAMS_PER_CREDENTIAL', 10)),
      /** Event streams one user (or visitor) may hold open at once in a process, across all of their credentials. */
      streamsPerUser: Math.max(1, int(env, 'EVENTS_STREAMS_PER_USER', 20)),
      /** Event streams one organisation may hold open at once in a process. */
      streamsPerOrganisation: Math.max(1, int(env, 'EVENTS_STREAMS_PER_ORGANISATION', 5000)),
      /** Event streams one client address (an IPv6 /64) may hold open at once in a process. */
      streamsPerAddress: Math.max(1, int(env, 'EVENTS_STREAMS_PER_ADDRESS', 100)),
      /** Bytes a stream may have waiting for a slow client; beyond, the client is disconnected (it resumes later). */
      streamBufferBytes: Math.max(64 * 1024, int(env, 'EVENTS_STREAM_BUFFER_BYTES', 1024 * 1024)),
      /** Accept webhook URLs on loopback, private and link-local addresses, and plain http (development only). */
      webhookAllowPrivateUrls: text(env, 'WEBHOOK_ALLOW_PRIVATE_URLS') === 'true',
      /** Run the webhook delivery worker inside `serve`. */
      webhookWorker: (text(env, 'WEBHOOK_WORKER') ?? 'true') !== 'false',
      /** Deadline of one delivery attempt (connect, send, answer). */
      webhookTimeoutMs: Math.max(100, int(env, 'WEBHOOK_TIMEOUT_MS', 10_000)),
      /** Base delay of the exponential backoff between attempts (the first retry comes after 1 to 2 times this). */
      webhookRetryBaseSeconds: Math.max(1, int(env, 'WEBHOOK_RETRY_BASE_SECONDS', 5)),
      /** How long a delivery is retried before it is `failed`. */
      webhookRetryHours: Math.max(1, int(env, 'WEBHOOK_RETRY_HOURS', 24)),
      /** Attempts one process runs at once. */
      webhookConcurrency: Math.max(1, int(env, 'WEBHOOK_CONCURRENCY', 16)),
      /** Attempts leased at once for one endpoint (a hanging receiver holds no more slots than this). */
      webhookEndpointConcurrency: Math.max(1, int(env, 'WEBHOOK_ENDPOINT_CONCURRENCY', 2)),
      /** How often the worker looks for due deliveries (a new event wakes it at once). */
      webhookPollMs: Math.max(50, int(env, 'WEBHOOK_POLL_MS', 1000)),
    },
  };
}
