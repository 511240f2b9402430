/**
 * The SIP edge as one supervised unit (`parley sip serve`): a loopback receiver of Kamailio's call
 * events, Kamailio itself (rendered configuration, foreground), and two timers: gateway edits reloaded
 * into Kamailio, and calls whose dialog is gone ended (reconciliation). See docs/sip.md.
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { sql } from 'kysely';
import type { Db } from '../db/schema.js';
import type { Records } from '../jsonapi/records.js';
import { CallEvents, parseCallEvent } from './call-events.js';
import { renderKamailioConfig, type SipSettings } from './config.js';
import { dialogCallIds, haveProgram, startKamailio, type KamailioProcess } from './kamailio.js';

export const EVENTS_PATH = '/internal/sip/events';
export const SECRET_HEADER = 'x-parley-sip-secret';

export interface SipEdgeOptions {
  settings: SipSettings;
  databaseUrl: string | undefined;
  db: Db;
  records: Records;
  /** Where the rendered configuration and Kamailio's sockets go; a new temporary folder when absent. */
  runDir?: string;
  log?: (level: 'info' | 'warn' | 'error', message: string, detail?: Record<string, unknown>) => void;
  onKamailioLog?: (line: string) => void;
}

export interface SipEdge {
  kamailio: KamailioProcess;
  runDir: string;
  events: CallEvents;
  /** Where Kamailio posts call events, and the secret it sends (this run's). */
  eventUrl: string;
  eventSecret: string;
  /** Checks the gateways now and reloads Kamailio's trunk registrations and ACLs when they changed; true when in sync. */
  reloadIfChanged(): Promise<boolean>;
  /** Ends the calls whose dialog Kamailio no longer holds (older than `graceMs`). */
  reconcile(graceMs?: number): Promise<number>;
  stop(): Promise<void>;
}

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
  return undefined;
}

export async function startSipEdge(options: SipEdgeOptions): Promise<SipEdge> {
  const { settings, db, records } = options;
  const log = options.log ?? (() => {});
  const unavailable = sipEdgeUnavailable(options.databaseUrl, settings);
  if (unavailable) throw new Error(unavailable);

  // The domain every organisation's SIP domain derives from (`<slug>.<SIP_DOMAIN>`), for the views Kamailio
  // reads and for the API (Organisation sip_domain, SipUser sip_uri); migration 0012.
  await db.updateTable('sip_settings').set({ domain: settings.domain }).where('id', '=', 1).execute();

  const events = new CallEvents({ db, records });
  // Kamailio holds no dialog before it starts: every call left open by an earlier run ends now.
  const ended = await events.reconcile(() => false, new Date());
  if (ended) log('warn', `ended ${ended} call(s) left open by an earlier run`, { ended });

  const secret = randomBytes(32).toString('base64url');
  const receiver = await startReceiver(events, secret, log);
  const runDir = options.runDir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'parley-sip-'));
  fs.mkdirSync(runDir, { recursive: true });
  const configFile = path.join(runDir, 'kamailio.cfg');
  const eventUrl = `http://127.0.0.1:${receiver.port}${EVENTS_PATH}`;
  // The file holds the database URL and the event secret: readable by this user only.
  fs.writeFileSync(
    configFile,
    renderKamailioConfig({ settings, databaseUrl: options.databaseUrl!, runDir, eventUrl, eventSecret: secret }),
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
    await receiver.close();
    throw error;
  }
  log('info', 'Kamailio is running', { listen: settings.listen, domain: settings.domain, runDir });

  // Kamailio caches trunk registrations (uac) and ACLs (permissions); each is reloaded over RPC when its
  // view changed. Both modules refuse reloads that come too fast (uac: reg_gc_interval, permissions:
  // reload_delta): a refused reload is retried at the next check.
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
  const reconcile = async (graceMs = 10_000) => {
    const alive = dialogCallIds(await kamailio.rpc('dlg.list'));
    const count = await events.reconcile((id) => alive.has(id), new Date(Date.now() - graceMs));
    if (count) log('warn', `ended ${count} call(s) whose dialog is gone`, { count });
    return count;
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
  const reloadTimer = setInterval(guarded('gateway reload', reloadIfChanged), settings.reloadIntervalMs);
  const reconcileTimer = setInterval(guarded('reconciliation', reconcile), settings.reconcileIntervalMs);
  reloadTimer.unref();
  reconcileTimer.unref();

  return {
    kamailio,
    runDir,
    events,
    eventUrl,
    eventSecret: secret,
    reloadIfChanged,
    reconcile,
    async stop() {
      clearInterval(reloadTimer);
      clearInterval(reconcileTimer);
      await kamailio.stop();
      await receiver.close();
      // Dialogs ended with Kamailio: their calls end now rather than at the next start.
      await events.reconcile(() => false, new Date()).catch(() => 0);
    },
  };
}

/** A digest of what Kamailio loaded from a view: when it differs, Kamailio's cached copy is stale. */
async function viewFingerprint(db: Db, view: 'sip_uacreg' | 'sip_address'): Promise<string> {
  const { rows } = await sql<{ digest: string | null }>`
    SELECT md5(string_agg(v::text, ',' ORDER BY v::text)) AS digest FROM ${sql.table(view)} v`.execute(db);
  return rows[0].digest ?? '';
}

/**
 * The internal interface: POST /internal/sip/events on 127.0.0.1, an ephemeral port, a secret made
 * for this run and given only to this Kamailio (in its configuration file). Not part of the public API.
 */
async function startReceiver(events: CallEvents, secret: string, log: NonNullable<SipEdgeOptions['log']>) {
  const expected = Buffer.from(secret);
  const server = http.createServer((req, res) => {
    const answer = (status: number, body?: unknown) => {
      res.writeHead(status, body === undefined ? {} : { 'content-type': 'application/json' });
      res.end(body === undefined ? undefined : JSON.stringify(body));
    };
    const given = Buffer.from(String(req.headers[SECRET_HEADER] ?? ''));
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return answer(401, { errors: ['bad secret'] });
    if (req.method !== 'POST' || req.url !== EVENTS_PATH) return answer(404, { errors: ['not found'] });
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > 16 * 1024) req.destroy();
      else chunks.push(chunk);
    });
    req.on('end', () => {
      let body: unknown;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        return answer(400, { errors: ['body is not JSON'] });
      }
      const { event, problems } = parseCallEvent(body);
      if (!event) return answer(400, { errors: problems });
      events.apply(event).then(
        () => answer(204),
        (error: unknown) => {
          log('error', `call event ${event.event} for ${event.call_id} failed: ${error instanceof Error ? error.message : String(error)}`);
          answer(503, { errors: ['not applied; the call is reconciled later'] });
        },
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  return {
    port,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
