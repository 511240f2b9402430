import parsePhoneNumberFromString, { type CountryCode } from 'libphonenumber-js';
import { type ActionContext, ApiError, attr, defineResource, errorObject, type ErrorObject, rel } from '../jsonapi/index.js';
import { ADMINS, EVERY_ROLE } from './scopes.js';
import { timestamps } from './timestamps.js';
import { at } from './pointer.js';

/** What a dialled or written number may contain: digits, one leading `+`, and visual separators (RFC 3966 section 5.1.1). */
const NUMBER_TEXT = /^\+?[0-9 ().\-/]{2,40}$/;

/**
 * A number in E.164 form (`+` and at most 15 digits, ITU-T E.164), or undefined when `input` is not a
 * possible number. `00` is the international prefix of most countries; a number without `+` or `00` is
 * national, read with the organisation's `default_country` (ISO 3166-1 alpha-2), and refused without one.
 */
export function e164(input: string, defaultCountry?: string | null): string | undefined {
  let text = input.trim();
  if (!NUMBER_TEXT.test(text)) return undefined;
  if (text.startsWith('00')) text = `+${text.slice(2)}`;
  if (!text.startsWith('+') && !defaultCountry) return undefined;
  const parsed = parsePhoneNumberFromString(text, (defaultCountry ?? undefined) as CountryCode | undefined);
  if (!parsed?.isPossible()) return undefined;
  return /^\+[1-9][0-9]{1,14}$/.test(parsed.number) ? parsed.number : undefined;
}

/** The number normalised to E.164, and at most one target (an AI agent or a SIP user): one 422 per problem. */
async function checkNumber(ctx: ActionContext): Promise<void> {
  const errors: ErrorObject[] = [];
  if (typeof ctx.values.number === 'string') {
    const org = await ctx.db
      .selectFrom('organisations')
      .select('default_country')
      .where('id', '=', ctx.principal.organisationId)
      .executeTakeFirst();
    const normalised = e164(ctx.values.number, org?.default_country);
    if (normalised) ctx.values.number = normalised;
    else {
      const national = org?.default_country
        ? `, or a national number of ${org.default_country} (the organisation's default_country)`
        : " (a national number needs the organisation's default_country)";
      errors.push(
        errorObject('invalid_attribute', `\`number\` must be an international number such as +442079460018${national}.`, at('number')),
      );
    }
  }
  const agent = 'ai_agent_id' in ctx.values ? ctx.values.ai_agent_id : ctx.existing?.ai_agent_id;
  const sipUser = 'sip_user_id' in ctx.values ? ctx.values.sip_user_id : ctx.existing?.sip_user_id;
  if (agent && sipUser) {
    const detail = 'A number routes to one AI agent, one SIP user, or neither (the available operators): set the other to null.';
    errors.push(errorObject('invalid_attribute', detail, at(ctx.provided.has('sip_user_id') ? 'sip_user_id' : 'ai_agent_id')));
  }
  if (errors.length > 0) throw new ApiError(errors);
}

/**
 * A phone number (DID) of the organisation and where its calls go: an AI agent, a SIP user, or neither,
 * meaning the organisation's available operators. Unique in the installation. The SIP edge reads it per call
 * (docs/sip.md), so an edit applies to the next call; calls in progress are not affected by an edit or a delete.
 */
export default defineResource({
  type: 'PhoneNumber',
  path: 'phone_numbers',
  table: 'phone_numbers',
  attributes: {
    number: attr.string({
      create: 'required',
      update: true,
      maxLength: 40,
      pattern: NUMBER_TEXT.source,
      sortable: true,
      filterable: true,
      description: 'E.164 (`+` and up to 15 digits); written national numbers are read with the organisation default_country.',
    }),
    gateway_id: attr.uuid({ create: true, update: true, nullable: true, sortable: true, filterable: true, references: 'Gateway' }),
    ai_agent_id: attr.uuid({ create: true, update: true, nullable: true, sortable: true, filterable: true, references: 'AiAgent' }),
    sip_user_id: attr.uuid({ create: true, update: true, nullable: true, sortable: true, filterable: true, references: 'SipUser' }),
    ...timestamps,
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
    gateway: rel.belongsTo('Gateway', 'gateway_id'),
    ai_agent: rel.belongsTo('AiAgent', 'ai_agent_id'),
    sip_user: rel.belongsTo('SipUser', 'sip_user_id'),
  },
  uniqueConstraints: { phone_numbers_number_key: 'number' },
  operations: { list: true, get: true, create: true, update: true, delete: true },
  access: { read: EVERY_ROLE, create: ADMINS, update: ADMINS, delete: ADMINS },
  beforeInsert: checkNumber,
  beforeUpdate: checkNumber,
});
