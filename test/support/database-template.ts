/**
 * Vitest global setup: the migrated cluster that every in-memory test server loads instead of running initdb
 * and the migrations (src/db/pglite-template.ts), made once before the test processes start, so that they do
 * not each make it at the same moment. Kept between runs; a change to the migrations makes a new one.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { templateTarball } from '../../src/db/pglite-template.js';

export default function setup(): void {
  if (fs.existsSync(templateTarball)) return;
  // In a process of its own: PGlite's WebAssembly memory is never given back, and this process runs the suite.
  execFileSync(process.execPath, ['--import', 'tsx', 'src/db/pglite-template.ts', 'tarball'], { stdio: 'inherit' });
}
