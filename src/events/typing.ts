/**
 * Typing indicators (docs/events.md, "Typing"): an ephemeral signal, no resource and no row, never replayed. It
 * travels on its own NOTIFY channel, so every server process hears it and hands it to its event streams that
 * may see the conversation, as a `Conversation.typing` message without an `id:` (it moves no Last-Event-ID).
 * A sender's repeats within `TYPING_MIN_INTERVAL_MS` are answered but not passed on (no query, no NOTIFY): a
 * keystroke per request costs the database nothing beyond the first signal of each interval.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { sql } from 'kysely';
import { type DatabaseHandle, notifyAfterCommit } from '../db/connection.js';
import { ApiError, errorObject, notFound } from '../jsonapi/errors.js';
import { methodNotAllowed } from '../jsonapi/routes.js';
import { UUID_PATTERN } from '../jsonapi/validate.js';

/** The NOTIFY channel: payload the signal's JSON (`TypingSignal`). */
export const TYPING_CHANNEL = 'parley_typing';
/** The event type on GET /api/events. */
export const TYPING_EVENT = 'Conversation.typing';
/** How long a signal stands without a repeat. */
export const TYPING_TTL_MS = 6000;
/** A sender's repeats closer together than this are coalesced. */
export const TYPING_MIN_INTERVAL_MS = 2000;
const JSONAPI = { version: '1.0' };
/** Senders remembered for coalescing; beyond, the oldest are forgotten (a forgotten sender's next signal just goes out). */
const MAX_SENDERS = 50_000;

export interface TypingSignal {
  organisation_id: string;
  conversation_id: string;
  /** `operator` for a member of the organisation, `visitor` for the widget's visitor. */
  role: 'operator' | 'visitor';
  /** The member's user id (null for a visitor). */
  user_id: string | null;
  /** The member's full name (null when they have none, and for a visitor). */
  name: string | null;
  occurred_at: string;
  expires_at: string;
}

type TypingListener = (signal: TypingSignal, json: string) => void;

/**
 * The process's typing listeners, fed from the NOTIFY channel: by organisation (members' streams), and by
 * conversation for listeners that hear one conversation only (visitors' streams), so that a signal is handed
 * to the streams that may hear it and never to the thousands of visitors' streams of the organisation's other
 * conversations.
 */
export class TypingHub {
  private readonly listeners = new Map<string, Set<TypingListener>>();
  private readonly byConversation = new Map<string, Set<TypingListener>>();
  private unlisten?: Promise<() => Promise<void>>;

  constructor(private readonly database: DatabaseHandle) {}

  /** Starts listening (once); resolves when the channel is heard. */
  ready(): Promise<unknown> {
    this.unlisten ??= this.database.listen(TYPING_CHANNEL, (payload) => this.heard(payload));
    return this.unlisten.catch((error) => {
      this.unlisten = undefined;
      throw error;
    });
  }

  /** Listens to the organisation's signals, or with `conversationId` to that conversation's only. */
  subscribe(organisationId: string, listener: TypingListener, conversationId?: string): () => void {
    // Conversation ids are UUIDs, unique across organisations; the key still carries the organisation.
    const [map, key] =
      conversationId === undefined ? [this.listeners, organisationId] : [this.byConversation, `${organisationId}/${conversationId}`];
    const set = map.get(key) ?? map.set(key, new Set()).get(key)!;
    set.add(listener);
    return () => {
      set.delete(listener);
      if (set.size === 0 && map.get(key) === set) map.delete(key);
    };
  }

  private heard(payload: string): void {
    let signal: TypingSignal;
    try {
      signal = JSON.parse(payload) as TypingSignal;
    } catch {
      return;
    }
    const set = this.listeners.get(signal.organisation_id);
    const routed = this.byConversation.get(`${signal.organisation_id}/${signal.conversation_id}`);
    if (!set && !routed) return;
    const json = JSON.stringify({
      type: TYPING_EVENT,
      occurred_at: signal.occurred_at,
      organisation_id: signal.organisation_id,
      data: {
        type: 'Conversation',
        id: signal.conversation_id,
        meta: { typing: { role: signal.role, user_id: signal.user_id, name: signal.name, expires_at: signal.expires_at } },
      },
    });
    if (set) for (const listener of set) listener(signal, json);
    if (routed) for (const listener of routed) listener(signal, json);
  }

