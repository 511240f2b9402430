/**
 * Parses include, fields, filter, sort and page (already split into nested
 * objects by the query-string parser) into a ParsedQuery, collecting every
 * problem into one 400.
 */
import { ApiError, errorObject, type ErrorCode, type ErrorObject } from '../errors.js';
import { converted, invalid, isPlainObject, KINDS, operatorProblem, type Conversion } from '../kinds.js';
import { fieldNames, type AttributeDef, type Registry, type ResourceDef } from '../resource.js';
import type { CursorCodec } from './cursor.js';
import {
  FILTER_OPERATORS,
  type FilterNode,
  type FilterOperator,
  type IncludeTree,
  type PageParams,
  type ParsedQuery,
  type SortKey,
} from './types.js';

export type { Registry };

/** Page sizes and offsets, read by the parser and stated in the OpenAPI document. */
export const PAGE_LIMITS = { defaultLimit: 25, maxLimit: 100, maxOffset: 10_000 } as const;

/** Bounds of a filter, read by the parser and stated in the OpenAPI document. */
export const MAX_FILTER_DEPTH = 4;
export const MAX_FILTER_CONDITIONS = 50;
export const MAX_IN_VALUES = 100;
/** Words of a `matches` search taken into account; more are a 400. */
const MAX_SEARCH_WORDS = 8;

/** `id`, filterable and sortable in every type. */
const ID_ATTRIBUTE: AttributeDef = { kind: 'uuid', filterable: true };
/** What a type's `searches` entry is filtered as: words, `matches` only. */
const SEARCH_ATTRIBUTE: AttributeDef = { kind: 'string', searchable: true };

/** The definition a filter on `name` is judged by (`id`, an attribute, a search), or undefined when there is none. */
export function filterableAttribute(resource: ResourceDef, name: string): AttributeDef | undefined {
  if (name === 'id') return ID_ATTRIBUTE;
  if (resource.searches && Object.hasOwn(resource.searches, name)) return SEARCH_ATTRIBUTE;
  const def = Object.hasOwn(resource.attributes, name) ? resource.attributes[name] : undefined;
  return (def?.filterable || def?.searchable) && !def.writeOnly ? def : undefined;
}

class Problems {
  readonly list: ErrorObject[] = [];
  add(code: ErrorCode, parameter: string, detail: string): void {
    this.list.push(errorObject(code, detail, { parameter }));
  }
}

/** `cursors` verifies page[after] / page[before]; lists need it. */
export function parseQuery(
  raw: Record<string, unknown>,
  resource: ResourceDef,
  registry: Registry,
  kind: 'list' | 'single' | 'delete',
  { cursors }: { cursors?: CursorCodec } = {},
): ParsedQuery {
  const problems = new Problems();
  const allowed = kind === 'list' ? ['include', 'fields', 'filter', 'sort', 'page'] : kind === 'single' ? ['include', 'fields'] : [];
  for (const name of Object.keys(raw)) {
    if (!allowed.includes(name)) problems.add('unknown_parameter', name, `This endpoint does not take \`${name}\`.`);
  }
  const include = parseInclude(raw.include, resource, registry, problems);
  const fields = parseFields(raw.fields, registry, problems);
  const filter = kind === 'list' && raw.filter !== undefined ? parseFilter(raw.filter, resource, problems) : undefined;
  const sort = parseSort(kind === 'list' ? raw.sort : undefined, resource, problems);
  const page = parsePage(kind === 'list' ? raw.page : undefined, sort, cursors, problems);
  if (problems.list.length > 0) throw new ApiError(problems.list);
  return { include, fields, filter, sort, page };
}

