import { createOrganisation, createUserInOrganisation } from '../../src/auth/accounts.js';
import { createApiKey } from '../../src/auth/api-keys.js';
import { issueUserToken } from '../../src/auth/user-tokens.js';
import type { Role } from '../../src/jsonapi/principal.js';
import type { TestApp } from './app.js';

export interface Member {
  id: string;
  email: string;
  password: string;
  fullName: string;
  role: Role;
  /** A user access token, as login would issue. */
  token: string;
}

export interface Tenant {
  organisationId: string;
  owner: Member;
  admin: Member;
  operator: Member;
  publishableKey: string;
  /** The owner's secret key. */
  secretKey: string;
}

let counter = 0;

/** An organisation with an owner, an admin and an operator, each with a key and a token. */
export async function seedTenant(t: TestApp, name = 'Tenant'): Promise<Tenant> {
  const organisation = await createOrganisation(t.services.records!, { name });
  const tag = `${Date.now().toString(36)}${(counter++).toString(36)}`;
  const member = async (role: Role, fullName: string): Promise<Member> => {
    const email = `${role}.${tag}@${name.toLowerCase().replace(/\W/g, '')}.example`;
    const password = `pw-${role}-${tag}`;
    const user = await createUserInOrganisation(t.services.records!, { organisationId: organisation.id, email, password, fullName, role });
    await createApiKey(t.services.records!, { organisationId: organisation.id, userId: user.id, keyType: 'secret', name: `${role} key` });
    const { token } = await issueUserToken(t.db, t.services, { organisationId: organisation.id, userId: user.id });
    return { id: user.id, email, password, fullName, role, token };
  };
  const owner = await member('owner', `${name} Owner`);
  const admin = await member('admin', `${name} Admin`);
  const operator = await member('operator', `${name} Operator`);
  const publishable = await createApiKey(t.services.records!, {
    organisationId: organisation.id,
    userId: owner.id,
    keyType: 'publishable',
    name: 'widget',
  });
  const secret = await createApiKey(t.services.records!, {
    organisationId: organisation.id,
    userId: owner.id,
    keyType: 'secret',
    name: 'server',
  });
  return { organisationId: organisation.id, owner, admin, operator, publishableKey: publishable.token, secretKey: secret.token };
}
