/**
 * Checks resource declarations against each other before any route exists, so a typo in a
 * declaration stops the server at start with every problem named, instead of surfacing as a
 * 500 (or a silently ignored sort key) on the first request that touches it. Pure: no database.
 */
import { KIND_OPTIONS, KINDS } from './kinds.js';
import { fieldNames, type AttributeDef, type ResourceDef } from './resource.js';

export interface VerifyOptions {
  /**
   * The schema's SQL (the migrations' text), when known: then every table and every unique
   * constraint a declaration names must appear in it.
   */
  schemaSql?: string;
}

const IDENTIFIER = /^[a-z_][a-z0-9_]*$/;

/** Throws one Error listing every problem in the declarations; returns when there is none. */
export function verifyResources(resources: readonly ResourceDef[], options: VerifyOptions = {}): void {
  const problems = resourceProblems(resources, options);
  if (problems.length > 0) {
    throw new Error(`Invalid resource declarations (${problems.length}):\n${problems.map((p) => `- ${p}`).join('\n')}`);
  }
}

/** Every problem in the declarations, one sentence each, prefixed with the type. */
export function resourceProblems(resources: readonly ResourceDef[], { schemaSql }: VerifyOptions = {}): string[] {
  const problems: string[] = [];
  const types = new Map<string, ResourceDef>();
  const paths = new Map<string, string>();
  const schemaWords = schemaSql === undefined ? undefined : new Set(schemaSql.toLowerCase().match(/[a-z_][a-z0-9_]*/g) ?? []);
  for (const r of resources) {
    if (types.has(r.type)) problems.push(`${r.type}: the type is declared twice.`);
    types.set(r.type, r);
    if (r.path !== undefined) {
      const other = paths.get(r.path);
      if (other) problems.push(`${r.type}: path \`${r.path}\` is also the path of ${other}.`);
      paths.set(r.path, r.type);
    }
  }
  for (const r of resources) {
    const add = (problem: string) => problems.push(`${r.type}: ${problem}`);
    if (!IDENTIFIER.test(r.table)) add(`table \`${r.table}\` is not a plain SQL name.`);
    else if (schemaWords && !schemaWords.has(r.table)) add(`table \`${r.table}\` is not in the schema.`);

    for (const [name, a] of Object.entries(r.attributes)) for (const p of attributeProblems(name, a, types)) add(p);

    for (const [name, relation] of Object.entries(r.relationships)) {
      if (Object.hasOwn(r.attributes, name)) add(`\`${name}\` is both an attribute and a relationship.`);
      if (!types.has(relation.type)) add(`relationship \`${name}\` names unknown type \`${relation.type}\`.`);
      const links = [relation.foreignKey, relation.inverseKey, relation.through, relation.resolve].filter((l) => l !== undefined);
      if (links.length !== 1) {
        add(`relationship \`${name}\` needs exactly one of foreignKey, inverseKey, through or resolve (has ${links.length}).`);
      }
      if (relation.cardinality === 'many' && (relation.foreignKey !== undefined || relation.resolve !== undefined)) {
        add(`to-many relationship \`${name}\` must be linked by inverseKey or through.`);
      }
      const keys = [relation.foreignKey, relation.inverseKey, relation.through?.table, relation.through?.from, relation.through?.to];
      for (const key of keys)
        if (key !== undefined && !IDENTIFIER.test(key)) add(`relationship \`${name}\`: \`${key}\` is not a plain SQL name.`);
      if (relation.through && schemaWords && !schemaWords.has(relation.through.table)) {
        add(`relationship \`${name}\`: table \`${relation.through.table}\` is not in the schema.`);
      }
      // A belongs-to key that is also a declared attribute must hold ids of the related type.
      const keyAttribute = Object.entries(r.attributes).find(([n, a]) => (a.column ?? n) === relation.foreignKey)?.[1];
      if (keyAttribute && !KINDS[keyAttribute.kind].options?.includes('references'))
        add(`relationship \`${name}\`: key \`${relation.foreignKey}\` is not a uuid attribute.`);
      if (keyAttribute?.references && keyAttribute.references !== relation.type) {
        add(`relationship \`${name}\` is of type ${relation.type} but \`${relation.foreignKey}\` references ${keyAttribute.references}.`);
      }
    }

    const fields = new Set(fieldNames(r));

    for (const name of r.defaultSort ?? []) {
      const a = Object.hasOwn(r.attributes, name) ? r.attributes[name] : undefined;
      if (!a) add(`defaultSort names \`${name}\`, which is no attribute.`);
      else if (sortBlocker(a)) add(`defaultSort names \`${name}\`, which cannot be sorted by (${sortBlocker(a)}).`);
    }

    for (const [constraint, attribute] of Object.entries(r.uniqueConstraints ?? {})) {
      if (!Object.hasOwn(r.attributes, attribute))
        add(`unique constraint \`${constraint}\` maps to \`${attribute}\`, which is no attribute.`);
      else if (!fields.has(attribute)) add(`unique constraint \`${constraint}\` maps to \`${attribute}\`, which responses do not carry.`);
      if (schemaWords && !schemaWords.has(constraint.toLowerCase())) add(`unique constraint \`${constraint}\` is not in the schema.`);
    }

    const operations = r.operations;
    if (Object.values(operations).some(Boolean) && r.path === undefined) add('has operations but no path.');
    if (operations.create && !r.access.create?.length) add('has a create operation but no role may create.');
    if (operations.update && !r.access.update?.length) add('has an update operation but no role may update.');
    if (operations.delete && !r.access.delete?.length) add('has a delete operation but no role may delete.');
    if (operations.update && !Object.values(r.attributes).some((a) => a.update)) add('has an update operation but no updatable attribute.');
    if (r.remove && !operations.delete) add('has a remove hook but no delete operation.');
    if (r.beforeDelete && !operations.delete) add('has a beforeDelete hook but no delete operation.');
    if (r.access.writable && !operations.update && !operations.delete) add('has a writable rule but neither update nor delete.');
    if (Object.values(r.attributes).some((a) => a.storedByHook) && !r.create && !r.beforeUpdate) {
      add('has attributes stored by a hook but neither a create action nor a beforeUpdate hook.');
    }
    for (const alias of Object.keys(r.aliases ?? {})) {
      if (r.path === undefined) add(`alias \`${alias}\` needs a path.`);
      if (!/^[a-z][a-z_]*$/.test(alias)) add(`alias \`${alias}\` is not a plain lower-case name.`);
      if (Object.values(r.actions ?? {}).some((action) => action.path === `${r.path}/${alias}`))
        add(`alias \`${alias}\` is also an action's path.`);
    }

    for (const [name, action] of Object.entries(r.actions ?? {})) {
      for (const [input, a] of Object.entries(action.input)) {
        for (const p of attributeProblems(input, a, types)) add(`action \`${name}\`: ${p}`);
      }
    }
  }
  return problems;
}

