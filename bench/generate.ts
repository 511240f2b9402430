/**
 * Fills a PostgreSQL database with a realistic data set, set-based in SQL. Two shapes:
 *
 * - `default`: 200 organisations (one big one, a fifth of everything), 1,000,000 conversations (a quarter
 *   bound to an AI agent), 3,000,000 items, 50,000 operator status events, 100,000 calls with participants
 *   and transcripts;
 * - `agents`: every conversation bound to its organisation's published AI agent, an organisation of 300,000
 *   conversations (the one measured) and one of 100,000, two items each (a user's and the agent's answer)
 *   and a caught-up agent runtime (nothing waits for a turn), with the calls and status events as above.
 *
 * Ids are time-ordered UUIDv7 values, like the service's own.
 */
import { sql } from 'kysely';
import { createApiKey } from '../src/auth/api-keys.js';
import { hashPassword } from '../src/auth/passwords.js';
import { createServices } from '../src/app.js';
import { loadConfig } from '../src/config/index.js';
import { openDatabase, type Database } from '../src/db/connection.js';
import { migrate } from '../src/db/migrate.js';

export interface BenchData {
  organisationId: string;
  secretKey: string;
  publishableKey: string;
  email: string;
  password: string;
}

export const BENCH_PASSWORD = 'bench-password-1';

export type BenchShape = 'default' | 'agents';
export const BENCH_SHAPES: readonly BenchShape[] = ['default', 'agents'];

async function timed(label: string, work: () => Promise<unknown>) {
  const start = Date.now();
  await work();
  console.log(`  ${label.padEnd(36)} ${((Date.now() - start) / 1000).toFixed(1)} s`);
}

const run = (db: Database, text: string) => sql.raw(text).execute(db);

