import { randomBytes, randomUUID } from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';
import { signToken, verifyToken, type TokenClaims } from '../src/auth/tokens.js';

const claims = (): TokenClaims => ({ typ: 'api_key', sub: randomUUID(), org: randomUUID(), jti: randomUUID(), kty: 'secret' });

describe('verified token cache', () => {
  it('still refuses a token once it expires, though it was verified before', async () => {
    const key = randomBytes(32);
    const expiresAt = new Date(Date.now() + 60_000);
    const token = await signToken(claims(), key, expiresAt);
    expect(await verifyToken(token, key)).toBeDefined();
    vi.useFakeTimers({ now: expiresAt.getTime() + 1000, toFake: ['Date'] });
    try {
      expect(await verifyToken(token, key)).toBeUndefined();
    } finally {
      vi.useRealTimers();
    }
  });

  it('does not carry a verification over to another key', async () => {
    const key = randomBytes(32);
    const token = await signToken(claims(), key);
    expect(await verifyToken(token, key)).toBeDefined();
    expect(await verifyToken(token, randomBytes(32))).toBeUndefined();
  });
});
