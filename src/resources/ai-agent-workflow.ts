/**
 * The JSON Schema of an AiAgent's `workflow` (docs/agents.md explains each
 * step with examples). It lives with the resource, which validates it on
 * create and update; the agent runtime (src/agents/workflow.ts) interprets it.
 * An empty object is the default: no scripted steps, model turns only.
 */
import { Ajv, type ErrorObject as AjvError } from 'ajv';
import { ApiError, errorObject } from '../jsonapi/index.js';

const id = { type: 'string', pattern: '^[A-Za-z0-9_.-]{1,64}$', description: 'A name for the step, unique in the workflow.' };
const text = { type: 'string', minLength: 1, maxLength: 4000 };
/** A condition on the conversation: the latest user message, or an answer stored by a question, matches a regex. */
const when = {
  type: 'object',
  additionalProperties: false,
  required: ['matches'],
  properties: {
    field: {
      type: 'string',
      pattern: '^[A-Za-z0-9_.-]{1,64}$',
      description: 'A conversation metadata key; default: the latest user message.',
    },
    matches: {
      type: 'string',
      minLength: 1,
      maxLength: 500,
      format: 'regex',
      description: 'A JavaScript regular expression, matched case-insensitively.',
    },
  },
};

export const WORKFLOW_SCHEMA = {
  $id: 'https://parley.dev/schemas/ai-agent-workflow.json',
  type: 'object',
  additionalProperties: false,
  properties: {
    steps: {
      type: 'array',
      maxItems: 100,
      items: {
        type: 'object',
        required: ['type'],
        properties: { type: { enum: ['message', 'question', 'model', 'handoff', 'end'] } },
        allOf: [
          {
            if: { properties: { type: { const: 'message' } } },
            then: { additionalProperties: false, required: ['type', 'text'], properties: { type: {}, id, text } },
          },
          {
            if: { properties: { type: { const: 'question' } } },
            then: {
              additionalProperties: false,
              required: ['type', 'text', 'store_as'],
              properties: { type: {}, id, text, store_as: { type: 'string', pattern: '^[A-Za-z0-9_.-]{1,64}$' } },
            },
          },
          {
            if: { properties: { type: { const: 'model' } } },
            then: {
              additionalProperties: false,
              required: ['type'],
              properties: { type: {}, id, instructions: text, max_turns: { type: 'integer', minimum: 1, maximum: 1000 } },
            },
          },
          {
            if: { properties: { type: { const: 'handoff' } } },
            then: {
              additionalProperties: false,
              required: ['type', 'reason'],
              properties: { type: {}, id, reason: { type: 'string', minLength: 1, maxLength: 500 }, text, when },
            },
          },
          {
            if: { properties: { type: { const: 'end' } } },
            then: { additionalProperties: false, required: ['type'], properties: { type: {}, id, text, close: { type: 'boolean' } } },
          },
        ],
      },
    },
  },
} as const;

export type WorkflowStep =
  | { type: 'message'; id?: string; text: string }
  | { type: 'question'; id?: string; text: string; store_as: string }
  | { type: 'model'; id?: string; instructions?: string; max_turns?: number }
  | { type: 'handoff'; id?: string; reason: string; text?: string; when?: { field?: string; matches: string } }
  | { type: 'end'; id?: string; text?: string; close?: boolean };

export interface Workflow {
  steps?: WorkflowStep[];
}

const ajv = new Ajv({ allErrors: true, strict: false });
// `format: regex`: the pattern must compile as a JavaScript regular expression (ajv-formats is not needed for one format).
ajv.addFormat('regex', (value: string) => {
  try {
    new RegExp(value, 'i');
    return true;
  } catch {
    return false;
  }
});
const validate = ajv.compile(WORKFLOW_SCHEMA);

/** The failing schema branches of `if/then` repeat their error as "must match then schema": only the specific ones are kept. */
function problems(errors: AjvError[]): { pointer: string; detail: string }[] {
  const seen = new Set<string>();
  const out: { pointer: string; detail: string }[] = [];
  for (const e of errors) {
    if (e.keyword === 'if') continue;
    let pointer = e.instancePath;
    let detail = e.message ?? 'is invalid';
    if (e.keyword === 'additionalProperties') {
      const extra = (e.params as { additionalProperty: string }).additionalProperty;
      pointer = `${pointer}/${extra}`;
      detail = 'is not a property this step has';
    } else if (e.keyword === 'required') {
      const missing = (e.params as { missingProperty: string }).missingProperty;
      pointer = `${pointer}/${missing}`;
      detail = 'is required';
    } else if (e.keyword === 'format' && (e.params as { format: string }).format === 'regex') {
      detail = 'must be a valid regular expression';
    }
    const key = `${pointer} ${detail}`;
    if (seen.has(key)) continue;
    seen.add(key);
    out.push({ pointer, detail });
  }
  return out;
}

/** Problems of a workflow value, each with the JSON pointer inside it (`/steps/2/type`); empty when valid. */
export function workflowProblems(workflow: unknown): { pointer: string; detail: string }[] {
  const found = validate(workflow) ? [] : problems(validate.errors ?? []);
  const steps = (workflow as Workflow | null)?.steps;
  return Array.isArray(steps) ? [...found, ...duplicateIds(steps)] : found;
}

/** Throws a 422 naming every problem at `/data/attributes/workflow/...`. */
export function assertWorkflow(workflow: unknown): void {
  const found = workflowProblems(workflow);
  if (found.length === 0) return;
  throw new ApiError(
    found.map((p) =>
      errorObject('invalid_attribute', `\`workflow${p.pointer.replaceAll('/', '.')}\` ${p.detail}.`, {
        pointer: `/data/attributes/workflow${p.pointer}`,
      }),
    ),
  );
}

function duplicateIds(steps: unknown[]) {
  const found: { pointer: string; detail: string }[] = [];
  const ids = new Map<string, number>();
  steps.forEach((step, index) => {
    const id = (step as { id?: unknown } | null)?.id;
    if (typeof id !== 'string') return;
    if (ids.has(id)) found.push({ pointer: `/steps/${index}/id`, detail: `repeats the id of step ${ids.get(id)}` });
    ids.set(id, index);
  });
  return found;
}
