/** `parley sip`: the SIP edge's commands (their work is in sip-serve.ts, loaded when one runs). */
import type { Command } from 'commander';
import { action } from './command.js';

export function addSipCommands(program: Command): void {
  const sip = program.command('sip').description('the SIP edge (Kamailio; needs PostgreSQL)');
  sip
    .command('serve')
    .description('render the Kamailio configuration from SIP_LISTEN, SIP_DOMAIN and DATABASE_URL and run Kamailio in the foreground')
    .action(action(async () => (await import('./sip-serve.js')).sipServe()));
}
