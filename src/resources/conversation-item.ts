import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import {
  type ActionContext,
  type ActionResult,
  ApiError,
  attr,
  defineResource,
  insertRecord,
  insertRecordFrom,
  rel,
  rowScope,
} from '../jsonapi/index.js';
import conversation from './conversation.js';
import { timestamps } from './timestamps.js';
import { EVERY_ROLE_AND_VISITORS, ownConversationForVisitors } from './scopes.js';
import { ITEM_MODALITIES, ITEM_ROLES } from './values.js';
import { at } from './pointer.js';

/** Fields compared when an `item_id` is posted again (those the repeat gives): same content means the same item. */
const IDEMPOTENT_FIELDS = ['content', 'role', 'modality'] as const;
/** Largest index, so that the next one still fits the integer column. */
const MAX_CONTENT_INDEX = 2_147_483_646;
/**
 * How far ahead of the conversation's next index a client may number an item itself. Each item moves the
 * next index at most this far, so no single request (or handful) can use up a conversation's numbering,
 * while clients that number a burst of items themselves still can.
 */
export const CONTENT_INDEX_LOOKAHEAD = 1000;

/** Largest `content`, in bytes of UTF-8 (the agent runtime cuts its replies to this). */
export const CONTENT_MAX_BYTES = 32 * 1024;
/**
 * Item ids the agent runtime derives from a user item's id (`reply_<id>`, `handoff_<id>`): nobody else may
 * take them, or a reply could never be stored (a visitor posting `reply_<its own item's id>` first).
 */
const RESERVED_ITEM_ID = /^(reply|handoff)_/;

/**
 * How far a visitor's `occurred_at` may be from the server's clock: a widget's clock may be off, and a message
 * written offline may arrive late, but a visitor may not date an item years away (sorting and history by
 * time would place it anywhere).
 */
export const VISITOR_OCCURRED_AT_PAST_MS = 24 * 3600_000;
export const VISITOR_OCCURRED_AT_FUTURE_MS = 5 * 60_000;

/** An item id for an item posted without one. */
const newItemId = () => `item_${randomUUID().replaceAll('-', '')}`;

/** What a post may not say, whatever its conversation. */
function checkItem(ctx: ActionContext): void {
  const { values } = ctx;
  if (values.organisation_id !== undefined && values.organisation_id !== ctx.principal.organisationId) {
    throw ApiError.of('invalid_attribute', 'organisation_id must be your organisation.', at('organisation_id'));
  }
  if (ctx.principal.role === 'visitor' && values.role !== 'user') {
    throw ApiError.of('forbidden', 'A visitor may only post items with role user.', at('role'));
  }
  if (ctx.principal.role === 'visitor' && values.occurred_at !== undefined && ctx.provided.has('occurred_at')) {
    const when = new Date(values.occurred_at as string | Date).getTime();
    const now = Date.now();
    if (!(when >= now - VISITOR_OCCURRED_AT_PAST_MS && when <= now + VISITOR_OCCURRED_AT_FUTURE_MS)) {
      throw ApiError.of(
        'invalid_attribute',
        "A visitor's occurred_at must be within the last 24 hours (or 5 minutes ahead); omit it for now.",
        at('occurred_at'),
      );
    }
  }
  if (ctx.principal.credential !== 'system' && typeof values.item_id === 'string' && RESERVED_ITEM_ID.test(values.item_id)) {
    throw ApiError.of('invalid_attribute', "item_id may not start with reply_ or handoff_: those are the AI agent's.", at('item_id'));
  }
}

/**
 * The usual post (no item_id, no content_index): one statement takes the next index of an open conversation in
 * the caller's scope, locking its row as the SELECT ... FOR UPDATE of `createItem` would, and inserts the item
 * with it. Undefined when it wrote nothing (a closed or invisible conversation, no index left, or a post that
 * names its item or index): `createItem` then gives the answer. Made alone, outside a transaction
 * (`createAtOnce`), the conversation's lock is held for that statement only: a hot conversation's posts wait
 * for each other's statement, not for each other's round trips (docs/benchmarks.md, "Eleventh round").
 */
async function appendNext(ctx: ActionContext): Promise<ActionResult | undefined> {
  const { values } = ctx;
  if (values.item_id !== undefined || values.content_index !== undefined) return undefined;
  values.item_id = newItemId();
  const inserted = await insertRecordFrom(ctx, {
    with: sql`UPDATE conversations c SET next_content_index = c.next_content_index + 1
      WHERE c.id = ${values.conversation_id} AND ${rowScope(conversation, ctx.principal, 'c')}
        AND c.status <> 'closed' AND c.next_content_index <= ${MAX_CONTENT_INDEX}
      RETURNING c.next_content_index - 1 AS content_index`,
    columns: { content_index: sql`src.content_index` },
  });
  if (!inserted) values.item_id = undefined;
  return inserted;
}

/**
 * Appends an item. The conversation row is locked first, so concurrent posts
 * to one conversation take consecutive `content_index` values, and a repeated
 * `item_id` finds the earlier item instead of racing it.
 */