  async close(): Promise<void> {
    const unlisten = this.unlisten;
    this.unlisten = undefined;
    this.listeners.clear();
    this.byConversation.clear();
    if (unlisten) await (await unlisten.catch(() => async () => {}))();
  }
}

/** Registers POST /api/conversations/{id}/typing; returns the hub the event streams subscribe to. */
export function registerTyping(app: FastifyInstance, options: { database: DatabaseHandle }): TypingHub {
  const hub = new TypingHub(options.database);
  /** sender key -> when its last signal went out (insertion order is age order: a repeat re-inserts). */
  const lastSent = new Map<string, number>();

  app.addHook('preClose', () => hub.close());

  app.post('/api/conversations/:id/typing', { config: { allowVisitor: true } }, async (request: FastifyRequest, reply: FastifyReply) => {
    const principal = request.principal;
    if (!principal) throw ApiError.of('unauthenticated', 'A valid bearer token is required.');
    // Like every route, an unknown query parameter is refused rather than ignored (this one takes none).
    const unknown = Object.keys((request.query ?? {}) as Record<string, unknown>);
    if (unknown.length > 0) {
      throw new ApiError(
        unknown.map((name) =>
          errorObject('unknown_parameter', `This endpoint takes no \`${name}\` (it takes no query parameters).`, { parameter: name }),
        ),
      );
    }
    const id = String((request.params as { id: string }).id).toLowerCase();
    if (!UUID_PATTERN.test(id)) throw notFound();
    // A visitor signals in its own conversation only; anything else is as if it did not exist.
    if (principal.credential === 'visitor' && principal.conversationId !== id) throw notFound();
    const now = Date.now();
    const key = `${principal.credentialId}:${principal.userId}:${id}`;
    const previous = lastSent.get(key);
    const expiresAt = new Date(now + TYPING_TTL_MS).toISOString();
    if (previous !== undefined && now - previous < TYPING_MIN_INTERVAL_MS) {
      // The signal that went out still stands: nothing to pass on.
      return reply
        .code(202)
        .send({ meta: { typing: { expires_at: new Date(previous + TYPING_TTL_MS).toISOString(), coalesced: true } }, jsonapi: JSONAPI });
    }
    const { rows } = await sql<{ status: string; full_name: string | null }>`
      SELECT c.status, (SELECT u.full_name FROM users u WHERE u.id = ${principal.credential === 'visitor' ? null : principal.userId}::uuid) AS full_name
      FROM conversations c WHERE c.id = ${id} AND c.organisation_id = ${principal.organisationId}`.execute(options.database.db);
    const conversation = rows[0];
    if (!conversation) throw notFound();
    if (conversation.status === 'closed') {
      throw ApiError.of('conversation_closed', 'The conversation is closed: nobody is there to see the typing.');
    }
    lastSent.delete(key);
    lastSent.set(key, now);
    if (lastSent.size > MAX_SENDERS) {
      for (const [old, at] of lastSent) {
        if (lastSent.size <= MAX_SENDERS && now - at < TYPING_TTL_MS) break;
        lastSent.delete(old);
      }
    }
    const visitor = principal.credential === 'visitor';
    const signal: TypingSignal = {
      organisation_id: principal.organisationId,
      conversation_id: id,
      role: visitor ? 'visitor' : 'operator',
      user_id: visitor ? null : principal.userId,
      name: visitor ? null : conversation.full_name?.trim() || null,
      occurred_at: new Date(now).toISOString(),
      expires_at: expiresAt,
    };
    notifyAfterCommit(options.database.db, TYPING_CHANNEL, JSON.stringify(signal));
    return reply.code(202).send({ meta: { typing: { expires_at: expiresAt, coalesced: false } }, jsonapi: JSONAPI });
  });
  methodNotAllowed(app, '/api/conversations/:id/typing', ['POST']);
  return hub;
}
