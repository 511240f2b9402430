/**
 * What the background loops cost when there is nothing to do (issue 26: O(work), not O(data)). Each loop's
 * look for work runs once against tables that hold a large history and no pending work, every statement it
 * sends is captured at the PostgreSQL client, and each is then planned (EXPLAIN, nothing run twice): none may
 * read a table of history sequentially. The loops are the ones that run on their own in `serve` and `sip serve`:
 * the agent runtime's tick (handoff queue, analyses, the turn claim), the webhook worker's claim, event
 * retention, the SIP call event queue's claim and SIP reconciliation. PostgreSQL only (PGlite has one
 * connection and its own planner statistics; the figure that matters is the server's).
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentRuntime } from '../src/agents/runtime.js';
import { EventPruner, WebhookWorker } from '../src/events/webhooks.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { CallEvents } from '../src/sip/call-events.js';
import { CallEventQueue } from '../src/sip/call-queue.js';
import { reconcileCalls } from '../src/sip/reconcile.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';

const postgres = process.env.DATABASE_URL?.startsWith('postgres');
/** Rows of history in each large table: enough for a sequential scan to cost more than any index probe. */
const HISTORY = 20_000;
/** The tables whose size is the data's, not the work's. */
const LARGE = ['conversations', 'agent_turns', 'calls', 'events', 'webhook_deliveries'];

interface Statement {
  text: string;
  values: unknown[];
}