/** Generates into PostgreSQL (a URL) or into an embedded database (`{ dataDir }`, PGlite). */
export async function generate(target: string | { dataDir: string }, scale = 1, shape: BenchShape = 'default'): Promise<BenchData> {
  const config = loadConfig(
    (typeof target === 'string'
      ? { DATABASE_URL: target, DATABASE_TIMEOUT_MS: '3600000' }
      : { DATA_DIR: target.dataDir }) as NodeJS.ProcessEnv,
  );
  const database = await openDatabase(config);
  const db = database.db;
  const n = (count: number) => Math.max(1, Math.round(count * scale));
  const agents = shape === 'agents';
  const orgs = agents ? 2 : 200;
  const conversations = agents ? n(400_000) : n(1_000_000);
  const calls = n(100_000);
  const events = n(50_000);
  try {
    await migrate(db);
    await run(db, `SET synchronous_commit = off`);
    await run(
      db,
      `CREATE OR REPLACE FUNCTION bench_uuid7(ts timestamptz) RETURNS uuid LANGUAGE sql VOLATILE AS $$
      SELECT (lpad(to_hex(floor(extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3)
              || '8' || substr(md5(random()::text), 1, 15))::uuid $$`,
    );
    // Row i of a table gets a timestamp i ms after the start, so id order is creation order.
    const start = `now() - interval '30 days'`;
    const passwordHash = await hashPassword(BENCH_PASSWORD);

    await timed('organisations, users, memberships', async () => {
      await run(
        db,
        `INSERT INTO organisations (id, name, slug) SELECT bench_uuid7(${start} + g * interval '1 ms'), 'Org ' || g, 'org-' || g FROM generate_series(1, ${orgs}) g`,
      );
      await run(db, `CREATE TEMP TABLE bench_orgs AS SELECT id, row_number() OVER (ORDER BY id) AS n FROM organisations`);
      await run(
        db,
        `INSERT INTO users (id, email, full_name, password_hash)
        SELECT bench_uuid7(${start} + (o.n * 4 + r) * interval '1 ms'), 'user' || r || '.' || o.n || '@bench.example', 'User ' || r || ' of ' || o.n, '${passwordHash}'
        FROM bench_orgs o, generate_series(0, 3) r`,
      );
      await run(
        db,
        `INSERT INTO memberships (organisation_id, user_id, role)
        SELECT o.id, u.id, CASE WHEN u.email LIKE 'user0.%' THEN 'owner' WHEN u.email LIKE 'user1.%' THEN 'admin' ELSE 'operator' END
        FROM bench_orgs o JOIN users u ON u.email LIKE '%.' || o.n || '@bench.example'`,
      );
      await run(
        db,
        `INSERT INTO ai_agents (id, organisation_id, name, languages, workflow, published)
        SELECT bench_uuid7(${start} + n * interval '1 ms'), id, 'Agent ' || n, ARRAY['en'], '{"steps":[]}', ${agents} FROM bench_orgs`,
      );
    });

    // Organisation 1 is the big one: a fifth of everything (the agents shape: three quarters of the conversations).
    const bigOrg = agents ? `CASE WHEN g % 4 = 0 THEN 2 ELSE 1 END` : `CASE WHEN g % 5 = 0 THEN 1 ELSE 2 + (g % ${orgs - 1}) END`;
    const itemsPer = agents ? 2 : 3;
    await timed(`${conversations} conversations`, () =>
      run(
        db,
        `INSERT INTO conversations (id, organisation_id, channel, mode, status, public_id, ai_agent_id, metadata, next_content_index)
        SELECT bench_uuid7(${start} + g * interval '1 ms'), o.id,
               (ARRAY['chat','voice','sms'])[1 + g % 3], (ARRAY['text','voice'])[1 + g % 2], (ARRAY['active','pending','closed'])[1 + g % 3],
               md5(g::text || random()::text), CASE WHEN ${agents} OR g % 4 = 0 THEN a.id END, jsonb_build_object('n', g, 'vip', g % 10 = 0), ${itemsPer}
        FROM generate_series(1, ${conversations}) g
        JOIN bench_orgs o ON o.n = ${bigOrg}
        JOIN ai_agents a ON a.organisation_id = o.id`,
      ),
    );
    await timed(`${conversations * itemsPer} conversation items`, () =>
      run(
        db,
        `INSERT INTO conversation_items (id, organisation_id, conversation_id, content, role, modality, content_index, item_id, occurred_at)
        SELECT bench_uuid7(${start} + interval '1 hour' + (c.rn * 3 + k) * interval '1 ms'), c.organisation_id, c.id,
               'Message ' || k || ' of a conversation about order ' || c.rn, (ARRAY['user','assistant','user'])[k + 1], 'text', k, 'i' || k, now()
        FROM (SELECT id, organisation_id, row_number() OVER () AS rn FROM conversations) c, generate_series(0, ${itemsPer - 1}) k`,
      ),
    );
    if (agents) {
      // Every user item has its answer: the runtime has taken each conversation up and is caught up.
      await timed('agent turns (caught up)', async () => {
        await run(
          db,
          `INSERT INTO agent_turns (conversation_id, organisation_id, last_handled_index)
          SELECT id, organisation_id, next_content_index - 1 FROM conversations`,
        );
        await run(db, `DELETE FROM agent_work`);
      });
    }
    await timed('SIP users, operator statuses', async () => {
      await run(
        db,
        `INSERT INTO sip_users (id, organisation_id, sip_username, sip_password, user_id)
        SELECT bench_uuid7(${start} + (o.n * 2 + r) * interval '1 ms'), o.id, 'op' || o.n || '_' || r, md5(random()::text), u.id
        FROM bench_orgs o, generate_series(2, 3) r JOIN users u ON true
        WHERE u.email = 'user' || r || '.' || o.n || '@bench.example'`,
      );
      await run(
        db,
        `INSERT INTO operator_statuses (id, organisation_id, sip_user_id, agent_name, status, source, changed_by_user_id)
        SELECT bench_uuid7(now() - interval '1 day'), s.organisation_id, s.id, s.sip_username, 'available', 'api', s.user_id FROM sip_users s`,
      );
    });
    await timed(`${events} operator status events`, () =>
      run(
        db,
        `INSERT INTO operator_status_events (id, organisation_id, operator_status_id, sip_user_id, agent_name, status, previous_status, source, changed_by_user_id, occurred_at)
        SELECT bench_uuid7(${start} + interval '2 hours' + g * interval '1 ms'), s.organisation_id, s.id, s.sip_user_id, s.agent_name,
               (ARRAY['available','busy','wrap_up','away','offline'])[1 + g % 5], (ARRAY['offline','available','busy','wrap_up','away'])[1 + g % 5],
               'widget', s.changed_by_user_id, ${start} + interval '2 hours' + g * interval '1 s'
        FROM generate_series(1, ${events}) g
        JOIN (SELECT *, row_number() OVER (ORDER BY id) AS rn FROM operator_statuses) s ON s.rn = 1 + (CASE WHEN g % 5 = 0 THEN 0 ELSE g END) % ${orgs * 2}`,
      ),
    );
    await timed(`${calls} calls, participants, transcripts`, async () => {
      await run(
        db,
        `INSERT INTO calls (id, organisation_id, direction, from_number, to_number, sip_username, status, call_uuid, call_source, started_at, ended_at, duration_seconds)
        SELECT bench_uuid7(${start} + interval '3 hours' + g * interval '1 ms'), o.id, (ARRAY['inbound','outbound'])[1 + g % 2],
               '+4420' || lpad(g::text, 8, '0'), '+4479' || lpad(g::text, 8, '0'), 'op1_2',
               (ARRAY['completed','completed','no_answer','busy','failed'])[1 + g % 5], 'call-' || g, 'sip',
               now() - g * interval '1 minute', now() - g * interval '1 minute' + interval '3 minutes', 180
        FROM generate_series(1, ${calls}) g JOIN bench_orgs o ON o.n = CASE WHEN g % 5 = 0 THEN 1 ELSE 2 + (g % ${orgs - 1}) END`,
      );
      await run(
        db,
        `INSERT INTO call_participants (id, organisation_id, call_id, member_uuid, role, joined_at, left_at)
        SELECT bench_uuid7(${start} + interval '4 hours' + (c.rn * 2 + k) * interval '1 ms'), c.organisation_id, c.id, 'm-' || c.rn || '-' || k,
               (ARRAY['caller','agent'])[k + 1], date_trunc('second', c.started_at), date_trunc('second', c.ended_at)
        FROM (SELECT *, row_number() OVER () AS rn FROM calls) c, generate_series(0, 1) k`,
      );
      await run(
        db,
        `INSERT INTO call_transcripts (id, organisation_id, call_id, content, speaker, content_index, item_id, occurred_at)
        SELECT bench_uuid7(${start} + interval '5 hours' + (c.rn * 5 + k) * interval '1 ms'), c.organisation_id, c.id, 'Transcript line ' || k,
               (ARRAY['caller','agent'])[1 + k % 2], k, 't' || k, c.started_at + k * interval '5 s'
        FROM (SELECT *, row_number() OVER () AS rn FROM calls) c, generate_series(0, 4) k`,
      );
    });
    await timed('VACUUM ANALYZE', () => run(db, 'VACUUM ANALYZE'));

    const { rows } = await sql<{ id: string; owner: string; email: string }>`
      SELECT o.id, u.id AS owner, u.email FROM bench_orgs o JOIN users u ON u.email = 'user0.' || o.n || '@bench.example' WHERE o.n = 1`.execute(
      db,
    );
    const records = (await createServices(database, config)).records!;
    const big = rows[0];
    const secret = await createApiKey(records, { organisationId: big.id, userId: big.owner, keyType: 'secret', name: 'bench' });
    const publishable = await createApiKey(records, {
      organisationId: big.id,
      userId: big.owner,
      keyType: 'publishable',
      name: 'bench widget',
    });
    return {
      organisationId: big.id,
      secretKey: secret.token,
      publishableKey: publishable.token,
      email: big.email,
      password: BENCH_PASSWORD,
    };
  } finally {
    await database.close();
  }
}
