/**
 * The server bench/streams.ts drives: `parley serve`'s HTTP server on DATABASE_URL (no agent runtime, no
 * webhook worker), and beside it, on STATS_PORT, a bench-only HTTP endpoint that reports what the process has
 * spent: statements sent to PostgreSQL (every `pg` client query, the LISTEN connection's included), CPU time,
 * resident memory, heap and open file descriptors (sockets). Bench only; not part of the product.
 */
import fs from 'node:fs';
import http from 'node:http';
import { createServices } from '../src/app.js';
import { loadConfig } from '../src/config/index.js';
import { openDatabase } from '../src/db/connection.js';
import { buildServer } from '../src/http/server.js';
import { countStatements } from './statements.js';

const statements = countStatements();

const config = loadConfig();
const database = await openDatabase(config);
const services = await createServices(database, config);
const app = await buildServer({ ...services, database });
await app.listen({ port: config.port, host: config.host });

const stats = http.createServer((_request, response) => {
  const cpu = process.cpuUsage();
  const memory = process.memoryUsage();
  response.writeHead(200, { 'content-type': 'application/json' });
  response.end(
    JSON.stringify({
      statements: statements.count,
      cpuMs: (cpu.user + cpu.system) / 1000,
      rssMb: memory.rss / 2 ** 20,
      heapMb: memory.heapUsed / 2 ** 20,
      fds: fs.readdirSync('/proc/self/fd').length,
    }),
  );
});
await new Promise<void>((resolve) => stats.listen(Number(process.env.STATS_PORT), '127.0.0.1', resolve));
process.on('SIGTERM', async () => {
  stats.close();
  stats.closeAllConnections();
  await app.close();
  await database.close();
  process.exit(0);
});
