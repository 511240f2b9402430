/**
 * A Kysely dialect for PGlite, the embedded PostgreSQL.
 *
 * Kysely ships one from 0.29 on, but 0.29 declares Node 22 and Parley supports Node 20, so it uses
 * Kysely 0.28 with this adaptation of 0.29's driver (kysely-org/kysely, src/dialect/pglite, MIT licence,
 * Copyright (c) 2022 Sami Koskimäki). Delete this file for `PGliteDialect` from 'kysely' when Node 20
 * support is dropped.
 *
 * PGlite is one connection: a mutex hands it to one Kysely caller at a time (as Kysely's SQLite driver
 * does), and a transaction runs inside `pglite.transaction()`, which holds PGlite's own transaction lock,
 * so other users of the same instance (the local command socket) cannot interleave with it.
 */
import type { PGlite, Transaction } from '@electric-sql/pglite';
import {
  type CompiledQuery,
  type DatabaseConnection,
  type DatabaseIntrospector,
  type Dialect,
  type DialectAdapter,
  type Driver,
  type Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  type QueryCompiler,
  type QueryResult,
} from 'kysely';

/** A promise-chain mutex: `acquire` resolves, in order, to the function that lets the next one in. */
export class Mutex {
  #tail: Promise<void> = Promise.resolve();
  async acquire(): Promise<() => void> {
    const previous = this.#tail;
    let release!: () => void;
    this.#tail = new Promise((resolve) => {
      release = resolve;
    });
    await previous;
    return release;
  }
}

export class PGliteDialect implements Dialect {
  /** `mutex` is shared with other users of the instance (the local command socket). */
  constructor(
    private readonly pglite: PGlite,
    private readonly mutex: Mutex = new Mutex(),
  ) {}
  createAdapter(): DialectAdapter {
    return new PostgresAdapter();
  }
  createDriver(): Driver {
    return new PGliteDriver(this.pglite, this.mutex);
  }
  // biome-ignore lint/suspicious/noExplicitAny: Kysely's own signature.
  createIntrospector(db: Kysely<any>): DatabaseIntrospector {
    return new PostgresIntrospector(db);
  }
  createQueryCompiler(): QueryCompiler {
    return new PostgresQueryCompiler();
  }
}

class PGliteDriver implements Driver {
  readonly #connection: PGliteConnection;
  #release: (() => void) | undefined;

  constructor(
    private readonly pglite: PGlite,
    private readonly mutex: Mutex,
  ) {
    this.#connection = new PGliteConnection(pglite);
  }

  async init(): Promise<void> {
    await this.pglite.waitReady;
  }

  async acquireConnection(): Promise<DatabaseConnection> {
    this.#release = await this.mutex.acquire();
    return this.#connection;
  }

  async releaseConnection(): Promise<void> {
    const release = this.#release;
    this.#release = undefined;
    release?.();
  }

  async beginTransaction(): Promise<void> {
    await this.#connection.begin();
  }

  async commitTransaction(): Promise<void> {
    await this.#connection.commit();
  }

  async rollbackTransaction(): Promise<void> {
    await this.#connection.rollback();
  }

  async destroy(): Promise<void> {
    if (!this.pglite.closed) await this.pglite.close();
  }
}

class PGliteConnection implements DatabaseConnection {
  #transaction: Transaction | undefined;
  #finish: ((commit: boolean) => void) | undefined;
  #closed: Promise<unknown> | undefined;

  constructor(private readonly pglite: PGlite) {}

  async executeQuery<R>(compiled: CompiledQuery): Promise<QueryResult<R>> {
    const { affectedRows, rows } = await (this.#transaction ?? this.pglite).query<R>(compiled.sql, compiled.parameters as unknown[], {
      rowMode: 'object',
    });
    return { numAffectedRows: affectedRows != null ? BigInt(affectedRows) : undefined, rows: rows ?? [] };
  }

  // biome-ignore lint/correctness/useYield: PGlite cannot stream; the generator only throws.
  async *streamQuery<R>(): AsyncIterableIterator<QueryResult<R>> {
    throw new Error('Streaming is not supported by PGlite.');
  }

  /** Opens `pglite.transaction()` and keeps it open until commit or rollback settles it. */
  async begin(): Promise<void> {
    let begun!: () => void;
    const started = new Promise<void>((resolve) => {
      begun = resolve;
    });
    const settled = new Promise<boolean>((resolve) => {
      this.#finish = resolve;
    });
    this.#closed = this.pglite.transaction(async (tx) => {
      this.#transaction = tx;
      begun();
      if (!(await settled)) await tx.rollback();
    });
    // A failure to begin settles `#closed` before `started`: surface it.
    await Promise.race([started, this.#closed]);
  }

  async commit(): Promise<void> {
    this.#finish?.(true);
    try {
      await this.#closed;
    } finally {
      this.#reset();
    }
  }

  async rollback(): Promise<void> {
    this.#finish?.(false);
    await this.#closed?.catch(() => {});
    this.#reset();
  }

  #reset(): void {
    this.#transaction = undefined;
    this.#finish = undefined;
    this.#closed = undefined;
  }
}
