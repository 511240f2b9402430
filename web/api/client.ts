/**
 * The typed API client of the console and the widget: openapi-fetch over the types that
 * web/scripts/api-types.ts generates from the server's own OpenAPI document, with the JSON:API media type
 * and the bearer credential added to every request.
 */
import createClient, { type Middleware } from 'openapi-fetch';
import type { components, paths } from './schema';

export type Schemas = components['schemas'];
export type ErrorDocument = Schemas['ErrorDocument'];
export type ConversationResource = Schemas['ConversationResource'];
export type ConversationItemResource = Schemas['ConversationItemResource'];
export type CallResource = Schemas['CallResource'];
export type CallParticipantResource = Schemas['CallParticipantResource'];
export type CallTranscriptResource = Schemas['CallTranscriptResource'];
export type OperatorStatusResource = Schemas['OperatorStatusResource'];
export type SipUserResource = Schemas['SipUserResource'];
export type ItemRole = NonNullable<Schemas['ConversationItemAttributes']['role']>;
export type OperatorAvailability = NonNullable<Schemas['OperatorStatusAttributes']['status']>;
export type ConversationStatus = NonNullable<Schemas['ConversationAttributes']['status']>;
export type Channel = NonNullable<Schemas['ConversationAttributes']['channel']>;

export const JSON_API = 'application/vnd.api+json';

export interface ClientOptions {
  baseUrl: string;
  /** The bearer token for each request (read each time: it changes on sign-in and sign-out). */
  token: () => string | undefined;
  /** Called on a 401 from a request that carried the session's token: the session expired or was revoked. */
  onUnauthorized?: () => void;
}

export function apiClient(options: ClientOptions) {
  const client = createClient<paths>({ baseUrl: options.baseUrl, headers: { Accept: JSON_API } });
  const auth: Middleware = {
    onRequest({ request }) {
      const token = options.token();
      if (token) request.headers.set('Authorization', `Bearer ${token}`);
      // JSON:API requires its media type, without parameters, on every request with a body (RFC 7159 + JSON:API 1.0).
      if (request.method !== 'GET') request.headers.set('Content-Type', JSON_API);
      return request;
    },
    onResponse({ request, response }) {
      // Only a refused session token means the session ended: a sign-in refused with the publishable key (a wrong
      // password) is that form's own error, not an expired session.
      const token = options.token();
      if (response.status === 401 && token && request.headers.get('Authorization') === `Bearer ${token}`) options.onUnauthorized?.();
      return response;
    },
  };
  client.use(auth);
  return client;
}

export type ApiClient = ReturnType<typeof apiClient>;

/** What failed and why: the fallback sentence, then each problem of the JSON:API error document (with its field). */
export function describeError(error: unknown, fallback = 'The request failed.'): string {
  const errors = (error as ErrorDocument | undefined)?.errors;
  if (!errors?.length) return error instanceof Error ? `${fallback} (${error.message})` : fallback;
  const details = errors.map((e) => {
    const field = e.source?.pointer?.split('/').pop();
    return `${e.detail ?? e.title}${field && field !== 'data' ? ` (${field})` : ''}`;
  });
  return `${fallback} ${details.join(' ')}`;
}
