/** JWTs issued and verified by the service: HS256 only, with issuer and audience. */
import { createHash } from 'node:crypto';
import { jwtVerify, SignJWT } from 'jose';
import { UUID_PATTERN as UUID } from '../jsonapi/validate.js';

const ISSUER = 'parley';
const AUDIENCE = 'parley-api';

export interface TokenClaims {
  typ: 'api_key' | 'user' | 'visitor';
  /** user id; for a visitor, the visitor's own random id (no user) */
  sub: string;
  /** organisation id */
  org: string;
  /** id of the api_keys or user_sessions row; for a visitor, the publishable key that issued it */
  jti: string;
  /** for API keys: publishable or secret */
  kty?: 'publishable' | 'secret';
  /** for a visitor: the one conversation it may use */
  cnv?: string;
}

/** An expiry `ttlSeconds` from now in whole seconds (as a JWT holds it), and as responses show it (RFC 3339). */
export function expiryIn(ttlSeconds: number): { at: Date; text: string } {
  const at = new Date(Math.floor(Date.now() / 1000 + ttlSeconds) * 1000);
  return { at, text: at.toISOString().replace('.000Z', 'Z') };
}

export async function signToken(claims: TokenClaims, key: Uint8Array, expiresAt?: Date): Promise<string> {
  const { sub, jti, ...rest } = claims;
  const jwt = new SignJWT({ ...rest })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setSubject(sub)
    .setJti(jti)
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setIssuedAt();
  if (expiresAt) jwt.setExpirationTime(Math.floor(expiresAt.getTime() / 1000));
  return jwt.sign(key);
}

/**
 * Tokens whose signature and claims were verified recently, with their claims: verifying an HMAC is a pure
 * function of the token and the key, so a hit skips it. Expiry is still checked on every use, and the record
 * behind the token (revocation, membership) is checked by the caller on every request.
 */
const VERIFIED_CAPACITY = 10_000;
const verified = new WeakMap<Uint8Array, Map<string, { claims: TokenClaims; expiresAtMs: number }>>();

/** The claims of a valid token, or undefined for anything forged, expired or malformed. */
export async function verifyToken(token: string, key: Uint8Array): Promise<TokenClaims | undefined> {
  const cache = verified.get(key) ?? verified.set(key, new Map()).get(key)!;
  const hit = cache.get(token);
  if (hit && hit.expiresAtMs > Date.now()) return hit.claims;
  if (hit) cache.delete(token);
  const claims = await verifySignedToken(token, key);
  if (claims) {
    if (cache.size >= VERIFIED_CAPACITY) cache.delete(cache.keys().next().value!);
    cache.set(token, { claims: claims.claims, expiresAtMs: claims.expiresAtMs });
  }
  return claims?.claims;
}

const isUuid = (value: unknown): value is string => typeof value === 'string' && UUID.test(value);

async function verifySignedToken(token: string, key: Uint8Array): Promise<{ claims: TokenClaims; expiresAtMs: number } | undefined> {
  try {
    const { payload } = await jwtVerify(token, key, { algorithms: ['HS256'], issuer: ISSUER, audience: AUDIENCE });
    const { typ, sub, org, jti, kty, cnv } = payload as Record<string, unknown>;
    if (typ !== 'api_key' && typ !== 'user' && typ !== 'visitor') return undefined;
    if (!isUuid(sub) || !isUuid(org) || !isUuid(jti)) return undefined;
    if (typ === 'api_key' && kty !== 'publishable' && kty !== 'secret') return undefined;
    if (typ === 'visitor' && !isUuid(cnv)) return undefined;
    const claims: TokenClaims = { typ, sub, org, jti, kty: kty as TokenClaims['kty'] };
    if (typ === 'visitor') claims.cnv = cnv as string;
    return { claims, expiresAtMs: payload.exp === undefined ? Infinity : payload.exp * 1000 };
  } catch {
    return undefined;
  }
}

/** What the database keeps of a token: its SHA-256, never the token. */
export const tokenHash = (token: string) => createHash('sha256').update(token).digest('base64url');
