/** Starting and stopping the service: database, migrations, signing key, demo data, HTTP server. */
import { once } from 'node:events';
import net from 'node:net';
import { Redis } from 'ioredis';
import type { AgentRuntime } from './agents/runtime.js';
import { loadSigningKey } from './auth/signing-key.js';
import type { Config } from './config/index.js';
import { openDatabase, type DatabaseHandle } from './db/connection.js';
import { migrate } from './db/migrate.js';
import { isEmpty, seedDemo, type DemoResult } from './demo/demo.js';
import { createRecords } from './jsonapi/records.js';
import { buildRegistry } from './jsonapi/routes.js';
import type { AppServices } from './jsonapi/index.js';
import { resources } from './resources/index.js';

export function connectRedis(url: string | undefined): Redis | undefined {
  if (!url) return undefined;
  const redis = new Redis(url, { maxRetriesPerRequest: 1, enableOfflineQueue: false, lazyConnect: false });
  redis.on('error', () => {}); // counted as unavailable; the rate limiter fails open
  return redis;
}

/** The process's services on an open, migrated database: signing key, Redis, and the records service. */
export async function createServices(database: DatabaseHandle, config: Config, redis?: Redis): Promise<AppServices> {
  const services: AppServices = { config, signingKey: await loadSigningKey(database.db, config), redis };
  services.records = createRecords({ db: database.db, registry: buildRegistry(resources), services });
  // The agent modules (and the model's client) load when a suite first runs: a command that only needs the
  // records service does not load them (src/cli/).
  services.agentTests = async (organisationId, agentId, suite) =>
    (await import('./agents/suite.js')).agentTestsService(database.db, services)(organisationId, agentId, suite);
  return services;
}

/** Refuses, with a message that names it, a port something else listens on (checked by binding it once). */
export async function assertPortFree(port: number, host: string): Promise<void> {
  const probe = net.createServer().listen({ port, host, exclusive: true });
  try {
    await once(probe, 'listening');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw error;
    throw new Error(
      `port ${port} on ${host} is in use (another server, or another Parley, listens there). Stop it, or start with PORT=<another port>. ` +
        'Nothing was created: the first start that can listen sets up the demo and prints its login (or run `parley demo`).',
    );
  }
  await new Promise((resolve) => probe.close(resolve));
}

export async function startApp(config: Config) {
  // Imported here rather than at the top: the administration commands import this module for createServices.
  const [{ AgentRuntime }, { EventPruner, WebhookWorker }, { buildServer }] = await Promise.all([
    import('./agents/runtime.js'),
    import('./events/webhooks.js'),
    import('./http/server.js'),
  ]);
  const database = await openDatabase(config, { shareLocally: true });
  await migrate(database.db);
  const services = await createServices(database, config, connectRedis(config.redisUrl));
  // Before anything is seeded: a start that cannot listen must leave nothing behind (the demo's login is printed
  // once, by the start that creates it).
  try {
    await assertPortFree(config.port, config.host);
  } catch (error) {
    await database.close();
    throw error;
  }
  const firstStart = database.kind === 'pglite' && config.demoOnFirstStart && (await isEmpty(database.db));
  const demo = firstStart ? await seedDemo(database.db, services.records!) : undefined;
  const agents = config.agentRuntime ? new AgentRuntime({ db: database.db, services, config, listen: database.listen }) : undefined;
  // The runtime learns of the API's writes as of every other process's: from the outbox's notification.
  const app = await buildServer({ ...services, database });
  await app.listen({ port: config.port, host: config.host });
  if (agents) {
    agents.logger = app.log as unknown as NonNullable<AgentRuntime['logger']>;
    agents.start();
  }
  const webhooks = config.events.webhookWorker
    ? new WebhookWorker({ database, config, records: services.records!, logger: app.log })
    : undefined;
  await webhooks?.start();
  const pruner = new EventPruner(database.db, config.events.retentionDays, app.log);
  pruner.start();
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
      pruner.stop();
      await webhooks?.stop();
      await agents?.stop();
      await app.close();
      await database.close();
      services.redis?.disconnect();
    },
  };
}

/**
 * The console's link for an organisation: its publishable key rides in the fragment, which browsers never
 * send to a server (RFC 3986 section 3.5), so no access log records it; the console clears it after reading.
 */
export function consoleLink(url: string, publishableKey: string): string {
  return `${url}/console#key=${publishableKey}`;
}

/** How to sign in to the demo organisation: the console link, and a ready-to-paste curl line. */
export function loginHint(url: string, demo: DemoResult): string {
  const user = demo.users[0];
  const body = JSON.stringify({ data: { type: 'User', attributes: { email: user.email, password: user.password } } });
  const operator = demo.users.find((u) => u.role === 'operator') ?? user;
  return [
    'Demo organisation created.',
    `Operator console (sign in as ${operator.email}):`,
    `  ${consoleLink(url, demo.publishable_key)}`,
    'Or sign in over the API:',
    `  curl -s -X POST ${url}/api/users/login \\`,
    `    -H 'Authorization: Bearer ${demo.publishable_key}' \\`,
    `    -H 'Content-Type: application/vnd.api+json' \\`,
    `    -d '${body}'`,
    'Demo users (shown once; only password hashes are stored):',
    ...demo.users.map((u) => `  ${u.role.padEnd(8)} ${u.email}  ${u.password}`),
    `Secret key (server-to-server, shown once): ${demo.secret_key}`,
    ...(demo.phone
      ? [
          'Call the demo agent from a softphone (with `parley sip serve` running; README, "Call the demo agent"):',
          `  register as ${demo.phone.sip_username}@${demo.phone.domain}, password ${demo.phone.sip_password}`,
          `  dial ${demo.phone.agent_user}@${demo.phone.domain} or ${demo.phone.number}`,
        ]
      : []),
  ].join('\n');
}
