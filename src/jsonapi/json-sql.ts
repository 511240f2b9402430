/**
 * A resource object rendered by PostgreSQL: the JSON `renderResource` makes of a row (serialize.ts), as a
 * `jsonb` expression over the row aliased `t`, for resources that every reader sees alike
 * (`viewIndependent`: no computed attribute, no to-one linkage looked up or resolved per reader). The outbox
 * stores events as `jsonb`, so a write whose event is built this way inserts the record and its event in one
 * statement, with no rendering in Node.js and no second round trip (write.ts, `insertRecord`). Values as the
 * renderer gives them: timestamps as RFC 3339 text (select.ts), write-only attributes left out, values shown
 * once null. `test/events.test.ts` compares the two renderings for every such resource.
 */
import { sql, type RawBuilder } from 'kysely';
import { KINDS, renderedValue } from './kinds.js';
import { columnOf, type AttributeDef, type ResourceDef } from './resource.js';
import { memo } from './memo.js';
import { frozen, viewIndependent } from './select.js';
import { relatedLink } from './serialize.js';

const compiled = new WeakMap<ResourceDef, Map<string, RawBuilder<unknown>>>();

/**
 * The resource object of row `t` as `jsonb`, or undefined when `resource` is not rendered alike for every
 * reader. Made once per resource and base URL (the configured one, a literal in it) as SQL text.
 */
export function resourceJsonb(resource: ResourceDef, baseUrl: string): RawBuilder<unknown> | undefined {
  if (!viewIndependent(resource)) return undefined;
  return memo(
    memo(compiled, resource, () => new Map()),
    baseUrl,
    () => frozen(compile(resource, baseUrl)),
  );
}

function attributeValue(name: string, def: AttributeDef): RawBuilder<unknown> {
  if (def.revealedOnCreate) return sql`NULL::jsonb`;
  const column = sql.ref(`t.${columnOf(name, def)}`);
  return KINDS[def.kind].jsonb?.(column) ?? sql`to_jsonb(${renderedValue(column, def)})`;
}

/** `jsonb_build_object` of name/value pairs (it takes at most 100 arguments: nested per 40 pairs). */
function object(pairs: [string, RawBuilder<unknown>][]): RawBuilder<unknown> {
  if (pairs.length === 0) return sql`'{}'::jsonb`;
  const chunks: RawBuilder<unknown>[] = [];
  for (let i = 0; i < pairs.length; i += 40) {
    chunks.push(sql`jsonb_build_object(${sql.join(pairs.slice(i, i + 40).map(([name, value]) => sql`${sql.lit(name)}::text, ${value}`))})`);
  }
  return sql.join(chunks, sql` || `);
}

function compile(resource: ResourceDef, baseUrl: string): RawBuilder<unknown> {
  const attributes = Object.entries(resource.attributes)
    .filter(([, def]) => !def.writeOnly)
    .map(([name, def]): [string, RawBuilder<unknown>] => [name, attributeValue(name, def)]);
  const relationships = Object.entries(resource.relationships).map(([name, relationship]): [string, RawBuilder<unknown>] => {
    if (relationship.cardinality === 'one') {
      const key = sql.ref(`t.${relationship.foreignKey!}`);
      return [
        name,
        sql`jsonb_build_object('data', CASE WHEN ${key} IS NULL THEN NULL ELSE jsonb_build_object('id', ${key}::text, 'type', ${sql.lit(relationship.type)}::text, 'meta', '{}'::jsonb) END)`,
      ];
    }
    // As serialize.ts's relatedLink: /api/{path}/{id}/{relationship}.
    if (!relatedLink(resource, '', name, baseUrl)) return [name, sql`'{"meta":{}}'::jsonb`];
    const prefix = `${baseUrl}/api/${resource.path}/`;
    const suffix = `/${name}`;
    return [
      name,
      sql`jsonb_build_object('links', jsonb_build_object('related', ${sql.lit(prefix)}::text || t.id::text || ${sql.lit(suffix)}::text), 'meta', '{}'::jsonb)`,
    ];
  });
  const members: [string, RawBuilder<unknown>][] = [
    ['id', sql`to_jsonb(t.id::text)`],
    ['type', sql`to_jsonb(${sql.lit(resource.type)}::text)`],
    ['attributes', object(attributes)],
    ['relationships', object(relationships)],
  ];
  if (resource.path)
    members.push(['links', sql`jsonb_build_object('self', ${sql.lit(`${baseUrl}/api/${resource.path}/`)}::text || t.id::text)`]);
  members.push(['meta', sql`'{}'::jsonb`]);
  return object(members);
}
