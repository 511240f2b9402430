/**
 * Visitor credentials: the chat widget on a customer's website trades the organisation's publishable key for
 * a short-lived JWT bound to one new conversation. The holder is no user: it may read that conversation and
 * its items and post `user` items to it, and nothing else (see the resources' access rules and docs/api.md).
 */
import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { ApiError, forbidden } from '../jsonapi/errors.js';
import type { ActionContext, ActionResult } from '../jsonapi/resource.js';
import { systemActor } from '../jsonapi/actor.js';
import { expiryIn, signToken } from './tokens.js';

/** POST /api/visitor_sessions: a new chat conversation (answered by `ai_agent_id` when given) and its visitor token. */
export async function openVisitorSession(ctx: ActionContext): Promise<ActionResult & { meta: Record<string, unknown> }> {
  const { principal, services } = ctx;
  if (principal.credential !== 'publishable_key') throw forbidden('Visitor sessions are opened with a publishable key.');
  const agentId = (ctx.values.ai_agent_id as string | null | undefined) ?? null;
  if (agentId !== null) {
    const { rows } = await sql`SELECT 1 FROM ai_agents WHERE id = ${agentId} AND organisation_id = ${principal.organisationId}`.execute(
      ctx.db,
    );
    if (rows.length === 0) {
      throw ApiError.of('invalid_attribute', '`ai_agent_id` does not name an AiAgent of your organisation.', {
        pointer: '/data/attributes/ai_agent_id',
      });
    }
  }
  const visitorId = randomUUID();
  // Through the one write path (validation, defaults such as public_id, the event), as the system: the
  // publishable key's own role plays no part in what a visitor session may create.
  const { id } = await ctx.records.create(systemActor(principal.organisationId, 'widget'), 'Conversation', {
    status: 'active',
    channel: 'chat',
    mode: 'text',
    ai_agent_id: agentId,
    metadata: { visitor: { id: visitorId } },
  });
  const expiry = expiryIn(services.config.visitorTokenTtlSeconds);
  const token = await signToken(
    { typ: 'visitor', sub: visitorId, org: principal.organisationId, jti: principal.credentialId, cnv: id },
    services.signingKey,
    expiry.at,
  );
  return { id, status: 201, meta: { token, token_expires_at: expiry.text } };
}
