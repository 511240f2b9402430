import { sql } from 'kysely';
import { type ActionContext, ApiError, attr, defineResource, rel } from '../jsonapi/index.js';
import { assertWorkflow } from './ai-agent-workflow.js';
import { ADMINS, EVERY_ROLE } from './scopes.js';
import { timestamps } from './timestamps.js';

/** BCP 47 language tag, e.g. `en`, `en-GB`, `zh-Hant-TW`. */
const LANGUAGE_TAG = '^[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*$';

/** The workflow's own schema (docs/agents.md), with every problem at its exact pointer under /data/attributes/workflow. */
function checkWorkflow(ctx: ActionContext): void {
  if (ctx.values.workflow !== undefined)
    assertWorkflow(ctx.values.workflow, { allowPrivateUrls: ctx.services.config.events.webhookAllowPrivateUrls });
}

/**
 * The agent's knowledge documents go with it (through the records service: each is a `KnowledgeDocument.deleted`
 * event, and its chunks follow it). A delete refused because conversations name the agent rolls them back too.
 */
async function removeKnowledge(ctx: ActionContext): Promise<Record<string, number>> {
  const { rows } = await sql<{ id: string }>`SELECT id FROM knowledge_documents WHERE ai_agent_id = ${ctx.existing!.id}`.execute(ctx.db);
  for (const row of rows) await ctx.records.delete(ctx.actor, 'KnowledgeDocument', row.id);
  return rows.length > 0 ? { KnowledgeDocument: rows.length } : {};
}

/**
 * Created, updated and deleted by owners and admins (or the command line). A delete is refused (409) while
 * conversations name the agent: they keep the agent that answered them; unpublish it instead, or move them.
 */
export default defineResource({
  type: 'AiAgent',
  path: 'ai_agents',
  table: 'ai_agents',
  attributes: {
    name: attr.string({ create: 'required', update: true, minLength: 1, maxLength: 120, sortable: true, filterable: true }),
    voice: attr.string({ create: true, update: true, nullable: true, maxLength: 120 }),
    tone: attr.string({ create: true, update: true, nullable: true, maxLength: 120 }),
    languages: attr.stringArray({
      create: true,
      update: true,
      minItems: 1,
      maxItems: 20,
      items: { pattern: LANGUAGE_TAG, maxLength: 35 },
      filterable: true,
      default: () => ['en'],
    }),
    workflow: attr.object({ create: true, update: true, maxBytes: 64 * 1024, default: () => ({}) }),
    system_prompt: attr.string({ create: true, update: true, nullable: true, maxBytes: 32 * 1024 }),
    safety_guardrails: attr.string({ create: true, update: true, nullable: true, maxBytes: 32 * 1024 }),
    published: attr.boolean({ create: true, update: true, sortable: true, filterable: true, default: false }),
    ...timestamps,
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  operations: { list: true, get: true, create: true, update: true, delete: true },
  beforeInsert: checkWorkflow,
  beforeUpdate: checkWorkflow,
  beforeDelete: removeKnowledge,
  access: { read: EVERY_ROLE, create: ADMINS, update: ADMINS, delete: ADMINS },
  actions: {
    test: {
      path: 'ai_agents/test',
      summary:
        'Run an agent test suite (docs/agents.md) against one of your agents and the configured model, storing nothing; returns the agent and the report in meta.report (meta.report.failed is 0 when every case passed)',
      roles: ADMINS,
      input: {
        ai_agent_id: attr.uuid({ create: 'required' }),
        suite: attr.object({
          create: 'required',
          maxBytes: 256 * 1024,
          description: 'The suite, as the YAML file would hold it, in JSON.',
        }),
      },
      // Outside a transaction: the cases wait on the model for seconds, and a dry run stores nothing.
      transaction: false,
      // One request runs every case against the model: a tighter budget than the API's.
      rateLimitPerAddress: () => ({ max: 30, timeWindowMs: 60_000 }),
      run: async (ctx) => {
        if (!ctx.services.agentTests) throw ApiError.of('unavailable', 'This server does not run agent test suites.');
        const agentId = String(ctx.values.ai_agent_id);
        const report = await ctx.services.agentTests(ctx.principal.organisationId, agentId, ctx.values.suite);
        return { id: agentId, status: 200, meta: { report } };
      },
    },
  },
});
