import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { serveNodeFlags } from '../../bench/serve-flags.js';

describe("the server's Node flags", () => {
  it('are the same in the parley command and npm start, and name a young generation larger than the default', () => {
    const flags = serveNodeFlags();
    expect(flags).toContain('--max-semi-space-size=32');
    const start = JSON.parse(fs.readFileSync(new URL('../../package.json', import.meta.url), 'utf8')).scripts.start as string;
    expect(start).toBe(`exec node ${flags.join(' ')} dist/cli/main.js serve`);
  });
});
