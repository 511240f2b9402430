/**
 * The Node flags `parley serve` runs with: those of the command's first line (`#!/usr/bin/env -S node ...`),
 * which `npm start` passes too. The benchmarks start servers with them, so they measure what is deployed.
 */
import fs from 'node:fs';
import path from 'node:path';

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');

export function serveNodeFlags(): string[] {
  const first = fs.readFileSync(path.join(root, 'src', 'cli', 'main.ts'), 'utf8').split('\n', 1)[0];
  const match = /^#!\/usr\/bin\/env -S node(?: (.*))?$/.exec(first);
  if (!match) throw new Error(`src/cli/main.ts: unexpected first line ${first}`);
  return match[1] ? match[1].split(' ') : [];
}
