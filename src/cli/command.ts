/**
 * What every command shares, without importing anything heavy (main.ts loads this for `--help` and usage
 * errors too): reporting a failure, running an action, stopping a long-running command on a signal.
 */
import { ApiError } from '../jsonapi/errors.js';

export type Output = Record<string, unknown>;

/** Prints the failure (one JSON object on stdout with --json, else a line on stderr) and exits with status 1. */
export function fail(error: unknown, json: boolean): never {
  // A refused write names each problem with the attribute it concerns, as the API would.
  const message =
    error instanceof ApiError
      ? error.errors
          .map((e) => {
            const pointer = e.source && 'pointer' in e.source ? e.source.pointer : '';
            return `${pointer.startsWith('/data/attributes/') ? `${pointer.slice(17)}: ` : ''}${e.detail ?? e.title}`;
          })
          .join('; ')
      : error instanceof Error
        ? error.message
        : String(error);
  if (json) console.log(JSON.stringify({ error: message }));
  else console.error(`parley: ${message}`);
  process.exit(1);
}

/**
 * A command's action: `load` imports the command's module when the command runs and gives its work (its
 * options' type with it); any error of either is reported by `fail`.
 */
export function action<T extends { json?: boolean }>(load: () => Promise<(options: T) => Promise<void>>) {
  return async (options: T) => {
    try {
      await (await load())(options);
    } catch (error) {
      fail(error, options.json ?? false);
    }
  };
}

/**
 * The one way long-running commands (`serve`, `worker`, `sip serve`) stop: on the first SIGTERM or SIGINT,
 * `stop` runs once (later signals are ignored while it does), then the process exits with status 0. Returns
 * whether stopping has begun (a command that ends by itself exits otherwise).
 */
export function stopOnSignal(stop: (signal: string) => Promise<void>): () => boolean {
  let stopping = false;
  const onSignal = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    await stop(signal);
    process.exit(0);
  };
  process.on('SIGTERM', () => void onSignal('SIGTERM'));
  process.on('SIGINT', () => void onSignal('SIGINT'));
  return () => stopping;
}
