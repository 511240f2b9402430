import { sql } from 'kysely';
import { uuidv7 } from 'uuidv7';
import {
  type ActionContext,
  type ActionResult,
  ApiError,
  attr,
  forbidden,
  type AttributeDef,
  defineResource,
  rel,
  systemActor,
} from '../jsonapi/index.js';
import { timestamps } from './timestamps.js';
import { EVERY_ROLE } from './scopes.js';
import { OPERATOR_STATUS_SOURCES, OPERATOR_STATUSES } from './values.js';
import { at } from './pointer.js';

/** Attributes shared by the current status and its history events. */
export const operatorStatusAttributes = {
  // Exactly one of `sip_user_id` and `user_id` names the operator on create (setStatus checks it: an operator
  // without a SIP user is named by their user). Read back, a SIP user's status names its user too.
  sip_user_id: attr.uuid({ create: true, nullable: true, sortable: true, filterable: true, references: 'SipUser' }),
  user_id: attr.uuid({ create: true, nullable: true, sortable: true, filterable: true, references: 'User' }),
  agent_name: attr.string({ sortable: true, filterable: true }),
  status: attr.enum(OPERATOR_STATUSES, { create: 'required', sortable: true, filterable: true }),
  source: attr.enum(OPERATOR_STATUS_SOURCES, { create: true, sortable: true, filterable: true, default: 'api' }),
  changed_by_user_id: attr.uuid({ nullable: true, sortable: true, filterable: true }),
} satisfies Record<string, AttributeDef>;

export const operatorStatusRelationships = {
  changed_by_user: rel.belongsTo('User', 'changed_by_user_id'),
  organisation: rel.belongsTo('Organisation', 'organisation_id'),
  sip_user: rel.belongsTo('SipUser', 'sip_user_id'),
  user: rel.belongsTo('User', 'user_id'),
};

/**
 * Whose status a create sets: the SIP user and the user behind it, or the user and their SIP user here if
 * they have one, so that each operator has one current status however it is named. `agent_name` is the
 * user's full name, else the SIP username (as before), else the user's e-mail address.
 */
async function operatorOf(ctx: ActionContext): Promise<{ sipUserId: string | null; userId: string | null; agentName: string }> {
  const { db, values, principal, provided } = ctx;
  const bySip = provided.has('sip_user_id') && values.sip_user_id != null;
  const byUser = provided.has('user_id') && values.user_id != null;
  if (bySip && byUser) {
    throw ApiError.of('invalid_attribute', 'Send one of `sip_user_id` and `user_id`, not both.', at('user_id'));
  }
  if (!bySip && !byUser) {
    // The spec's own message for a missing `sip_user_id`, with the alternative named.
    throw ApiError.of('required', '`sip_user_id` is required (or `user_id`, for an operator without a SIP user).', at('sip_user_id'));
  }
  if (bySip) {
    const owner = await sql<{ sip_username: string; user_id: string | null; full_name: string | null }>`
      SELECT s.sip_username, s.user_id, u.full_name FROM sip_users s LEFT JOIN users u ON u.id = s.user_id
      WHERE s.id = ${values.sip_user_id} AND s.organisation_id = ${principal.organisationId}`.execute(db);
    const sipUser = owner.rows[0];
    return { sipUserId: String(values.sip_user_id), userId: sipUser.user_id, agentName: sipUser.full_name?.trim() || sipUser.sip_username };
  }
  // As with SIP users (an operator sees only their own), an operator sets only their own availability.
  if (principal.role === 'operator' && values.user_id !== principal.userId) throw forbidden('Your role may not use this User.');
  const member = await sql<{ email: string; full_name: string; sip_user_id: string | null; sip_username: string | null }>`
    SELECT u.email, u.full_name, s.id AS sip_user_id, s.sip_username FROM users u
    LEFT JOIN sip_users s ON s.user_id = u.id AND s.organisation_id = ${principal.organisationId}
    WHERE u.id = ${values.user_id}`.execute(db);
  const user = member.rows[0];
  return {
    sipUserId: user.sip_user_id,
    userId: String(values.user_id),
    agentName: user.full_name.trim() || user.sip_username || user.email,
  };
}

/**
 * Upserts the operator's one current status and, when the status changes,
 * appends an OperatorStatusEvent in the same transaction.
 */
async function setStatus(ctx: ActionContext): Promise<ActionResult> {
  const { db, values, principal } = ctx;
  const { sipUserId, userId, agentName } = await operatorOf(ctx);
  const now = new Date();

  // Either unique index (the SIP user's, the user's) may hold the operator's row already.
  const inserted = await sql<{ id: string }>`
    INSERT INTO operator_statuses (id, organisation_id, sip_user_id, user_id, agent_name, status, source, changed_by_user_id, created_at, updated_at)
    VALUES (${uuidv7()}, ${principal.organisationId}, ${sipUserId}, ${userId}, ${agentName}, ${values.status}, ${values.source},
            ${principal.userId}, ${now}, ${now})
    ON CONFLICT DO NOTHING
    RETURNING id`.execute(db);
  let id = inserted.rows[0]?.id;
  let previousStatus: string | null = null;
  const created = id !== undefined;
  if (!created) {
    // The SIP user's row first; else the user's row from before they had a SIP user, which the SIP user joins.
    const current = await sql<{ id: string; status: string }>`
      SELECT id, status FROM operator_statuses
      WHERE organisation_id = ${principal.organisationId}
        AND (sip_user_id = ${sipUserId} OR user_id = ${userId})
      ORDER BY (sip_user_id IS NOT DISTINCT FROM ${sipUserId}) DESC
      LIMIT 1 FOR UPDATE`.execute(db);
    id = current.rows[0].id;
    previousStatus = current.rows[0].status;
    await sql`
      UPDATE operator_statuses SET status = ${values.status}, source = ${values.source}, agent_name = ${agentName},
             sip_user_id = COALESCE(${sipUserId}::uuid, sip_user_id), user_id = ${userId},
             changed_by_user_id = ${principal.userId}, updated_at = ${now}
      WHERE id = ${id}`.execute(db);
  }
  if (created || previousStatus !== values.status) {
    // The history record is the engine's, written along with the status in this transaction.
    await ctx.records.create(systemActor(principal.organisationId, 'engine'), 'OperatorStatusEvent', {
      operator_status_id: id,
      sip_user_id: sipUserId,
      user_id: userId,
      agent_name: agentName,
      status: values.status as string,
      previous_status: previousStatus,
      source: values.source as string,
      changed_by_user_id: principal.userId,
      occurred_at: now,
    });
  }
  return { id: id!, status: created ? 201 : 200 };
}

export default defineResource({
  type: 'OperatorStatus',
  path: 'operator_statuses',
  table: 'operator_statuses',
  attributes: { ...operatorStatusAttributes, ...timestamps },
  relationships: operatorStatusRelationships,
  // The list answers "who is available now": filter[status]=available, sort=updated_at (idle longest first).
  operations: { list: true, create: true, get: true },
  access: { read: EVERY_ROLE, create: EVERY_ROLE },
  create: setStatus,
});
