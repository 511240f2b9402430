import fs from 'node:fs';
import path from 'node:path';
import { CompiledQuery, Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import type { Config } from '../config/index.js';
import { exposeLocally, sharedLocally } from './local-socket.js';
import { Mutex, PGliteDialect } from './pglite-dialect.js';
import { clusterTemplate, tarballTemplate } from './pglite-template.js';
import { preparedStatementsPool } from './prepared.js';
import type { Database } from './schema.js';

export type { Database } from './schema.js';

/** Runs `work` in a transaction, or in the caller's when `db` is one already (Kysely does not nest them). */
export function inTransaction<T>(db: Database, work: (trx: Database) => Promise<T>): Promise<T> {
  return db.isTransaction ? work(db) : transaction(db, work);
}

/** Work registered by `beforeCommit` and `afterCommit`, by open transaction. */
const commitHooks = new WeakMap<Database, { before: Array<() => Promise<void>>; after: Array<(db: Database) => void> }>();

/**
 * A new transaction whose `beforeCommit` hooks run, in order, after `work` and just before COMMIT (the event
 * outbox appends there, so that a transaction's events follow its other writes), and whose `afterCommit`
 * hooks run once COMMIT has succeeded, with `db`.
 */
export async function transaction<T>(db: Database, work: (trx: Database) => Promise<T>, committing?: () => void): Promise<T> {
  const after: Array<(db: Database) => void> = [];
  const result = await db.transaction().execute(async (trx) => {
    const before: Array<() => Promise<void>> = [];
    commitHooks.set(trx, { before, after });
    const result = await work(trx);
    // A hook may register another; each runs once.
    for (let i = 0; i < before.length; i++) await before[i]();
    committing?.();
    return result;
  });
  for (const hook of after) hook(db);
  return result;
}

/**
 * Runs `hook` just before `trx` commits. False when `trx` was not opened by `transaction` (then the caller
 * must do the work at once instead).
 */
export function beforeCommit(trx: Database, hook: () => Promise<void>): boolean {
  return commitHooks.get(trx)?.before.push(hook) !== undefined;
}

/**
 * Runs `hook` (with the database `trx` was opened on) after `trx` has committed; never for a rollback. False
 * when `trx` was not opened by `transaction`.
 */
export function afterCommit(trx: Database, hook: (db: Database) => void): boolean {
  return commitHooks.get(trx)?.after.push(hook) !== undefined;
}

/** The shortest time between two notification statements of one database handle. */
export const NOTIFY_BATCH_MS = 10;

interface Notifier {
  /** Payloads waiting, by channel. */
  waiting: Map<string, Set<string>>;
  timer?: NodeJS.Timeout;
  sending?: Promise<void>;
  last: number;
}
const notifiers = new WeakMap<Database, Notifier>();

/**
 * Sends `payload` on `channel` (NOTIFY) once `trx` commits, never for a rollback (`trx` not in a transaction:
 * at once; in one not opened by `transaction`: with a NOTIFY in it). The notifications are sent after COMMIT in a statement of their own, at most one
 * such statement every `NOTIFY_BATCH_MS`, with every payload waiting: a NOTIFY inside a transaction makes every
 * notifying commit of the database wait for the one before it (PostgreSQL queues notifications under a
 * database-wide lock held until the commit is flushed). The first commit after a quiet spell is announced at
 * once, those that follow within `NOTIFY_BATCH_MS` together after it. A subscriber must not rely on every
 * notification arriving (a process may stop before sending it): it also looks for what it missed.
 */
export function notifyAfterCommit(trx: Database, channel: string, payload: string): void {
  checkChannel(channel);
  if (afterCommit(trx, (db) => queueNotification(db, channel, payload))) return;
  if (!trx.isTransaction) queueNotification(trx, channel, payload);
  // A transaction opened elsewhere: a NOTIFY in it, delivered by PostgreSQL if it commits.
  else void sql`SELECT pg_notify(${channel}, ${payload})`.execute(trx).catch(() => {});
}

function queueNotification(db: Database, channel: string, payload: string): void {
  const notifier = notifiers.get(db) ?? { waiting: new Map(), last: 0 };
  notifiers.set(db, notifier);
  notifier.waiting.set(channel, (notifier.waiting.get(channel) ?? new Set()).add(payload));
  scheduleNotifications(db, notifier);
}

function scheduleNotifications(db: Database, notifier: Notifier): void {
  if (notifier.timer || notifier.sending) return;
  notifier.timer = setTimeout(
    () => {
      notifier.timer = undefined;
      notifier.sending = sendNotifications(db, notifier).finally(() => {
        notifier.sending = undefined;
        if (notifier.waiting.size > 0) scheduleNotifications(db, notifier);
      });
    },
    Math.max(0, notifier.last + NOTIFY_BATCH_MS - Date.now()),
  );
}

async function sendNotifications(db: Database, notifier: Notifier): Promise<void> {
  const channels = [...notifier.waiting].flatMap(([channel, waiting]) => [...waiting].map(() => channel));
  const payloads = [...notifier.waiting.values()].flatMap((waiting) => [...waiting]);
  notifier.waiting.clear();
  notifier.last = Date.now();
  await sql`SELECT pg_notify(c, p) FROM unnest(${channels}::text[], ${payloads}::text[]) AS n (c, p)`.execute(db).catch(() => {});
}

/** Sends the notifications still waiting (before the database closes). */
async function flushNotifications(db: Database): Promise<void> {
  const notifier = notifiers.get(db);
  if (!notifier) return;
  clearTimeout(notifier.timer);
  notifier.timer = undefined;
  await notifier.sending;
  if (notifier.waiting.size > 0) await sendNotifications(db, notifier);
}

export interface DatabaseHandle {
  db: Database;
  kind: 'postgres' | 'pglite';
  /**
   * Subscribes to a PostgreSQL notification channel (LISTEN/NOTIFY; lower-case names). `onNotify` gets each
   * payload; `onResumed` is called after a lost listening connection is back, since notifications sent while
   * it was down are gone and the subscriber must catch up from the table itself (on the embedded database:
   * after a local command's statements, whose notifications do not reach this process's listeners).
   * Returns the unsubscribe.
   */
  listen(
    channel: string,
    onNotify: (payload: string) => void,
    onResumed?: () => void,
    options?: {
      /** Called when the listening connection is lost (notifications are missed until `onResumed`). */
      onLost?: () => void;
      /**
       * Also listen on every pooled connection, so that a notification raised by this process's own statement
       * reaches `onNotify` before that statement's result does: PostgreSQL delivers a session's own notifications
       * on its connection before it reports the commit ready. A notification may then arrive more than once.
       * (PGlite is one connection: always so.)
       */
      ownStatementsFirst?: boolean;
    },
  ): Promise<() => Promise<void>>;
  /**
   * PostgreSQL only: runs a short read on a connection of its own, outside the pool, for a statement that
   * requests wait for before their own (the credential epoch, src/auth/plugin.ts) or that delivers what they
   * wrote (the event streams' read of new events, src/events/stream.ts). Through the pool it queued behind the
   * requests' statements: with 32 requests in flight and 10 connections, each request waited for a connection
   * twice. While that connection cannot be had, the read goes through the pool.
   */
  readAside?<R>(text: string, values?: unknown[]): Promise<R[]>;
  close(): Promise<void>;
}

/** `shareLocally`: serve the embedded database to local commands on a socket in DATA_DIR while open (the server does). */
export async function openDatabase(config: Config, { shareLocally = false } = {}): Promise<DatabaseHandle> {
  if (config.databaseUrl) {
    const pool = new pg.Pool({
      connectionString: config.databaseUrl,
      max: config.databasePoolSize,
      connectionTimeoutMillis: config.databaseTimeoutMs,
      statement_timeout: config.databaseTimeoutMs,
      query_timeout: config.databaseTimeoutMs + 1000,
      idleTimeoutMillis: 30_000,
      // No JIT compilation: it pays off for long analytical queries, and Parley's are short. PostgreSQL
      // compiles any statement whose estimated cost passes jit_above_cost, on every execution: measured on a
      // list whose plan was misestimated (300,000 conversations), 110 ms of the 534 ms went to emitting code.
      options: '-c jit=off',
    });
    // A lost server connection must not crash the process: the query in flight fails
    // (503), and the pool drops the broken client and opens a new one when asked.
    pool.on('error', () => {});
    pool.on('connect', (client) => client.on('error', () => {}));
    const db: Database = new Kysely({ dialect: new PostgresDialect({ pool: preparedStatementsPool(pool) }) });
    const listener = new Listener(config);
    const pooled = new PoolListener(pool);
    const aside = new AsideConnection(config, db);
    return {
      db,
      kind: 'postgres',
      readAside: (text, values) => aside.read(text, values),
      listen: async (channel, onNotify, onResumed, options = {}) => {
        const unlisten = await listener.listen(channel, onNotify, onResumed, options.onLost);
        const unpool = options.ownStatementsFirst ? pooled.listen(channel, onNotify) : () => {};
        return () => {
          unpool();
          return unlisten();
        };
      },
      close: async () => {
        await flushNotifications(db);
        await listener.close();
        await aside.close();
        await db.destroy();
      },
    };
  }
  const { PGlite } = await import('@electric-sql/pglite');
  const inMemory = config.dataDir.startsWith('memory://');
  if (!inMemory) fs.mkdirSync(config.dataDir, { recursive: true });
  let unlock: () => void;
  try {
    unlock = inMemory ? () => {} : lockDataDir(config.dataDir);
  } catch (error) {
    // The server holds it and shares it: work through the server's socket.
    if (error instanceof DataDirInUse && sharedLocally(config.dataDir)) return openShared(config);
    throw error;
  }
  let stopSharing = async () => {};
  try {
    // First start (always, in memory): an initialised and migrated cluster instead of initdb and the migrations
    // (see pglite-template): the build's directory copied, else the tarball loaded.
    const fresh = inMemory || !fs.existsSync(path.join(config.dataDir, 'PG_VERSION'));
    const template = fresh && !inMemory ? clusterTemplate() : undefined;
    if (template) fs.cpSync(template, config.dataDir, { recursive: true });
    const pglite = await PGlite.create({
      dataDir: config.dataDir,
      loadDataDir: fresh && !template ? await tarballTemplate() : undefined,
      // PGlite keeps PostgreSQL's shared buffers in its WebAssembly memory, all of it resident once touched:
      // 32 MB (PostgreSQL's default is 128 MB) bounds the process's memory; the data files are read through
      // Node's file system, cached by the operating system.
      postgresqlconf: 'shared_buffers = 32MB',
    });
    const mutex = new Mutex();
    const db: Database = new Kysely({ dialect: new PGliteDialect(pglite, mutex) });
    const catchUps = new Set<() => void>();
    if (shareLocally && !inMemory) {
      // A local command's statements reach PGlite through the socket, whose output is not parsed for
      // notifications: after each of its units of work, subscribers catch up as after a lost connection.
      stopSharing = await exposeLocally(pglite, mutex, config.dataDir, () => {
        for (const catchUp of catchUps) catchUp();
      });
    }
    return {
      db,
      kind: 'pglite',
      // PGlite delivers the notifications of its own connection, which is every writer in this process.
      listen: async (channel, onNotify, onResumed) => {
        checkChannel(channel);
        const unsubscribe = await pglite.listen(channel, onNotify);
        const catchUp = () => onResumed?.();
        catchUps.add(catchUp);
        return async () => {
          catchUps.delete(catchUp);
          // Closed already (the database before the server): nothing listens any more.
          if (!pglite.closed) await unsubscribe();
        };
      },
      close: async () => {
        await flushNotifications(db);
        await stopSharing();
        await db.destroy();
        unlock();
      },
    };
  } catch (error) {
    await stopSharing();
    unlock();
    throw error;
  }
}

/** The embedded database of a running server, through its local socket (PostgreSQL protocol, one connection). */
function openShared(config: Config): DatabaseHandle {
  const pool = new pg.Pool({
    host: config.dataDir,
    user: 'postgres',
    database: 'postgres',
    max: 1,
    connectionTimeoutMillis: config.databaseTimeoutMs,
  });
  pool.on('error', () => {});
  // Unnamed statements only: every local command shares the server's one embedded session, where a name
  // prepared by one command would still be there, for another text, when the next command comes.
  const db: Database = new Kysely({ dialect: new PostgresDialect({ pool }) });
  return {
    db,
    kind: 'pglite',
    listen: () => Promise.reject(new Error("A local command cannot listen on the running server's embedded database.")),
    close: async () => {
      await flushNotifications(db);
      await db.destroy();
    },
  };
}

/** Channel names are written into LISTEN statements (they cannot be bound parameters), so only identifiers pass. */
function checkChannel(channel: string): void {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(channel)) throw new Error(`Invalid notification channel name: ${channel}`);
}

