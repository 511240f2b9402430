/** Running Kamailio in the foreground under `sip serve`, and its management interface (kamcmd over the ctl socket). */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface KamailioProcess {
  /** The supervisor script (see SUPERVISOR); Kamailio is its child, in a process group of its own. */
  child: ChildProcess;
  /** Kamailio's main process id (also its process group id). */
  pid(): number | undefined;
  /** Resolves with the exit code (or signal name) when Kamailio ends. */
  exited: Promise<number | string>;
  /** One management command (`uac.reg_reload`, `dlg.list`...); its text answer. */
  rpc(command: string, ...args: string[]): Promise<string>;
  /** SIGTERM to Kamailio, then SIGKILL to its process group after 5 s (the supervisor's grace). */
  stop(): Promise<void>;
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

/**
 * The supervisor between `sip serve` and Kamailio, a POSIX shell script (so that it costs no Node process):
 * - Kamailio runs in its own session and process group (`setsid`; a background job of a non-interactive
 *   shell is not a group leader, so setsid makes Kamailio's own pid the group id without forking);
 * - when Kamailio's main process ends, however (SIGKILL included), every process left in its group (its
 *   workers, which would otherwise keep the SIP port and their database connections) is killed;
 * - a watchdog reads the pipe that `sip serve` holds open on the script's stdin: end of file means `sip serve`
 *   stopped or died (SIGKILL included: the kernel closes the pipe), and Kamailio gets SIGTERM, then after
 *   `$2` seconds its whole group SIGKILL. Stopping Kamailio is closing that pipe.
 * Kamailio's pid goes to the file `$1`; the script exits with Kamailio's status. (Debian's sh is dash, whose
 * `kill` takes a negative pid as a process group but not a `--` before it.)
 */
export const SUPERVISOR = `pidfile=$1; grace=$2; shift 2
exec 3<&0
setsid "$@" </dev/null &
k=$!
echo "$k" > "$pidfile"
{ while read -r _; do :; done; kill -TERM "$k" 2>/dev/null; sleep "$grace"; kill -KILL "-$k" 2>/dev/null; } <&3 &
w=$!
exec 3<&-
wait "$k"
status=$?
kill -KILL "-$k" 2>/dev/null
kill "$w" 2>/dev/null
exit "$status"
`;

/** A process run under SUPERVISOR: its supervisor child, its exit, its pid (from the pid file), and stop. */
export interface Supervised {
  child: ChildProcess;
  exited: Promise<number | string>;
  pid(): number | undefined;
  /** Closes the watchdog's pipe (SIGTERM, then SIGKILL of the group after the grace) and waits for the exit. */
  stop(): Promise<void>;
}

/** Starts `argv` under SUPERVISOR (`name` shows in ps), its pid in `pidFile`, each non-empty output line to `onLine`. */
export function supervise(name: string, pidFile: string, argv: string[], onLine?: (line: string) => void): Supervised {
  fs.rmSync(pidFile, { force: true });
  const child = spawn('/bin/sh', ['-c', SUPERVISOR, name, pidFile, '5', ...argv], { stdio: ['pipe', 'pipe', 'pipe'] });
  // The pipe is the watchdog's lifeline; writing is never needed, and an error on it (the script gone) is
  // seen through 'exit'.
  child.stdin!.on('error', () => {});
  const lines = (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n')) if (line.trim()) onLine?.(line);
  };
  child.stdout!.on('data', lines);
  child.stderr!.on('data', lines);
  const exited = new Promise<number | string>((resolve) => {
    child.on('exit', (code, signal) => resolve(code ?? signal ?? 'unknown'));
    child.on('error', () => resolve('spawn failed'));
  });
  return {
    child,
    exited,
    pid() {
      try {
        const pid = Number(fs.readFileSync(pidFile, 'utf8').trim());
        return Number.isInteger(pid) && pid > 0 ? pid : undefined;
      } catch {
        return undefined;
      }
    },
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.stdin!.end();
      await exited;
    },
  };
}

export async function startKamailio(options: StartOptions): Promise<KamailioProcess> {
  // -DD: stay in the foreground without forking; -E: log to stderr; -Y: runtime directory (pid, sockets).
  const supervised = supervise(
    'parley-sip-supervisor',
    path.join(options.runDir, 'kamailio.pid'),
    [options.binary, '-f', options.configFile, '-DD', '-E', '-Y', options.runDir],
    options.onLog,
  );
  const { child, exited } = supervised;
  const socket = `unix:${path.join(options.runDir, 'kamailio_ctl')}`;
  const rpc = async (command: string, ...args: string[]) => {
    const { stdout } = await run(options.kamcmd, ['-s', socket, command, ...args], { timeout: 5000 });
    return stdout;
  };
  const handle: KamailioProcess = { child, exited, rpc, pid: supervised.pid, stop: supervised.stop };

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
        await handle.stop();
        throw new Error('Kamailio did not become ready in time');
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}
