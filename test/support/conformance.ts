import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
/** The official JSON:API response schema, vendored with its source and licence in test/vendor/jsonapi. */
const schemaPath = path.resolve(repoRoot, 'test', 'vendor', 'jsonapi', 'schema.json');

const ajv = new Ajv2020.default({ allErrors: true, strict: false });
addFormats.default(ajv);
const validate = ajv.compile(JSON.parse(fs.readFileSync(schemaPath, 'utf8')));

/** Throws with the schema's complaints when `document` is not a valid JSON:API response document. */
export function expectJsonApi(document: unknown): void {
  if (!validate(document)) {
    throw new Error(`not a valid JSON:API document: ${ajv.errorsText(validate.errors)}\n${JSON.stringify(document).slice(0, 2000)}`);
  }
}
