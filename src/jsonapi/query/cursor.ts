/**
 * Opaque keyset cursors: the sort they belong to, the text form of each sort
 * value and the id, as base64url JSON with an HMAC. Only cursors this service
 * issued for the same sort are accepted, so a cursor can never inject a value
 * of the wrong type into a query or page through a different order. The HMAC
 * also covers the organisation the cursor was issued to (not carried in it),
 * so a cursor is worthless to anyone else. Only sortable attributes' values
 * ever appear in a cursor, and no secret is sortable.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { Cursor, SortKey } from './types.js';
import { UUID_PATTERN as UUID } from '../kinds.js';
import { memo } from '../memo.js';

const MAC_BYTES = 16;

export interface CursorCodec {
  encode(sort: SortKey[], cursor: Cursor): string;
  /** The cursor, or undefined for anything this service did not issue for `sort`. */
  decode(text: string, sort: SortKey[]): Cursor | undefined;
}

/** `status:asc:last,id:asc:last`: what a cursor is bound to. */
const sortSignature = (sort: SortKey[]) => sort.map((k) => `${k.attribute}:${k.direction}:${k.nulls}`).join(',');

/** The cursor key derived from each signing secret, derived once (a codec is made for every list request). */
const derived = new WeakMap<Uint8Array, Buffer>();

/** A codec for cursors of one organisation (`scope`): a cursor of another scope does not verify. */
export function cursorCodec(secret: Uint8Array, scope: string): CursorCodec {
  const key = memo(derived, secret, () => createHmac('sha256', secret).update('parley keyset cursor').digest());
  const mac = (payload: string) => createHmac('sha256', key).update(`${scope}\n${payload}`).digest().subarray(0, MAC_BYTES);
  return {
    encode(sort, cursor) {
      const payload = Buffer.from(JSON.stringify([sortSignature(sort), cursor.values, cursor.id])).toString('base64url');
      return `${payload}.${mac(payload).toString('base64url')}`;
    },
    decode(text, sort) {
      const match = /^([A-Za-z0-9_-]{1,4096})\.([A-Za-z0-9_-]{22})$/.exec(text);
      if (!match) return undefined;
      const [, payload, signature] = match;
      const given = Buffer.from(signature, 'base64url');
      if (given.length !== MAC_BYTES || !timingSafeEqual(given, mac(payload))) return undefined;
      const [signed, values, id] = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as [string, (string | null)[], string];
      if (signed !== sortSignature(sort) || values.length !== sort.length - 1 || !UUID.test(id)) return undefined;
      return { values, id };
    },
  };
}