function parseInclude(value: unknown, resource: ResourceDef, registry: Registry, problems: Problems): IncludeTree {
  const tree: IncludeTree = {};
  if (value === undefined || value === '') return tree;
  if (typeof value !== 'string') {
    problems.add('invalid_includes', 'include', '`include` must be a comma-separated list of relationship paths.');
    return tree;
  }
  const paths = includePaths(resource, registry);
  for (const path of value.split(',')) {
    const segments = path.trim().split('.');
    if (segments.length > 2) {
      problems.add('invalid_includes', 'include', `\`${path}\` is deeper than two levels.`);
    } else if (!paths.includes(path.trim())) {
      problems.add('invalid_includes', 'include', `\`${path}\` is not an includable relationship path of ${resource.type}.`);
    } else {
      let node = tree;
      for (const segment of segments) node = node[segment] ??= {};
    }
  }
  return tree;
}

/** Relationship paths `include` accepts (one or two levels): includable relationships of a known type. */
export function includePaths(resource: ResourceDef, registry: Registry): string[] {
  const step = (r: ResourceDef) =>
    Object.entries(r.relationships).filter(([, rel]) => (rel.includable ?? rel.cardinality === 'one') && registry.has(rel.type));
  const paths: string[] = [];
  for (const [name, rel] of step(resource)) {
    paths.push(name);
    for (const [next] of step(registry.get(rel.type)!)) paths.push(`${name}.${next}`);
  }
  return paths;
}

/** Names `sort` takes: `id` and the sortable attributes. */
export const sortableNames = (r: ResourceDef) => ['id', ...Object.keys(r.attributes).filter((n) => r.attributes[n].sortable)];

function parseFields(value: unknown, registry: Registry, problems: Problems): Map<string, Set<string>> {
  const fields = new Map<string, Set<string>>();
  if (value === undefined) return fields;
  if (!isPlainObject(value)) {
    problems.add('invalid_field', 'fields', '`fields` takes the form fields[Type]=a,b.');
    return fields;
  }
  for (const [type, list] of Object.entries(value)) {
    const parameter = `fields[${type}]`;
    const resource = registry.get(type);
    if (!resource) {
      problems.add('invalid_field', parameter, `\`${type}\` is not a resource type.`);
      continue;
    }
    if (typeof list !== 'string') {
      problems.add('invalid_field', parameter, 'Give a comma-separated list of field names.');
      continue;
    }
    const known = new Set(fieldNames(resource));
    const names = list === '' ? [] : list.split(',').map((n) => n.trim());
    const unknown = names.filter((n) => !known.has(n));
    if (unknown.length > 0) problems.add('invalid_field', parameter, `${type} has no field ${unknown.map((n) => `\`${n}\``).join(', ')}.`);
    else fields.set(type, new Set(names));
  }
  return fields;
}

/**
 * A `matches` operand as a tsquery: each word (letters and digits, Unicode-aware) a prefix (`refund:*`), all of
 * them required. Nothing but those words reaches the query text, so no tsquery syntax can be injected.
 */
function searchQuery(operand: unknown): Conversion {
  if (typeof operand !== 'string') return invalid('The value must be a single string.');
  const words = operand.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [];
  if (words.length === 0) return invalid('`matches` takes one or more words.');
  if (words.length > MAX_SEARCH_WORDS) return invalid(`\`matches\` takes at most ${MAX_SEARCH_WORDS} words.`);
  return converted(words.map((w) => `${w.slice(0, 100)}:*`).join(' & '));
}

