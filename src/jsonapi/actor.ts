/**
 * The actor of a write: an authenticated principal (HTTP callers, with their
 * role's checks) or the system acting for one organisation (command line, demo
 * seed, agent runtime, SIP edge, webhooks). The system passes no role checks
 * and may set any declared attribute, but its values are validated, defaulted
 * and reference-checked like everyone's, inside its organisation only.
 */
import type { Principal } from './principal.js';

/** `engine`: a record the engine writes along with another (an OperatorStatusEvent with its status). */
/** `widget`: a conversation opened for a website visitor (POST /api/visitor_sessions). */
export type SystemSource = 'cli' | 'demo' | 'agent' | 'sip' | 'webhook' | 'engine' | 'test' | 'widget';

export type Actor = { kind: 'principal'; principal: Principal } | { kind: 'system'; organisationId: string; source: SystemSource };

export const asPrincipal = (principal: Principal): Actor => ({ kind: 'principal', principal });
export const systemActor = (organisationId: string, source: SystemSource): Actor => ({ kind: 'system', organisationId, source });

/** The principal the engine's generated SQL scopes by: the system sees its whole organisation. */
export function principalOf(actor: Actor): Principal {
  if (actor.kind === 'principal') return actor.principal;
  return { organisationId: actor.organisationId, userId: null, role: 'owner', credential: 'system', credentialId: actor.source };
}
