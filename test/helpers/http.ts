import type { FastifyInstance } from 'fastify';
import { expect } from 'vitest';
import { expectJsonApi } from '../support/conformance.js';

interface Response {
  status: number;
  headers: Record<string, string | string[] | number | undefined>;
  body: any;
}

type Method = 'GET' | 'POST' | 'PATCH' | 'PUT' | 'DELETE' | 'HEAD';

/**
 * An HTTP client over app.inject that checks every JSON:API response against
 * the official schema and that no response is a 5xx.
 */
export function client(app: FastifyInstance, token?: string) {
  async function request(method: Method, url: string, body?: unknown, headers: Record<string, string> = {}): Promise<Response> {
    const response = await app.inject({
      method,
      url,
      headers: {
        ...(token ? { authorization: `Bearer ${token}` } : {}),
        ...(body !== undefined ? { 'content-type': 'application/vnd.api+json' } : {}),
        ...headers,
      },
      payload: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    });
    expect(response.statusCode, `${method} ${url} answered ${response.statusCode}: ${response.body}`).toBeLessThan(500);
    let parsed: unknown;
    if (response.body) {
      parsed = JSON.parse(response.body);
      if (url.startsWith('/api/') && !url.startsWith('/api/open_api')) {
        expect(response.headers['content-type']).toContain('application/vnd.api+json');
        expectJsonApi(parsed);
      }
    }
    return { status: response.statusCode, headers: response.headers, body: parsed };
  }
  return {
    get: (url: string, headers?: Record<string, string>) => request('GET', url, undefined, headers),
    post: (url: string, body: unknown, headers?: Record<string, string>) => request('POST', url, body, headers),
    patch: (url: string, body: unknown, headers?: Record<string, string>) => request('PATCH', url, body, headers),
    delete: (url: string, headers?: Record<string, string>) => request('DELETE', url, undefined, headers),
    request,
  };
}

export type Client = ReturnType<typeof client>;

/** `{data: {type, attributes}}` (plus id for updates). */
export function resourceDocument(type: string, attributes: Record<string, unknown>, id?: string) {
  return { data: { type, ...(id ? { id } : {}), attributes, relationships: {} } };
}

export function errorCodes(response: Response): string[] {
  return (response.body?.errors ?? []).map((e: { code: string }) => e.code);
}

export function pointers(response: Response): string[] {
  return (response.body?.errors ?? []).map((e: { source?: { pointer?: string } }) => e.source?.pointer);
}
