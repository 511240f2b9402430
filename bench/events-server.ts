/**
 * The server bench/events.ts drives: `parley serve`'s HTTP server on DATABASE_URL, with events on, or, with
 * BENCH_EVENTS=off, with every type declared `events: false` (no outbox append): the same code path otherwise,
 * which is what "item creation before events" means for the throughput ratio. With BENCH_WEBHOOKS=on the
 * delivery worker runs too. Bench only; not part of the product.
 */
import { createServices } from '../src/app.js';
import { loadConfig } from '../src/config/index.js';
import { openDatabase } from '../src/db/connection.js';
import { migrate } from '../src/db/migrate.js';
import { WebhookWorker } from '../src/events/webhooks.js';
import { buildServer } from '../src/http/server.js';
import { createRecords } from '../src/jsonapi/records.js';
import { buildRegistry } from '../src/jsonapi/routes.js';
import { resources } from '../src/resources/index.js';

const config = loadConfig();
const database = await openDatabase(config);
await migrate(database.db);
const services = await createServices(database, config);
if (process.env.BENCH_EVENTS === 'off') {
  services.records = createRecords({ db: database.db, registry: buildRegistry(resources.map((r) => ({ ...r, events: false }))), services });
}
const app = await buildServer({ ...services, database });
await app.listen({ port: config.port, host: config.host });
const worker = process.env.BENCH_WEBHOOKS === 'on' ? new WebhookWorker({ database, config, records: services.records! }) : undefined;
await worker?.start();
process.on('SIGTERM', async () => {
  await worker?.stop();
  await app.close();
  await database.close();
  process.exit(0);
});
