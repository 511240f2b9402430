/**
 * The SIP edge as one supervised unit (`parley sip serve`): rtpengine (the media plane: every call's RTP),
 * Kamailio (rendered configuration, each in its own process group, ended with `sip serve`), the consumer of the call event queue Kamailio writes, and two
 * timers: gateway edits reloaded into Kamailio, and calls whose dialog is gone ended (reconciliation).
 * See docs/sip.md.
 */
import dgram from 'node:dgram';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { sql } from 'kysely';
import type { Db } from '../db/schema.js';
import type { Records } from '../jsonapi/records.js';
import { CallEvents } from './call-events.js';
import { CallEventQueue, type CallQueueOptions } from './call-queue.js';
import { mediaListenAddress, parseSipListen, renderKamailioConfig, type SipListen, type SipSettings } from './config.js';
import { haveProgram, startKamailio, type KamailioProcess } from './kamailio.js';
import { reconcileCalls } from './reconcile.js';
import { assertRtpRangeFree, startRtpengine, type RtpengineProcess } from './rtpengine.js';

export interface SipEdgeOptions {
  settings: SipSettings;
  databaseUrl: string | undefined;
  db: Db;
  records: Records;
  /** NOTIFY subscriptions (the database handle's `listen`): the event queue is then consumed without delay. */
  listen?: CallQueueOptions['listen'];
  /** Where the rendered configuration and Kamailio's sockets go; a new temporary folder when absent. */
  runDir?: string;
  log?: (level: 'info' | 'warn' | 'error', message: string, detail?: Record<string, unknown>) => void;
  onKamailioLog?: (line: string) => void;
  onRtpengineLog?: (line: string) => void;
}

export type SipEdge = Awaited<ReturnType<typeof startSipEdge>>;

/** Why the SIP edge cannot run here, or undefined when it can. */
export function sipEdgeUnavailable(databaseUrl: string | undefined, settings: SipSettings): string | undefined {
  if (!databaseUrl) {
    return (
      'the SIP edge needs PostgreSQL: Kamailio reads SIP users and gateways from the database and cannot open the ' +
      'embedded one. Set DATABASE_URL (the same as `parley serve` uses) and run `parley sip serve` again.'
    );
  }
  if (!haveProgram(settings.kamailioBinary))
    return `Kamailio not found (${settings.kamailioBinary}): install Debian's kamailio, kamailio-postgres-modules, kamailio-extra-modules and kamailio-utils-modules`;
  if (!haveProgram(settings.kamcmdBinary)) return `kamcmd not found (${settings.kamcmdBinary}): it comes with Debian's kamailio package`;
  if (!haveProgram(settings.media.rtpengineBinary))
    return `rtpengine not found (${settings.media.rtpengineBinary}): install Debian's rtpengine-daemon (the media plane; its system service is not needed)`;
  return undefined;
}

/**
 * Refuses to start on a SIP port another process holds. Kamailio binds UDP with SO_REUSEADDR, so a second
 * Kamailio (or the workers a killed one left behind) would share the port without an error and take half the
 * traffic; a plain bind without that option fails while anyone holds the port. Every address of SIP_LISTEN is
 * tried: UDP with a datagram socket, TCP and TLS with a listening one.
 */
export async function assertSipPortFree(listen: string): Promise<void> {
  for (const address of parseSipListen(listen)) await assertAddressFree(address, listen);
}

async function assertAddressFree({ proto, host: bracketed, port }: SipListen, listen: string): Promise<void> {
  const label = `${proto}:${bracketed}:${port}`;
  const host = bracketed.replace(/^\[|\]$/g, '');
  const socket =
    proto === 'udp' ? dgram.createSocket({ type: host.includes(':') ? 'udp6' : 'udp4', reuseAddr: false }) : net.createServer();
  try {
    await new Promise<void>((resolve, reject) => {
      socket.once('error', reject);
      if (socket instanceof net.Server) socket.listen({ port, host, exclusive: true }, resolve);
      else socket.bind(port, host, resolve);
    });
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === 'EADDRINUSE')
      throw new Error(
        `the SIP port ${label} is taken by another process (another Kamailio, or one left by an earlier run): stop it, or set SIP_LISTEN (${listen}) to a free port`,
      );
    throw new Error(`cannot listen on ${label}: ${error instanceof Error ? error.message : String(error)}`);
  } finally {
    // A socket that never bound closes all the same, or throws: either way it is done.
    await new Promise<void>((resolve) => {
      try {
        socket.close(() => resolve());
      } catch {
        resolve();
      }
    });
  }
}

