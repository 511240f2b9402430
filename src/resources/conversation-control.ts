/**
 * Who answers a conversation, as four named actions on it (POST /api/conversations/{id}/<action>): the console,
 * the agent runtime and routing call them, and the records service runs each in its transaction with the row
 * locked. Each changes only its own keys of `metadata` (`agent_paused`, `assigned_operator`, `assigned_at`,
 * `handoff_reason`, read by clients as before) in one jsonb statement, never the whole object from a copy read
 * earlier, so an agent turn storing an answer and an operator taking over at the same moment both survive.
 * The handoff queue's row (`agent_handoffs`) follows the assignment in the same transaction.
 */
import { sql } from 'kysely';
import { type ActionContext, type ActionResult, attr } from '../jsonapi/index.js';
import { ADMINS, EVERY_ROLE } from './scopes.js';

/** The keys of `metadata` that only these actions write. */
export const CONTROL_KEYS = ['agent_paused', 'assigned_operator', 'assigned_at', 'handoff_reason'] as const;

interface Control {
  /** `resume`: a `pending` conversation (taken over, handed back) is `active` again; a closed one stays closed. */
  status: 'pending' | 'resume' | 'keep';
  set?: Record<string, unknown>;
  drop?: readonly (typeof CONTROL_KEYS)[number][];
  /** The queue row (`agent_handoffs`): assigned to a user, removed (the handoff is over), or a new request. */
  queue?: ReturnType<typeof sql>;
}

const STATUS = { pending: sql`'pending'`, resume: sql`CASE WHEN status = 'pending' THEN 'active' ELSE status END`, keep: sql`status` };

async function control(ctx: ActionContext, { status, set = {}, drop = [], queue }: Control): Promise<ActionResult> {
  const id = String(ctx.existing?.id);
  await sql`UPDATE conversations SET status = ${STATUS[status]}, updated_at = now(),
      metadata = (metadata - ${sql.val([...drop])}::text[]) || ${JSON.stringify(set)}::jsonb WHERE id = ${id}`.execute(ctx.db);
  if (queue) await sql`${queue}`.execute(ctx.db);
  return { id, status: 200 };
}

const assignQueue = (ctx: ActionContext, user: string) =>
  sql`UPDATE agent_handoffs SET assigned_user_id = ${user}, assigned_at = now() WHERE conversation_id = ${ctx.existing?.id}`;
const now = () => new Date().toISOString();

export const conversationControl = {
  take_over: {
    path: 'take_over',
    member: true,
    summary:
      'Take the conversation over from its AI agent: the agent stays silent and you answer (metadata.agent_paused, assigned_operator)',
    roles: EVERY_ROLE,
    input: {},
    // The runtime (the system, no user) pauses the agent when an operator item arrives: nobody is assigned then.
    run: (ctx: ActionContext) => {
      const user = ctx.principal.userId;
      if (!user) return control(ctx, { status: 'resume', set: { agent_paused: true } });
      return control(ctx, {
        status: 'resume',
        set: { agent_paused: true, assigned_operator: user, assigned_at: now() },
        queue: assignQueue(ctx, user),
      });
    },
  },
  hand_back: {
    path: 'hand_back',
    member: true,
    summary: 'Hand the conversation back to its AI agent, which answers the next user item',
    roles: EVERY_ROLE,
    input: {},
    run: (ctx: ActionContext) =>
      control(ctx, {
        status: 'resume',
        set: { agent_paused: false, assigned_operator: null },
        drop: ['assigned_at'],
        queue: sql`DELETE FROM agent_handoffs WHERE conversation_id = ${ctx.existing?.id}`,
      }),
  },
  hand_off: {
    path: 'hand_off',
    member: true,
    summary: 'Hand the conversation to the operators: it goes pending and is offered to the available operator idle longest',
    roles: EVERY_ROLE,
    input: { reason: attr.string({ create: 'required', minLength: 1, maxLength: 500 }) },
    run: (ctx: ActionContext) =>
      control(ctx, {
        status: 'pending',
        set: { handoff_reason: ctx.values.reason },
        drop: ['assigned_operator', 'assigned_at'],
        queue: sql`INSERT INTO agent_handoffs (conversation_id, organisation_id, reason, requested_at)
          VALUES (${ctx.existing?.id}, ${ctx.principal.organisationId}, ${ctx.values.reason}, now())
          ON CONFLICT (conversation_id) DO UPDATE SET reason = EXCLUDED.reason, requested_at = now(), assigned_user_id = NULL, assigned_at = NULL`,
      }),
  },
  assign: {
    path: 'assign',
    member: true,
    summary: 'Assign the conversation to a member (metadata.assigned_operator), as routing does for a handoff',
    roles: ADMINS,
    input: { user_id: attr.uuid({ create: 'required', references: 'User' }) },
    run: (ctx: ActionContext) => {
      const user = String(ctx.values.user_id);
      return control(ctx, { status: 'keep', set: { assigned_operator: user, assigned_at: now() }, queue: assignQueue(ctx, user) });
    },
  },
};
