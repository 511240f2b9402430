import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';
import { type ActionContext, ApiError, attr, defineResource, rel } from '../jsonapi/index.js';
import { ADMINS } from './scopes.js';
import { timestamps } from './timestamps.js';
import { GATEWAY_PROVIDERS } from './values.js';
import { isPublicAddress } from './webhook-url.js';
import { at } from './pointer.js';

const HOST_NAME = '[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*';
const HOST = `^${HOST_NAME}$`;
const HOST_PORT = `^(${HOST_NAME}|\\[[0-9A-Fa-f:.]+\\])(:[0-9]{1,5})?$`;
const SIP_USER_PART = "^[A-Za-z0-9_.!~*'()&=+$,;?/%-]+$";

/** An IPv4 or IPv6 CIDR block such as `203.0.113.0/24` or `2001:db8::/32`. */
export function cidrProblem(value: unknown): string | undefined {
  const problem = 'must be an IPv4 or IPv6 CIDR block, such as 203.0.113.0/24';
  if (typeof value !== 'string') return problem;
  const [address, bits, extra] = value.split('/');
  const version = isIP(address ?? '');
  if (version === 0 || extra !== undefined || bits === undefined || !/^\d{1,3}$/.test(bits)) return problem;
  if (Number(bits) > (version === 4 ? 32 : 128)) return problem;
  const network = (version === 4 ? ipaddr.IPv4 : ipaddr.IPv6).networkAddressFromCIDR(value).toString();
  return network === ipaddr.parse(address).toString() ? undefined : `has host bits set: the block is ${network}/${bits}`;
}

function proxyProblem(value: unknown): string | undefined {
  if (typeof value !== 'string') return undefined;
  const port = /:(\d+)$/.exec(value)?.[1];
  return port !== undefined && (Number(port) < 1 || Number(port) > 65535) ? 'port must be 1..65535' : undefined;
}

/** The host of `host[:port]` or `[IPv6]:port`. */
function hostOf(value: string): string {
  return /^\[([^\]]+)\]/.exec(value)?.[1] ?? value.replace(/:\d+$/, '');
}

/**
 * Why the SIP edge must not send to `value` (a gateway's proxy, or its realm when it has none), or undefined:
 * a loopback, private (RFC 1918, RFC 4193), link-local, CGNAT or otherwise non-public address, or `localhost`
 * (RFC 6761), would let a tenant make the edge send REGISTERs and calls into the network it runs in.
 * Host names are not resolved here (a carrier's name may have no address until SRV lookup); an IP literal is
 * judged as written.
 */
export function privateGatewayProblem(value: unknown): string | undefined {
  if (typeof value !== 'string') return undefined;
  const host = hostOf(value).toLowerCase();
  const literal = isIP(host) !== 0;
  if ((literal && !isPublicAddress(host)) || host === 'localhost' || host.endsWith('.localhost')) {
    return 'names a loopback, private or link-local address, which the SIP edge does not send to (SIP_ALLOW_PRIVATE_GATEWAYS=true allows it for development)';
  }
  return undefined;
}

/** `name` is derived: `username@realm`, unique per organisation. The destination must be public (see above). */
function deriveName(ctx: ActionContext): void {
  const username = ctx.values.username ?? ctx.existing?.username;
  const realm = ctx.values.realm ?? ctx.existing?.realm;
  ctx.values.name = `${username}@${realm}`;
  if (ctx.services.config.sipAllowPrivateGateways) return;
  const proxy = 'proxy' in ctx.values ? ctx.values.proxy : ctx.existing?.proxy;
  const [attribute, destination] = proxy ? ['proxy', proxy] : ['realm', realm];
  const problem = privateGatewayProblem(destination);
  if (problem) throw ApiError.of('invalid_attribute', `\`${attribute}\` ${problem}.`, at(attribute));
}

export default defineResource({
  type: 'Gateway',
  path: 'gateways',
  table: 'gateways',
  attributes: {
    name: attr.string({ sortable: true, filterable: true }),
    provider: attr.enum(GATEWAY_PROVIDERS, { create: true, update: true, default: 'generic', sortable: true, filterable: true }),
    username: attr.string({ create: 'required', update: true, minLength: 1, maxLength: 128, pattern: SIP_USER_PART }),
    password: attr.string({ create: true, update: true, nullable: true, writeOnly: true, minLength: 1, maxLength: 128 }),
    realm: attr.string({
      create: 'required',
      update: true,
      minLength: 1,
      maxLength: 253,
      pattern: HOST,
      sortable: true,
      filterable: true,
      example: 'sip.example.com',
    }),
    proxy: attr.string({ create: true, update: true, nullable: true, maxLength: 260, pattern: HOST_PORT, check: proxyProblem }),
    register: attr.boolean({ create: true, update: true, default: true, sortable: true, filterable: true }),
    from_domain: attr.string({ create: true, update: true, nullable: true, maxLength: 253, pattern: HOST }),
    from_user: attr.string({ create: true, update: true, nullable: true, maxLength: 128, pattern: SIP_USER_PART }),
    inbound_acl: attr.stringArray({
      create: true,
      update: true,
      maxItems: 64,
      items: { maxLength: 49 },
      check: (v) => (Array.isArray(v) ? v.map(cidrProblem).find(Boolean) : undefined),
      default: () => [],
    }),
    ...timestamps,
  },
  relationships: {
    organisation: rel.belongsTo('Organisation', 'organisation_id'),
  },
  uniqueConstraints: { gateways_org_name_key: 'name' },
  // Nothing names a gateway: a delete removes it alone (the SIP edge stops registering it within seconds).
  operations: { list: true, get: true, create: true, update: true, delete: true },
  access: { read: ADMINS, create: ADMINS, update: ADMINS, delete: ADMINS },
  beforeInsert: deriveName,
  beforeUpdate: deriveName,
});
