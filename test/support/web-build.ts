/**
 * Vitest global setup: the console and the widget are built by `npm install` (prepare); when a checkout was
 * installed without scripts, build them once here so that the tests serve what users get.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { PUBLIC_DIR } from '../../src/web/assets.js';

export default function setup(): void {
  if (existsSync(`${PUBLIC_DIR}console/index.html`) && existsSync(`${PUBLIC_DIR}widget.js`)) return;
  execFileSync('npm', ['run', '--silent', 'build:web'], { stdio: 'inherit' });
}
