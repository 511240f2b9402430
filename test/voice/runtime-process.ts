/**
 * The voice runtime alone in a process, as `parley sip serve` runs it (settings from the environment, the
 * agent runtime's commits heard through the database's notifications), for voice-restart.test.ts, which kills
 * it mid-call. Sends `{ port }` over the IPC channel once it takes calls.
 */
import { createServices } from '../../src/app.js';
import { loadConfig } from '../../src/config/index.js';
import { openDatabase } from '../../src/db/connection.js';
import { VoiceRuntime } from '../../src/voice/runtime.js';

const config = loadConfig(process.env);
const database = await openDatabase(config);
const services = await createServices(database, config);
const voice = new VoiceRuntime({ db: database.db, services, config, listen: (c, n, r) => database.listen(c, n, r) });
await voice.start();
process.send?.({ port: voice.endpoint.port });
