import { attr, type AttributeDef } from '../jsonapi/index.js';

/**
 * `created_at` and `updated_at`, on every type: set by the engine (insert and every update), never by a
 * client; sortable and filterable, so that "what changed since" is one list query.
 */
export const timestamps = {
  created_at: attr.timestamp({ sortable: true, filterable: true, description: 'When the record was created.' }),
  updated_at: attr.timestamp({ sortable: true, filterable: true, description: 'When the record last changed.' }),
} satisfies Record<string, AttributeDef>;
