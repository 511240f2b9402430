import { sql } from 'kysely';
import type { Principal, PrincipalRole, Role, Scope } from '../jsonapi/index.js';

export const EVERY_ROLE: readonly Role[] = ['owner', 'admin', 'operator'];
export const ADMINS: readonly Role[] = ['owner', 'admin'];

/** Operators see only rows whose `column` names their own user; admins and owners see all. */
export function ownRowsForOperators(column: string): Scope {
  const scope: Scope = (p: Principal, alias: string) =>
    p.role === 'operator' ? sql`${sql.ref(`${alias}.${column}`)} = ${p.userId}` : undefined;
  scope.onColumns = (p, columns) => (p.role === 'operator' ? columns[column] === p.userId : undefined);
  return scope;
}

/** Members of every role, and website visitors (who see only their one conversation). */
export const EVERY_ROLE_AND_VISITORS: readonly PrincipalRole[] = [...EVERY_ROLE, 'visitor'];

/**
 * A visitor sees only rows whose `column` names its one conversation, and none whose `role` is one of
 * `hiddenRoles` (the agent's `tool` items: what its tools were asked and answered is for the organisation, not
 * the visitor); members are not limited here.
 */
export function ownConversationForVisitors(column: string, hiddenRoles: readonly string[] = []): Scope {
  const scope: Scope = (p: Principal, alias: string) => {
    if (p.role !== 'visitor') return undefined;
    const own = sql`${sql.ref(`${alias}.${column}`)} = ${p.conversationId ?? null}`;
    if (hiddenRoles.length === 0) return own;
    return sql`${own} AND ${sql.ref(`${alias}.role`)} NOT IN (${sql.join(hiddenRoles.map((r) => sql.lit(r)))})`;
  };
  // SQL's `=` with a NULL side is not true: a visitor without a conversation sees nothing here either.
  scope.onColumns = (p, columns) =>
    p.role === 'visitor'
      ? p.conversationId !== undefined && columns[column] === p.conversationId && !hiddenRoles.includes(columns.role as string)
      : undefined;
  scope.visitorConversationColumn = column;
  return scope;
}