async function createItem(ctx: ActionContext): Promise<ActionResult> {
  checkItem(ctx);
  const next = await appendNext(ctx);
  if (next) return next;
  const { db, values } = ctx;
  // The caller's scope of conversations (a visitor's is its one conversation) decides which it may post to.
  const target = await sql<{ status: string; next_content_index: number }>`
    SELECT status, next_content_index FROM conversations c
    WHERE c.id = ${values.conversation_id} AND ${rowScope(conversation, ctx.principal, 'c')}
    FOR UPDATE`.execute(db);
  const row = target.rows[0];
  if (!row) throw ApiError.of('invalid_attribute', 'No such conversation.', at('conversation_id'));

  if (values.item_id !== undefined) {
    const existing = await db
      .selectFrom('conversation_items')
      .select(['id', ...IDEMPOTENT_FIELDS])
      .where('conversation_id', '=', values.conversation_id as string)
      .where('item_id', '=', values.item_id as string)
      .executeTakeFirst();
    if (existing) {
      const same = IDEMPOTENT_FIELDS.every((f) => !ctx.provided.has(f) || values[f] === existing[f]);
      if (same) return { id: existing.id, status: 200, unchanged: true };
      throw ApiError.of('conflict', 'An item with this item_id exists with other content.', at('item_id'));
    }
  }
  if (row.status === 'closed') {
    throw ApiError.of('invalid_transition', 'The conversation is closed; reopen it to add items.', at('conversation_id'));
  }

  const contentIndex = (values.content_index as number | undefined) ?? row.next_content_index;
  if (ctx.principal.role === 'visitor' && values.content_index !== undefined && contentIndex < row.next_content_index) {
    // A gap below the AI agent's cursor would never be answered, and would place the visitor's words before
    // replies already given: a visitor may fill gaps only past it.
    const cursor = await sql<{ last_handled_index: number }>`
      SELECT last_handled_index FROM agent_turns WHERE conversation_id = ${values.conversation_id}`.execute(db);
    const handled = cursor.rows[0]?.last_handled_index ?? -1;
    if (contentIndex <= handled) {
      throw ApiError.of(
        'invalid_attribute',
        `content_index must be past ${handled}, the last item the AI agent has dealt with; omit it to take the next.`,
        at('content_index'),
      );
    }
  }
  if (contentIndex > row.next_content_index + CONTENT_INDEX_LOOKAHEAD) {
    throw ApiError.of(
      'invalid_attribute',
      `content_index may be at most ${row.next_content_index + CONTENT_INDEX_LOOKAHEAD} (the next index, ${row.next_content_index}, plus ${CONTENT_INDEX_LOOKAHEAD}); omit it to take the next.`,
      at('content_index'),
    );
  }
  if (contentIndex > MAX_CONTENT_INDEX) {
    throw ApiError.of(
      'invalid_attribute',
      `The conversation has no content_index left (at most ${MAX_CONTENT_INDEX}).`,
      at('content_index'),
    );
  }
  await sql`UPDATE conversations SET next_content_index = GREATEST(next_content_index, ${contentIndex + 1})
            WHERE id = ${values.conversation_id}`.execute(db);
  values.content_index = contentIndex;
  values.item_id ??= newItemId();
  return insertRecord(ctx);
}

export default defineResource({
  type: 'ConversationItem',
  path: 'conversation_items',
  table: 'conversation_items',
  attributes: {
    role: attr.enum(ITEM_ROLES, { create: 'required' }),
    modality: attr.enum(ITEM_MODALITIES, { create: true, default: 'text' }),
    // Searched by words (`filter[content][matches]=refund invoice`; docs/api.md, "Search"), GIN-indexed.
    content: attr.string({ create: 'required', maxBytes: CONTENT_MAX_BYTES, searchable: true }),
    metadata: attr.object({ create: true, maxBytes: 16 * 1024, default: () => ({}) }),
    item_id: attr.string({ create: true, minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9_.:-]+$' }),
    content_index: attr.integer({ create: true, sortable: true, minimum: 0, maximum: MAX_CONTENT_INDEX }),
    occurred_at: attr.timestamp({ create: true, default: () => new Date() }),
    conversation_id: attr.uuid({ create: 'required', references: 'Conversation', referenceCheckedByAction: true }),
    organisation_id: attr.uuid({ create: true, references: 'Organisation', referenceCheckedByAction: true }),
    ...timestamps,
  },
  relationships: {
    conversation: rel.belongsTo('Conversation', 'conversation_id'),
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  defaultSort: ['content_index'],
  uniqueConstraints: { conversation_items_index_key: 'content_index', conversation_items_item_id_key: 'item_id' },
  operations: { create: true, get: true },
  // A visitor reads its conversation's items but the agent's `tool` items (docs/agents.md,
  // "Tools") and `system` items (internal notes such as handoff reasons; docs/console.md).
  access: {
    read: EVERY_ROLE_AND_VISITORS,
    create: EVERY_ROLE_AND_VISITORS,
    visible: ownConversationForVisitors('conversation_id', ['tool', 'system']),
  },
  create: createItem,
  createAtOnce: async (ctx) => {
    checkItem(ctx);
    return appendNext(ctx);
  },
});
