import { sql } from 'kysely';
import { uuidv7 } from 'uuidv7';
import { type ActionContext, type ActionResult, attr, type AttributeDef, defineResource, rel, systemActor } from '../jsonapi/index.js';
import { timestamps } from './timestamps.js';
import { EVERY_ROLE } from './scopes.js';
import { OPERATOR_STATUS_SOURCES, OPERATOR_STATUSES } from './values.js';

/** Attributes shared by the current status and its history events. */
export const operatorStatusAttributes = {
  sip_user_id: attr.uuid({ create: 'required', sortable: true, filterable: true, references: 'SipUser' }),
  agent_name: attr.string({ sortable: true, filterable: true }),
  status: attr.enum(OPERATOR_STATUSES, { create: 'required', sortable: true, filterable: true }),
  source: attr.enum(OPERATOR_STATUS_SOURCES, { create: true, sortable: true, filterable: true, default: 'api' }),
  changed_by_user_id: attr.uuid({ nullable: true, sortable: true, filterable: true }),
} satisfies Record<string, AttributeDef>;

export const operatorStatusRelationships = {
  changed_by_user: rel.belongsTo('User', 'changed_by_user_id'),
  organisation: rel.belongsTo('Organisation', 'organisation_id'),
  sip_user: rel.belongsTo('SipUser', 'sip_user_id'),
};

/**
 * Upserts the SIP user's one current status and, when the status changes,
 * appends an OperatorStatusEvent in the same transaction.
 */
async function setStatus(ctx: ActionContext): Promise<ActionResult> {
  const { db, values, principal } = ctx;
  const owner = await sql<{ sip_username: string; full_name: string | null }>`
    SELECT s.sip_username, u.full_name FROM sip_users s LEFT JOIN users u ON u.id = s.user_id
    WHERE s.id = ${values.sip_user_id} AND s.organisation_id = ${principal.organisationId}`.execute(db);
  const sipUser = owner.rows[0];
  const agentName = sipUser.full_name?.trim() || sipUser.sip_username;
  const now = new Date();

  const inserted = await sql<{ id: string }>`
    INSERT INTO operator_statuses (id, organisation_id, sip_user_id, agent_name, status, source, changed_by_user_id, created_at, updated_at)
    VALUES (${uuidv7()}, ${principal.organisationId}, ${values.sip_user_id}, ${agentName}, ${values.status}, ${values.source},
            ${principal.userId}, ${now}, ${now})
    ON CONFLICT (sip_user_id) DO NOTHING
    RETURNING id`.execute(db);
  let id = inserted.rows[0]?.id;
  let previousStatus: string | null = null;
  const created = id !== undefined;
  if (!created) {
    const current = await sql<{ id: string; status: string }>`
      SELECT id, status FROM operator_statuses WHERE sip_user_id = ${values.sip_user_id} FOR UPDATE`.execute(db);
    id = current.rows[0].id;
    previousStatus = current.rows[0].status;
    await sql`
      UPDATE operator_statuses SET status = ${values.status}, source = ${values.source}, agent_name = ${agentName},
             changed_by_user_id = ${principal.userId}, updated_at = ${now}
      WHERE id = ${id}`.execute(db);
  }
  if (created || previousStatus !== values.status) {
    // The history record is the engine's, written along with the status in this transaction.
    await ctx.records.create(systemActor(principal.organisationId, 'engine'), 'OperatorStatusEvent', {
      operator_status_id: id,
      sip_user_id: values.sip_user_id,
      agent_name: agentName,
      status: values.status,
      previous_status: previousStatus,
      source: values.source,
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
