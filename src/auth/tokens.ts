/** JWTs issued and verified by the service: HS256 only, with issuer and audience. */
import { createHash } from 'node:crypto';
import { jwtVerify, SignJWT } from 'jose';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export const ISSUER = 'parley';
export const AUDIENCE = 'parley-api';

export interface TokenClaims {
  typ: 'api_key' | 'user';
  /** user id */
  sub: string;
  /** organisation id */
  org: string;
  /** id of the api_keys or user_sessions row */
  jti: string;
  /** for API keys: publishable or secret */
  kty?: 'publishable' | 'secret';
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

/** The claims of a valid token, or undefined for anything forged, expired or malformed. */
export async function verifyToken(token: string, key: Uint8Array): Promise<TokenClaims | undefined> {
  try {
    const { payload } = await jwtVerify(token, key, { algorithms: ['HS256'], issuer: ISSUER, audience: AUDIENCE });
    const { typ, sub, org, jti, kty } = payload as Record<string, unknown>;
    if ((typ !== 'api_key' && typ !== 'user') || ![sub, org, jti].every((v) => typeof v === 'string' && UUID.test(v))) {
      return undefined;
    }
    if (typ === 'api_key' && kty !== 'publishable' && kty !== 'secret') return undefined;
    return { typ, sub: sub as string, org: org as string, jti: jti as string, kty: kty as TokenClaims['kty'] };
  } catch {
    return undefined;
  }
}

/** What the database keeps of a token: its SHA-256, never the token. */
export const tokenHash = (token: string) => createHash('sha256').update(token).digest('base64url');
