import { type Migration, type MigrationProvider, Migrator, sql } from 'kysely';
import type { Database } from './schema.js';
import * as initial from './migrations/0001_initial.js';
import * as gatewayRealmCase from './migrations/0002_gateway_realm_case.js';
import * as sipEdge from './migrations/0005_sip_edge.js';
import * as events from './migrations/0006_events.js';
import * as manage from './migrations/0007_manage.js';
import * as agentRuntime from './migrations/0008_agent_runtime.js';
import * as credentialCache from './migrations/0009_credential_cache.js';
import * as eventOrder from './migrations/0010_event_order.js';
import * as eventBarrier from './migrations/0011_event_barrier.js';
import * as sipNamespaces from './migrations/0012_a_sip_namespaces.js';
import * as phoneNumbers from './migrations/0012_b_phone_numbers.js';
import * as outbound from './migrations/0012_c_outbound.js';
import * as callAnsweredAt from './migrations/0012_d_call_answered_at.js';
import * as sipCallQueue from './migrations/0013_sip_call_queue.js';
import * as keyCeiling from './migrations/0014_a_key_ceiling.js';
import * as invitations from './migrations/0014_b_invitations.js';
import * as credentialEpoch from './migrations/0014_c_credential_epoch.js';
import * as eventIdPrivacy from './migrations/0014_d_event_id_privacy.js';
import * as agentTurnFailures from './migrations/0015_a_agent_turn_failures.js';
import * as webhookFairClaim from './migrations/0015_b_webhook_fair_claim.js';
import * as agentWork from './migrations/0018_agent_work.js';
import * as voice from './migrations/0019_voice.js';
import * as transcribeCalls from './migrations/0021_transcribe_calls.js';
import * as sipCredentials from './migrations/0022_sip_credentials.js';
import * as operatorUsers from './migrations/0023_operator_users.js';
import * as toolSecrets from './migrations/0024_tool_secrets.js';
import * as knowledge from './migrations/0025_knowledge.js';
import * as openCalls from './migrations/0026_open_calls.js';
import * as dialogFacts from './migrations/0028_dialog_facts.js';
import * as duplicateOrgIndexes from './migrations/0029_duplicate_org_indexes.js';

/** Versioned migrations, in order. Each is plain SQL that runs on PostgreSQL and PGlite alike. */
const migrations: Record<string, { up: string }> = {
  '0001_initial': initial,
  '0002_gateway_realm_case': gatewayRealmCase,
  '0005_sip_edge': sipEdge,
  '0006_events': events,
  '0007_manage': manage,
  '0008_agent_runtime': agentRuntime,
  '0009_credential_cache': credentialCache,
  '0010_event_order': eventOrder,
  '0011_event_barrier': eventBarrier,
  '0012_a_sip_namespaces': sipNamespaces,
  '0012_b_phone_numbers': phoneNumbers,
  '0012_c_outbound': outbound,
  '0012_d_call_answered_at': callAnsweredAt,
  '0013_sip_call_queue': sipCallQueue,
  '0014_a_key_ceiling': keyCeiling,
  '0014_b_invitations': invitations,
  '0014_c_credential_epoch': credentialEpoch,
  '0014_d_event_id_privacy': eventIdPrivacy,
  '0015_a_agent_turn_failures': agentTurnFailures,
  '0015_b_webhook_fair_claim': webhookFairClaim,
  '0018_agent_work': agentWork,
  '0019_voice': voice,
  '0021_transcribe_calls': transcribeCalls,
  '0022_sip_credentials': sipCredentials,
  '0023_operator_users': operatorUsers,
  '0024_tool_secrets': toolSecrets,
  '0025_knowledge': knowledge,
  '0026_open_calls': openCalls,
  '0028_dialog_facts': dialogFacts,
  '0029_duplicate_org_indexes': duplicateOrgIndexes,
};

/** Every migration's name and SQL, in order (a template cluster is named after their digest: pglite-template). */
export const migrationList = (): Array<[name: string, sql: string]> => Object.entries(migrations).map(([name, m]) => [name, m.up]);

/** The schema's SQL, every migration in order (declarations are checked against it at start). */
export const schemaSql = (): string =>
  Object.values(migrations)
    .map((m) => m.up)
    .join('\n');

const provider: MigrationProvider = {
  async getMigrations() {
    const result: Record<string, Migration> = {};
    for (const [name, migration] of Object.entries(migrations)) {
      result[name] = {
        up: async (db) => {
          // One statement at a time: the extended protocol (PGlite's) refuses several in one.
          for (const statement of splitStatements(migration.up)) await sql.raw(statement).execute(db);
        },
      };
    }
    return result;
  },
};

/**
 * Our migrations end each statement with `;` at a line end, and have no other such `;` outside `$$`-quoted
 * function bodies (whose statements end lines too), so splitting there, outside `$$ ... $$`, is exact.
 */
export function splitStatements(script: string): string[] {
  const statements: string[] = [];
  let quoted = false;
  let current = '';
  for (const part of script.split(/(\$\$|;\s*\n)/)) {
    if (part === '$$') quoted = !quoted;
    if (!quoted && /^;\s*\n$/.test(part)) {
      statements.push(current);
      current = '';
    } else current += part;
  }
  statements.push(current);
  return statements.map((s) => s.trim()).filter(Boolean);
}

/** Applies pending migrations (under Kysely's advisory lock, so concurrent nodes are safe). */
export async function migrate(db: Database): Promise<string[]> {
  // Numbers were reserved for parts built side by side, so a database may have run a later one (0008) before
  // an earlier one (0007) exists: each migration stands alone, and the pending ones run in number order.
  const migrator = new Migrator({ db, provider, allowUnorderedMigrations: true });
  const { error, results } = await migrator.migrateToLatest();
  if (error) throw error instanceof Error ? error : new Error(String(error));
  return (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName);
}
