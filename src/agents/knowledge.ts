/**
 * Retrieval from an agent's knowledge documents (docs/agents.md, "Knowledge"): PostgreSQL full text search
 * over the chunks that a `KnowledgeDocument`'s create wrote (src/resources/knowledge-document.ts), ranked
 * with `ts_rank`. Used two ways, as the workflow's `knowledge.mode` says: the model calls the
 * `search_knowledge` tool, or the runtime searches with the user's message before each model turn.
 */
import { sql } from 'kysely';
import type { Db } from '../db/schema.js';
import type { Workflow } from '../resources/ai-agent-workflow.js';

/** Passages per search unless the workflow says otherwise. */
export const DEFAULT_RESULTS = 4;
/** Searches the model may make in one turn; past them search_knowledge is no longer offered (src/agents/runtime.ts). */
export const MAX_SEARCHES_PER_TURN = 3;
/** Characters of a query that are searched for (a question, not a document). */
const QUERY_MAX_CHARS = 1000;

export interface KnowledgeHit {
  document_id: string;
  title: string;
  /** The chunk's index in its document. */
  chunk: number;
  content: string;
  rank: number;
}

/**
 * The agent's mode: the workflow's `knowledge.mode`, else `tool` when the agent has documents and `off`
 * when it has none (no tool the model could only call in vain).
 */
export async function knowledgeMode(db: Db, agentId: string, workflow: Workflow): Promise<'tool' | 'retrieve' | 'off'> {
  const mode = workflow.knowledge?.mode;
  if (mode) return mode;
  const { rows } = await sql<{ any: boolean }>`
    SELECT EXISTS (SELECT 1 FROM knowledge_chunks WHERE ai_agent_id = ${agentId}) AS any`.execute(db);
  return rows[0]?.any ? 'tool' : 'off';
}

/**
 * The best chunks of the agent's documents for `query`. The query's words, reduced to lexemes by each
 * configuration the agent's chunks were indexed with, are OR-ed (a question's words rarely all occur in the
 * passage that answers it), and the chunks matching any are ranked by `ts_rank`. The GIN index on `tsv`
 * answers the match; the organisation bounds it as everywhere else.
 */
export async function searchKnowledge(db: Db, organisationId: string, agentId: string, query: string, limit = DEFAULT_RESULTS) {
  const text = query.replaceAll('\u0000', '').slice(0, QUERY_MAX_CHARS);
  if (text.trim() === '') return [];
  // Each lexeme quoted for tsquery input (quotes and backslashes doubled), so no character of the visitor's
  // message is tsquery syntax.
  const { rows } = await sql<KnowledgeHit>`
    WITH configs AS (
      SELECT DISTINCT language FROM knowledge_chunks WHERE ai_agent_id = ${agentId} AND organisation_id = ${organisationId}
    ), queries AS (
      SELECT language, (
        SELECT string_agg('''' || replace(replace(lexeme, '\\', '\\\\'), '''', '''''') || '''', ' | ')
        FROM unnest(tsvector_to_array(to_tsvector(language, ${text}))) AS lexeme
      )::tsquery AS query
      FROM configs
    )
    SELECT c.document_id, d.title, c.chunk_index AS chunk, c.content, ts_rank(c.tsv, q.query)::float8 AS rank
    FROM queries q
    JOIN knowledge_chunks c ON c.language = q.language AND c.tsv @@ q.query
    JOIN knowledge_documents d ON d.id = c.document_id
    WHERE q.query IS NOT NULL AND c.ai_agent_id = ${agentId} AND c.organisation_id = ${organisationId}
    ORDER BY rank DESC, c.document_id, c.chunk_index
    LIMIT ${limit}`.execute(db);
  return rows.map((r) => ({ ...r, rank: Number(r.rank) }));
}

/** What the model reads of a search: the passages, numbered, with their document ids. */
export function formatHits(hits: KnowledgeHit[]): string {
  if (hits.length === 0) return 'No passage of the knowledge base matches.';
  return hits.map((h, i) => `[${i + 1}] document ${h.document_id}, "${h.title}", part ${h.chunk + 1}:\n${h.content}`).join('\n\n');
}

/** Citations of the passages a reply was given (its `metadata.sources`), each once, in the order they were first found. */
export function sourcesOf(hits: KnowledgeHit[]) {
  const sources = hits.map(({ document_id, title, chunk }) => [`${document_id}:${chunk}`, { document_id, title, chunk }] as const);
  return [...new Map(sources).values()];
}
