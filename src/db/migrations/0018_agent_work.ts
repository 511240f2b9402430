/**
 * The agent runtime's work queue: one row per conversation that may need an agent turn, and only those.
 *
 * Until now each runtime found its work by joining every agent-bound conversation to its `agent_turns` row
 * and comparing the conversation's `next_content_index` with the turn's cursor, every `AGENT_POLL_MS`: a scan
 * of every conversation that names an agent (measured on 300,000 of them: a parallel scan of 200,000 rows,
 * 124 ms, five times a second per runtime), whether or not anything was to be done. The condition spans two
 * tables, so no partial index can answer it; a queue written in the writing transaction can.
 *
 * - A `user` or `operator` item (the roles that need a turn, or that pause the agent) queues its conversation
 *   when the conversation names an agent, in the item's own transaction (a row trigger, so every writer is
 *   covered: the API, the command line, the SIP edge, imports).
 * - A conversation whose agent or status changes is queued as well (a closed conversation reopened, an agent
 *   attached to a conversation that has items): the runtime then decides from the cursor, as before.
 * - Publishing an agent makes its conversations' parked rows ready again. A row is parked when the runtime
 *   found the agent unpublished (the items wait for it, docs/agents.md); the publish bumps every work row of
 *   the agent, so a runtime that read the agent as unpublished just before cannot park a row afterwards.
 * - A row stays while its conversation is leased; a lease that ran out is found through the row (the set of
 *   rows is the pending work, however many conversations there are).
 *
 * `version` is bumped by every queueing: a runtime deletes (or parks) the row only at the version it read
 * before it last looked at the items, so an item committed after that look keeps the row (the bump takes the
 * row's lock, and the delete re-checks the version after waiting for it).
 *
 * The existing pending work is queued once here.
 */
export const up = /* sql */ `
CREATE TABLE agent_work (
  conversation_id uuid PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
  organisation_id uuid NOT NULL,
  queued_at timestamptz NOT NULL DEFAULT now(),
  version bigint NOT NULL DEFAULT 1,
  parked boolean NOT NULL DEFAULT false
);
CREATE INDEX agent_work_ready_idx ON agent_work (queued_at) WHERE NOT parked;

CREATE FUNCTION parley_queue_agent_work() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_TABLE_NAME = 'conversation_items' THEN
    INSERT INTO agent_work (conversation_id, organisation_id)
      SELECT c.id, c.organisation_id FROM conversations c WHERE c.id = NEW.conversation_id AND c.ai_agent_id IS NOT NULL
      ON CONFLICT (conversation_id) DO UPDATE SET version = agent_work.version + 1, parked = false;
  ELSE
    INSERT INTO agent_work (conversation_id, organisation_id) VALUES (NEW.id, NEW.organisation_id)
      ON CONFLICT (conversation_id) DO UPDATE SET version = agent_work.version + 1, parked = false;
  END IF;
  RETURN NULL;
END
$$;
CREATE TRIGGER conversation_items_agent_work AFTER INSERT ON conversation_items
  FOR EACH ROW WHEN (NEW.role IN ('user', 'operator')) EXECUTE FUNCTION parley_queue_agent_work();
CREATE TRIGGER conversations_agent_work AFTER UPDATE OF ai_agent_id, status ON conversations
  FOR EACH ROW WHEN (NEW.ai_agent_id IS NOT NULL AND NEW.next_content_index > 0
                     AND (OLD.ai_agent_id IS DISTINCT FROM NEW.ai_agent_id OR OLD.status IS DISTINCT FROM NEW.status))
  EXECUTE FUNCTION parley_queue_agent_work();

CREATE FUNCTION parley_unpark_agent_work() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE agent_work w SET parked = false, version = w.version + 1
    FROM conversations c WHERE c.id = w.conversation_id AND c.ai_agent_id = NEW.id;
  RETURN NULL;
END
$$;
CREATE TRIGGER ai_agents_agent_work AFTER UPDATE OF published ON ai_agents
  FOR EACH ROW WHEN (NEW.published AND NOT OLD.published) EXECUTE FUNCTION parley_unpark_agent_work();

INSERT INTO agent_work (conversation_id, organisation_id)
  SELECT c.id, c.organisation_id FROM conversations c LEFT JOIN agent_turns t ON t.conversation_id = c.id
  WHERE c.ai_agent_id IS NOT NULL AND c.status <> 'closed' AND c.next_content_index - 1 > COALESCE(t.last_handled_index, -1);
`;
