/**
 * Writes typed by resource. The engine may not import the resource modules (they import it), so
 * src/resources/index.ts declares them into `ResourceTypes` (module augmentation, as fastify's plugins do):
 * a write through `records.create/update` that names a type is then checked against that type's declared
 * attributes (an undeclared name is a compile error) and each value against its column's type in
 * db/schema.ts, and the record it returns has typed attributes. A type named by a run-time string (the HTTP
 * routes) keeps the open `Record<string, unknown>`, checked by the validator alone.
 */
import type { ColumnType } from 'kysely';
import type { Json, Schema } from '../db/schema.js';

/** Each resource's declaration by its JSON:API type name; filled in by src/resources/index.ts. */
// biome-ignore lint/suspicious/noEmptyInterface: declarations are merged into it from src/resources.
export interface ResourceTypes {}

type Declared<K> = K extends keyof ResourceTypes ? ResourceTypes[K] : never;
type AttributeNames<K> = Declared<K> extends { attributes: infer A } ? keyof A & string : never;
type Columns<K> = Declared<K> extends { table: infer T } ? (T extends keyof Schema ? Schema[T] : object) : object;
type Updated<C> = C extends ColumnType<unknown, unknown, infer U> ? U : C;
/** The column's type, or undefined for an attribute that is no column of its own (computed, stored by a hook). */
type ColumnValue<K, N> = N extends keyof Columns<K> ? Updated<Columns<K>[N]> : undefined;
type IsJson<V> = [NonNullable<Json>] extends [NonNullable<V>] ? true : false;

/** A column's value as a writer passes it (`D`: a timestamp also as RFC 3339 text) or a rendering shows it; JSON as any value. */
type Value<V, D> = [V] extends [undefined] ? unknown : IsJson<V> extends true ? unknown : V extends Date ? D : V;

/** What a write of type `K` accepts: its declared attributes, each of its column's type. */
export type WriteValues<K extends string> = K extends keyof ResourceTypes
  ? { [N in AttributeNames<K>]?: Value<ColumnValue<K, N>, Date | string> }
  : Record<string, unknown>;

/** The record a write of type `K` returns when no `render` is given: the resource object as a GET renders it. */
export type RecordOf<K extends string> = K extends keyof ResourceTypes
  ? Record<string, unknown> & { id: string; type: K; attributes: { [N in AttributeNames<K>]: Value<ColumnValue<K, N>, string> } }
  : Record<string, unknown>;

/** `T` when the caller names it (or its `render` does), else the typed resource object. */
export type Rendered<T, K extends string> = [T] extends [never] ? RecordOf<K> : T;
