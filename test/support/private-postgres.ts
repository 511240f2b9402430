/**
 * A throwaway PostgreSQL cluster with its own data directory and port, so a
 * test may stop and start it without disturbing any other server.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

function binDir(): string | undefined {
  const root = '/usr/lib/postgresql';
  if (!fs.existsSync(root)) return undefined;
  const versions = fs.readdirSync(root).sort((a, b) => Number(b) - Number(a));
  return versions.map((v) => path.join(root, v, 'bin')).find((dir) => fs.existsSync(path.join(dir, 'initdb')));
}

export const privatePostgresAvailable = () => binDir() !== undefined;

export class PrivatePostgres {
  readonly url: string;
  private readonly bin: string;
  private readonly dir: string;
  private readonly asPostgres: boolean;

  constructor(readonly port: number) {
    const bin = binDir();
    if (!bin) throw new Error('PostgreSQL server binaries not found');
    this.bin = bin;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-pg-'));
    this.asPostgres = process.getuid?.() === 0;
    if (this.asPostgres) execFileSync('chown', ['postgres', this.dir]);
    this.url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  }

  private run(tool: string, args: string[]): void {
    const command = path.join(this.bin, tool);
    if (this.asPostgres) execFileSync('runuser', ['-u', 'postgres', '--', command, ...args], { stdio: 'pipe' });
    else execFileSync(command, args, { stdio: 'pipe' });
  }

  init(): this {
    this.run('initdb', ['-D', path.join(this.dir, 'data'), '-A', 'trust', '-U', 'postgres', '--no-sync']);
    return this;
  }

  /** `settings`: more `-c name=value` server settings (a benchmark's shared_preload_libraries, memory). */
  start(settings: string[] = []): void {
    const options = [`-p ${this.port} -k ${this.dir} -c listen_addresses=127.0.0.1 -c fsync=off`, ...settings.map((s) => `-c ${s}`)].join(
      ' ',
    );
    this.run('pg_ctl', ['-D', path.join(this.dir, 'data'), '-o', options, '-l', path.join(this.dir, 'log'), '-w', 'start']);
  }

  stop(mode: 'fast' | 'immediate' = 'fast'): void {
    this.run('pg_ctl', ['-D', path.join(this.dir, 'data'), '-m', mode, '-w', 'stop']);
  }

  destroy(): void {
    try {
      this.stop('immediate');
    } catch {
      // already stopped
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}
