/** The browser's API types (web/api/schema.d.ts) are generated from the server's resources and must match them. */
import { readFileSync } from 'node:fs';
import { expect, it } from 'vitest';
import { apiTypes } from '../web/scripts/api-types.js';

it('web/api/schema.d.ts matches the OpenAPI document (run `npm run web:types` after changing a resource)', async () => {
  expect(readFileSync(new URL('../web/api/schema.d.ts', import.meta.url), 'utf8')).toBe(await apiTypes());
});