function attributeProblems(name: string, a: AttributeDef, types: ReadonlyMap<string, ResourceDef>): string[] {
  const problems: string[] = [];
  const add = (problem: string) => problems.push(`attribute \`${name}\` ${problem}`);
  if (name === 'id' || name === 'type') add('uses a name JSON:API reserves.');
  if (!IDENTIFIER.test(a.column ?? name)) add(`has column \`${a.column ?? name}\`, not a plain SQL name.`);
  if (a.sortable && sortBlocker(a)) add(`is sortable but cannot be sorted by (${sortBlocker(a)}).`);
  if (a.filterable && a.writeOnly) add('is filterable but cannot be filtered by (write-only).');
  if (a.expression && (a.create || a.update) && !a.storedByHook) add('is computed but accepted as input.');
  if (a.storedByHook && !a.expression) add('is stored by a hook but is not computed (give it an expression).');
  if (a.storedByHook && !a.create && !a.update) add('is stored by a hook but never accepted as input.');
  if (a.writeOnly && !a.create && !a.update) add('is write-only but never accepted as input.');
  const kind = KINDS[a.kind];
  for (const p of kind.declarationProblems?.(a) ?? []) add(p);
  for (const option of KIND_OPTIONS) {
    const takers = Object.keys(KINDS).filter((k) => KINDS[k as AttributeDef['kind']].options?.includes(option));
    if (a[option] !== undefined && !kind.options?.includes(option))
      add(`has \`${option}\`, which only ${takers.join(', ')} attributes take.`);
  }
  if (a.references !== undefined && !types.has(a.references)) add(`references unknown type \`${a.references}\`.`);
  return problems;
}

/** Sorting reads the column and compares its text form in cursors: computed, write-only and list values cannot. */
function sortBlocker(a: AttributeDef): string | undefined {
  if (a.expression) return 'computed';
  if (a.writeOnly) return 'write-only';
  return KINDS[a.kind].unsortable;
}
