/**
 * What the interactive reference's "Try it out" sends: each list operation's `fields` and `filter` examples,
 * serialised as deepObject parameters, answer 2xx (they used to pre-fill "string" for every type and a value
 * for every filterable attribute, which answered 400).
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { buildOpenApi } from '../src/jsonapi/openapi.js';
import { resources } from '../src/resources/index.js';
import { client } from './helpers/http.js';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant } from './support/seed.js';

let t: TestApp;
beforeAll(async () => {
  t = await startTestApp();
});
afterAll(async () => t?.close());

/** `name[key]=value` and `name[key][op]=value`, as Swagger UI serialises a deepObject. */
function deepObject(name: string, value: Record<string, unknown>): string[] {
  return Object.entries(value).flatMap(([key, inner]) =>
    inner !== null && typeof inner === 'object'
      ? Object.entries(inner as Record<string, unknown>).map(([op, v]) => `${name}[${key}][${op}]=${encodeURIComponent(String(v))}`)
      : [`${name}[${key}]=${encodeURIComponent(String(inner))}`],
  );
}

it("answers 2xx to every list operation's fields and filter examples", async () => {
  const tenant = await seedTenant(t, 'Examples');
  const admin = client(t.app, tenant.admin.token);
  const doc = buildOpenApi(resources) as { paths: Record<string, Record<string, { parameters?: { name: string; example?: unknown }[] }>> };
  let checked = 0;
  for (const [path, methods] of Object.entries(doc.paths)) {
    const parameters = methods.get?.parameters ?? [];
    const examples = parameters.filter((p) => (p.name === 'fields' || p.name === 'filter') && p.example !== undefined);
    if (path.includes('{') || examples.length < 2) continue;
    const query = examples.flatMap((p) => deepObject(p.name, p.example as Record<string, unknown>)).join('&');
    const response = await admin.get(`${path}?${query}`);
    expect(response.status, `${path}?${query}: ${JSON.stringify(response.body.errors ?? '')}`).toBe(200);
    checked += 1;
  }
  expect(checked).toBeGreaterThan(10);
  const conversations = doc.paths['/api/conversations'].get.parameters!.filter((p) => p.name === 'fields' || p.name === 'filter');
  expect(conversations.map((p) => p.example)).toEqual([
    { Conversation: expect.stringMatching(/^\w+,\w+$/) },
    { created_at: { less_than: '2999-01-01T00:00:00Z' } },
  ]);
});