function parseFilter(value: unknown, resource: ResourceDef, problems: Problems): FilterNode | undefined {
  let conditions = 0;
  const walk = (node: unknown, path: string, depth: number): FilterNode | undefined => {
    if (!isPlainObject(node)) {
      problems.add('invalid_filter', path, `\`${path}\` must name attributes, e.g. ${path}[status]=active.`);
      return undefined;
    }
    if (depth > MAX_FILTER_DEPTH) {
      problems.add('invalid_filter', path, `Filters nest at most ${MAX_FILTER_DEPTH} levels.`);
      return undefined;
    }
    const children: FilterNode[] = [];
    for (const [key, child] of Object.entries(node)) {
      const parameter = `${path}[${key}]`;
      if (key === 'and' || key === 'or') {
        const items = Array.isArray(child) || isPlainObject(child) ? Object.entries(child) : [];
        if (items.length === 0 || items.some(([index]) => !/^\d{1,3}$/.test(index))) {
          problems.add('invalid_filter', parameter, `\`${parameter}\` takes indexed filters, e.g. ${parameter}[0][status]=active.`);
          continue;
        }
        const parsed = items.map(([index, item]) => walk(item, `${parameter}[${index}]`, depth + 1));
        if (parsed.every((p): p is FilterNode => p !== undefined)) children.push({ kind: key, children: parsed });
      } else if (key === 'not') {
        const parsed = walk(child, parameter, depth + 1);
        if (parsed) children.push({ kind: 'not', child: parsed });
      } else {
        conditions += 1;
        if (conditions > MAX_FILTER_CONDITIONS) {
          problems.add('invalid_filter', parameter, `At most ${MAX_FILTER_CONDITIONS} filter conditions.`);
          continue;
        }
        children.push(...parseConditions(resource, key, child, parameter, problems));
      }
    }
    return children.length === 1 ? children[0] : { kind: 'and', children };
  };
  return walk(value, 'filter', 1);
}

function parseConditions(resource: ResourceDef, attribute: string, value: unknown, parameter: string, problems: Problems): FilterNode[] {
  const def = filterableAttribute(resource, attribute);
  if (!def) {
    problems.add('invalid_filter', parameter, `${resource.type} cannot be filtered by \`${attribute}\`.`);
    return [];
  }
  const operations: [string, unknown][] = isPlainObject(value) ? Object.entries(value) : [['eq', value]];
  const nodes: FilterNode[] = [];
  for (const [operator, operand] of operations) {
    const where = isPlainObject(value) ? `${parameter}[${operator}]` : parameter;
    if (!(FILTER_OPERATORS as readonly string[]).includes(operator)) {
      problems.add('invalid_filter', where, `Unknown operator \`${operator}\`; use one of ${FILTER_OPERATORS.join(', ')}.`);
      continue;
    }
    const result = convertOperand(def, operator as FilterOperator, operand);
    if (result.ok) nodes.push({ kind: 'condition', attribute, operator: operator as FilterOperator, value: result.value });
    else problems.add('invalid_filter', where, result.problem);
  }
  return nodes;
}

/** The operand converted to the attribute's type, or a message saying why it cannot be. */
function convertOperand(def: AttributeDef, operator: FilterOperator, operand: unknown): Conversion {
  const problem = operatorProblem(def, operator);
  if (problem) return invalid(problem);
  if (operator === 'matches') return searchQuery(operand);
  if (operator === 'is_nil') {
    return operand === 'true' || operand === 'false' ? converted(operand === 'true') : invalid('`is_nil` takes true or false.');
  }
  if (operator === 'in') {
    const items =
      typeof operand === 'string' ? operand.split(',') : Array.isArray(operand) || isPlainObject(operand) ? Object.values(operand) : [];
    if (items.length === 0 || items.length > MAX_IN_VALUES) return invalid(`\`in\` takes 1 to ${MAX_IN_VALUES} values.`);
    const values: unknown[] = [];
    for (const item of items) {
      const result = convertScalar(def, item);
      if (!result.ok) return result;
      values.push(result.value);
    }
    return converted(values);
  }
  return convertScalar(def, operand);
}

function convertScalar(def: AttributeDef, operand: unknown): Conversion {
  if (typeof operand !== 'string') return invalid('The value must be a single string.');
  if (operand.includes('\u0000') || !operand.isWellFormed()) return invalid('The value contains characters that cannot be stored.');
  return KINDS[def.kind].fromQuery(def, operand);
}

