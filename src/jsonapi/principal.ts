/** Who is asking: roles, credential kinds and the principal the engine scopes every query by. */

export type Role = 'owner' | 'admin' | 'operator';
export const ROLES: readonly Role[] = ['owner', 'admin', 'operator'];
/** Whom access rules name: members by role, and website visitors (no user; one conversation). */
export type PrincipalRole = Role | 'visitor';

/** `system`: a writer inside Parley (command line, demo, agent runtime, SIP edge), acting for one organisation. */
export type CredentialKind = 'user_token' | 'secret_key' | 'publishable_key' | 'system' | 'visitor';

/** Resolved by the auth layer (or made for a system actor), consumed by the engine. */
export interface Principal {
  organisationId: string;
  /** The user acting; null for the system; for a visitor, its own random id, which names no user. */
  userId: string | null;
  role: PrincipalRole;
  credential: CredentialKind;
  /** id of the api_keys or user_sessions row behind the credential; the system's source for a system actor */
  credentialId: string;
  /** For a visitor: the one conversation it may read and write. */
  conversationId?: string;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by the auth layer for every /api request that carries a valid credential. */
    principal?: Principal;
  }
  interface FastifyContextConfig {
    /** A publishable key may call this route (only login). */
    allowPublishable?: boolean;
    /** No credential needed (health, metrics, docs). */
    public?: boolean;
    /** A visitor credential (the chat widget's) may call this route; every other route refuses it. */
    allowVisitor?: boolean;
    /** A tighter budget per client address for this route (e.g. opening visitor sessions). */
    addressBudget?: { max: number; timeWindowMs: number };
  }
}
