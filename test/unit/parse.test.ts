import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/jsonapi/errors.js';
import { cursorCodec } from '../../src/jsonapi/query/cursor.js';
import { parseQuery } from '../../src/jsonapi/query/parse.js';
import { registry, ticket } from './fixtures.js';

const cursors = cursorCodec(new Uint8Array(32).fill(7), 'org-under-test');
const list = (raw: Record<string, unknown>) => parseQuery(raw, ticket, registry, 'list', { cursors });

/** The 400's problems as [code, parameter, detail] triples. */
function problems(raw: Record<string, unknown>, kind: 'list' | 'single' = 'list'): [string, string | undefined, string | undefined][] {
  try {
    parseQuery(raw, ticket, registry, kind, { cursors });
  } catch (error) {
    expect(error).toBeInstanceOf(ApiError);
    const apiError = error as ApiError;
    expect(apiError.status).toBe(400);
    return apiError.errors.map((e) => [e.code, e.source && 'parameter' in e.source ? e.source.parameter : undefined, e.detail]);
  }
  throw new Error('the query was accepted');
}

describe('query parsing: defaults', () => {
  it('an empty query lists by id, 25 at a time, with no filter, include or fields', () => {
    expect(list({})).toEqual({
      include: {},
      fields: new Map(),
      filter: undefined,
      sort: [{ attribute: 'id', direction: 'asc', nulls: 'last' }],
      page: { limit: 25, count: false },
    });
  });
});

describe('query parsing: filters', () => {
  it('converts each value to its attribute type', () => {
    const { filter } = list({
      filter: { status: 'open', priority: { greater_than: '2' }, urgent: 'true', due_at: { less_than: '2026-01-31T12:00:00+01:00' } },
    });
    expect(filter).toEqual({
      kind: 'and',
      children: [
        { kind: 'condition', attribute: 'status', operator: 'eq', value: 'open' },
        { kind: 'condition', attribute: 'priority', operator: 'greater_than', value: 2 },
        { kind: 'condition', attribute: 'urgent', operator: 'eq', value: true },
        { kind: 'condition', attribute: 'due_at', operator: 'less_than', value: new Date('2026-01-31T11:00:00Z') },
      ],
    });
  });

  it('takes one condition as itself, `in` lists, uuids lower-cased, is_nil and JSON objects', () => {
    expect(list({ filter: { status: { in: 'open,closed' } } }).filter).toEqual({
      kind: 'condition',
      attribute: 'status',
      operator: 'in',
      value: ['open', 'closed'],
    });
    expect(list({ filter: { queue_id: 'AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE' } }).filter).toMatchObject({
      value: 'aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee',
    });
    expect(list({ filter: { priority: { is_nil: 'true' } } }).filter).toMatchObject({ operator: 'is_nil', value: true });
    expect(list({ filter: { metadata: { contains: '{"problem":"late delivery"}' } } }).filter).toEqual({
      kind: 'condition',
      attribute: 'metadata',
      operator: 'contains',
      value: { problem: 'late delivery' },
    });
    expect(list({ filter: { labels: { contains: 'vip' } } }).filter).toMatchObject({ operator: 'contains', value: 'vip' });
  });

  it('builds or / not groups from indexed members', () => {
    const { filter } = list({ filter: { or: { 0: { status: 'open' }, 1: { not: { urgent: 'false' } } } } });
    expect(filter).toEqual({
      kind: 'or',
      children: [
        { kind: 'condition', attribute: 'status', operator: 'eq', value: 'open' },
        { kind: 'not', child: { kind: 'condition', attribute: 'urgent', operator: 'eq', value: false } },
      ],
    });
  });

  it('reports every bad condition at once, each with its parameter', () => {
    expect(
      problems({
        filter: {
          status: 'pending',
          priority: { greater_than: 'high', between: '1' },
          title: { less_than: ['a', 'b'] },
          secret: 'x',
          score: '1',
          labels: 'vip',
          urgent: { less_than: 'true' },
          or: { first: { status: 'open' } },
        },
      }),
    ).toEqual([
      ['invalid_filter', 'filter[status]', 'The value must be one of: open, closed.'],
      ['invalid_filter', 'filter[priority][greater_than]', 'The value must be an integer.'],
      ['invalid_filter', 'filter[priority][between]', expect.stringContaining('Unknown operator `between`')],
      ['invalid_filter', 'filter[title][less_than]', 'The value must be a single string.'],
      ['invalid_filter', 'filter[secret]', 'Ticket cannot be filtered by `secret`.'],
      ['invalid_filter', 'filter[score]', 'Ticket cannot be filtered by `score`.'],
      ['invalid_filter', 'filter[labels]', 'Lists take `contains` or `is_nil` only.'],
      ['invalid_filter', 'filter[urgent][less_than]', '`less_than` does not apply to this attribute.'],
      ['invalid_filter', 'filter[or]', expect.stringContaining('takes indexed filters')],
    ]);
  });

  it('refuses too deep nesting and malformed values', () => {
    const deep = { not: { not: { not: { not: { status: 'open' } } } } };
    expect(problems({ filter: deep })).toEqual([['invalid_filter', 'filter[not][not][not][not]', 'Filters nest at most 4 levels.']]);
    expect(problems({ filter: 'open' })).toEqual([['invalid_filter', 'filter', expect.stringContaining('must name attributes')]]);
    expect(problems({ filter: { metadata: '[1]', due_at: '31/01/2026', title: 'a\u0000' } })).toEqual([
      ['invalid_filter', 'filter[metadata]', 'The value must be a JSON object.'],
      ['invalid_filter', 'filter[due_at]', expect.stringContaining('RFC 3339')],
      ['invalid_filter', 'filter[title]', 'The value contains characters that cannot be stored.'],
    ]);
  });
});

