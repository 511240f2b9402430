import { attr, defineResource, rel } from '../jsonapi/index.js';
import { timestamps } from './timestamps.js';
import { EVERY_ROLE } from './scopes.js';
import { TRANSCRIPT_SPEAKERS } from './values.js';

/** Written by the telephony side; a call's lines in `content_index` order. */
export default defineResource({
  type: 'CallTranscript',
  path: 'call_transcripts',
  table: 'call_transcripts',
  attributes: {
    content: attr.string({ sortable: true, filterable: true }),
    speaker: attr.enum(TRANSCRIPT_SPEAKERS, { sortable: true, filterable: true }),
    item_id: attr.string({ sortable: true, filterable: true }),
    content_index: attr.integer({ sortable: true, filterable: true }),
    occurred_at: attr.timestamp({ sortable: true, filterable: true }),
    /** Voice runtime notes: an agent line's latency budget and how much was spoken (docs/voice.md). */
    metadata: attr.object({ maxBytes: 16 * 1024, default: () => ({}) }),
    call_id: attr.uuid({ sortable: true, filterable: true, references: 'Call' }),
    ...timestamps,
  },
  relationships: {
    call: rel.belongsTo('Call', 'call_id'),
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  defaultSort: ['call_id', 'content_index'],
  operations: { list: true, get: true },
  access: { read: EVERY_ROLE },
});
