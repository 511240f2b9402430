/** Reading records: by id, by list query, and the records a request includes. */
import { sql, type RawBuilder } from 'kysely';
import type { Database } from '../db/connection.js';
import { genericPlan, preparedPlan } from '../db/prepared.js';
import { cursorSelectSql, filterSql, keysetSql, orderBySql } from './query/sql.js';
import type { FilterNode, IncludeTree, ParsedQuery } from './query/types.js';
import type { Principal } from './principal.js';
import { columnOf, type RelationshipDef, type ResourceDef, type Registry } from './resource.js';
import { rowScope, mayPerform } from './scope.js';
import { ApiError, errorObject } from './errors.js';
import { identifier, renderResource, type Identifier, type RenderContext, type Row } from './serialize.js';
import { linkageColumn, selectList } from './select.js';
import { memo } from './memo.js';

export interface Reader {
  db: Database;
  principal: Principal;
  registry: Registry;
}

const PARENT = '_parent';

function where(conditions: (RawBuilder<unknown> | undefined)[]): RawBuilder<unknown> {
  return sql.join(
    conditions.filter((c): c is RawBuilder<unknown> => c !== undefined),
    sql` AND `,
  );
}

async function fetchByIds(reader: Reader, resource: ResourceDef, ids: string[]): Promise<Row[]> {
  if (ids.length === 0) return [];
  // By primary key: one plan serves every value (genericPlan).
  const { rows } = await genericPlan(sql<Row>`
    SELECT ${selectList(resource, reader.principal, reader.registry)} FROM ${sql.table(resource.table)} t
    WHERE ${where([sql`t.id = ANY(${ids}::uuid[])`, rowScope(resource, reader.principal)])}`).execute(reader.db);
  return rows;
}

export async function fetchById(reader: Reader, resource: ResourceDef, id: string): Promise<Row | undefined> {
  return (await fetchByIds(reader, resource, [id]))[0];
}

/** Whether a filter is conditions of equality joined by AND. */
const equalities = (node: FilterNode): boolean =>
  node.kind === 'and' ? node.children.every(equalities) : node.kind === 'condition' && node.operator === 'eq';

/**
 * The rows of `related` that a to-many relationship of the record `parentId` holds, as a condition on the
 * related table (aliased `t`): its inverse key, or membership of the join table.
 */
export function relatedRowsOf(relationship: RelationshipDef, parentId: string): RawBuilder<unknown> {
  if (relationship.through) {
    const { table, from, to } = relationship.through;
    return sql`t.id IN (SELECT ${sql.ref(`j.${to}`)} FROM ${sql.table(table)} j WHERE ${sql.ref(`j.${from}`)} = ${parentId})`;
  }
  return sql`${sql.ref(`t.${relationship.inverseKey!}`)} = ${parentId}`;
}

/**
 * One page of a list: tenancy, role scope, filter, sort and offset or keyset paging; `within` narrows it to
 * one record's to-many relationship (`relatedRowsOf`), for the relationship's related link.
 */
