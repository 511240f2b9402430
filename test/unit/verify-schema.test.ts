/**
 * The declarations against db/schema.ts (src/jsonapi/verify-schema.ts): the real ones match, and a
 * misdeclared attribute (no such column, a kind its column cannot hold, `virtual` over a real column, an
 * undeclared hook-only attribute) is named.
 */
import { describe, expect, it } from 'vitest';
import { attr, type ResourceDef } from '../../src/jsonapi/resource.js';
import { schemaProblems, verifySchema } from '../../src/jsonapi/verify-schema.js';
import { resources } from '../../src/resources/index.js';

/** A copy of a real declaration with `attributes` changed. */
function withAttributes(type: string, change: (a: ResourceDef['attributes']) => void): ResourceDef {
  const resource = resources.find((r) => r.type === type)!;
  const attributes = { ...resource.attributes };
  change(attributes);
  return { ...resource, attributes };
}

describe('declarations against db/schema.ts', () => {
  it('the real declarations match the schema', () => {
    expect(schemaProblems(resources)).toEqual([]);
    expect(() => verifySchema(resources)).not.toThrow();
  });

  it('names an attribute with no column, and one whose kind its column cannot hold', () => {
    const call = withAttributes('Call', (a) => {
      a.duraton_seconds = attr.integer({ create: true });
      a.sip_code = attr.string({ create: true });
      a.started_at = attr.boolean({ create: true });
    });
    expect(schemaProblems([call])).toEqual([
      'Call.started_at: a boolean attribute (boolean) cannot be stored in `calls.started_at` (timestamptz).',
      'Call.sip_code: a string attribute (text) cannot be stored in `calls.sip_code` (int4).',
      'Call.duraton_seconds: `calls` has no column `duraton_seconds` (declare it `virtual` if the hooks store it).',
    ]);
    expect(() => verifySchema([call])).toThrow(/Declarations do not match db\/schema.ts \(3\)/);
  });

  it('a hook-only attribute must be declared virtual, and a virtual one must not shadow a column', () => {
    const user = withAttributes('User', (a) => {
      a.password = { ...a.password, virtual: undefined };
      a.email = { ...a.email, virtual: true };
    });
    expect(schemaProblems([user])).toEqual([
      'User.email: declared `virtual` but `users.email` exists.',
      'User.password: `users` has no column `password` (declare it `virtual` if the hooks store it).',
    ]);
  });

  it('names a table the schema does not have', () => {
    const renamed = { ...resources.find((r) => r.type === 'Gateway')!, table: 'gateway' };
    expect(schemaProblems([renamed])).toEqual(['Gateway: table `gateway` is not in db/schema.ts.']);
  });
});
