/**
 * The error catalogue (src/jsonapi/errors.ts) and docs/api.md's error table name the same codes with the same
 * statuses, and every code the source raises is in the catalogue with a title.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ERRORS, errorObject } from '../src/jsonapi/errors.js';

const root = new URL('..', import.meta.url).pathname;

function documentedErrors(): Map<string, number> {
  const api = readFileSync(join(root, 'docs/api.md'), 'utf8');
  const section = api.slice(api.indexOf('## Errors'), api.indexOf('\n## ', api.indexOf('## Errors') + 1));
  const rows = [...section.matchAll(/^\| `([a-z_]+)` \| (\d{3}) \|/gm)];
  return new Map(rows.map((m) => [m[1], Number(m[2])]));
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? sourceFiles(path) : path.endsWith('.ts') ? [path] : [];
  });
}

describe('the error catalogue', () => {
  it("docs/api.md's error table lists exactly the catalogue's codes, each with its status", () => {
    const catalogue = new Map(Object.entries(ERRORS).map(([code, [status]]) => [code, status as number]));
    expect(Object.fromEntries(documentedErrors())).toEqual(Object.fromEntries(catalogue));
  });

  it('gives every code its status and a title of its own', () => {
    for (const code of Object.keys(ERRORS) as (keyof typeof ERRORS)[]) {
      const error = errorObject(code);
      expect(error.status).toBe(String(ERRORS[code][0]));
      expect(error.title).not.toBe(code);
      expect(error.title.length).toBeGreaterThan(3);
    }
  });

  it('every quoted code passed to ApiError.of or errorObject in src/ is catalogued', () => {
    const used = new Set<string>();
    for (const file of sourceFiles(join(root, 'src'))) {
      for (const m of readFileSync(file, 'utf8').matchAll(/(?:ApiError\.of|errorObject)\(\s*'([a-z_]+)'/g)) used.add(m[1]);
    }
    expect(used.size).toBeGreaterThan(15);
    expect([...used].filter((code) => !(code in ERRORS))).toEqual([]);
  });
});
