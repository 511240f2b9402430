import { attr, defineResource, rel } from '../jsonapi/resource.js';
import { assertWorkflow } from './ai-agent-workflow.js';
import { ADMINS, EVERY_ROLE } from './scopes.js';

/** BCP 47 language tag, e.g. `en`, `en-GB`, `zh-Hant-TW`. */
const LANGUAGE_TAG = '^[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*$';

/** Created by the command line; updated over the API. */
export default defineResource({
  type: 'AiAgent',
  path: 'ai_agents',
  table: 'ai_agents',
  attributes: {
    name: attr.string({ update: true, minLength: 1, maxLength: 120 }),
    voice: attr.string({ update: true, nullable: true, maxLength: 120 }),
    tone: attr.string({ update: true, nullable: true, maxLength: 120 }),
    languages: attr.stringArray({ update: true, minItems: 1, maxItems: 20, items: { pattern: LANGUAGE_TAG, maxLength: 35 } }),
    workflow: attr.object({ update: true, maxBytes: 64 * 1024 }),
    system_prompt: attr.string({ update: true, nullable: true, maxBytes: 32 * 1024 }),
    safety_guardrails: attr.string({ update: true, nullable: true, maxBytes: 32 * 1024 }),
    published: attr.boolean({ update: true }),
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  operations: { update: true },
  // The workflow's own schema (docs/agents.md), with every problem at its exact pointer under /data/attributes/workflow.
  beforeInsert: (ctx) => {
    if (ctx.values.workflow !== undefined) assertWorkflow(ctx.values.workflow);
  },
  beforeUpdate: (ctx) => {
    if (ctx.values.workflow !== undefined) assertWorkflow(ctx.values.workflow);
  },
  access: { read: EVERY_ROLE, update: ADMINS },
});
