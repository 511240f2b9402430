import { sql } from 'kysely';
import type { Principal, Role, Scope } from '../jsonapi/resource.js';

export const EVERY_ROLE: readonly Role[] = ['owner', 'admin', 'operator'];
export const ADMINS: readonly Role[] = ['owner', 'admin'];

/** Operators see only rows whose `column` names their own user; admins and owners see all. */
export function ownRowsForOperators(column: string): Scope {
  return (p: Principal, alias: string) =>
    p.role === 'operator' ? sql`${sql.ref(`${alias}.${column}`)} = ${p.userId}` : undefined;
}
