/** Running Kamailio in the foreground under `sip serve`, and its management interface (kamcmd over the ctl socket). */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface KamailioProcess extends Supervised {
  /** One management command (`uac.reg_reload`, `dlg.list`...); its text answer. */
  rpc(command: string, ...args: string[]): Promise<string>;
}

export interface StartOptions {
  binary: string;
  kamcmd: string;
  configFile: string;
  runDir: string;
  /** Each line Kamailio writes to stderr (its log). */
  onLog?: (line: string) => void;
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

/** A process run under SUPERVISOR (Kamailio, rtpengine). */
export interface Supervised {
  /** The supervisor script; the process is its child, in a process group of its own. */
  child: ChildProcess;
  /** Resolves with the exit code (or signal name) when the process ends. */
  exited: Promise<number | string>;
  /** The process's pid (also its process group id), from the pid file. */
  pid(): number | undefined;
  /** Closes the watchdog's pipe (SIGTERM, then SIGKILL of the group after 5 s) and waits for the exit. */
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

/**
 * Waits until `ready` answers true (asked every 100 ms). Throws `exitError` when the process exits first; stops
 * it and throws `slow` when `timeoutMs` has passed.
 */
export async function waitReady(
  supervised: Supervised,
  ready: () => Promise<boolean>,
  timeoutMs: number,
  exitError: (code: number | string) => Error,
  slow: string,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let ended: number | string | undefined;
  void supervised.exited.then((code) => (ended = code));
  for (;;) {
    if (ended !== undefined) throw exitError(ended);
    if (await ready().catch(() => false)) return;
    if (Date.now() > deadline) {
      await supervised.stop();
      throw new Error(slow);
    }
    await delay(100);
  }
}

export async function startKamailio(options: StartOptions): Promise<KamailioProcess> {
  // -DD: stay in the foreground without forking; -E: log to stderr; -Y: runtime directory (pid, sockets).
  const supervised = supervise(
    'parley-sip-supervisor',
    path.join(options.runDir, 'kamailio.pid'),
    [options.binary, '-f', options.configFile, '-DD', '-E', '-Y', options.runDir],
    options.onLog,
  );
  const socket = `unix:${path.join(options.runDir, 'kamailio_ctl')}`;
  const rpc = async (command: string, ...args: string[]) => {
    const { stdout } = await run(options.kamcmd, ['-s', socket, command, ...args], { timeout: 5000 });
    return stdout;
  };
  // Ready when the management socket answers: every module is initialised and the workers run.
  await waitReady(
    supervised,
    () => rpc('core.uptime').then(() => true),
    15_000,
    (code) => new Error(`Kamailio exited during start-up (${code}); see its log above`),
    'Kamailio did not become ready in time',
  );
  return { ...supervised, rpc };
}
