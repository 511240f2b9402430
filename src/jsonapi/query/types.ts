/** The parsed form of a request's query string (include, fields, filter, sort, page). */

/** include=a.b,c  ->  { a: { b: {} }, c: {} } */
export interface IncludeTree {
  [relationship: string]: IncludeTree;
}

/** Every filter operator, in the order the OpenAPI document lists them; which apply to an attribute: kinds.ts. */
export const FILTER_OPERATORS = [
  'eq',
  'not_eq',
  'in',
  'less_than',
  'greater_than',
  'less_than_or_equal',
  'greater_than_or_equal',
  'is_nil',
  'contains',
  'matches',
] as const;
export type FilterOperator = (typeof FILTER_OPERATORS)[number];
export const ORDERED_OPERATORS: readonly FilterOperator[] = ['less_than', 'greater_than', 'less_than_or_equal', 'greater_than_or_equal'];

export type FilterNode =
  | { kind: 'and'; children: FilterNode[] }
  | { kind: 'or'; children: FilterNode[] }
  | { kind: 'not'; child: FilterNode }
  /** `value` is already converted to the attribute's type (Date, number, boolean, string, object); an array for `in`; a boolean for `is_nil`. */
  | { kind: 'condition'; attribute: string; operator: FilterOperator; value: unknown };

export interface SortKey {
  /** attribute name, or 'id' */
  attribute: string;
  direction: 'asc' | 'desc';
  nulls: 'first' | 'last';
}

/** A keyset position: the text form of every sort key's value, then the id. */
export interface Cursor {
  values: (string | null)[];
  id: string;
}

export interface PageParams {
  limit: number;
  offset?: number;
  after?: Cursor;
  before?: Cursor;
  count: boolean;
}

export interface ParsedQuery {
  include: IncludeTree;
  /** type name -> allowed field names (attributes and relationships); absent type = all fields */
  fields: Map<string, Set<string>>;
  filter?: FilterNode;
  /** Requested keys then the defaults, always ending with `id`. */
  sort: SortKey[];
  page: PageParams;
}
