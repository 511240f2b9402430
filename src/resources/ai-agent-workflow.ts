/**
 * The JSON Schema of an AiAgent's `workflow` (docs/agents.md explains each
 * step with examples). It lives with the resource, which validates it on
 * create and update; the agent runtime (src/agents/workflow.ts) interprets it.
 * An empty object is the default: no scripted steps, model turns only.
 */
import { Ajv, type ErrorObject as AjvError, type ValidateFunction } from 'ajv';
import { ApiError, errorObject } from '../jsonapi/index.js';
import { urlFormProblem } from './webhook-url.js';
import { at } from './pointer.js';

/** A name in a workflow: a step's id, a metadata key. */
const NAME = { type: 'string', pattern: '^[A-Za-z0-9_.-]{1,64}$' };
const id = { ...NAME, description: 'A name for the step, unique in the workflow.' };
const text = { type: 'string', minLength: 1, maxLength: 4000 };
/** A condition on the conversation: the latest user message, or an answer stored by a question, matches a regex. */
const when = {
  type: 'object',
  additionalProperties: false,
  required: ['matches'],
  properties: {
    field: { ...NAME, description: 'A conversation metadata key; default: the latest user message.' },
    matches: {
      type: 'string',
      minLength: 1,
      maxLength: 500,
      format: 'regex',
      description: 'A JavaScript regular expression, matched case-insensitively.',
    },
  },
};

/** Each step type's own properties beside `type` and `id` (no others), and those it requires. */
const STEPS = {
  message: { required: ['text'], properties: { text } },
  question: { required: ['text', 'store_as'], properties: { text, store_as: NAME } },
  model: { required: [], properties: { instructions: text, max_turns: { type: 'integer', minimum: 1, maximum: 1000 } } },
  handoff: { required: ['reason'], properties: { reason: { type: 'string', minLength: 1, maxLength: 500 }, text, when } },
  end: { required: [], properties: { text, close: { type: 'boolean' } } },
};

/**
 * Names of the built-in tools (src/agents/tools.ts holds their definitions; a test checks both lists agree).
 * A declared tool may not take one: the model would see two tools of one name.
 */
export const BUILT_IN_TOOL_NAMES = [
  'handoff_to_operator',
  'end_conversation',
  'transfer_call',
  'store_answer',
  'search_knowledge',
] as const;

/** Bounds of a tool's `timeout_ms`: a voice caller waits for it, so it is short. */
export const TOOL_TIMEOUT_MS = { min: 100, max: 30_000, default: 5000 } as const;

/** A tool the model may call, answered by the organisation's HTTPS endpoint (docs/agents.md, "Tools"). */
const tool = {
  type: 'object',
  additionalProperties: false,
  required: ['name', 'description', 'parameters', 'url'],
  properties: {
    // OpenAI's function-name rule: letters, digits, _ and -, at most 64.
    name: { type: 'string', pattern: '^[A-Za-z0-9_-]{1,64}$' },
    description: { type: 'string', minLength: 1, maxLength: 1000 },
    parameters: { type: 'object', description: "A JSON Schema (draft 2020-12 or 07) of the call's arguments; its type is object." },
    url: { type: 'string', minLength: 1, maxLength: 2048 },
    timeout_ms: { type: 'integer', minimum: TOOL_TIMEOUT_MS.min, maximum: TOOL_TIMEOUT_MS.max },
    say_while_waiting: { type: 'string', minLength: 1, maxLength: 500 },
  },
};