export async function startSipEdge(options: SipEdgeOptions) {
  const { settings, db, records } = options;
  const log = options.log ?? (() => {});
  const unavailable = sipEdgeUnavailable(options.databaseUrl, settings);
  if (unavailable) throw new Error(unavailable);
  await assertSipPortFree(settings.listen);
  const mediaAddress = mediaListenAddress(settings);
  const range = await assertRtpRangeFree(mediaAddress, settings.media.rtpPortMin, settings.media.rtpPortMax);
  if (range.taken.length)
    log('warn', `${range.taken.length} of the ${range.total} RTP ports are taken by other processes; rtpengine skips them`, {
      first: range.taken.slice(0, 10),
    });
  // The WebSocket addresses too (SIP_WS_LISTEN): Kamailio's TCP and TLS sockets under them.
  for (const ws of settings.wsListens) {
    await assertAddressFree({ proto: ws.proto === 'ws' ? 'tcp' : 'tls', host: ws.host, port: ws.port }, settings.listen);
  }

  // The domain every organisation's SIP domain derives from (`<slug>.<SIP_DOMAIN>`), for the views Kamailio
  // reads and for the API (Organisation sip_domain, SipUser sip_uri); migration 0012.
  await db.updateTable('sip_settings').set({ domain: settings.domain }).where('id', '=', 1).execute();

  const events = new CallEvents({ db, records });
  // The consumer of `sip_call_events` (stopped and started again by tests that take Parley away). Events queued
  // while no consumer ran (sip serve down, Parley's database unreachable) are applied first.
  const queue = new CallEventQueue({ db, events, listen: options.listen, log });
  await queue.start();

  const runDir = options.runDir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'parley-sip-'));
  fs.mkdirSync(runDir, { recursive: true });

  // rtpengine, the media plane, first: Kamailio anchors every call's media in it, and its module pings it at start.
  let rtpengine: RtpengineProcess;
  try {
    rtpengine = await startRtpengine({
      binary: settings.media.rtpengineBinary,
      runDir,
      listenAddress: mediaAddress,
      advertisedAddress: settings.media.advertisedAddress,
      portMin: settings.media.rtpPortMin,
      portMax: settings.media.rtpPortMax,
      timeoutSeconds: settings.media.timeoutSeconds,
      logLevel: settings.media.logLevel,
      onLog: options.onRtpengineLog,
    });
  } catch (error) {
    await queue.stop();
    throw error;
  }
  log('info', 'rtpengine is running', {
    rtp: `${mediaAddress}:${settings.media.rtpPortMin}-${settings.media.rtpPortMax}`,
    advertised: settings.media.advertisedAddress ?? mediaAddress,
    ng: rtpengine.ngSocket,
    pid: rtpengine.pid(),
  });

  const configFile = path.join(runDir, 'kamailio.cfg');
  // The file holds the database URL: readable by this user only.
  fs.writeFileSync(
    configFile,
    renderKamailioConfig({ settings, databaseUrl: options.databaseUrl!, runDir, rtpengineSocket: rtpengine.ngSocket }),
    { mode: 0o600 },
  );

  let kamailio: KamailioProcess;
  try {
    kamailio = await startKamailio({
      binary: settings.kamailioBinary,
      kamcmd: settings.kamcmdBinary,
      configFile,
      runDir,
      onLog: options.onKamailioLog,
    });
  } catch (error) {
    await rtpengine.stop();
    await queue.stop();
    throw error;
  }
  log('info', 'Kamailio is running', { listen: settings.listen, domain: settings.domain, runDir, pid: kamailio.pid() });

  // Kamailio caches trunk registrations (uac) and ACLs (permissions); each is reloaded over RPC when its
  // view changed. Both modules refuse reloads that come too fast (uac: reg_gc_interval, permissions:
  // reload_delta): a refused reload is retried at the next check. True when in sync.
  const loaded = { uac: await viewFingerprint(db, 'sip_uacreg'), address: await viewFingerprint(db, 'sip_address') };
  const reloadIfChanged = async () => {
    let inSync = true;
    for (const [view, key, command] of [
      ['sip_uacreg', 'uac', 'uac.reg_reload'],
      ['sip_address', 'address', 'permissions.addressReload'],
    ] as const) {
      const now = await viewFingerprint(db, view);
      if (now === loaded[key]) continue;
      try {
        // kamcmd exits 0 on an RPC fault too and prints `error: <code> - <text>` (a reload refused as too soon
        // answers "error: 500 - ongoing reload"): only an answer without one is a reload done.
        const answer = await kamailio.rpc(command);
        if (/^error: \d+/m.test(answer)) throw new Error(answer.trim());
        loaded[key] = now;
        log('info', `gateways changed: ${command} done`);
      } catch (error) {
        inSync = false;
        log('warn', `${command} refused for now (retried): ${error instanceof Error ? error.message : String(error)}`);
      }
    }
    return inSync;
  };
  // Kamailio keeps its dialogs in sip_dialogs (written within a second, loaded at its start), so a call
  // without a dialog row has ended, whether Kamailio or sip serve restarted in between or not. How many it ended.
  const reconcile = async (graceMs = 10_000) => {
    const count = await reconcileCalls(db, events, {
      answeredBefore: new Date(Date.now() - graceMs),
      unansweredBefore: new Date(Date.now() - Math.max(graceMs, (settings.ringTimeoutSeconds + 30) * 1000)),
    });
    if (count) log('warn', `ended ${count} call(s) whose dialog is gone`, { count });
    return count;
  };

  // A party's softphone credential that stopped standing (sign-out, revocation, member removed) ends the call at
  // the edge, not only in the console: dlg.end_dlg sends a BYE to both (docs/sip.md, "Softphone credentials").
  const endRevoked = async () => {
    const { rows } = await sql<{ hash_entry: number; hash_id: number; credential: string }>`
      SELECT hash_entry, hash_id, dialog_value AS credential FROM sip_dialog_vars v WHERE dialog_key IN ('cred_caller', 'cred_callee')
        AND NOT EXISTS (SELECT 1 FROM sip_subscriber s WHERE s.username = v.dialog_value)`.execute(db);
    for (const d of rows) {
      const answer = await kamailio.rpc('dlg.end_dlg', String(d.hash_entry), String(d.hash_id));
      log('info', `call ended: credential ${d.credential} no longer stands`, { answer: answer.trim() });
    }
  };

  const guarded = (name: string, work: () => Promise<unknown>) => {
    let running = false;
    return () => {
      if (running) return;
      running = true;
      work()
        .catch((error: unknown) => log('error', `${name} failed: ${error instanceof Error ? error.message : String(error)}`))
        .finally(() => (running = false));
    };
  };
  const checks = () => Promise.all([reloadIfChanged(), endRevoked()]);
  const reloadTimer = setInterval(guarded('gateway reload or ending revoked calls', checks), settings.reloadIntervalMs).unref();
  const reconcileTimer = setInterval(guarded('reconciliation', reconcile), settings.reconcileIntervalMs).unref();

  return {
    kamailio,
    rtpengine,
    runDir,
    events,
    queue,
    reloadIfChanged,
    reconcile,
    async stop() {
      clearInterval(reloadTimer);
      clearInterval(reconcileTimer);
      // Kamailio writes its dialogs and the events still in its memory before it exits; calls still talking
      // stay open, and the next start finds their dialogs (or their end) in the database.
      await kamailio.stop();
      // After Kamailio: no offer can arrive for a stopped engine. Calls still talking lose their media here
      // (rtpengine keeps its sessions in memory only); their dialogs outlive the restart (docs/sip.md).
      await rtpengine.stop();
      await queue.drain().catch(() => 0);
      await queue.stop();
    },
  };
}

/** A digest of what Kamailio loaded from a view: when it differs, Kamailio's cached copy is stale. */
async function viewFingerprint(db: Db, view: 'sip_uacreg' | 'sip_address'): Promise<string> {
  const { rows } = await sql<{ digest: string | null }>`
    SELECT md5(string_agg(v::text, ',' ORDER BY v::text)) AS digest FROM ${sql.table(view)} v`.execute(db);
  return rows[0].digest ?? '';
}