interface Subscription {
  onNotify: (payload: string) => void;
  onResumed?: () => void;
  onLost?: () => void;
}

/** A connection of its own, outside the pool: opened when first needed, ended by `close`. */
abstract class OwnConnection {
  protected client?: pg.Client;
  private connecting?: Promise<pg.Client>;
  protected closed = false;

  constructor(
    protected readonly config: Config,
    private readonly settings: pg.ClientConfig = {},
  ) {}

  /** Sets a new client's handlers, before it connects. */
  protected abstract prepare(client: pg.Client): void;

  protected connect(): Promise<pg.Client> {
    if (this.client) return Promise.resolve(this.client);
    this.connecting ??= (async () => {
      const client = new pg.Client({
        connectionString: this.config.databaseUrl,
        connectionTimeoutMillis: this.config.databaseTimeoutMs,
        query_timeout: this.config.databaseTimeoutMs + 1000,
        ...this.settings,
      });
      this.prepare(client);
      try {
        await client.connect();
      } catch (error) {
        client.end().catch(() => {});
        throw error;
      } finally {
        this.connecting = undefined;
      }
      // Closed while connecting (a reconnection in flight): kept, the connection would hold the process open.
      if (this.closed) {
        await client.end().catch(() => {});
        throw new Error('closed');
      }
      this.client = client;
      return client;
    })();
    return this.connecting;
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.drop();
  }