export async function listRows(reader: Reader, resource: ResourceDef, query: ParsedQuery, within?: RawBuilder<unknown>) {
  const { page, sort } = query;
  const backwards = page.before !== undefined;
  const cursor = page.after ?? page.before;
  const scope = rowScope(resource, reader.principal);
  const filter = query.filter ? filterSql(resource, query.filter, reader.principal) : undefined;
  const keyset = cursor ? keysetSql(resource, sort, cursor, backwards ? 'before' : 'after') : undefined;
  const cursorColumns = cursorSelectSql(resource, sort);
  const columns = cursorColumns
    ? sql`${selectList(resource, reader.principal, reader.registry)}, ${cursorColumns}`
    : selectList(resource, reader.principal, reader.registry);

  // The page's rows first, then the select list over them alone: when no index gives the order, PostgreSQL
  // sorts every matching row, and would otherwise compute each one's select list (timestamps as text, linkage
  // subqueries) before sorting, for rows the page does not show.
  // Without a filter on values and with no row scope beyond the organisation, the plan is the organisation's
  // records in the sort's order, whatever the organisation, cursor or page (genericPlan). A filter's
  // selectivity, or an operator's own rows among the organisation's, depends on the values: such a list is
  // planned for them on each call.
  //
  // The page's size is written into the statement, not passed as a parameter: a generic plan does not know a
  // parameter's value and assumes a LIMIT returns a tenth of the rows it is estimated to read, so for an
  // organisation holding half of the table it chose a parallel sequential scan and a sort of every one of the
  // organisation's rows (with JIT compilation, its estimated cost being that high): 360 ms for a page of 25 on
  // 300,000 conversations against 0.2 ms for the index scan on (organisation_id, id). A page size is one of
  // `maxLimit` integers (validated), so the texts stay a small set. An offset page (values up to `maxOffset`)
  // keeps its offset as a parameter and is planned for its values.
  const order = orderBySql(resource, sort, backwards);
  const offset = page.offset ?? 0;
  const statement = sql<Row>`
    SELECT ${columns} FROM (
      SELECT t.* FROM ${sql.table(resource.table)} t
      WHERE ${where([scope, within, filter, keyset])}
      ORDER BY ${order}
      LIMIT ${sql.lit(Math.trunc(page.limit) + 1)}${offset > 0 ? sql` OFFSET ${offset}` : sql``}
    ) t
    ORDER BY ${order}`;
  // A page in id order filtered by equality alone is a range of an (organisation_id, attribute, id) index for
  // any value: it is prepared, and PostgreSQL decides after five runs whether to keep planning it (preparedPlan).
  const plain = offset === 0 && !within && !resource.access.visible?.(reader.principal, 't');
  const prepared = plain && query.filter !== undefined && sort.length === 1 && equalities(query.filter);
  const marked = plain && !filter ? genericPlan(statement) : prepared ? preparedPlan(statement) : statement;
  const { rows } = await marked.execute(reader.db);

  // Whether more rows exist beyond this page in the direction of travel.
  const hasMore = rows.length > page.limit;
  if (hasMore) rows.pop();
  if (backwards) rows.reverse();

  let total: number | undefined;
  if (page.count) {
    const counted = await sql<{ total: number }>`
      SELECT count(*)::int AS total FROM ${sql.table(resource.table)} t WHERE ${where([scope, within, filter])}`.execute(reader.db);
    total = counted.rows[0].total;
  }
  return { rows, hasMore, total };
}

/** Related rows of a to-many relationship, each tagged with its parent's id in `_parent`. */
async function fetchToMany(reader: Reader, relationship: RelationshipDef, related: ResourceDef, parentIds: string[], limit: number) {
  if (parentIds.length === 0) return [];
  const columns = selectList(related, reader.principal, reader.registry);
  const scope = rowScope(related, reader.principal);
  const order = (related.defaultSort ?? []).map((name) => sql.ref(`t.${columnOf(name, related.attributes[name])}`));
  const orderBy = sql.join([...order, sql`t.id`]);
  // Through a join table `j`, or by the related table's own key back to the parent.
  const through = relationship.through;
  const [from, parent] = through
    ? [
        sql`${sql.table(through.table)} j JOIN ${sql.table(related.table)} t ON t.id = ${sql.ref(`j.${through.to}`)}`,
        sql.ref(`j.${through.from}`),
      ]
    : [sql`${sql.table(related.table)} t`, sql.ref(`t.${relationship.inverseKey!}`)];
  const { rows } = await sql<Row>`
    SELECT ${columns}, ${parent} AS ${sql.id(PARENT)} FROM ${from}
    WHERE ${parent} = ANY(${parentIds}::uuid[]) AND ${scope}
    ORDER BY ${orderBy} LIMIT ${limit}`.execute(reader.db);
  return rows;
}

const keyOf = (type: string, id: unknown) => `${type}:${String(id)}`;

