/** `parley serve` (the HTTP server) and `parley worker` (the agent runtime alone). */
import { AgentRuntime } from '../agents/runtime.js';
import { createServices, loginHint, startApp } from '../app.js';
import { loadConfig } from '../config/index.js';
import { openDatabase } from '../db/connection.js';
import { migrate } from '../db/migrate.js';
import { createLogger } from '../http/logger.js';
import { stopOnSignal } from './command.js';

/** How long a stopping server waits for in-flight requests before cutting the connections left. */
const SHUTDOWN_GRACE_MS = 10_000;

export async function serve(o: { json?: boolean }): Promise<void> {
  const running = await startApp(loadConfig());
  running.app.log.info({ url: running.url, database: running.database.kind }, 'Parley is listening');
  if (o.json) {
    console.log(JSON.stringify({ url: running.url, database: running.database.kind, demo: running.demo ?? null }));
  } else {
    console.log(`Parley listening on ${running.url} (${running.database.kind} database)`);
    if (running.demo) console.log(loginHint(running.url, running.demo));
    else if (running.database.kind === 'pglite')
      console.log(
        'The demo login is printed by the first start only; `parley demo` creates another demo organisation and prints its login.',
      );
  }
  stopOnSignal(async (signal) => {
    running.app.log.info({ signal }, 'shutting down: finishing in-flight requests');
    setTimeout(() => running.app.server.closeAllConnections(), SHUTDOWN_GRACE_MS).unref();
    await running.close();
  });
}

export async function worker(): Promise<void> {
  const config = loadConfig();
  const logger = createLogger(config);
  const database = await openDatabase(config);
  await migrate(database.db);
  const services = await createServices(database, config);
  const runtime = new AgentRuntime({ db: database.db, services, config, logger, listen: database.listen });
  runtime.start();
  logger.info({ database: database.kind, pollMs: config.agentPollMs }, 'agent worker running');
  stopOnSignal(async (signal) => {
    logger.info({ signal }, 'agent worker: finishing the turns in flight');
    await runtime.stop();
    await database.close();
  });
}
