import { createQueryId, PostgresQueryCompiler, sql, type RawBuilder } from 'kysely';
import type { Principal } from './principal.js';
import { renderedValue } from './kinds.js';
import { memo } from './memo.js';
import { columnOf, type ResourceDef, type Registry } from './resource.js';
import { rowScope } from './scope.js';

/** Column alias under which a relationship's linkage id is selected. */
export const linkageColumn = (relationship: string) => `_rel_${relationship}`;

/**
 * The select list of a resource row (main table aliased `t`): id, every
 * readable attribute (computed ones by expression), and to-one linkage ids.
 */
export function selectList(resource: ResourceDef, principal: Principal, registry: Registry): RawBuilder<unknown> {
  // Built once per resource, or per reader when it depends on who reads (the query builder's nodes are
  // immutable, so one serves every query): building it took a twentieth of a list request's CPU.
  const cached = memo(selectLists, resource, () => new Map());
  const key = viewIndependent(resource)
    ? ''
    : `${principal.organisationId}|${principal.role}|${principal.userId}|${principal.conversationId ?? ''}`;
  return memo(cached, key, () => {
    if (cached.size >= SELECT_LISTS_PER_RESOURCE) cached.clear();
    return frozen(buildSelectList(resource, principal, registry));
  });
}

/** Readers whose select lists are kept per resource (organisations, roles, users, visitors); then it starts over. */
const SELECT_LISTS_PER_RESOURCE = 1000;
const selectLists = new WeakMap<ResourceDef, Map<string, RawBuilder<unknown>>>();

function buildSelectList(resource: ResourceDef, principal: Principal, registry: Registry): RawBuilder<unknown> {
  const parts: RawBuilder<unknown>[] = [sql`t.id`];
  for (const [name, def] of Object.entries(resource.attributes)) {
    if (def.writeOnly || def.revealedOnCreate) continue;
    const column = sql.ref(`t.${columnOf(name, def)}`);
    const value = def.expression ? def.expression(principal) : renderedValue(column, def);
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
  return memo(
    independent,
    resource,
    () =>
      Object.values(resource.attributes).every((def) => !def.expression || def.writeOnly || def.revealedOnCreate) &&
      Object.values(resource.relationships).every((r) => r.cardinality !== 'one' || (r.foreignKey !== undefined && !r.resolve)),
  );
}

const compiler = new PostgresQueryCompiler();

/**
 * A fragment as one raw node of its SQL text: the query builder then copies the text instead of visiting (and
 * freezing) its tree on every query, which took a sixth of an item create's CPU in Node.js. A page of
 * conversations selects its call through a subquery scoped to the reader's organisation, a parameter: its
 * select list was most of the nodes its statement visited. Parameters stay parameters, between the text's
 * pieces; should the text hold a `$n` that is not the compiler's placeholders in order (in a literal), the fragment is returned as it is.
 * Literals in it are the compiler's, escaped.
 */
export function frozen(fragment: RawBuilder<unknown>): RawBuilder<unknown> {
  const { sql: text, parameters } = compiler.compileQuery(fragment.toOperationNode(), createQueryId());
  const numbers = [...text.matchAll(/\$(\d+)/g)].map((match) => Number(match[1]));
  if (numbers.length !== parameters.length || numbers.some((n, i) => n !== i + 1)) return fragment;
  const pieces = text.split(/\$\d+/);
  return sql(Object.assign(pieces, { raw: pieces }), ...parameters);
}
