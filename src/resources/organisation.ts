import { sql } from 'kysely';
import { isSupportedCountry } from 'libphonenumber-js';
import { type ActionContext, type ActionResult, attr, defineResource } from '../jsonapi/index.js';
import { ADMINS, EVERY_ROLE } from './scopes.js';
import { timestamps } from './timestamps.js';
import { newWebhookSecret } from './webhook-endpoint.js';

/**
 * A new signing secret for the organisation's tool calls (docs/agents.md, "Tools"), replacing the one in use
 * (the runtime makes one on the first call when there is none), shown in this response only (`meta.tool_secret`).
 */
async function rotateToolSecret(ctx: ActionContext): Promise<ActionResult & { meta: Record<string, unknown> }> {
  const secret = newWebhookSecret();
  const id = ctx.principal.organisationId;
  await sql`INSERT INTO tool_secrets (organisation_id, secret) VALUES (${id}, ${secret})
            ON CONFLICT (organisation_id) DO UPDATE SET secret = EXCLUDED.secret, updated_at = now()`.execute(ctx.db);
  return { id, status: 200, meta: { tool_secret: secret } };
}

/**
 * The organisation's slug, the first label of its SIP domain (`<slug>.<SIP_DOMAIN>`): the name in lower
 * case, every run of other characters one hyphen, at most 40 characters, `org` when nothing is left
 * (migration 0012 derived the existing ones the same way). A DNS label (RFC 1035 section 2.3.1).
 */
export function slugBase(name: string): string {
  const base = name
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .slice(0, 40)
    .replace(/^-+|-+$/g, '');
  return base || 'org';
}

/**
 * A new organisation is created by the system acting for it: the actor's
 * organisation id is the id the new record takes (the command line makes one).
 * Its slug is stored once made (a rename never moves its phones to another SIP domain); when another
 * organisation has the name's slug already, the first 8 hex digits of the id make it unique.
 */
async function createOrganisation(ctx: ActionContext): Promise<ActionResult> {
  const now = new Date();
  const id = ctx.principal.organisationId;
  const base = slugBase(String(ctx.values.name));
  const taken = await ctx.db.selectFrom('organisations').select('id').where('slug', '=', base).executeTakeFirst();
  const slug = taken ? `${base}-${id.slice(0, 8)}` : base;
  await ctx.db
    .insertInto('organisations')
    .values({ id, name: ctx.values.name as string, slug, created_at: now, updated_at: now })
    .execute();
  return { id: ctx.principal.organisationId, status: 201 };
}

/**
 * Created by the command line; over the API, owners and admins may change `default_country` and `transcribe_calls` of their own
 * organisation (the one their credential is for). A caller sees the organisations its user belongs to.
 */
export default defineResource({
  type: 'Organisation',
  path: 'organisations',
  table: 'organisations',
  attributes: {
    name: attr.string({ create: 'required', minLength: 1, maxLength: 200, sortable: true, filterable: true }),
    slug: attr.string({ sortable: true, filterable: true, description: 'Stable, unique label made from the name when created.' }),
    /** Whose national numbers the organisation writes and dials without the international prefix (ISO 3166-1 alpha-2). */
    default_country: attr.string({
      update: true,
      nullable: true,
      pattern: '^[A-Z]{2}$',
      check: (v) =>
        typeof v === 'string' && !isSupportedCountry(v)
          ? 'must be an ISO 3166-1 alpha-2 country code with a telephone numbering plan'
          : undefined,
      description: "ISO 3166-1 alpha-2 code (GB, US...): national numbers are read as this country's.",
    }),
    /**
     * Calls between people (phone to phone, trunk to operator) are transcribed live, per leg, from media
     * rtpengine forks to Parley (docs/voice.md, "Calls between people"); off: nothing is forked.
     */
    transcribe_calls: attr.boolean({
      update: true,
      default: true,
      sortable: true,
      filterable: true,
      description: 'Transcribe calls between people per leg (caller, callee, operator) while they run.',
    }),
    /** The organisation's SIP domain: `<slug>.<SIP_DOMAIN>` (the SIP_DOMAIN the SIP edge last started with). */
    sip_domain: attr.string({
      description: 'The SIP domain its phones register in: `<slug>.<SIP_DOMAIN>`.',
      expression: () => sql`parley_sip_domain(t.slug)`,
    }),
    ...timestamps,
  },
  relationships: {},
  operations: { list: true, get: true, update: true },
  access: {
    read: EVERY_ROLE,
    update: ADMINS,
    // Only the organisation the credential is for, though a user sees every organisation it belongs to.
    writable: (p, alias) => sql`${sql.ref(`${alias}.id`)} = ${p.organisationId}`,
  },
  // A user sees the organisations it belongs to (User.organisations); the system its own.
  tenancy: (p, alias) =>
    p.userId === null
      ? sql`${sql.ref(`${alias}.id`)} = ${p.organisationId}`
      : sql`${sql.ref(`${alias}.id`)} IN (SELECT m.organisation_id FROM memberships m WHERE m.user_id = ${p.userId})`,
  create: createOrganisation,
  actions: {
    toolSecret: {
      path: 'organisations/tool_secret',
      summary:
        "Make a new signing secret for the organisation's agent tool calls (Standard Webhooks); returns the organisation and the secret, once, in meta.tool_secret",
      roles: ADMINS,
      input: {},
      run: rotateToolSecret,
    },
  },
});