  /** Ends the connection (a new one is opened when next needed, unless closed). */
  protected async drop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    await client?.end().catch(() => {});
  }
}

/**
 * One dedicated connection per process for LISTEN (a pooled connection would be handed to other queries).
 * It is opened on the first subscription and, when lost, reopened with growing pauses; then every channel is
 * listened to again and its subscribers told to catch up.
 */
class Listener extends OwnConnection {
  private readonly channels = new Map<string, Set<Subscription>>();
  private retryMs = 250;
  private timer?: NodeJS.Timeout;

  async listen(
    channel: string,
    onNotify: (payload: string) => void,
    onResumed?: () => void,
    onLost?: () => void,
  ): Promise<() => Promise<void>> {
    checkChannel(channel);
    const subscription: Subscription = { onNotify, onResumed, onLost };
    const subscribers = this.channels.get(channel);
    if (subscribers) subscribers.add(subscription);
    else {
      this.channels.set(channel, new Set([subscription]));
      await (await this.connect()).query(`LISTEN ${channel}`);
    }
    return async () => {
      const set = this.channels.get(channel);
      if (set?.delete(subscription) && set.size === 0) {
        this.channels.delete(channel);
        await this.client?.query(`UNLISTEN ${channel}`).catch(() => {});
      }
    };
  }

