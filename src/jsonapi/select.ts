import { sql, type RawBuilder } from 'kysely';
import type { Registry } from './query/parse.js';
import type { Principal } from './principal.js';
import { columnOf, type ResourceDef } from './resource.js';
import { rowScope } from './scope.js';

/** Column alias under which a relationship's linkage id is selected. */
export const linkageColumn = (relationship: string) => `_rel_${relationship}`;

/**
 * The select list of a resource row (main table aliased `t`): id, every
 * readable attribute (computed ones by expression), and to-one linkage ids.
 */
export function selectList(resource: ResourceDef, principal: Principal, registry: Registry): RawBuilder<unknown> {
  const parts: RawBuilder<unknown>[] = [sql`t.id`];
  for (const [name, def] of Object.entries(resource.attributes)) {
    if (def.writeOnly || def.revealedOnCreate) continue;
    const value = def.expression ? def.expression(principal) : sql.ref(`t.${columnOf(name, def)}`);
    parts.push(sql`${value} AS ${sql.id(name)}`);
  }
  for (const [name, relationship] of Object.entries(resource.relationships)) {
    if (relationship.cardinality !== 'one') continue;
    if (relationship.foreignKey) {
      parts.push(sql`${sql.ref(`t.${relationship.foreignKey}`)} AS ${sql.id(linkageColumn(name))}`);
    } else if (relationship.inverseKey) {
      const related = registry.get(relationship.type)!;
      parts.push(sql`(SELECT r.id FROM ${sql.table(related.table)} r
        WHERE ${sql.ref(`r.${relationship.inverseKey}`)} = t.id AND ${rowScope(related, principal, 'r')}
        ORDER BY r.id LIMIT 1) AS ${sql.id(linkageColumn(name))}`);
    }
  }
  return sql.join(parts);
}

const independent = new WeakMap<ResourceDef, boolean>();

/**
 * Whether every reader of the organisation gets the same row of `resource` from `selectList` and the same
 * rendering of it: no computed attribute and no to-one linkage that depends on who asks (an expression, a
 * linkage resolved from the principal or looked up under the reader's row scope). Then one read of a written
 * row serves both the writer's response and the event, which is the organisation's view.
 */
export function viewIndependent(resource: ResourceDef): boolean {
  let known = independent.get(resource);
  if (known === undefined) {
    known =
      Object.values(resource.attributes).every((def) => !def.expression || def.writeOnly || def.revealedOnCreate) &&
      Object.values(resource.relationships).every((r) => r.cardinality !== 'one' || (r.foreignKey !== undefined && !r.resolve));
    independent.set(resource, known);
  }
  return known;
}
