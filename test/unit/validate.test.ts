import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/jsonapi/errors.js';
import type { AttributeDef } from '../../src/jsonapi/resource.js';
import { convertTimestamp } from '../../src/jsonapi/kinds.js';
import { validateBody } from '../../src/jsonapi/validate.js';
import { ticket } from './fixtures.js';

const accepted: Record<string, AttributeDef> = ticket.attributes;
const create = (attributes: Record<string, unknown>) =>
  validateBody({ data: { type: 'Ticket', attributes } }, { type: 'Ticket', kind: 'create', accepted, required: ['title'] });

/** The refusal's errors as [status, code, pointer, detail]. */
function refusal(run: () => unknown): [string, string, string | undefined, string | undefined][] {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(ApiError);
    return (error as ApiError).errors.map((e) => [
      e.status,
      e.code,
      e.source && 'pointer' in e.source ? e.source.pointer : undefined,
      e.detail,
    ]);
  }
  throw new Error('the document was accepted');
}

describe('value conversion', () => {
  it('converts every kind to its stored form', () => {
    expect(
      create({
        title: 'Printer',
        status: 'closed',
        priority: 5,
        urgent: false,
        due_at: '2026-01-31T12:00:00.123+02:00',
        metadata: { floor: 3, tags: ['a'] },
        labels: ['x', 'y'],
        queue_id: 'AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE',
        secret: 's',
      }),
    ).toEqual({
      title: 'Printer',
      status: 'closed',
      priority: 5,
      urgent: false,
      due_at: new Date('2026-01-31T10:00:00.123Z'),
      metadata: { floor: 3, tags: ['a'] },
      labels: ['x', 'y'],
      queue_id: 'aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee',
      secret: 's',
    });
  });

  it('takes an object whose only member is `problem` as a value, not as an error', () => {
    expect(create({ title: 'Late', metadata: { problem: 'late delivery' } })).toEqual({
      title: 'Late',
      metadata: { problem: 'late delivery' },
    });
  });

  it('takes null only where the attribute is nullable', () => {
    expect(create({ title: 'a', priority: null, due_at: null })).toEqual({ title: 'a', priority: null, due_at: null });
    expect(refusal(() => create({ title: null }))).toEqual([
      ['422', 'invalid_attribute', '/data/attributes/title', '`title` must not be null.'],
    ]);
  });

  it('reports every invalid attribute at once, each with its pointer', () => {
    expect(
      refusal(() =>
        create({
          title: 'x'.repeat(21),
          status: 'pending',
          priority: 6,
          urgent: 'yes',
          due_at: '2026-02-30T00:00:00Z',
          metadata: [1],
          labels: ['ok', 'toolong'],
          queue_id: 'not-a-uuid',
          colour: 'red',
        }),
      ),
    ).toEqual([
      ['422', 'invalid_attribute', '/data/attributes/title', '`title` must have at most 20 characters.'],
      ['422', 'invalid_attribute', '/data/attributes/status', '`status` must be one of: open, closed.'],
      ['422', 'invalid_attribute', '/data/attributes/priority', '`priority` must be between 1 and 5.'],
      ['422', 'invalid_attribute', '/data/attributes/urgent', '`urgent` must be true or false.'],
      ['422', 'invalid_attribute', '/data/attributes/due_at', expect.stringContaining('`due_at` must be an RFC 3339 date-time')],
      ['422', 'invalid_attribute', '/data/attributes/metadata', '`metadata` must be a JSON object.'],
      ['422', 'invalid_attribute', '/data/attributes/labels', '`labels` item 1 must have at most 5 characters.'],
      ['422', 'invalid_attribute', '/data/attributes/queue_id', '`queue_id` must be a UUID.'],
      ['422', 'unknown_attribute', '/data/attributes/colour', '`colour` cannot be set by this operation.'],
    ]);
  });

  it('bounds JSON objects and lists, refuses NUL and lone surrogates', () => {
    expect(
      refusal(() => create({ title: 'a\u0000', metadata: { text: 'x'.repeat(64) }, labels: ['a', 'b', 'c'], secret: '\ud800' })),
    ).toEqual([
      ['422', 'invalid_attribute', '/data/attributes/title', '`title` must not contain NUL characters.'],
      ['422', 'invalid_attribute', '/data/attributes/metadata', '`metadata` must be at most 64 bytes of JSON.'],
      ['422', 'invalid_attribute', '/data/attributes/labels', '`labels` must have at most 2 items.'],
      ['422', 'invalid_attribute', '/data/attributes/secret', '`secret` must be well-formed Unicode.'],
    ]);
  });

  it('requires required attributes and refuses relationships the operation does not set', () => {
    expect(
      refusal(() =>
        validateBody(
          { data: { type: 'Ticket', attributes: {}, relationships: { queue: { data: null }, owner: { data: null } } } },
          { type: 'Ticket', kind: 'create', accepted, required: ['title'] },
        ),
      ),
    ).toEqual([
      ['422', 'unknown_attribute', '/data/relationships/owner', expect.stringContaining('cannot be set by this operation')],
      ['422', 'required', '/data/attributes/title', '`title` is required.'],
    ]);
  });
});

describe('document envelope', () => {
  const expectation = { type: 'Ticket', kind: 'update' as const, id: '01890000-0000-7000-8000-000000000000', accepted, required: [] };
  it('checks type, id and members, with status and pointer', () => {
    expect(refusal(() => validateBody([], expectation))).toEqual([['400', 'invalid_body', '', 'The body must be a JSON object.']]);
    expect(refusal(() => validateBody({ data: { type: 'Queue', id: expectation.id } }, expectation))).toEqual([
      ['409', 'conflict', '/data/type', 'This endpoint takes `Ticket`, not `Queue`.'],
    ]);
    expect(refusal(() => validateBody({ data: { type: 'Ticket', id: '01890000-0000-7000-8000-000000000001' } }, expectation))).toEqual([
      ['409', 'conflict', '/data/id', '`data.id` does not match the id in the path.'],
    ]);
    expect(refusal(() => validateBody({ data: { type: 'Ticket' }, extra: 1 }, expectation))).toEqual([
      ['400', 'invalid_body', '/extra', 'Unexpected top-level member `extra`.'],
    ]);
    expect(refusal(() => validateBody({ data: { type: 'Ticket', id: 'x' } }, { ...expectation, kind: 'create' }))).toEqual([
      ['403', 'forbidden', '/data/id', 'Ids are assigned by the server.'],
    ]);
  });

  it('an update accepts the id in any case', () => {
    const id = expectation.id.toUpperCase();
    expect(validateBody({ data: { type: 'Ticket', id, attributes: { title: 'b' } } }, expectation)).toEqual({ title: 'b' });
  });
});

describe('timestamps', () => {
  it('parses RFC 3339 with any offset and refuses impossible dates', () => {
    expect(convertTimestamp('2026-01-31t23:59:59.5-01:00')).toEqual({ ok: true, value: new Date('2026-02-01T00:59:59.500Z') });
    expect(convertTimestamp('2026-01-31T12:00:00.987Z', true)).toEqual({ ok: true, value: new Date('2026-01-31T12:00:00Z') });
    for (const bad of [
      '2026-02-29T00:00:00Z',
      '2026-01-31 12:00:00Z',
      '2026-01-31T12:00:00',
      '2026-13-01T00:00:00Z',
      '0999-12-31T00:00:00Z',
      20260131,
    ]) {
      expect(convertTimestamp(bad).ok, String(bad)).toBe(false);
    }
  });
});
