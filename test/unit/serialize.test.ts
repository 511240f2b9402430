/**
 * The precompiled rendering of resource objects as JSON text must be exactly what serialising the rendered
 * objects gives, for every resource: same members, order and values (dates, nulls, JSON values, to-one
 * linkage, related links, self links).
 */
import { describe, expect, it } from 'vitest';
import { buildRegistry } from '../../src/jsonapi/routes.js';
import qs from 'qs';
import { documentJson, document, queryString, renderResource, type RenderContext, type Row } from '../../src/jsonapi/serialize.js';
import { linkageColumn } from '../../src/jsonapi/select.js';
import { resources } from '../../src/resources/index.js';

const registry = buildRegistry(resources);
const ctx: RenderContext = {
  baseUrl: 'https://parley.example:8443',
  principal: {
    organisationId: '01890000-0000-7000-8000-000000000001',
    userId: null,
    role: 'admin',
    credential: 'secret_key',
    credentialId: 'k',
  },
  registry,
  fields: new Map(),
};

/** A row with a value of the attribute's kind, or null, for every attribute and to-one relationship. */
function row(resource: (typeof resources)[number], variant: number): Row {
  const values: Row = { id: `01890000-0000-7000-8000-00000000000${variant}` };
  let n = 0;
  for (const [name, def] of Object.entries(resource.attributes)) {
    n++;
    if ((n + variant) % 4 === 0) {
      values[name] = null;
      continue;
    }
    const kind = def.kind;
    values[name] =
      kind === 'timestamp'
        ? new Date(Date.UTC(2026, 0, 2, 3, 4, 5, 678 + variant))
        : kind === 'integer'
          ? n * 7 + variant
          : kind === 'boolean'
            ? variant % 2 === 0
            : kind === 'object'
              ? { nested: { list: [1, 'two', null], quote: 'say "hi"\n' }, n }
              : kind === 'string_array'
                ? ['a', `b${variant}`]
                : `value "${name}" ${variant} \u2028 é`;
  }
  for (const [name, relationship] of Object.entries(resource.relationships)) {
    if (relationship.cardinality === 'one')
      values[linkageColumn(name)] = variant % 2 ? null : `01890000-0000-7000-8000-0000000000${10 + variant}`;
  }
  return values;
}

describe('documentJson', () => {
  for (const resource of resources) {
    it(`renders ${resource.type} exactly as the serialised resource object`, () => {
      for (const variant of [0, 1, 2, 3]) {
        const r = row(resource, variant);
        expect(documentJson(resource, r, ctx, {})).toBe(JSON.stringify(document(renderResource(resource, r, ctx), [], {})));
      }
    });
  }

  it('documentJson is the serialised document', () => {
    const resource = resources.find((r) => r.type === 'Conversation')!;
    const rows = [row(resource, 0), row(resource, 1)];
    const links = { self: `${ctx.baseUrl}/api/conversations`, next: null };
    expect(documentJson(resource, rows, ctx, { page: { limit: 25 } }, links)).toBe(
      JSON.stringify(
        document(
          rows.map((r) => renderResource(resource, r, ctx)),
          [],
          { page: { limit: 25 } },
          links,
        ),
      ),
    );
    expect(documentJson(resource, rows[0], ctx, {})).toBe(JSON.stringify(document(renderResource(resource, rows[0], ctx), [], {})));
    expect(documentJson(resource, [], ctx, { page: { limit: 25 } })).toBe(JSON.stringify(document([], [], { page: { limit: 25 } })));
  });
});

describe('queryString', () => {
  it("is qs's RFC 3986 encoding, keys and values alike", () => {
    const cases: Record<string, unknown>[] = [
      { page: { after: 'WyJpZDph.ZB27eSp-_~' } },
      { filter: { name: "a b&c=d/é()*!'" }, sort: '-id' },
      { filter: { status: { in: ['a', 'b c'] } }, include: 'conversation_items' },
      { 'weird key[]': 'x', n: 5, b: true, z: null },
      {},
    ];
    for (const query of cases) {
      const text = qs.stringify(query, { encode: true, encodeValuesOnly: false });
      expect(queryString(query)).toBe(text ? `?${text}` : '');
    }
  });
});
