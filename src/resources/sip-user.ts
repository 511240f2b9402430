import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { issueSipCredential } from '../auth/sip-credentials.js';
import { type ActionContext, attr, defineResource, rel } from '../jsonapi/index.js';
import { ADMINS, EVERY_ROLE, ownRowsForOperators } from './scopes.js';
import { timestamps } from './timestamps.js';

/** 24 URL-safe characters from 144 random bits. */
const newSipPassword = () => randomBytes(18).toString('base64url');

/**
 * Deleting a SIP user takes its current OperatorStatus and that status's history along: neither means
 * anything without the phone account. Calls keep their participants (a leg's `member_uuid` is text).
 */
async function removeStatus(ctx: ActionContext): Promise<Record<string, number>> {
  const id = String(ctx.existing!.id);
  const events = await ctx.db.deleteFrom('operator_status_events').where('sip_user_id', '=', id).executeTakeFirst();
  const statuses = await ctx.db.deleteFrom('operator_statuses').where('sip_user_id', '=', id).executeTakeFirst();
  const removed: Record<string, number> = {};
  if (Number(events.numDeletedRows) > 0) removed.OperatorStatusEvent = Number(events.numDeletedRows);
  if (Number(statuses.numDeletedRows) > 0) removed.OperatorStatus = Number(statuses.numDeletedRows);
  return removed;
}

export default defineResource({
  type: 'SipUser',
  path: 'sip_users',
  table: 'sip_users',
  attributes: {
    sip_username: attr.string({ create: 'required', sortable: true, filterable: true, pattern: '^[A-Za-z0-9_.+-]{3,64}$' }),
    // A secret: neither filterable nor sortable, so it never appears in a URL, a log line or a paging cursor.
    sip_password: attr.string({
      create: true,
      update: true,
      minLength: 12,
      maxLength: 128,
      default: newSipPassword,
      example: 'correct-horse-battery',
    }),
    user_id: attr.uuid({ create: true, nullable: true, sortable: true, filterable: true, references: 'User' }),
    /** Read only: the address this phone registers as and is called at, in its organisation's own SIP domain. */
    sip_uri: attr.string({
      description: "`sip:<sip_username>@<the organisation's SIP domain>`.",
      expression: () =>
        sql`'sip:' || t.sip_username || '@' || (SELECT parley_sip_domain(o.slug) FROM organisations o WHERE o.id = t.organisation_id)`,
    }),
    /**
     * Read only: a registration of this user at the SIP edge has not expired. Kamailio writes
     * registrations to sip_locations (expiry in Unix seconds) under (user, organisation's domain).
     */
    registered: attr.boolean({
      expression: () => sql`EXISTS (SELECT 1 FROM sip_locations l
        WHERE l.username = t.sip_username
          AND l.domain = (SELECT parley_sip_domain(o.slug) FROM organisations o WHERE o.id = t.organisation_id)
          AND l.expires > extract(epoch FROM now()))`,
    }),
    ...timestamps,
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
    user: rel.belongsTo('User', 'user_id'),
  },
  uniqueConstraints: { sip_users_org_username_key: 'sip_username', sip_users_org_user_key: 'user_id' },
  operations: { create: true, list: true, get: true, update: true, delete: true },
  access: { read: EVERY_ROLE, create: ADMINS, update: ADMINS, delete: ADMINS, visible: ownRowsForOperators('user_id') },
  beforeDelete: removeStatus,
  actions: {
    issueSipCredential: {
      path: 'sip_users/credential',
      summary:
        'A short-lived SIP credential for the browser softphone (meta.sip_credential: username, password, expires_at, uri, domain, ws_uri) for `sip_user_id`, or your own SIP user when left out; operators get one for their own SIP user only',
      input: {
        sip_user_id: attr.uuid({ create: true, nullable: true, description: 'The SIP user; default: your own.' }),
      },
      // 422 at sip_user_id: no such SIP user, or none of the caller's; 409: the server has no SIP WebSocket (SIP_WS_URL).
      run: issueSipCredential,
    },
  },
});
