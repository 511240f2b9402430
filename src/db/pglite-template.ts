/**
 * A freshly initialised PGlite cluster with this build's migrations applied and nothing else (no signing
 * secret, no records: those are made on first start), made once when the package is built and copied into an
 * empty data directory on first start. PGlite's initdb runs PostgreSQL's bootstrap in WebAssembly, which
 * takes seconds and grows the process's WebAssembly memory (which never shrinks) to about 800 MB; loading the
 * cluster takes about a second and half of that memory, and the migrations are done. Without the file
 * (running from source) initdb and the migrations run. The file is named after the PGlite version, whose
 * catalogue it holds; a later migration than the build's still runs at start.
 */
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

/** The installed PGlite's version, from its package.json (which the package does not export). */
function pgliteVersion(): string {
  const entry = createRequire(import.meta.url).resolve('@electric-sql/pglite');
  const root = entry.slice(0, entry.lastIndexOf('@electric-sql/pglite') + '@electric-sql/pglite'.length);
  return JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')).version;
}
const version = pgliteVersion();

/** A data directory: copying its files is far quicker than PGlite unpacking a tarball of them. */
export const templateDir = fileURLToPath(new URL(`./pglite-cluster-${version}`, import.meta.url));

/** The template's directory, when the build made it. */
export function clusterTemplate(): string | undefined {
  return fs.existsSync(path.join(templateDir, 'PG_VERSION')) ? templateDir : undefined;
}

/** Runs initdb and the migrations into `dir` (`npm run build` does this). */
export async function writeClusterTemplate(dir = templateDir): Promise<void> {
  const { PGlite } = await import('@electric-sql/pglite');
  const { Kysely } = await import('kysely');
  const { Mutex, PGliteDialect } = await import('./pglite-dialect.js');
  const { migrate } = await import('./migrate.js');
  fs.rmSync(dir, { recursive: true, force: true });
  const pglite = await PGlite.create(dir);
  const db = new Kysely({ dialect: new PGliteDialect(pglite, new Mutex()) });
  await migrate(db);
  await pglite.exec('CHECKPOINT');
  await pglite.close();
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await writeClusterTemplate();