/**
 * What included records may cost one response. Past either bound the request is a 400 `invalid_includes`
 * (never a truncated document, whose to-many linkage would silently be incomplete): the client reads the
 * relationship through its own paged list instead. Rows are fetched at most one past the record bound.
 */
function includeBudget(limits: RenderContext['includeLimits']) {
  let records = 0;
  let bytes = 0;
  const refuse = (what: string, limit: number) =>
    new ApiError([
      errorObject(
        'invalid_includes',
        `The included records would exceed ${limit} ${what} in one response; include less, or read the relationship page by page.`,
        { parameter: 'include' },
        { limit, unit: what },
      ),
    ]);
  return {
    /** Rows a to-many fetch may return: one more than what is left, so that exceeding is seen. */
    get remaining() {
      return limits ? Math.max(0, limits.records - records) + 1 : 1_000_000;
    },
    spend(rows: Row[]) {
      if (!limits) return;
      records += rows.length;
      if (records > limits.records) throw refuse('records', limits.records);
      for (const row of rows) bytes += JSON.stringify(row).length;
      if (bytes > limits.bytes) throw refuse('bytes', limits.bytes);
    },
  };
}

/**
 * Loads everything a request's include tree names, de-duplicated and inside
 * the caller's tenancy and role scope, then renders primary data and included.
 */
export async function renderWithIncludes(
  reader: Reader,
  resource: ResourceDef,
  primaryRows: Row[],
  include: IncludeTree,
  ctx: RenderContext,
): Promise<{ data: Record<string, unknown>[]; included: Record<string, unknown>[] }> {
  const toMany = new Map<string, Map<string, Identifier[]>>();
  const loaded = new Map<string, { resource: ResourceDef; row: Row }>();
  const budget = includeBudget(ctx.includeLimits);

  async function walk(parent: ResourceDef, rows: Row[], tree: IncludeTree): Promise<void> {
    for (const [name, subtree] of Object.entries(tree)) {
      const relationship = parent.relationships[name];
      const related = reader.registry.get(relationship.type)!;
      if (!mayPerform(related, reader.principal, 'read')) continue;
      let relatedRows: Row[];
      if (relationship.cardinality === 'one') {
        const ids = new Set<string>();
        for (const row of rows) {
          const id = relationship.resolve ? relationship.resolve(reader.principal) : row[linkageColumn(name)];
          if (id) ids.add(String(id));
        }
        const missing = [...ids].filter((id) => !loaded.has(keyOf(related.type, id)));
        const known = [...ids].map((id) => loaded.get(keyOf(related.type, id))?.row).filter((r): r is Row => !!r);
        relatedRows = [...(await fetchByIds(reader, related, missing)), ...known];
      } else {
        const parentIds = rows.map((r) => String(r.id));
        relatedRows = await fetchToMany(reader, relationship, related, parentIds, budget.remaining);
        for (const row of rows) {
          const linkage = relatedRows
            .filter((r) => String(r[PARENT]) === String(row.id))
            .map((r) => identifier(related.type, String(r.id)));
          memo(toMany, keyOf(parent.type, row.id), () => new Map<string, Identifier[]>()).set(name, linkage);
        }
      }
      const fresh = relatedRows.filter((row) => !loaded.has(keyOf(related.type, row.id)));
      budget.spend(fresh);
      for (const row of fresh) loaded.set(keyOf(related.type, row.id), { resource: related, row });
      await walk(related, relatedRows, subtree);
    }
  }

  await walk(resource, primaryRows, include);
  const primaryKeys = new Set(primaryRows.map((row) => keyOf(resource.type, row.id)));
  const data = primaryRows.map((row) => renderResource(resource, row, ctx, toMany.get(keyOf(resource.type, row.id))));
  const included = [...loaded.entries()]
    .filter(([key]) => !primaryKeys.has(key))
    .map(([key, { resource: r, row }]) => renderResource(r, row, ctx, toMany.get(key)));
  return { data, included };
}