describe.skipIf(!postgres)('background loops with nothing to do (PostgreSQL plans)', () => {
  let t: TestApp;
  let tenant: Tenant;
  const capturing = new AsyncLocalStorage<Statement[]>();
  const original = pg.Client.prototype.query;

  beforeAll(async () => {
    t = await startTestApp();
    tenant = await seedTenant(t, 'Background');
    const org = tenant.organisationId;
    const actor = systemActor(org, 'test');
    const agent = await t.services.records!.create(actor, 'AiAgent', { name: 'Idle', published: true, languages: ['en'] });
    const endpoint = await t.services.records!.create(actor, 'WebhookEndpoint', { url: 'https://1.1.1.1/hook' });
    // The history, in bulk and consistent by construction (row triggers and foreign-key checks skipped): agent-bound
    // conversations caught up, finished SIP calls, recent events (inside the retention) and their delivered webhooks.
    // One connection of its own (the setting is the session's; no statement timeout for the load).
    const loader = new pg.Client({ connectionString: t.config.databaseUrl });
    await loader.connect();
    try {
      await loader.query('SET session_replication_role = replica');
      await loader.query(
        `INSERT INTO conversations (id, organisation_id, channel, mode, status, public_id, ai_agent_id, next_content_index)
         SELECT gen_random_uuid(), $1, 'chat', 'text', 'active', 'bg-' || g, $2, 2 FROM generate_series(1, $3::int) g`,
        [org, agent.id, HISTORY],
      );
      await loader.query(
        `INSERT INTO agent_turns (conversation_id, organisation_id, last_handled_index)
         SELECT id, organisation_id, 1 FROM conversations WHERE public_id LIKE 'bg-%'`,
      );
      await loader.query(
        `INSERT INTO calls (id, organisation_id, direction, status, call_uuid, call_source, started_at, ended_at, updated_at)
         SELECT gen_random_uuid(), $1, 'inbound', 'completed', 'bg-call-' || g, 'sip', now() - interval '1 day',
                now() - interval '1 day', now() - interval '1 day'
         FROM generate_series(1, $2::int) g`,
        [org, HISTORY],
      );
      await loader.query(
        `INSERT INTO events (id, organisation_id, type, occurred_at, data)
         SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - g), 12, '0') || '70008000' || lpad(to_hex(g), 12, '0'))::uuid,
                $1, 'Conversation.updated', now(), '{}'::jsonb
         FROM generate_series(1, $2::int) g`,
        [org, HISTORY],
      );
      await loader.query(
        `INSERT INTO webhook_deliveries (id, organisation_id, webhook_endpoint_id, event_id, event_type, status, attempts)
         SELECT gen_random_uuid(), $1, $2, e.id, e.type, 'succeeded', 1 FROM events e WHERE e.organisation_id = $1`,
        [org, endpoint.id],
      );
      for (const table of [...LARGE, 'agent_work', 'analysis_work', 'agent_handoffs', 'sip_call_events'])
        await loader.query(`ANALYZE ${table}`);
    } finally {
      await loader.end();
    }

    pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
      const store = capturing.getStore();
      if (store) {
        const first = args[0] as string | { text?: string; values?: unknown[] };
        const text = typeof first === 'string' ? first : (first?.text ?? '');
        const values = (typeof first === 'string' ? (args[1] as unknown[]) : first?.values) ?? [];
        store.push({ text, values });
      }
      return (original as (...a: unknown[]) => unknown).apply(this, args);
    } as typeof pg.Client.prototype.query;
  }, 120_000);

  afterAll(async () => {
    pg.Client.prototype.query = original;
    await t?.close();
  });

  async function statementsOf(work: () => Promise<unknown>): Promise<Statement[]> {
    const statements: Statement[] = [];
    await capturing.run(statements, work);
    return statements.filter((s) => /^\s*(WITH|SELECT|UPDATE|DELETE|INSERT)\b/i.test(s.text));
  }

  /** The relations each statement's plan reads sequentially. */
  async function sequentialScans(statements: Statement[]): Promise<{ statement: string; relations: string[] }[]> {
    const client = new pg.Client({ connectionString: t.config.databaseUrl });
    await client.connect();
    try {
      const found = [];
      for (const statement of statements) {
        const { rows } = await client.query(`EXPLAIN (FORMAT JSON) ${statement.text}`, statement.values);
        const relations: string[] = [];
        const visit = (node: Record<string, unknown>) => {
          if (node['Node Type'] === 'Seq Scan') relations.push(String(node['Relation Name']));
          for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) visit(child);
        };
        visit(rows[0]['QUERY PLAN'][0].Plan);
        found.push({ statement: statement.text.replace(/\s+/g, ' ').slice(0, 100), relations });
      }
      return found;
    } finally {
      await client.end();
    }
  }

  const expectNoLargeScan = (plans: { statement: string; relations: string[] }[]) => {
    for (const plan of plans)
      expect(
        plan.relations.filter((r) => LARGE.includes(r)),
        plan.statement,
      ).toEqual([]);
  };

  it('the agent runtime: handoff queue, analyses and the turn claim', async () => {
    const runtime = new AgentRuntime({ db: t.db, services: t.services, config: { ...t.config, agentPollMs: 600_000 } });
    const statements = await statementsOf(() => runtime.tick());
    expect(await runtime.tick()).toBe(0);
    expect(statements.length).toBeGreaterThanOrEqual(3);
    expectNoLargeScan(await sequentialScans(statements));
  });

  it('the webhook worker claim and event retention', async () => {
    const worker = new WebhookWorker({ database: t.database, config: t.config, records: t.services.records! });
    const claim = await statementsOf(() => worker.claim(8));
    expect(claim).toHaveLength(1);
    const pruner = new EventPruner(t.db, t.config.events.retentionDays);
    let pruned = -1;
    const prune = await statementsOf(async () => (pruned = await pruner.prune()));
    expect(pruned).toBe(0);
    expect(prune).toHaveLength(1);
    expectNoLargeScan(await sequentialScans([...claim, ...prune]));
  });

  it('the SIP call event queue and reconciliation', async () => {
    const events = new CallEvents({ db: t.db, records: t.services.records! });
    const queue = new CallEventQueue({ db: t.db, events });
    let applied = -1;
    const drain = await statementsOf(async () => (applied = await queue.drain()));
    expect(applied).toBe(0);
    let ended = -1;
    const reconcile = await statementsOf(
      async () => (ended = await reconcileCalls(t.db, events, { answeredBefore: new Date(), unansweredBefore: new Date() })),
    );
    expect(ended).toBe(0);
    expect(reconcile).toHaveLength(1);
    expectNoLargeScan(await sequentialScans([...drain, ...reconcile]));
  });
});
