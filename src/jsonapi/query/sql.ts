/** SQL fragments for filters, ordering and keyset paging over a resource's table, aliased `t`. */
import { sql, type RawBuilder } from 'kysely';
import { KINDS, typedParameter as typed } from '../kinds.js';
import type { Principal } from '../principal.js';
import { columnOf, type AttributeDef, type ResourceDef } from '../resource.js';
import type { Cursor, FilterNode, SortKey } from './types.js';

const ID: AttributeDef = { kind: 'uuid' };

function attributeOf(resource: ResourceDef, name: string): AttributeDef {
  return name === 'id' ? ID : resource.attributes[name];
}

function column(resource: ResourceDef, name: string): RawBuilder<unknown> {
  return sql.ref(`t.${name === 'id' ? 'id' : columnOf(name, resource.attributes[name])}`);
}

/** `principal` is needed by filterable computed attributes, whose expression depends on who asks. */
export function filterSql(resource: ResourceDef, node: FilterNode, principal?: Principal): RawBuilder<unknown> {
  switch (node.kind) {
    case 'and':
    case 'or':
      return node.children.length === 0
        ? sql`TRUE`
        : sql`(${sql.join(
            node.children.map((c) => filterSql(resource, c, principal)),
            node.kind === 'and' ? sql` AND ` : sql` OR `,
          )})`;
    case 'not':
      return sql`NOT COALESCE(${filterSql(resource, node.child, principal)}, FALSE)`;
    case 'condition':
      return condition(resource, node.attribute, node.operator, node.value, principal);
  }
}

/**
 * The column behind an attribute, or a computed attribute's expression (parenthesised) for filters. A visitor
 * filters an object without the keys hidden from it, so no operator (`contains`, `eq`) confirms a guessed value.
 */
function filterOperand(resource: ResourceDef, attribute: string, principal: Principal | undefined): RawBuilder<unknown> {
  const def = attributeOf(resource, attribute);
  const hidden = principal?.role === 'visitor' ? def.hiddenFromVisitors : undefined;
  if (Array.isArray(hidden)) return sql`(${column(resource, attribute)} - ARRAY[${sql.join(hidden.map((key) => sql`${key}::text`))}])`;
  if (!def.expression) return column(resource, attribute);
  if (!principal) throw new Error(`filter on computed ${resource.type}.${attribute} needs the principal`);
  return sql`(${def.expression(principal)})`;
}

function condition(resource: ResourceDef, attribute: string, operator: string, value: unknown, principal?: Principal): RawBuilder<unknown> {
  if (operator === 'matches') {
    const query = sql`to_tsquery('simple', ${value}::text)`;
    const search = resource.searches && Object.hasOwn(resource.searches, attribute) ? resource.searches[attribute] : undefined;
    // Else the very expression of the attribute's GIN index, so that the index answers it.
    return search ? search(query) : sql`to_tsvector('simple', ${filterOperand(resource, attribute, principal)}) @@ ${query}`;
  }
  const def = attributeOf(resource, attribute);
  const col = filterOperand(resource, attribute, principal);
  if (operator === 'is_nil') return value ? sql`${col} IS NULL` : sql`${col} IS NOT NULL`;
  if (operator === 'contains') return KINDS[def.kind].contains!(col, value);
  if (operator === 'in') return sql`${col} IN (${sql.join((value as unknown[]).map((v) => typed(def, v)))})`;
  return sql`${col} ${sql.raw(COMPARISONS[operator])} ${typed(def, value)}`;
}

/** The SQL comparison of each operator that compares with one value. */
const COMPARISONS: Record<string, string> = {
  eq: '=',
  not_eq: 'IS DISTINCT FROM',
  less_than: '<',
  greater_than: '>',
  less_than_or_equal: '<=',
  greater_than_or_equal: '>=',
};

const flip = (key: SortKey): SortKey => ({
  attribute: key.attribute,
  direction: key.direction === 'asc' ? 'desc' : 'asc',
  nulls: key.nulls === 'first' ? 'last' : 'first',
});

export function orderBySql(resource: ResourceDef, sort: SortKey[], reverse = false): RawBuilder<unknown> {
  return sql.join(
    sort
      .map((key) => (reverse ? flip(key) : key))
      .map(
        (key) =>
          sql`${column(resource, key.attribute)} ${sql.raw(key.direction === 'asc' ? 'ASC' : 'DESC')} NULLS ${sql.raw(key.nulls === 'first' ? 'FIRST' : 'LAST')}`,
      ),
  );
}

/** Extra select columns `_k0..` holding each sort value (but the final id) as text, for cursors; undefined when sorting by id alone. */
export function cursorSelectSql(resource: ResourceDef, sort: SortKey[]): RawBuilder<unknown> | undefined {
  const keys = sort.slice(0, -1);
  if (keys.length === 0) return undefined;
  return sql.join(keys.map((key, i) => sql`${column(resource, key.attribute)}::text AS ${sql.id(`_k${i}`)}`));
}

export function cursorFromRow(sort: SortKey[], row: Record<string, unknown>): Cursor {
  const values = sort.slice(0, -1).map((_, i) => (row[`_k${i}`] ?? null) as string | null);
  return { values, id: String(row.id) };
}

/** Default null placement of PostgreSQL for a direction: what a plain index scan yields. */
const defaultNulls = (key: SortKey) => (key.direction === 'asc' ? key.nulls === 'last' : key.nulls === 'first');

/**
 * Rows strictly after (or before) the cursor in the sort order. When every key
 * runs one way with default null placement over non-null columns, a row-value
 * comparison lets PostgreSQL scan an (organisation_id, key, id) index range, so
 * a deep page costs what the first does.
 */
export function keysetSql(resource: ResourceDef, sort: SortKey[], cursor: Cursor, direction: 'after' | 'before'): RawBuilder<unknown> {
  const keys = direction === 'before' ? sort.map(flip) : sort;
  const values = [...cursor.values, cursor.id];
  const oneWay = keys.every((k) => k.direction === keys[0].direction && defaultNulls(k));
  const nonNull = keys.every((k, i) => !attributeOf(resource, k.attribute).nullable && values[i] !== null);
  if (oneWay && nonNull) {
    const columns = sql.join(keys.map((k) => column(resource, k.attribute)));
    const params = sql.join(keys.map((k, i) => typed(attributeOf(resource, k.attribute), values[i])));
    return keys[0].direction === 'asc' ? sql`(${columns}) > (${params})` : sql`(${columns}) < (${params})`;
  }
  const branches = keys.map((key, i) => {
    const equal = keys.slice(0, i).map((k, j) => equalTo(resource, k, values[j]));
    return sql.join([...equal, afterValue(resource, key, values[i])], sql` AND `);
  });
  return sql`(${sql.join(
    branches.map((b) => sql`(${b})`),
    sql` OR `,
  )})`;
}

function equalTo(resource: ResourceDef, key: SortKey, value: string | null): RawBuilder<unknown> {
  const col = column(resource, key.attribute);
  return value === null ? sql`${col} IS NULL` : sql`${col} = ${typed(attributeOf(resource, key.attribute), value)}`;
}

function afterValue(resource: ResourceDef, key: SortKey, value: string | null): RawBuilder<unknown> {
  const col = column(resource, key.attribute);
  if (value === null) return key.nulls === 'first' ? sql`${col} IS NOT NULL` : sql`FALSE`;
  const param = typed(attributeOf(resource, key.attribute), value);
  const beyond = key.direction === 'asc' ? sql`${col} > ${param}` : sql`${col} < ${param}`;
  return key.nulls === 'last' ? sql`(${beyond} OR ${col} IS NULL)` : beyond;
}
