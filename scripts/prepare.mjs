/**
 * `npm install`'s `prepare` step: builds dist/ (server, embedded database template, console and widget) only
 * when it is missing or older than the sources. npm also runs `prepare` when `npx parley` installs the project
 * from its own folder; rebuilding then took over a minute, silently, and rewrote dist/ under a server running
 * from it. Up to date, this prints one line and changes nothing; otherwise it says what it builds and why.
 * `npm run build` always builds.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const root = new URL('..', import.meta.url).pathname;
const stamp = join(root, 'dist', '.build-stamp');
const inputs = ['src', 'web', 'package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json'];

/** The newest modification time under `path` (files only; node_modules and dist are not sources). */
function newest(path) {
  if (!existsSync(path)) return 0;
  const stats = statSync(path);
  if (!stats.isDirectory()) return stats.mtimeMs;
  let latest = 0;
  for (const entry of readdirSync(path)) {
    if (entry === 'node_modules' || entry === 'dist') continue;
    latest = Math.max(latest, newest(join(path, entry)));
  }
  return latest;
}

const sources = Math.max(...inputs.map((input) => newest(join(root, input))));
const built = existsSync(stamp) ? statSync(stamp).mtimeMs : 0;
if (built >= sources) {
  console.error('parley: dist/ is up to date with the sources; not rebuilding (`npm run build` forces it).');
  process.exit(0);
}
console.error(
  built === 0
    ? 'parley: building dist/ for the first time (server, database template, console; about a minute)...'
    : 'parley: sources changed since dist/ was built; rebuilding it (about a minute; a server running from dist/ should be restarted after)...',
);
const result = spawnSync('npm', ['run', '--silent', 'build'], { cwd: root, stdio: 'inherit' });
if (result.status !== 0) process.exit(result.status ?? 1);
writeFileSync(stamp, `${new Date().toISOString()}\n`);