describe('query parsing: sort', () => {
  it('reads directions and null placement, and ends with id', () => {
    expect(list({ sort: '-priority,++due_at,+title' }).sort).toEqual([
      { attribute: 'priority', direction: 'desc', nulls: 'first' },
      { attribute: 'due_at', direction: 'asc', nulls: 'first' },
      { attribute: 'title', direction: 'asc', nulls: 'last' },
      { attribute: 'id', direction: 'asc', nulls: 'last' },
    ]);
    // An unencoded `+` arrives as a space; `--` is descending with nulls last.
    expect(list({ sort: ' title,--priority' }).sort.slice(0, 2)).toEqual([
      { attribute: 'title', direction: 'asc', nulls: 'last' },
      { attribute: 'priority', direction: 'desc', nulls: 'last' },
    ]);
    // Keys after id change nothing: id is unique.
    expect(list({ sort: '-id,title' }).sort).toEqual([{ attribute: 'id', direction: 'desc', nulls: 'first' }]);
  });

  it('refuses unsortable, unknown and repeated keys together', () => {
    expect(problems({ sort: 'urgent,nothing,title,-title,+-x' })).toEqual([
      ['invalid_sort', 'sort', '`urgent` is not a sort key of Ticket.'],
      ['invalid_sort', 'sort', '`nothing` is not a sort key of Ticket.'],
      ['invalid_sort', 'sort', '`title` appears twice.'],
      ['invalid_sort', 'sort', '`+-x` is not a sort key of Ticket.'],
    ]);
  });
});

describe('query parsing: page', () => {
  it('clamps the limit, takes offsets and counts', () => {
    expect(list({ page: { limit: '500', offset: '40', count: 'true' } }).page).toEqual({ limit: 100, offset: 40, count: true });
  });

  it('round-trips a cursor for the same sort only', () => {
    const sort = list({ sort: 'title' }).sort;
    const after = cursors.encode(sort, { values: ['b'], id: '01890000-0000-7000-8000-000000000000' });
    expect(list({ sort: 'title', page: { after } }).page.after).toEqual({ values: ['b'], id: '01890000-0000-7000-8000-000000000000' });
    expect(problems({ sort: '-title', page: { after } })).toEqual([
      ['invalid_pagination', 'page[after]', expect.stringContaining('not valid')],
    ]);
    const tampered = `${after.slice(0, -2)}${after.endsWith('AA') ? 'AB' : 'AA'}`;
    expect(problems({ sort: 'title', page: { after: tampered } })).toEqual([
      ['invalid_pagination', 'page[after]', expect.stringContaining('not valid')],
    ]);
  });

  it('reports every bad page parameter', () => {
    expect(problems({ page: { limit: '0', offset: '10001', count: 'yes', size: '3' } })).toEqual([
      ['invalid_pagination', 'page[limit]', '`page[limit]` must be a positive integer.'],
      ['invalid_pagination', 'page[offset]', '`page[offset]` must be an integer from 0 to 10000.'],
      ['invalid_pagination', 'page[count]', '`page[count]` takes true or false.'],
      ['invalid_pagination', 'page[size]', 'Unknown page parameter `size`.'],
    ]);
  });
});

describe('query parsing: include and fields', () => {
  it('builds the include tree two levels deep', () => {
    expect(list({ include: 'queue,notes.author' }).include).toEqual({ queue: {}, notes: { author: {} } });
  });

  it('refuses unknown, non-includable and too deep paths', () => {
    expect(problems({ include: 'watchers,queue.nothing,notes.ticket.queue' })).toEqual([
      ['invalid_includes', 'include', '`watchers` is not an includable relationship path of Ticket.'],
      ['invalid_includes', 'include', '`queue.nothing` is not an includable relationship path of Ticket.'],
      ['invalid_includes', 'include', '`notes.ticket.queue` is deeper than two levels.'],
    ]);
  });

  it('takes sparse fieldsets per type, attributes and relationships alike', () => {
    expect(list({ fields: { Ticket: 'title,queue', Queue: '' } }).fields).toEqual(
      new Map([
        ['Ticket', new Set(['title', 'queue'])],
        ['Queue', new Set()],
      ]),
    );
  });

  it('refuses unknown types, unknown or write-only fields', () => {
    expect(problems({ fields: { Ticket: 'title,secret,nope', Nothing: 'a', Queue: ['name'] } })).toEqual([
      ['invalid_field', 'fields[Ticket]', 'Ticket has no field `secret`, `nope`.'],
      ['invalid_field', 'fields[Nothing]', '`Nothing` is not a resource type.'],
      ['invalid_field', 'fields[Queue]', 'Give a comma-separated list of field names.'],
    ]);
  });
});

describe('query parsing: parameters per endpoint', () => {
  it('a single-record GET takes include and fields only; unknown parameters are named', () => {
    expect(problems({ sort: 'title', filter: { status: 'open' }, page: { limit: '1' }, q: 'x' }, 'single')).toEqual([
      ['unknown_parameter', 'sort', 'This endpoint does not take `sort`.'],
      ['unknown_parameter', 'filter', 'This endpoint does not take `filter`.'],
      ['unknown_parameter', 'page', 'This endpoint does not take `page`.'],
      ['unknown_parameter', 'q', 'This endpoint does not take `q`.'],
    ]);
  });
});
