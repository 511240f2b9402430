/**
 * The embedded database belongs to the process that holds its lock (the server). That process
 * exposes it to local commands on a Unix socket inside DATA_DIR, speaking the PostgreSQL wire
 * protocol (@electric-sql/pglite-socket), so `parley org create` while `serve` runs goes through the
 * server's PGlite instead of failing on the lock. The socket is a file only local users with access
 * to DATA_DIR can reach (mode 0600), as the data files themselves.
 *
 * PGlite is one session. The server's own queries and a command's statements must not interleave:
 * a command's statement (a simple query, or an extended-protocol sequence up to its Sync) or its
 * whole transaction holds the same mutex the server's Kysely driver takes for each of its queries
 * and transactions.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { PGlite } from '@electric-sql/pglite';
import { PGLiteSocketServer } from '@electric-sql/pglite-socket';
import type { Mutex } from './pglite-dialect.js';

/** PostgreSQL clients find a server's socket as `<directory>/.s.PGSQL.<port>`. */
const PORT = 5432;
export const localSocketPath = (dataDir: string) => path.join(dataDir, `.s.PGSQL.${PORT}`);

/** A command that holds the socket this long without a word is disconnected, so the server cannot stall. */
const IDLE_TIMEOUT_MS = 30_000;

const SYNC = 0x53; // 'S': ends an extended-protocol sequence
const QUERY = 0x51; // 'Q': a simple query, complete in itself
const TERMINATE = 0x58; // 'X'

/**
 * Starts the socket; resolves to a function that stops it. `onCommandWork` is called after each unit of a
 * command's work (outside a transaction block), before its result goes back to the command.
 */
export async function exposeLocally(
  pglite: PGlite,
  mutex: Mutex,
  dataDir: string,
  onCommandWork: () => void = () => {},
): Promise<() => Promise<void>> {
  const socketPath = localSocketPath(dataDir);
  // We hold the data directory's lock: a socket file left here is a dead server's.
  fs.rmSync(socketPath, { force: true });

  let release: (() => void) | undefined;
  const hold = async () => {
    release ??= await mutex.acquire();
  };
  const letGo = () => {
    if (pglite.isInTransaction()) return;
    if (release) onCommandWork();
    const done = release;
    release = undefined;
    done?.();
  };
  // The socket server drives PGlite through these few methods; each message first takes the
  // mutex, which is let go once a unit of work is complete outside a transaction block.
  const guarded = {
    get waitReady() {
      return pglite.waitReady;
    },
    isInTransaction: () => pglite.isInTransaction(),
    runExclusive: async <T>(work: () => Promise<T>): Promise<T> => {
      await hold();
      return pglite.runExclusive(work);
    },
    execProtocolRawStream: async (message: Uint8Array, options: Parameters<PGlite['execProtocolRawStream']>[1]) => {
      try {
        return await pglite.execProtocolRawStream(message, options);
      } finally {
        if ([SYNC, QUERY, TERMINATE].includes(message[0]) || isStartup(message)) letGo();
      }
    },
    // Called when a command disconnects inside its transaction.
    exec: async (query: string) => {
      await hold();
      try {
        return await pglite.exec(query);
      } finally {
        letGo();
      }
    },
  };
  const server = new PGLiteSocketServer({
    db: guarded as unknown as PGlite,
    path: socketPath,
    maxConnections: 1,
    idleTimeout: IDLE_TIMEOUT_MS,
  });
  await server.start();
  fs.chmodSync(socketPath, 0o600);
  return async () => {
    await server.stop();
    fs.rmSync(socketPath, { force: true });
    letGo();
  };
}

/** A startup message: a length, then protocol version 3.0, with no type byte. */
function isStartup(message: Uint8Array): boolean {
  return message.length >= 8 && new DataView(message.buffer, message.byteOffset).getInt32(4) === 196608;
}

/** Whether a server in another process shares the embedded database in `dataDir`. */
export function sharedLocally(dataDir: string): boolean {
  try {
    return fs.statSync(localSocketPath(dataDir)).isSocket();
  } catch {
    return false;
  }
}
