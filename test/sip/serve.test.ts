/** `parley sip serve` without PostgreSQL: a clear error (runs on both databases, with or without Kamailio). */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);

describe('parley sip serve', () => {
  it('explains that the SIP edge needs PostgreSQL when DATABASE_URL is unset', async () => {
    const cli = path.resolve('src/cli/main.ts');
    const env = { ...process.env, DATABASE_URL: '', DATA_DIR: 'memory://' };
    const failure = await run(process.execPath, ['--import', 'tsx', cli, 'sip', 'serve'], { env }).then(
      () => undefined,
      (error: { code: number; stderr: string }) => error,
    );
    expect(failure?.code).toBe(1);
    expect(failure?.stderr).toContain('the SIP edge needs PostgreSQL');
    expect(failure?.stderr).toContain('DATABASE_URL');
  });
});
