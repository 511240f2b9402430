/** Small resource declarations for the engine's unit tests, independent of the real resources. */
import { sql } from 'kysely';
import { attr, defineResource, rel, type ResourceDef } from '../../src/jsonapi/resource.js';

const EVERY = ['owner', 'admin', 'operator'] as const;

export const ticket = defineResource({
  type: 'Ticket',
  path: 'tickets',
  table: 'tickets',
  attributes: {
    title: attr.string({ create: 'required', update: true, sortable: true, filterable: true, maxLength: 20 }),
    status: attr.enum(['open', 'closed'], { create: true, sortable: true, filterable: true, default: 'open' }),
    priority: attr.integer({ create: true, nullable: true, sortable: true, filterable: true, minimum: 1, maximum: 5 }),
    urgent: attr.boolean({ create: true, filterable: true }),
    due_at: attr.timestamp({ create: true, nullable: true, sortable: true, filterable: true, column: 'due' }),
    metadata: attr.object({ create: true, filterable: true, maxBytes: 64 }),
    labels: attr.stringArray({ create: true, filterable: true, maxItems: 2, items: { maxLength: 5 } }),
    queue_id: attr.uuid({ create: true, nullable: true, sortable: true, filterable: true, references: 'Queue' }),
    secret: attr.string({ create: true, writeOnly: true }),
    score: attr.integer({ expression: () => sql`1` }),
  },
  relationships: {
    queue: rel.belongsTo('Queue', 'queue_id'),
    notes: rel.hasMany('Note', 'ticket_id', { includable: true }),
    watchers: rel.hasMany('Note', 'watcher_id'),
  },
  operations: { list: true, create: true, update: true },
  access: { read: EVERY, create: EVERY, update: EVERY },
});

export const queue = defineResource({
  type: 'Queue',
  table: 'queues',
  attributes: { name: attr.string() },
  relationships: { tickets: rel.hasMany('Ticket', 'queue_id', { includable: true }) },
  operations: {},
  access: { read: EVERY },
});

export const note = defineResource({
  type: 'Note',
  table: 'notes',
  attributes: { body: attr.string() },
  relationships: { ticket: rel.belongsTo('Ticket', 'ticket_id'), author: rel.belongsTo('Queue', 'author_id') },
  operations: {},
  access: { read: EVERY },
});

export const registry: ReadonlyMap<string, ResourceDef> = new Map([ticket, queue, note].map((r) => [r.type, r]));