  // LISTEN and UNLISTEN are bounded too: the server's close waits for its UNLISTEN (stream.ts, typing.ts).
  protected prepare(client: pg.Client): void {
    client.on('notification', (message) => {
      for (const subscription of this.channels.get(message.channel) ?? []) subscription.onNotify(message.payload ?? '');
    });
    client.on('error', () => this.lost(client));
    client.on('end', () => this.lost(client));
  }

  private lost(client: pg.Client): void {
    if (this.client !== client) return;
    void this.drop();
    for (const subscribers of this.channels.values()) for (const s of subscribers) s.onLost?.();
    if (!this.closed) this.scheduleReconnect();
  }

  private scheduleReconnect(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(async () => {
      try {
        const client = await this.connect();
        for (const channel of this.channels.keys()) await client.query(`LISTEN ${channel}`);
        this.retryMs = 250;
        for (const subscribers of this.channels.values()) for (const s of subscribers) s.onResumed?.();
      } catch {
        this.retryMs = Math.min(this.retryMs * 2, 10_000);
        if (this.client) this.lost(this.client);
        else if (!this.closed) this.scheduleReconnect();
      }
    }, this.retryMs);
    this.timer.unref();
  }

  override async close(): Promise<void> {
    clearTimeout(this.timer);
    await super.close();
  }
}

