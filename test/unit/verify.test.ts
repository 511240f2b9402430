import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { schemaSql } from '../../src/db/migrate.js';
import { attr, defineResource, rel, type ResourceDef } from '../../src/jsonapi/resource.js';
import { resourceProblems, verifyResources } from '../../src/jsonapi/verify.js';
import { resources } from '../../src/resources/index.js';

const EVERY = ['owner', 'admin', 'operator'] as const;

/** A small valid pair of declarations; each test breaks one thing. */
function fixture(): ResourceDef[] {
  const widget = defineResource({
    type: 'Widget',
    path: 'widgets',
    table: 'widgets',
    attributes: {
      name: attr.string({ create: 'required', update: true, sortable: true, filterable: true }),
      colour: attr.enum(['red', 'blue'], { create: true, default: 'red', filterable: true }),
      tags: attr.stringArray({ create: true, filterable: true }),
      owner_id: attr.uuid({ create: true, references: 'Owner' }),
    },
    relationships: { owner: rel.belongsTo('Owner', 'owner_id'), parts: rel.hasMany('Owner', 'widget_id') },
    operations: { list: true, create: true, update: true },
    access: { read: EVERY, create: EVERY, update: EVERY },
    uniqueConstraints: { widgets_name_key: 'name' },
    defaultSort: ['name'],
  });
  const owner = defineResource({
    type: 'Owner',
    table: 'owners',
    attributes: { label: attr.string() },
    relationships: {},
    operations: {},
    access: { read: EVERY },
  });
  return [widget, owner];
}

const schema = 'CREATE TABLE widgets (...); CREATE TABLE owners (...); CREATE UNIQUE INDEX widgets_name_key ON widgets (name);';

describe('resource declarations', () => {
  it('the real declarations pass, against the migrations', () => {
    expect(resourceProblems(resources, { schemaSql: schemaSql() })).toEqual([]);
    expect(() => verifyResources(resources, { schemaSql: schemaSql() })).not.toThrow();
  });

  it('the fixture passes', () => {
    expect(resourceProblems(fixture(), { schemaSql: schema })).toEqual([]);
  });

  it('names an unknown relationship type and reference', () => {
    const [widget, owner] = fixture();
    widget.relationships.owner = rel.belongsTo('Ownr', 'owner_id');
    widget.attributes.owner_id = attr.uuid({ references: 'Ownr' });
    expect(resourceProblems([widget, owner])).toEqual([
      'Widget: attribute `owner_id` references unknown type `Ownr`.',
      'Widget: relationship `owner` names unknown type `Ownr`.',
    ]);
  });

  it('refuses relationships without exactly one key, and to-many by foreign key', () => {
    const [widget, owner] = fixture();
    widget.relationships.owner = { type: 'Owner', cardinality: 'one' };
    widget.relationships.parts = { type: 'Owner', cardinality: 'many', foreignKey: 'owner_id', inverseKey: 'widget_id' };
    expect(resourceProblems([widget, owner])).toEqual([
      'Widget: relationship `owner` needs exactly one of foreignKey, inverseKey, through or resolve (has 0).',
      'Widget: relationship `parts` needs exactly one of foreignKey, inverseKey, through or resolve (has 2).',
      'Widget: to-many relationship `parts` must be linked by inverseKey or through.',
    ]);
  });

  it('refuses sort and filter on what cannot be sorted or filtered', () => {
    const [widget, owner] = fixture();
    widget.attributes.tags = attr.stringArray({ sortable: true });
    widget.attributes.secret = attr.string({ create: true, writeOnly: true, filterable: true });
    widget.attributes.computed = attr.string({ sortable: true, expression: () => sql`1` });
    widget.defaultSort = ['name', 'nothing', 'tags'];
    expect(resourceProblems([widget, owner])).toEqual([
      'Widget: attribute `tags` is sortable but cannot be sorted by (a list).',
      'Widget: attribute `secret` is filterable but cannot be filtered by (write-only).',
      'Widget: attribute `computed` is sortable but cannot be sorted by (computed).',
      'Widget: defaultSort names `nothing`, which is no attribute.',
      'Widget: defaultSort names `tags`, which cannot be sorted by (a list).',
    ]);
  });

  it('refuses hooks, rules and aliases that nothing uses or that cannot work', () => {
    const [widget, owner] = fixture();
    widget.attributes.level = attr.string({ update: true, expression: () => sql`1` });
    widget.attributes.rank = attr.string({ update: true, storedByHook: true });
    widget.attributes.grade = attr.string({ storedByHook: true, expression: () => sql`1` });
    widget.remove = async () => ({});
    widget.beforeDelete = () => undefined;
    widget.access.writable = () => undefined;
    widget.operations = { list: true, create: true };
    widget.aliases = { Me: { summary: 'x', resolve: () => null } };
    owner.aliases = { me: { summary: 'x', resolve: () => null } };
    expect(resourceProblems([widget, owner])).toEqual([
      'Widget: attribute `level` is computed but accepted as input.',
      'Widget: attribute `rank` is stored by a hook but is not computed (give it an expression).',
      'Widget: attribute `grade` is stored by a hook but never accepted as input.',
      'Widget: has a remove hook but no delete operation.',
      'Widget: has a beforeDelete hook but no delete operation.',
      'Widget: has a writable rule but neither update nor delete.',
      'Widget: has attributes stored by a hook but neither a create action nor a beforeUpdate hook.',
      'Widget: alias `Me` is not a plain lower-case name.',
      'Owner: alias `me` needs a path.',
    ]);
  });

  it('accepts a filterable computed attribute, and one stored by a hook', () => {
    const [widget, owner] = fixture();
    widget.attributes.level = attr.string({ filterable: true, update: true, storedByHook: true, expression: () => sql`1` });
    widget.beforeUpdate = () => undefined;
    expect(resourceProblems([widget, owner])).toEqual([]);
  });

  it('refuses unique constraints on unknown attributes or missing from the schema', () => {
    const [widget, owner] = fixture();
    widget.uniqueConstraints = { widgets_name_key: 'name', widgets_label_key: 'label' };
    expect(resourceProblems([widget, owner], { schemaSql: schema })).toEqual([
      'Widget: unique constraint `widgets_label_key` maps to `label`, which is no attribute.',
      'Widget: unique constraint `widgets_label_key` is not in the schema.',
    ]);
  });

  it('refuses enum defaults outside the values, tables missing from the schema and duplicate types', () => {
    const [widget, owner] = fixture();
    widget.attributes.colour = attr.enum(['red', 'blue'], { default: 'green' });
    const again = { ...owner, table: 'owner_copies' };
    expect(resourceProblems([widget, owner, again], { schemaSql: schema })).toEqual([
      'Owner: the type is declared twice.',
      'Widget: attribute `colour` has default `green`, which is not one of its values.',
      'Owner: table `owner_copies` is not in the schema.',
    ]);
  });

  it('throws one error listing every problem', () => {
    const [widget, owner] = fixture();
    widget.relationships.owner = rel.belongsTo('Nobody', 'owner_id');
    widget.defaultSort = ['missing'];
    expect(() => verifyResources([widget, owner])).toThrow(
      'Invalid resource declarations (3):\n' +
        '- Widget: relationship `owner` names unknown type `Nobody`.\n' +
        '- Widget: relationship `owner` is of type Nobody but `owner_id` references Owner.\n' +
        '- Widget: defaultSort names `missing`, which is no attribute.',
    );
  });
});
