/**
 * Writes typed by resource (src/jsonapi/typed-writes.ts). The `@ts-expect-error` lines are the compile-time
 * half: `tsc -p tsconfig.json` fails if any of them stops being an error (a misspelt attribute, a value of the
 * wrong type, an undeclared one). The run-time half shows the typed record is the one stored, and that a type
 * named by a run-time string (as the HTTP routes name it) is still refused by the validator.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganisation } from '../src/auth/accounts.js';
import { systemActor } from '../src/jsonapi/actor.js';
import { ApiError } from '../src/jsonapi/errors.js';
import type { Records } from '../src/jsonapi/records.js';
import { startTestApp, type TestApp } from './support/app.js';

let t: TestApp;
let records: Records;
let org: string;

beforeAll(async () => {
  t = await startTestApp();
  records = t.services.records!;
  org = (await createOrganisation(records, { name: 'Typed writes' })).id;
});
afterAll(async () => {
  await t?.close();
});

describe('typed writes', () => {
  it('types the values and the returned record by the resource', async () => {
    const actor = systemActor(org, 'cli');
    const { id, record } = await records.create(actor, 'AiAgent', { name: 'Typed', languages: ['en'], published: false });
    const name: string = record.attributes.name;
    const languages: string[] = record.attributes.languages;
    // A timestamp comes back as RFC 3339 text.
    const created: string = record.attributes.created_at;
    expect({ name, languages, type: record.type }).toEqual({ name: 'Typed', languages: ['en'], type: 'AiAgent' });
    expect(created).toMatch(/^\d{4}-\d\d-\d\dT/);

    const updated = await records.update(actor, 'AiAgent', id, { tone: 'warm', system_prompt: null });
    const tone: string | null = updated.record.attributes.tone;
    expect(tone).toBe('warm');

    const refused = async (work: () => Promise<unknown>) => {
      const error = await work().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(ApiError);
      return (error as ApiError).status;
    };
    // @ts-expect-error a misspelt attribute
    expect(await refused(() => records.update(actor, 'AiAgent', id, { tonee: 'warm' }))).toBe(422);
    // @ts-expect-error a value of the wrong type for its column (bool)
    expect(await refused(() => records.update(actor, 'AiAgent', id, { published: 'yes' }))).toBe(422);
    // @ts-expect-error a column of the table that is not a declared attribute
    expect(await refused(() => records.create(actor, 'AiAgent', { name: 'x', organisation_id: org }))).toBe(422);
    // Named at run time, as the routes name it: open values, and the validator refuses them all the same.
    const type: string = 'AiAgent';
    expect(await refused(() => records.update(actor, type, id, { tonee: 'warm' }))).toBe(422);
  });
});