export const WORKFLOW_SCHEMA = {
  $id: 'https://parley.dev/schemas/ai-agent-workflow.json',
  type: 'object',
  additionalProperties: false,
  properties: {
    tools: { type: 'array', maxItems: 20, items: tool },
    steps: {
      type: 'array',
      maxItems: 100,
      items: {
        type: 'object',
        required: ['type'],
        properties: { type: { enum: Object.keys(STEPS) } },
        allOf: Object.entries(STEPS).map(([type, step]) => ({
          if: { properties: { type: { const: type } } },
          then: { additionalProperties: false, required: ['type', ...step.required], properties: { type: {}, id, ...step.properties } },
        })),
      },
    },
    knowledge: {
      type: 'object',
      additionalProperties: false,
      description: 'How model turns use the agent\'s knowledge documents (docs/agents.md, "Knowledge").',
      properties: {
        mode: {
          enum: ['tool', 'retrieve', 'off'],
          description:
            'tool: the model may call search_knowledge (default when the agent has documents); retrieve: the best passages for the user message go into the prompt before each model turn; off: neither.',
        },
        max_results: { type: 'integer', minimum: 1, maximum: 10, description: 'Passages per search (default 4).' },
      },
    },
    analysis: {
      type: 'object',
      additionalProperties: false,
      description: 'The analysis of the finished conversation (docs/agents.md, "Analysis").',
      properties: {
        schema: {
          type: 'object',
          description: 'A JSON Schema (draft 2020-12 subset that ajv compiles) for `analysis.data`.',
        },
        success_criteria: { type: 'string', minLength: 1, maxLength: 2000, description: 'What makes the conversation a success.' },
        instructions: { type: 'string', minLength: 1, maxLength: 4000, description: 'Further instructions for the analysis.' },
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

export interface WorkflowTool {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
  url: string;
  timeout_ms?: number;
  say_while_waiting?: string;
}

export interface Workflow {
  steps?: WorkflowStep[];
  tools?: WorkflowTool[];
  knowledge?: { mode?: 'tool' | 'retrieve' | 'off'; max_results?: number };
  analysis?: { schema?: Record<string, unknown>; success_criteria?: string; instructions?: string };
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
/** The agents' analysis schemas, compiled by their own instance (not the workflow's). */
const analysisAjv = new Ajv({ allErrors: true, strict: false });

/**
 * Compiles an agent's analysis schema (throws when it does not compile). Ajv keeps each compiled schema by its
 * object (and `$id`): it is removed again at once, so that agents' schemas neither accumulate nor collide.
 */
export function compileAnalysisSchema(schema: object) {
  try {
    return analysisAjv.compile(schema);
  } finally {
    analysisAjv.removeSchema(schema);
  }
}
/** Compiled on first use, not when the module loads: a process that never checks a workflow (most commands) does not pay for it. */
let compiledWorkflow: ValidateFunction | undefined;
const workflowValidator = (): ValidateFunction => (compiledWorkflow ??= ajv.compile(WORKFLOW_SCHEMA));

/** The failing schema branches of `if/then` repeat their error as "must match then schema": only the specific ones are kept. */
function problems(errors: AjvError[]): { pointer: string; detail: string }[] {
  // By pointer and detail: a repeat keeps its first place.
  const out = new Map<string, { pointer: string; detail: string }>();
  for (const e of errors) {
    if (e.keyword === 'if') continue;
    let pointer = e.instancePath;
    let detail = e.message ?? 'is invalid';
    if (e.keyword === 'additionalProperties') {
      const extra = (e.params as { additionalProperty: string }).additionalProperty;
      pointer = `${pointer}/${extra}`;
      detail = pointer.startsWith('/tools/') ? 'is not a property a tool has' : 'is not a property this step has';
    } else if (e.keyword === 'required') {
      const missing = (e.params as { missingProperty: string }).missingProperty;
      pointer = `${pointer}/${missing}`;
      detail = 'is required';
    } else if (e.keyword === 'format' && (e.params as { format: string }).format === 'regex') {
      detail = 'must be a valid regular expression';
    }
    out.set(`${pointer} ${detail}`, { pointer, detail });
  }
  return [...out.values()];
}

/** What the checks of a workflow depend on: `WEBHOOK_ALLOW_PRIVATE_URLS` lets tools use http and private addresses. */
export interface WorkflowRules {
  allowPrivateUrls?: boolean;
}

/** Problems of a workflow value, each with the JSON pointer inside it (`/steps/2/type`); empty when valid. */
export function workflowProblems(workflow: unknown, rules: WorkflowRules = {}): { pointer: string; detail: string }[] {
  const validate = workflowValidator();
  const found = validate(workflow) ? [] : problems(validate.errors ?? []);
  const { steps, tools, analysis } = (workflow ?? {}) as Workflow;
  const all = [...found, ...(Array.isArray(steps) ? duplicateIds(steps) : []), ...(Array.isArray(tools) ? toolProblems(tools, rules) : [])];
  const schema = analysis?.schema;
  if (schema && typeof schema === 'object' && !Array.isArray(schema)) {
    try {
      compileAnalysisSchema(schema);
    } catch (error) {
      all.push({ pointer: '/analysis/schema', detail: `must be a JSON Schema that compiles (${(error as Error).message})` });
    }
  }
  return all;
}

/** Throws a 422 naming every problem at `/data/attributes/workflow/...`. */
export function assertWorkflow(workflow: unknown, rules: WorkflowRules = {}): void {
  const found = workflowProblems(workflow, rules);
  if (found.length === 0) return;
  throw new ApiError(
    found.map((p) =>
      errorObject('invalid_attribute', `\`workflow${p.pointer.replaceAll('/', '.')}\` ${p.detail}.`, at(`workflow${p.pointer}`)),
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

/** Compiles declared parameter schemas; a separate instance, so that they never meet the workflow's own. */
const parametersAjv = new Ajv({ allErrors: true, strict: false });

/**
 * A tool's `parameters` compiled into a validator, or the reason it is not a usable schema. Cached by its
 * JSON text: the runtime validates every call's arguments with it, and compiling is the costly part.
 */
const compiled = new Map<string, ReturnType<typeof parametersAjv.compile> | string>();
export function compileParameters(schema: unknown): ReturnType<typeof parametersAjv.compile> | string {
  const key = JSON.stringify(schema);
  const known = compiled.get(key);
  if (known !== undefined) return known;
  let result: ReturnType<typeof parametersAjv.compile> | string;
  if (!schema || typeof schema !== 'object' || Array.isArray(schema)) result = 'must be a JSON Schema object';
  else if ((schema as { type?: unknown }).type !== 'object')
    result = 'must be a JSON Schema whose type is "object" (the call\'s arguments are an object)';
  else if (!parametersAjv.validateSchema(schema as object))
    result = `is not a valid JSON Schema: ${parametersAjv.errorsText(parametersAjv.errors, { dataVar: 'parameters' })}`;
  else {
    try {
      result = parametersAjv.compile(schema as object);
    } catch (error) {
      result = `is not a usable JSON Schema: ${(error as Error).message}`;
    }
  }
  if (compiled.size > 500) compiled.clear();
  compiled.set(key, result);
  return result;
}

/** Names unique and not built-in, parameters a schema, the URL https (or http and private ones under the override). */
function toolProblems(tools: unknown[], rules: WorkflowRules) {
  const found: { pointer: string; detail: string }[] = [];
  const names = new Map<string, number>();
  tools.forEach((value, index) => {
    const tool = value as Partial<WorkflowTool> | null;
    if (!tool || typeof tool !== 'object') return;
    if (typeof tool.name === 'string') {
      if ((BUILT_IN_TOOL_NAMES as readonly string[]).includes(tool.name))
        found.push({ pointer: `/tools/${index}/name`, detail: 'is the name of a built-in tool' });
      else if (names.has(tool.name))
        found.push({ pointer: `/tools/${index}/name`, detail: `repeats the name of tool ${names.get(tool.name)}` });
      names.set(tool.name, index);
    }
    if (tool.parameters !== undefined && typeof tool.parameters === 'object' && tool.parameters !== null) {
      const schema = compileParameters(tool.parameters);
      if (typeof schema === 'string') found.push({ pointer: `/tools/${index}/parameters`, detail: schema });
    }
    if (typeof tool.url === 'string') {
      // The URL's form only: its addresses are checked when it is called, after the name is resolved (the answer
      // may change between the two: checking then is what keeps internal services out of reach).
      const problem = urlFormProblem(tool.url, rules.allowPrivateUrls === true, 'https://example.com/tools/lookup');
      if (problem) found.push({ pointer: `/tools/${index}/url`, detail: problem });
    }
  });
  return found;
}
