/** Running Kamailio in the foreground under `sip serve`, and its management interface (kamcmd over the ctl socket). */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface KamailioProcess {
  child: ChildProcess;
  /** Resolves with the exit code (or signal name) when Kamailio ends. */
  exited: Promise<number | string>;
  /** One management command (`uac.reg_reload`, `dlg.list`...); its text answer. */
  rpc(command: string, ...args: string[]): Promise<string>;
  /** SIGTERM, then SIGKILL after `graceMs`. */
  stop(graceMs?: number): Promise<void>;
}

export interface StartOptions {
  binary: string;
  kamcmd: string;
  configFile: string;
  runDir: string;
  /** Each line Kamailio writes to stderr (its log). */
  onLog?: (line: string) => void;
  readyTimeoutMs?: number;
}

/** Whether a program is on PATH (or is an executable path). */
export function haveProgram(name: string): boolean {
  if (name.includes('/')) return isExecutable(name);
  return (process.env.PATH ?? '').split(path.delimiter).some((dir) => dir && isExecutable(path.join(dir, name)));
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

export async function startKamailio(options: StartOptions): Promise<KamailioProcess> {
  // -DD: stay in the foreground without forking; -E: log to stderr; -Y: runtime directory (pid, sockets).
  const child = spawn(options.binary, ['-f', options.configFile, '-DD', '-E', '-Y', options.runDir], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines = (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n')) if (line.trim()) options.onLog?.(line);
  };
  child.stdout!.on('data', lines);
  child.stderr!.on('data', lines);
  const exited = new Promise<number | string>((resolve) => {
    child.on('exit', (code, signal) => resolve(code ?? signal ?? 'unknown'));
    child.on('error', () => resolve('spawn failed'));
  });
  const socket = `unix:${path.join(options.runDir, 'kamailio_ctl')}`;
  const rpc = async (command: string, ...args: string[]) => {
    const { stdout } = await run(options.kamcmd, ['-s', socket, command, ...args], { timeout: 5000 });
    return stdout;
  };
  const handle: KamailioProcess = {
    child,
    exited,
    rpc,
    async stop(graceMs = 5000) {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      await exited;
      clearTimeout(timer);
    },
  };

  // Ready when the management socket answers: every module is initialised and the workers run.
  const deadline = Date.now() + (options.readyTimeoutMs ?? 15_000);
  let ended: number | string | undefined;
  void exited.then((code) => (ended = code));
  for (;;) {
    if (ended !== undefined) throw new Error(`Kamailio exited during start-up (${ended}); see its log above`);
    try {
      await rpc('core.uptime');
      return handle;
    } catch {
      if (Date.now() > deadline) {
        await handle.stop(1000);
        throw new Error('Kamailio did not become ready in time');
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

/** Call-IDs of the dialogs Kamailio holds (from `dlg.list`). */
export function dialogCallIds(listing: string): Set<string> {
  const ids = new Set<string>();
  for (const match of listing.matchAll(/^\s*call-id:\s*(.+?)\s*$/gm)) ids.add(match[1]);
  return ids;
}
