/**
 * The voice runtime alone in a process, as `parley sip serve` runs it (its own event loop, its database pool,
 * its speech engines from the settings), for bench/voice.ts. The agent runtime that answers the turns runs in
 * the parent, as it runs in `parley serve`, woken by the outbox's notification.
 *
 * Settings come from the environment. Over the IPC channel: it sends `{ type: 'ready', port }` once it takes
 * calls; `{ type: 'reset' }` (answered in kind) starts the measurements afresh; on `{ type: 'stop' }` it sends `{ type: 'report', ... }` (what it measured since ready), hangs up,
 * and exits.
 *
 * Measured here, on the sending side: the interval between two RTP packets of a call (send jitter is its
 * distance from 20 ms), each packet's lateness behind its due time on the frame grid, the event loop's
 * delay, garbage collection pauses, and the process's CPU time.
 */
import { monitorEventLoopDelay, PerformanceObserver } from 'node:perf_hooks';
import { createServices } from '../src/app.js';
import { loadConfig } from '../src/config/index.js';
import { openDatabase } from '../src/db/connection.js';
import { VoiceRuntime } from '../src/voice/runtime.js';
import { countStatements } from './statements.js';

export interface RuntimeReport {
  type: 'report';
  /** |interval - 20 ms| of every pair of consecutive packets of a call (ms). */
  jitter: number[];
  /** How late each packet left after its due time on the grid (ms). */
  lateness: number[];
  cpuMs: number;
  wallMs: number;
  eventLoopDelay: { p99: number; max: number };
  gc: { count: number; totalMs: number; maxMs: number };
  packets: number;
  /** Statements this process sent to PostgreSQL (every `pg` query: BEGIN/COMMIT, LISTEN and notifications too). */
  statements: number;
}

const statements = countStatements();

const config = loadConfig(process.env);
const database = await openDatabase(config);
const services = await createServices(database, config);
const jitter: number[] = [];
const lateness: number[] = [];
const last = new Map<string, number>();
const voice = new VoiceRuntime({
  db: database.db,
  services,
  config,
  // As `parley sip serve` gives it: the agent runtime's commits wake the calls waiting for their replies.
  listen: (channel, onNotify, onResumed) => database.listen(channel, onNotify, onResumed),
  onPacketSent: (callId, at, due) => {
    const previous = last.get(callId);
    if (previous !== undefined) jitter.push(Math.abs(at - previous - 20));
    last.set(callId, at);
    lateness.push(at - due);
  },
});
await voice.start();

const delay = monitorEventLoopDelay({ resolution: 1 });
delay.enable();
const gc = { count: 0, totalMs: 0, maxMs: 0 };
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    gc.count++;
    gc.totalMs += entry.duration;
    gc.maxMs = Math.max(gc.maxMs, entry.duration);
  }
}).observe({ entryTypes: ['gc'] });
let cpu = process.cpuUsage();
let started = performance.now();
process.send!({ type: 'ready', port: voice.endpoint.port });

/** After the warm-up call: forget what it cost (loading the rest of the code, the first JIT), collect its garbage. */
function reset() {
  jitter.length = 0;
  lateness.length = 0;
  last.clear();
  (globalThis as { gc?: () => void }).gc?.();
  delay.reset();
  Object.assign(gc, { count: 0, totalMs: 0, maxMs: 0 });
  cpu = process.cpuUsage();
  started = performance.now();
  statements.reset();
}

process.on('message', async (message: { type: string }) => {
  if (message.type === 'reset') {
    reset();
    process.send!({ type: 'reset' });
    return;
  }
  if (message.type !== 'stop') return;
  const used = process.cpuUsage(cpu);
  const report: RuntimeReport = {
    type: 'report',
    jitter,
    lateness,
    cpuMs: (used.user + used.system) / 1000,
    wallMs: performance.now() - started,
    eventLoopDelay: { p99: delay.percentile(99) / 1e6, max: delay.max / 1e6 },
    gc,
    packets: lateness.length,
    statements: statements.count,
  };
  process.send!(report, () => {
    void (async () => {
      await voice.stop();
      await database.close();
      process.exit(0);
    })();
  });
});
