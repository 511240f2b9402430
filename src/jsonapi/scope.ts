import { sql, type RawBuilder } from 'kysely';
import { forbidden } from './errors.js';
import type { Principal, PrincipalRole } from './principal.js';
import type { ResourceDef } from './resource.js';

/** The condition that keeps rows of `alias` inside the caller's organisation. */
export function tenancyScope(resource: ResourceDef, principal: Principal, alias = 't'): RawBuilder<unknown> {
  return resource.tenancy?.(principal, alias) ?? sql`${sql.ref(`${alias}.organisation_id`)} = ${principal.organisationId}`;
}

/** Tenancy plus the role's row visibility, as one SQL condition on `alias`. */
export function rowScope(resource: ResourceDef, principal: Principal, alias = 't'): RawBuilder<unknown> {
  const tenancy = tenancyScope(resource, principal, alias);
  const visible = resource.access.visible?.(principal, alias);
  return visible ? sql`(${tenancy} AND ${visible})` : tenancy;
}

export type Operation = 'read' | 'create' | 'update' | 'delete';

export function mayPerform(resource: ResourceDef, principal: Principal, operation: Operation): boolean {
  const roles: readonly PrincipalRole[] | undefined = resource.access[operation];
  return roles?.includes(principal.role) ?? false;
}

/** Type-level permission: a role that may never do this to the type gets 403, whatever the id. */
export function requirePermission(resource: ResourceDef, principal: Principal, operation: Operation): void {
  if (!mayPerform(resource, principal, operation)) {
    throw forbidden(`Your role may not ${operation} ${resource.type} records.`);
  }
}