/** The connection of `DatabaseHandle.readAside`: opened on first use, dropped when it fails (the pool serves then). */
class AsideConnection extends OwnConnection {
  constructor(
    config: Config,
    private readonly db: Database,
  ) {
    super(config, { statement_timeout: config.databaseTimeoutMs });
  }

  async read<R>(text: string, values: unknown[] = []): Promise<R[]> {
    if (!this.closed) {
      try {
        return (await (await this.connect()).query(text, values)).rows as R[];
      } catch {
        void this.drop();
      }
    }
    return (await this.db.executeQuery<R>(CompiledQuery.raw(text, values))).rows;
  }

  protected prepare(client: pg.Client): void {
    client.on('error', () => {
      if (this.client === client) void this.drop();
    });
  }
}

/**
 * LISTEN on the pool's connections: each connection, when handed out, first listens to the channels it does
 * not listen to yet (the statement is queued before the borrower's), so the connection a statement of this
 * process runs on brings that statement's own notifications before its result.
 */
class PoolListener {
  private readonly channels = new Map<string, Set<(payload: string) => void>>();
  private readonly listening = new WeakMap<pg.PoolClient, Set<string>>();

  constructor(pool: pg.Pool) {
    pool.on('acquire', (client) => {
      let mine = this.listening.get(client);
      if (!mine) {
        mine = new Set();
        this.listening.set(client, mine);
        client.on('notification', (message) => {
          for (const onNotify of this.channels.get(message.channel) ?? []) onNotify(message.payload ?? '');
        });
      }
      for (const channel of this.channels.keys()) {
        if (mine.has(channel)) continue;
        mine.add(channel);
        client.query(`LISTEN ${channel}`).catch(() => mine.delete(channel));
      }
    });
  }

  listen(channel: string, onNotify: (payload: string) => void): () => void {
    checkChannel(channel);
    const subscribers = (this.channels.get(channel) ?? new Set()).add(onNotify);
    this.channels.set(channel, subscribers);
    // Connections keep listening after the last unsubscribe; nothing is delivered to anyone then.
    return () => subscribers.delete(onNotify);
  }
}

class DataDirInUse extends Error {}

/**
 * The embedded database lives in one process at a time: a second process (a
 * command while the server runs) would work on its own copy and its writes
 * would be lost or overwrite the other's. A lock file holding the owner's pid
 * refuses that; a lock left by a process that no longer runs is taken over.
 * A server shares its database with local commands through a socket instead.
 */
function lockDataDir(dataDir: string): () => void {
  const lockFile = path.join(dataDir, 'parley.lock');
  const mine = String(process.pid);
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      fs.writeFileSync(lockFile, mine, { flag: 'wx' });
      return () => {
        if (fs.readFileSync(lockFile, 'utf8') === mine) fs.rmSync(lockFile, { force: true });
      };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      const owner = Number(fs.readFileSync(lockFile, 'utf8'));
      if (isRunning(owner)) {
        throw new DataDirInUse(
          `The embedded database in ${dataDir} is in use by process ${owner}. Stop it first, or use PostgreSQL ` +
            `(DATABASE_URL) to share a database between processes. (Lock file: ${lockFile}.)`,
        );
      }
      fs.rmSync(lockFile, { force: true });
    }
  }
  throw new Error(`Could not lock the embedded database in ${dataDir} (${lockFile}).`);
}

function isRunning(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}
