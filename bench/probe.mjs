// Where a server's latency tail comes from: loaded into a server process by `npm run bench` (node --import
// ./bench/probe.mjs, Parley and the bare server alike) and read between measurements. Bench only; not part of
// the product. It records, from one SIGUSR2 to the next:
//   - the event loop's delay (perf_hooks.monitorEventLoopDelay, 5 ms resolution): how long ready work waited
//     for the thread, i.e. synchronous stalls (and the scheduler's, on a loaded machine);
//   - garbage collection pauses by kind (PerformanceObserver 'gc'): count, total and longest;
//   - waits for a pooled PostgreSQL connection (pg.Pool's connect, timed to the hand-out): with more requests in
//     flight than connections, each waits its turn for the pool.
// On SIGUSR2 it writes the figures since the previous signal as JSON to PROBE_FILE and starts over.
import fs from 'node:fs';
import { constants, monitorEventLoopDelay, PerformanceObserver } from 'node:perf_hooks';
import pg from 'pg';

const file = process.env.PROBE_FILE;
const loop = monitorEventLoopDelay({ resolution: 5 });
loop.enable();

const KINDS = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'scavenge',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'mark-compact',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weak callbacks',
};
let gc = {};
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    const kind = KINDS[entry.detail?.kind ?? entry.kind] ?? 'other';
    gc[kind] ??= { count: 0, totalMs: 0, maxMs: 0 };
    const g = gc[kind];
    g.count++;
    g.totalMs += entry.duration;
    g.maxMs = Math.max(g.maxMs, entry.duration);
  }
}).observe({ entryTypes: ['gc'] });

let waits = [];
const connect = pg.Pool.prototype.connect;
pg.Pool.prototype.connect = function (callback) {
  const started = performance.now();
  if (typeof callback === 'function') {
    return connect.call(this, (error, client, release) => {
      waits.push(performance.now() - started);
      callback(error, client, release);
    });
  }
  return connect.call(this).then((client) => {
    waits.push(performance.now() - started);
    return client;
  });
};

const ms = (ns) => Math.round(ns / 1e5) / 10;
process.on('SIGUSR2', () => {
  const sorted = waits.sort((a, b) => a - b);
  const at = (p) => Math.round((sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? 0) * 10) / 10;
  const figures = {
    loopDelay: { p50: ms(loop.percentile(50)), p99: ms(loop.percentile(99)), max: ms(loop.max) },
    gc,
    poolWait: { count: sorted.length, p50: at(0.5), p99: at(0.99), max: at(1) },
  };
  if (file) fs.writeFileSync(file, JSON.stringify(figures));
  loop.reset();
  gc = {};
  waits = [];
});
