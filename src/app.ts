/** Starting and stopping the service: database, migrations, signing key, demo data, HTTP server. */
import type { FastifyInstance } from 'fastify';
import { Redis } from 'ioredis';
import { loadSigningKey } from './auth/signing-key.js';
import { isEmpty, seedDemo, type DemoResult } from './cli/demo.js';
import type { Config } from './config/index.js';
import { openDatabase, type DatabaseHandle } from './db/connection.js';
import { migrate } from './db/migrate.js';
import { buildServer } from './http/server.js';
import type { AppServices } from './jsonapi/resource.js';

export interface RunningApp {
  app: FastifyInstance;
  database: DatabaseHandle;
  services: AppServices;
  url: string;
  demo?: DemoResult;
  close(): Promise<void>;
}

export function connectRedis(url: string | undefined): Redis | undefined {
  if (!url) return undefined;
  const redis = new Redis(url, { maxRetriesPerRequest: 1, enableOfflineQueue: false, lazyConnect: false });
  redis.on('error', () => {}); // counted as unavailable; the rate limiter fails open
  return redis;
}

export async function startApp(config: Config): Promise<RunningApp> {
  const database = await openDatabase(config);
  await migrate(database.db);
  const services: AppServices = { config, signingKey: await loadSigningKey(database.db, config), redis: connectRedis(config.redisUrl) };
  const firstStart = database.kind === 'pglite' && config.demoOnFirstStart && (await isEmpty(database.db));
  const demo = firstStart ? await seedDemo(database.db, services) : undefined;
  const app = await buildServer({ ...services, database });
  await app.listen({ port: config.port, host: config.host });
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : config.port;
  const url = config.publicUrl ?? `http://${config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host}:${port}`;
  return {
    app,
    database,
    services,
    url,
    demo,
    async close() {
      await app.close();
      await database.close();
      services.redis?.disconnect();
    },
  };
}

/** How to sign in to the demo organisation, as a ready-to-paste curl line. */
export function loginHint(url: string, demo: DemoResult): string {
  const user = demo.users[0];
  const body = JSON.stringify({ data: { type: 'User', attributes: { email: user.email, password: user.password } } });
  return [
    'Demo organisation created. Sign in with:',
    `  curl -s -X POST ${url}/api/users/login \\`,
    `    -H 'Authorization: Bearer ${demo.publishable_key}' \\`,
    `    -H 'Content-Type: application/vnd.api+json' \\`,
    `    -d '${body}'`,
    'Demo users (shown once; only password hashes are stored):',
    ...demo.users.map((u) => `  ${u.role.padEnd(8)} ${u.email}  ${u.password}`),
    `Secret key (server-to-server, shown once): ${demo.secret_key}`,
  ].join('\n');
}
