import { sql } from 'kysely';
import { uuidv7 } from 'uuidv7';
import { type ActionContext, type ActionResult, ApiError, attr, defineResource, insertRecord, rel } from '../jsonapi/index.js';
import { chunkText, documentText, type KnowledgeContentType, textSearchConfig } from './knowledge-text.js';
import { ADMINS, EVERY_ROLE } from './scopes.js';
import { timestamps } from './timestamps.js';

export const KNOWLEDGE_CONTENT_TYPES = ['text/plain', 'text/markdown', 'text/html'] as const;

/** Chunks written per INSERT statement. */
const CHUNK_BATCH = 100;

const contentError = (detail: string) => ApiError.of('invalid_attribute', detail, { pointer: '/data/attributes/content' });

/**
 * A document must be text: C0 control characters other than tab, line feed, form feed and carriage return
 * (NUL is refused for every string already) are what binary data looks like once it is put into a JSON string.
 */
function checkContent(ctx: ActionContext): void {
  const content = ctx.values.content as string;
  const limit = ctx.services.config.knowledgeMaxBytes;
  const bytes = Buffer.byteLength(content);
  if (bytes > limit)
    throw contentError(`\`content\` is ${bytes} bytes; a knowledge document holds at most ${limit} bytes (KNOWLEDGE_MAX_BYTES).`);
  // biome-ignore lint/suspicious/noControlCharactersInRegex: the control characters are what is looked for.
  const control = /[\u0001-\u0008\u000b\u000e-\u001f\u007f]/.exec(content);
  if (control)
    throw contentError(
      `\`content\` is not text: it holds the control character U+${control[0].charCodeAt(0).toString(16).toUpperCase().padStart(4, '0')} at offset ${control.index}. Send text/plain, text/markdown or text/html.`,
    );
}

/**
 * Stores the document, then its chunks in the same transaction: the text reduced from its markup, cut into
 * overlapping passages, each indexed with the text search configuration of the agent's first language.
 */
async function createDocument(ctx: ActionContext): Promise<ActionResult> {
  checkContent(ctx);
  const text = documentText(ctx.values.content as string, ctx.values.content_type as KnowledgeContentType);
  if (text === '') throw contentError('`content` has no text once its markup is removed.');
  const agent = await sql<{ languages: string[] }>`
    SELECT languages FROM ai_agents WHERE id = ${ctx.values.ai_agent_id as string} AND organisation_id = ${ctx.principal.organisationId}`.execute(
    ctx.db,
  );
  const language = textSearchConfig(agent.rows[0]?.languages?.[0]);
  // The chunks are written after the row, so the event goes through the commit hook (rendered from the final state).
  ctx.eventOnInsert = undefined;
  const result = await insertRecord(ctx);
  const chunks = chunkText(text);
  for (let from = 0; from < chunks.length; from += CHUNK_BATCH) {
    const rows = chunks
      .slice(from, from + CHUNK_BATCH)
      .map(
        (content, k) =>
          sql`(${uuidv7()}, ${ctx.principal.organisationId}, ${ctx.values.ai_agent_id as string}, ${result.id}, ${from + k}, ${content}, ${language}::regconfig)`,
      );
    await sql`INSERT INTO knowledge_chunks (id, organisation_id, ai_agent_id, document_id, chunk_index, content, language)
      VALUES ${sql.join(rows)}`.execute(ctx.db);
  }
  return result;
}

/**
 * A document an agent answers from (docs/agents.md, "Knowledge"). Owners and admins create and delete;
 * every member reads. Documents are not changed: delete and create again. The chunks go with the document.
 */
export default defineResource({
  type: 'KnowledgeDocument',
  path: 'knowledge_documents',
  table: 'knowledge_documents',
  attributes: {
    ai_agent_id: attr.uuid({
      create: 'required',
      sortable: true,
      filterable: true,
      references: 'AiAgent',
      description: 'The AI agent that answers from this document.',
    }),
    title: attr.string({ create: 'required', minLength: 1, maxLength: 300, sortable: true, filterable: true }),
    content: attr.string({
      create: 'required',
      minLength: 1,
      description: 'The document: text, Markdown or HTML as `content_type` says; at most KNOWLEDGE_MAX_BYTES (512 KiB).',
    }),
    content_type: attr.enum(KNOWLEDGE_CONTENT_TYPES, { create: true, sortable: true, filterable: true, default: 'text/plain' }),
    ...timestamps,
  },
  relationships: {
    ai_agent: rel.belongsTo('AiAgent', 'ai_agent_id'),
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  operations: { list: true, get: true, create: true, delete: true },
  access: { read: EVERY_ROLE, create: ADMINS, delete: ADMINS },
  create: createDocument,
});
