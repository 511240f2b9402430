import path from 'node:path';

/** Every setting Parley reads, with its default. Documented in the README. */
export interface Config {
  port: number;
  host: string;
  /** PostgreSQL URL; when absent the embedded PGlite database in `dataDir` is used. */
  databaseUrl: string | undefined;
  dataDir: string;
  /** Base for absolute links and `Location`; when absent, taken from the request's Host. */
  publicUrl: string | undefined;
  /** HS256 secret for every JWT; generated and stored in the database when absent. */
  signingSecret: string | undefined;
  logLevel: string;
  userTokenTtlSeconds: number;
  /** Upper bound for one database statement and for acquiring a connection. */
  databaseTimeoutMs: number;
  databasePoolSize: number;
  bodyLimitBytes: number;
  rateLimitPerMinute: number;
  loginFailuresPerWindow: number;
  loginWindowSeconds: number;
  redisUrl: string | undefined;
  /** Seed the demo organisation on first start of an empty embedded database. */
  demoOnFirstStart: boolean;
  /** Take the client address from X-Forwarded-For (behind a reverse proxy). */
  trustProxy: boolean;
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

export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const databaseUrl = text(env, 'DATABASE_URL');
  const signingSecret = text(env, 'SIGNING_SECRET');
  if (signingSecret !== undefined && signingSecret.length < 32) {
    throw new Error('SIGNING_SECRET must be at least 32 characters');
  }
  return {
    port: int(env, 'PORT', 8080),
    host: text(env, 'HOST') ?? '0.0.0.0',
    databaseUrl,
    dataDir: dataDir(text(env, 'DATA_DIR')),
    publicUrl: text(env, 'PUBLIC_URL')?.replace(/\/+$/, ''),
    signingSecret,
    logLevel: text(env, 'LOG_LEVEL') ?? 'info',
    userTokenTtlSeconds: int(env, 'USER_TOKEN_TTL_SECONDS', 12 * 3600),
    databaseTimeoutMs: int(env, 'DATABASE_TIMEOUT_MS', 5000),
    databasePoolSize: int(env, 'DATABASE_POOL_SIZE', 10),
    bodyLimitBytes: int(env, 'BODY_LIMIT_BYTES', 1024 * 1024),
    rateLimitPerMinute: int(env, 'RATE_LIMIT_PER_MINUTE', 1200),
    loginFailuresPerWindow: int(env, 'LOGIN_FAILURES_PER_WINDOW', 10),
    loginWindowSeconds: int(env, 'LOGIN_WINDOW_SECONDS', 15 * 60),
    redisUrl: text(env, 'REDIS_URL'),
    demoOnFirstStart: (text(env, 'DEMO_ON_FIRST_START') ?? 'true') !== 'false',
    trustProxy: text(env, 'TRUST_PROXY') === 'true',
  };
}
