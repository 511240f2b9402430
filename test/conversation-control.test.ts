/**
 * Conversation control as named actions (POST /api/conversations/{id}/take_over, hand_back, hand_off, assign):
 * each changes only its own keys of `metadata`, in the records service's transaction with the row locked, and
 * an agent turn storing an answer at the moment an operator takes over loses neither.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentRuntime } from '../src/agents/runtime.js';
import { DEMO_WORKFLOW } from '../src/demo/demo.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, resourceDocument, type Client } from './helpers/http.js';

let t: TestApp;
let tenant: Tenant;
let owner: Client;
let operator: Client;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Control');
  owner = client(t.app, tenant.owner.token);
  operator = client(t.app, tenant.operator.token);
});
afterAll(async () => {
  await t?.close();
});

const actor = () => systemActor(tenant.organisationId, 'test');
const act = (who: Client, id: string, action: string, attributes?: Record<string, unknown>) =>
  who.post(`/api/conversations/${id}/${action}`, { data: { type: 'Conversation', id, ...(attributes ? { attributes } : {}) } });

async function conversationRow(id: string) {
  const { rows } = await sql<{ status: string; metadata: Record<string, any> }>`
    SELECT status, metadata FROM conversations WHERE id = ${id}`.execute(t.db);
  return rows[0];
}
async function queueRow(id: string) {
  const { rows } = await sql<{ assigned_user_id: string | null; reason: string }>`
    SELECT assigned_user_id, reason FROM agent_handoffs WHERE conversation_id = ${id}`.execute(t.db);
  return rows[0];
}

describe('the control actions over HTTP', () => {
  it('take_over, hand_back, hand_off and assign change only their keys; each is an updated event', async () => {
    const created = await owner.post('/api/conversations', resourceDocument('Conversation', { metadata: { topic: 'Invoice' } }));
    const id = created.body.data.id as string;

    const taken = await act(operator, id, 'take_over');
    expect(taken.status).toBe(200);
    expect(taken.body.data.attributes.metadata).toMatchObject({
      topic: 'Invoice',
      agent_paused: true,
      assigned_operator: tenant.operator.id,
    });

    const handedOff = await act(operator, id, 'hand_off', { reason: 'Needs a refund' });
    expect(handedOff.status).toBe(200);
    expect(handedOff.body.data.attributes.status).toBe('pending');
    expect(handedOff.body.data.attributes.metadata).toMatchObject({ topic: 'Invoice', handoff_reason: 'Needs a refund' });
    expect(handedOff.body.data.attributes.metadata.assigned_operator).toBeUndefined();
    expect(await queueRow(id)).toMatchObject({ assigned_user_id: null, reason: 'Needs a refund' });

    // Assigning is for owners and admins; the queue row follows the conversation's metadata.
    expect((await act(operator, id, 'assign', { user_id: tenant.admin.id })).status).toBe(403);
    const assigned = await act(owner, id, 'assign', { user_id: tenant.admin.id });
    expect(assigned.status).toBe(200);
    expect(assigned.body.data.attributes).toMatchObject({ status: 'pending', metadata: { assigned_operator: tenant.admin.id } });
    expect((await queueRow(id)).assigned_user_id).toBe(tenant.admin.id);

    const back = await act(operator, id, 'hand_back');
    expect(back.status).toBe(200);
    expect(back.body.data.attributes.status).toBe('active');
    expect(back.body.data.attributes.metadata).toMatchObject({ topic: 'Invoice', agent_paused: false, assigned_operator: null });
    expect(await queueRow(id)).toBeUndefined();

    const { rows } = await sql<{ type: string }>`
      SELECT type FROM events WHERE organisation_id = ${tenant.organisationId} AND data->>'id' = ${id} ORDER BY id`.execute(t.db);
    expect(rows.map((r) => r.type)).toEqual(['Conversation.created', ...Array(4).fill('Conversation.updated')]);
  });

  it('refuses an unknown record (404), a member of another organisation (422) and a missing reason (422)', async () => {
    const created = await owner.post('/api/conversations', resourceDocument('Conversation', {}));
    const id = created.body.data.id as string;
    const missing = await act(operator, '00000000-0000-7000-8000-000000000000', 'take_over');
    expect(missing.status).toBe(404);
    const noReason = await act(operator, id, 'hand_off', {});
    expect(noReason.status).toBe(422);
    const other = await seedTenant(t, 'Other control');
    const stranger = await act(owner, id, 'assign', { user_id: other.owner.id });
    expect(stranger.status).toBe(422);
    expect(errorCodes(stranger)).toContain('invalid_attribute');
    // A closed conversation taken over stays closed.
    await owner.patch(`/api/conversations/${id}`, resourceDocument('Conversation', { status: 'closed' }, id));
    expect((await act(operator, id, 'take_over')).body.data.attributes.status).toBe('closed');
  });
});

describe('an agent turn and a take-over at the same moment', () => {
  it('lose nothing: the answer the turn stored and the take-over both survive, every time', async () => {
    const agent = await t.services.records!.create(actor(), 'AiAgent', {
      name: 'Ava',
      published: true,
      languages: ['en'],
      workflow: DEMO_WORKFLOW,
    });
    const runtime = new AgentRuntime({
      db: t.db,
      services: t.services,
      config: { ...t.config, agentPollMs: 20, agentLeaseMs: 5000, agentConcurrency: 24, llmBaseUrl: undefined, llmApiKey: undefined },
    });
    const say = async (id: string, content: string) =>
      (await owner.post('/api/conversation_items', resourceDocument('ConversationItem', { conversation_id: id, content, role: 'user' })))
        .body.data;
    const handled = async (id: string, index: number) => {
      const { rows } = await sql<{
        n: number | null;
      }>`SELECT last_handled_index AS n FROM agent_turns WHERE conversation_id = ${id}`.execute(t.db);
      return (rows[0]?.n ?? -1) >= index;
    };
    const until = async (check: () => Promise<boolean>, what: string) => {
      const deadline = Date.now() + 30_000;
      while (!(await check())) {
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 25));
      }
    };
    runtime.start();
    const runs = 24;
    const outcomes: { answered: boolean; row: Awaited<ReturnType<typeof conversationRow>> }[] = [];
    try {
      const ids: string[] = [];
      for (let i = 0; i < runs; i++) {
        const created = await owner.post('/api/conversations', resourceDocument('Conversation', { ai_agent_id: agent.id }));
        ids.push(created.body.data.id);
      }
      // The greeting and the name question first, so that the next user item's turn stores an answer.
      await Promise.all(
        ids.map(async (id) => {
          const hello = await say(id, 'Hello');
          await until(() => handled(id, hello.attributes.content_index), 'the greeting');
        }),
      );
      await Promise.all(
        ids.map(async (id, i) => {
          // The take-over lands anywhere from before the turn to well after it (runs late in the spread meet no turn).
          const [answer] = await Promise.all([
            say(id, `Sam ${i}`),
            new Promise((r) => setTimeout(r, i * 100)).then(() => act(operator, id, 'take_over')),
          ]);
          await until(() => handled(id, answer.attributes.content_index), 'the answer handled');
          const { rows } = await sql`SELECT 1 FROM conversation_items WHERE conversation_id = ${id}
            AND item_id = ${`reply_${answer.id.replaceAll('-', '')}`}`.execute(t.db);
          outcomes[i] = { answered: rows.length > 0, row: await conversationRow(id) };
        }),
      );
    } finally {
      await runtime.stop();
    }
    for (const [i, { answered, row }] of outcomes.entries()) {
      // The take-over always survives; the answer survives whenever the turn ran (it replied).
      expect(row.metadata, `run ${i}`).toMatchObject({ agent_paused: true, assigned_operator: tenant.operator.id });
      if (answered) expect(row.metadata.visitor_name, `run ${i}`).toBe(`Sam ${i}`);
    }
    // Both effects together, in some runs at least: the turn and the take-over did meet.
    expect(outcomes.filter((o) => o.answered).length).toBeGreaterThan(0);
  }, 180_000);
});
