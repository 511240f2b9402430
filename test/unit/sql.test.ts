import { DummyDriver, Kysely, PostgresAdapter, PostgresIntrospector, PostgresQueryCompiler, type RawBuilder, sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { cursorSelectSql, filterSql, keysetSql, orderBySql } from '../../src/jsonapi/query/sql.js';
import type { FilterNode, SortKey } from '../../src/jsonapi/query/types.js';
import type { Principal } from '../../src/jsonapi/principal.js';
import { rowScope } from '../../src/jsonapi/scope.js';
import { ticket } from './fixtures.js';

/** Compiles PostgreSQL without a connection: the DummyDriver never runs anything. */
const db = new Kysely<any>({
  dialect: {
    createAdapter: () => new PostgresAdapter(),
    createDriver: () => new DummyDriver(),
    createIntrospector: (k) => new PostgresIntrospector(k),
    createQueryCompiler: () => new PostgresQueryCompiler(),
  },
});

const compile = (fragment: RawBuilder<unknown>) => {
  const { sql: text, parameters } = sql`SELECT 1 FROM tickets t WHERE ${fragment}`.compile(db);
  return { sql: text.replace('SELECT 1 FROM tickets t WHERE ', ''), parameters };
};
const condition = (attribute: string, operator: string, value: unknown): FilterNode =>
  ({ kind: 'condition', attribute, operator, value }) as FilterNode;
const key = (attribute: string, direction: 'asc' | 'desc' = 'asc', nulls: 'first' | 'last' = 'last'): SortKey => ({
  attribute,
  direction,
  nulls,
});
const ID = key('id');

describe('filter SQL', () => {
  it('filters a computed attribute by its expression, for the principal asking', () => {
    const computed = {
      ...ticket,
      attributes: {
        ...ticket.attributes,
        mine: { kind: 'string' as const, filterable: true, expression: (p: Principal) => sql`(SELECT ${p.userId}::text)` },
      },
    };
    const principal = { organisationId: 'o', userId: 'u1', role: 'operator', credential: 'user_token', credentialId: 's' } as Principal;
    expect(compile(filterSql(computed, condition('mine', 'eq', 'x'), principal))).toEqual({
      sql: '((SELECT $1::text)) = $2::text',
      parameters: ['u1', 'x'],
    });
    expect(() => filterSql(computed, condition('mine', 'eq', 'x'))).toThrow(/needs the principal/);
  });

  it('compares columns with parameters cast to the column type', () => {
    expect(compile(filterSql(ticket, condition('status', 'eq', 'open')))).toEqual({ sql: '"t"."status" = $1::text', parameters: ['open'] });
    expect(compile(filterSql(ticket, condition('priority', 'greater_than_or_equal', 2)))).toEqual({
      sql: '"t"."priority" >= $1::integer',
      parameters: [2],
    });
    const due = new Date('2026-01-31T12:00:00Z');
    // The attribute's column, not its name.
    expect(compile(filterSql(ticket, condition('due_at', 'less_than', due)))).toEqual({
      sql: '"t"."due" < $1::timestamptz',
      parameters: [due],
    });
    expect(compile(filterSql(ticket, condition('id', 'not_eq', 'a')))).toEqual({
      sql: '"t"."id" IS DISTINCT FROM $1::uuid',
      parameters: ['a'],
    });
  });

  it('renders in, is_nil and each kind of contains', () => {
    expect(compile(filterSql(ticket, condition('status', 'in', ['open', 'closed'])))).toEqual({
      sql: '"t"."status" IN ($1::text, $2::text)',
      parameters: ['open', 'closed'],
    });
    expect(compile(filterSql(ticket, condition('priority', 'is_nil', true))).sql).toBe('"t"."priority" IS NULL');
    expect(compile(filterSql(ticket, condition('priority', 'is_nil', false))).sql).toBe('"t"."priority" IS NOT NULL');
    // JSON objects travel as text and compare by containment.
    expect(compile(filterSql(ticket, condition('metadata', 'contains', { problem: 'late delivery' })))).toEqual({
      sql: '"t"."metadata" @> $1::jsonb',
      parameters: ['{"problem":"late delivery"}'],
    });
    expect(compile(filterSql(ticket, condition('labels', 'contains', 'vip')))).toEqual({
      sql: '$1::text = ANY("t"."labels")',
      parameters: ['vip'],
    });
    // Substring search without LIKE, so `%` and `_` in the value are literal.
    expect(compile(filterSql(ticket, condition('title', 'contains', '50%_off')))).toEqual({
      sql: 'strpos("t"."title", $1::text) > 0',
      parameters: ['50%_off'],
    });
  });

  it('groups and/or, and treats NOT of an unknown (NULL) comparison as true', () => {
    const tree: FilterNode = {
      kind: 'or',
      children: [
        { kind: 'and', children: [condition('status', 'eq', 'open'), condition('urgent', 'eq', true)] },
        { kind: 'not', child: condition('priority', 'eq', 1) },
      ],
    };
    expect(compile(filterSql(ticket, tree))).toEqual({
      sql: '(("t"."status" = $1::text AND "t"."urgent" = $2::boolean) OR NOT COALESCE("t"."priority" = $3::integer, FALSE))',
      parameters: ['open', true, 1],
    });
    expect(compile(filterSql(ticket, { kind: 'and', children: [] })).sql).toBe('TRUE');
  });

  it('never puts a value into the SQL text', () => {
    const hostile = "x'); DROP TABLE tickets; --";
    const { sql: text, parameters } = compile(filterSql(ticket, condition('title', 'eq', hostile)));
    expect(text).not.toContain('DROP');
    expect(parameters).toEqual([hostile]);
  });
});

describe('order and keyset SQL', () => {
  it('orders with explicit null placement, and reverses for backwards pages', () => {
    const sort = [key('priority', 'desc', 'first'), key('title'), ID];
    expect(compile(orderBySql(ticket, sort)).sql).toBe(
      '"t"."priority" DESC NULLS FIRST, "t"."title" ASC NULLS LAST, "t"."id" ASC NULLS LAST',
    );
    expect(compile(orderBySql(ticket, sort, true)).sql).toBe(
      '"t"."priority" ASC NULLS LAST, "t"."title" DESC NULLS FIRST, "t"."id" DESC NULLS FIRST',
    );
  });

  it('selects each sort value but the id as text for cursors', () => {
    expect(cursorSelectSql(ticket, [ID])).toBeUndefined();
    expect(compile(cursorSelectSql(ticket, [key('title'), key('due_at'), ID])!).sql).toBe(
      '"t"."title"::text AS "_k0", "t"."due"::text AS "_k1"',
    );
  });

  it('uses a row comparison when every key runs one way over non-null columns', () => {
    const cursor = { values: ['Printer'], id: '01890000-0000-7000-8000-000000000000' };
    expect(compile(keysetSql(ticket, [key('title'), ID], cursor, 'after'))).toEqual({
      sql: '("t"."title", "t"."id") > ($1::text, $2::uuid)',
      parameters: ['Printer', cursor.id],
    });
    // Before the cursor: every key flipped.
    expect(compile(keysetSql(ticket, [key('title'), ID], cursor, 'before')).sql).toBe('("t"."title", "t"."id") < ($1::text, $2::uuid)');
  });

  it('spells the comparison out for nullable keys, with nulls where the sort puts them', () => {
    const cursor = { values: ['3'], id: '01890000-0000-7000-8000-000000000000' };
    expect(compile(keysetSql(ticket, [key('priority'), ID], cursor, 'after'))).toEqual({
      sql: '((("t"."priority" > $1::integer OR "t"."priority" IS NULL)) OR ("t"."priority" = $2::integer AND ("t"."id" > $3::uuid OR "t"."id" IS NULL)))',
      parameters: ['3', '3', cursor.id],
    });
    // A cursor on a null value: with nulls last nothing non-null follows; only later ids among the nulls.
    const onNull = { values: [null], id: cursor.id };
    expect(compile(keysetSql(ticket, [key('priority'), ID], onNull, 'after'))).toEqual({
      sql: '((FALSE) OR ("t"."priority" IS NULL AND ("t"."id" > $1::uuid OR "t"."id" IS NULL)))',
      parameters: [cursor.id],
    });
  });
});

describe('tenancy SQL', () => {
  const principal: Principal = {
    organisationId: '01890000-0000-7000-8000-0000000000aa',
    userId: '01890000-0000-7000-8000-0000000000bb',
    role: 'operator',
    credential: 'user_token',
    credentialId: '01890000-0000-7000-8000-0000000000cc',
  };

  it("keeps rows inside the caller's organisation, plus the role's visibility", () => {
    expect(compile(rowScope(ticket, principal))).toEqual({ sql: '"t"."organisation_id" = $1', parameters: [principal.organisationId] });
    const own = {
      ...ticket,
      access: { ...ticket.access, visible: (p: Principal, alias: string) => sql`${sql.ref(`${alias}.user_id`)} = ${p.userId}` },
    };
    expect(compile(rowScope(own, principal, 'x'))).toEqual({
      sql: '("x"."organisation_id" = $1 AND "x"."user_id" = $2)',
      parameters: [principal.organisationId, principal.userId],
    });
  });
});
