/**
 * A freshly initialised PGlite cluster with this build's migrations applied and nothing else (no signing
 * secret, no records: those are made on first start), made once and then used instead of initdb and the
 * migrations. PGlite's initdb runs PostgreSQL's bootstrap in WebAssembly, which takes seconds and grows the
 * process's WebAssembly memory (which never shrinks) to about 800 MB; loading the cluster takes about a second
 * and half of that memory, and the migrations are done.
 *
 * Two forms of it:
 * - a data directory that `npm run build` makes next to this file, copied into an empty data directory on
 *   first start (copying files is far quicker than PGlite unpacking a tarball of them);
 * - a tarball, which PGlite loads into an in-memory database (`memory://`: every test server) or into a new
 *   data directory when there is no directory template (running from source). It is made on first use and
 *   kept in the package's `node_modules/.cache/parley/` (the usual place for tools' caches), so that each test
 *   server starts from it instead of running initdb; where that cannot be written, each process makes its own.
 *
 * Both are named after the PGlite version, whose catalogue they hold, and a digest of every migration's name
 * and SQL: a template made before a migration was added, changed or renamed has another name and is not used
 * (the build removes its old directories; old tarballs stay in the cache folder, unused).
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Kysely } from 'kysely';
import { migrate, migrationList } from './migrate.js';
import { Mutex, PGliteDialect } from './pglite-dialect.js';

/** The installed PGlite's version, from its package.json (which the package does not export). */
function pgliteVersion(): string {
  const entry = createRequire(import.meta.url).resolve('@electric-sql/pglite');
  const root = entry.slice(0, entry.lastIndexOf('@electric-sql/pglite') + '@electric-sql/pglite'.length);
  return JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')).version;
}

const digest = createHash('sha256').update(JSON.stringify(migrationList())).digest('hex').slice(0, 16);
const name = `pglite-cluster-${pgliteVersion()}-${digest}`;

/** The directory template `npm run build` makes. */
export const templateDir = fileURLToPath(new URL(`./${name}`, import.meta.url));

/** The tarball template, two levels up from src/db or dist/db: the package's folder. */
export const templateTarball = fileURLToPath(new URL(`../../node_modules/.cache/parley/${name}.tar`, import.meta.url));

/** The directory template, when the build made it for these migrations. */
export function clusterTemplate(): string | undefined {
  return fs.existsSync(path.join(templateDir, 'PG_VERSION')) ? templateDir : undefined;
}

/** Runs initdb and the migrations into a PGlite at `dataDir`, then `finish` with it, then closes it. */
async function makeCluster<T>(dataDir: string, finish: (pglite: import('@electric-sql/pglite').PGlite) => Promise<T>): Promise<T> {
  const { PGlite } = await import('@electric-sql/pglite');
  const pglite = await PGlite.create(dataDir);
  try {
    await migrate(new Kysely({ dialect: new PGliteDialect(pglite, new Mutex()) }));
    await pglite.exec('CHECKPOINT');
    return await finish(pglite);
  } finally {
    await pglite.close();
  }
}

/** Runs initdb and the migrations into `dir` (`npm run build` does this), removing older templates beside it. */
export async function writeClusterTemplate(dir = templateDir): Promise<void> {
  const parent = path.dirname(dir);
  for (const entry of fs.existsSync(parent) ? fs.readdirSync(parent) : []) {
    if (entry.startsWith('pglite-cluster-')) fs.rmSync(path.join(parent, entry), { recursive: true, force: true });
  }
  await makeCluster(dir, async () => {});
}

let tarball: Promise<Blob> | undefined;

/** The tarball template (PGlite's `loadDataDir`), read from the cache folder, or made and kept there. */
export function tarballTemplate(): Promise<Blob> {
  tarball ??= (async () => {
    try {
      return new Blob([fs.readFileSync(templateTarball)]);
    } catch {
      // Not made yet (or not readable): made below.
    }
    const made = await makeCluster('memory://', (pglite) => pglite.dumpDataDir('none'));
    // Written under a name of this process's, then renamed: a concurrent reader sees the whole file or none.
    const partial = `${templateTarball}.${process.pid}`;
    try {
      fs.mkdirSync(path.dirname(templateTarball), { recursive: true });
      fs.writeFileSync(partial, new Uint8Array(await made.arrayBuffer()));
      fs.renameSync(partial, templateTarball);
    } catch {
      // A read-only installation: this process keeps its own copy.
      fs.rmSync(partial, { force: true });
    }
    return made;
  })();
  // A failure is not kept: the next database tries again.
  tarball.catch(() => (tarball = undefined));
  return tarball;
}

// `node dist/db/pglite-template.js` (the build) writes the directory template; with `tarball`, the tarball
// (the test suites' global setup, so that their processes do not each make it at once).
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  if (process.argv[2] === 'tarball') await tarballTemplate();
  else await writeClusterTemplate();
}
