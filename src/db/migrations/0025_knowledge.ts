/**
 * The knowledge base and the analysis of finished conversations (docs/agents.md, "Knowledge" and "Analysis").
 *
 * - `knowledge_documents`: a text, Markdown or HTML document of an AI agent (`KnowledgeDocument`), in the
 *   agent's organisation (composite foreign key). Documents are created and deleted, never changed.
 * - `knowledge_chunks`: the document reduced to plain text and cut into overlapping passages of a few hundred
 *   words, written by the document's create hook in the same transaction and deleted with it (ON DELETE
 *   CASCADE). Each chunk keeps the text search configuration it was indexed with (`language`, from the
 *   agent's first language when the document was created), so a later change of the agent's languages never
 *   compares a query with vectors of another configuration. `tsv` is a stored generated column with a GIN
 *   index: PostgreSQL's full text search, which PGlite has too (no vector extension is available on the
 *   supported systems).
 * - `conversations.analysis`: the read-only result of the analysis (summary, data, success, analysed_at).
 * - `analysis_work`: the queue of conversations to analyse, like `agent_work` (migration 0018): a row is
 *   written by a trigger in the transaction that closes a conversation naming an agent (a call that ends closes
 *   its conversation, src/sip/call-events.ts and src/voice/runtime.ts), and the agent runtime claims ready rows
 *   with FOR UPDATE SKIP LOCKED through a partial index, so looking for work costs what there is to do.
 *   `available_at` delays a retry after a model failure; `version` is bumped when a conversation is closed
 *   again while its analysis runs, so the finished run deletes the row only at the version it read. A
 *   conversation created closed (an import, the demo's history) was never closed by anyone: it is not queued.
 */
export const up = /* sql */ `
ALTER TABLE conversations ADD COLUMN analysis jsonb;

CREATE TABLE knowledge_documents (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL REFERENCES organisations (id),
  ai_agent_id uuid NOT NULL,
  title text NOT NULL,
  content text NOT NULL,
  content_type text NOT NULL CHECK (content_type IN ('text/plain', 'text/markdown', 'text/html')),
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (organisation_id, id),
  FOREIGN KEY (organisation_id, ai_agent_id) REFERENCES ai_agents (organisation_id, id)
);
CREATE INDEX knowledge_documents_org_created_idx ON knowledge_documents (organisation_id, created_at, id);
CREATE INDEX knowledge_documents_agent_idx ON knowledge_documents (ai_agent_id);

CREATE TABLE knowledge_chunks (
  id uuid PRIMARY KEY,
  organisation_id uuid NOT NULL,
  ai_agent_id uuid NOT NULL,
  document_id uuid NOT NULL REFERENCES knowledge_documents (id) ON DELETE CASCADE,
  chunk_index integer NOT NULL,
  content text NOT NULL,
  language regconfig NOT NULL,
  tsv tsvector GENERATED ALWAYS AS (to_tsvector(language, content)) STORED,
  UNIQUE (document_id, chunk_index)
);
CREATE INDEX knowledge_chunks_tsv_idx ON knowledge_chunks USING gin (tsv);
CREATE INDEX knowledge_chunks_agent_idx ON knowledge_chunks (ai_agent_id, language);

CREATE TABLE analysis_work (
  conversation_id uuid PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
  organisation_id uuid NOT NULL,
  queued_at timestamptz NOT NULL DEFAULT now(),
  available_at timestamptz NOT NULL DEFAULT now(),
  version bigint NOT NULL DEFAULT 1,
  attempts integer NOT NULL DEFAULT 0,
  lease_until timestamptz,
  last_error text
);
CREATE INDEX analysis_work_ready_idx ON analysis_work (available_at);

CREATE FUNCTION parley_queue_analysis() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO analysis_work (conversation_id, organisation_id) VALUES (NEW.id, NEW.organisation_id)
    ON CONFLICT (conversation_id) DO UPDATE
      SET version = analysis_work.version + 1, attempts = 0, available_at = now(), last_error = NULL;
  RETURN NULL;
END
$$;
CREATE TRIGGER conversations_analysis AFTER UPDATE OF status ON conversations
  FOR EACH ROW WHEN (NEW.status = 'closed' AND OLD.status IS DISTINCT FROM 'closed' AND NEW.ai_agent_id IS NOT NULL)
  EXECUTE FUNCTION parley_queue_analysis();
`;