function parseSort(value: unknown, resource: ResourceDef, problems: Problems): SortKey[] {
  const keys: SortKey[] = [];
  const seen = new Set<string>();
  if (value !== undefined && typeof value !== 'string') problems.add('invalid_sort', 'sort', '`sort` must be a comma-separated list.');
  if (typeof value === 'string' && value !== '') {
    for (const entry of value.split(',')) {
      const key = sortKey(entry);
      if (!key || !sortableNames(resource).includes(key.attribute)) {
        problems.add('invalid_sort', 'sort', `\`${entry.trim()}\` is not a sort key of ${resource.type}.`);
      } else if (seen.has(key.attribute)) {
        problems.add('invalid_sort', 'sort', `\`${key.attribute}\` appears twice.`);
      } else {
        seen.add(key.attribute);
        keys.push(key);
      }
    }
  }
  for (const attribute of resource.defaultSort ?? []) {
    if (!seen.has(attribute) && !seen.has('id')) {
      seen.add(attribute);
      keys.push({ attribute, direction: 'asc', nulls: 'last' });
    }
  }
  const idIndex = keys.findIndex((k) => k.attribute === 'id');
  if (idIndex >= 0) return keys.slice(0, idIndex + 1);
  keys.push({ attribute: 'id', direction: 'asc', nulls: 'last' });
  return keys;
}

/** `name`, `+name`, `-name`, `++name`, `--name`; an unencoded `+` arrives as a space. */
function sortKey(entry: string): SortKey | undefined {
  const match = /^([ +]{1,2}|-{1,2})?([A-Za-z_][A-Za-z0-9_]*)$/.exec(entry);
  if (!match) return undefined;
  const prefix = (match[1] ?? '').replaceAll(' ', '+');
  return { attribute: match[2], ...SORT_PREFIXES[prefix] };
}

const SORT_PREFIXES: Record<string, Pick<SortKey, 'direction' | 'nulls'>> = {
  '': { direction: 'asc', nulls: 'last' },
  '+': { direction: 'asc', nulls: 'last' },
  '++': { direction: 'asc', nulls: 'first' },
  '-': { direction: 'desc', nulls: 'first' },
  '--': { direction: 'desc', nulls: 'last' },
};

function parsePage(value: unknown, sort: SortKey[], cursors: CursorCodec | undefined, problems: Problems): PageParams {
  const page: PageParams = { limit: PAGE_LIMITS.defaultLimit, count: false };
  if (value === undefined) return page;
  if (!isPlainObject(value)) {
    problems.add('invalid_pagination', 'page', '`page` takes page[limit], page[offset], page[after], page[before] and page[count].');
    return page;
  }
  for (const [key, item] of Object.entries(value)) {
    const parameter = `page[${key}]`;
    const text = typeof item === 'string' ? item : undefined;
    switch (key) {
      case 'limit': {
        // Any positive integer, however long, is clamped to the maximum (it only asks for "as many as allowed").
        const limit = text !== undefined && /^\d+$/.test(text) ? Number(text) : NaN;
        if (!(limit >= 1)) problems.add('invalid_pagination', parameter, '`page[limit]` must be a positive integer.');
        else page.limit = Math.min(limit, PAGE_LIMITS.maxLimit);
        break;
      }
      case 'offset': {
        const offset = text !== undefined && /^\d{1,9}$/.test(text) ? Number(text) : NaN;
        if (!(offset >= 0 && offset <= PAGE_LIMITS.maxOffset)) {
          problems.add('invalid_pagination', parameter, `\`page[offset]\` must be an integer from 0 to ${PAGE_LIMITS.maxOffset}.`);
        } else page.offset = offset;
        break;
      }
      case 'after':
      case 'before': {
        const cursor = text !== undefined ? cursors?.decode(text, sort) : undefined;
        if (!cursor) {
          problems.add('invalid_pagination', parameter, 'The cursor is not valid for this sort; take cursors from the links.');
        } else page[key] = cursor;
        break;
      }
      case 'count':
        if (text !== 'true' && text !== 'false') problems.add('invalid_pagination', parameter, '`page[count]` takes true or false.');
        else page.count = text === 'true';
        break;
      default:
        problems.add('invalid_pagination', parameter, `Unknown page parameter \`${key}\`.`);
    }
  }
  if (page.after && page.before) problems.add('invalid_pagination', 'page[before]', 'Use page[after] or page[before], not both.');
  if (page.offset !== undefined && (page.after || page.before)) {
    problems.add('invalid_pagination', 'page[offset]', 'Use offset or cursor paging, not both.');
  }
  return page;
}
