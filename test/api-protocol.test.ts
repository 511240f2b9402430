import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, errorCodes, resourceDocument, type Client } from './helpers/http.js';
import { expectJsonApi } from './support/conformance.js';

let t: TestApp;
let tenant: Tenant;
let api: Client;

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Protocol');
  api = client(t.app, tenant.owner.token);
});
afterAll(async () => t?.close());

const body = resourceDocument('Conversation', {});

describe('media types', () => {
  it('accepts application/vnd.api+json and application/json bodies', async () => {
    expect((await api.post('/api/conversations', body)).status).toBe(201);
    expect((await api.post('/api/conversations', body, { 'content-type': 'application/json' })).status).toBe(201);
    expect((await api.post('/api/conversations', body, { 'content-type': 'application/vnd.api+json; ext="https://example.com/ext"' })).status).toBe(201);
  });

  it('refuses other content types and media type parameters with 415', async () => {
    for (const contentType of ['text/plain', 'application/vnd.api+json; charset=utf-8', 'application/x-www-form-urlencoded']) {
      const response = await api.post('/api/conversations', body, { 'content-type': contentType });
      expect(response.status, contentType).toBe(415);
      expect(errorCodes(response)).toEqual(['unsupported_media_type']);
    }
  });

  it('answers 406 only when every JSON:API Accept range has parameters', async () => {
    expect((await api.get('/api/conversations', { accept: 'application/vnd.api+json; charset=utf-8' })).status).toBe(406);
    const mixed = await api.get('/api/conversations', { accept: 'application/vnd.api+json; charset=utf-8, application/vnd.api+json' });
    expect(mixed.status).toBe(200);
    expect((await api.get('/api/conversations', { accept: '*/*' })).status).toBe(200);
    expect((await api.get('/api/conversations', { accept: 'application/vnd.api+json; profile="x"' })).status).toBe(200);
  });

  it('sets Content-Type and Vary on every API response', async () => {
    const response = await api.get('/api/conversations');
    expect(response.headers['content-type']).toBe('application/vnd.api+json');
    expect(response.headers.vary).toContain('Accept');
  });

  it('answers a body over 1 MiB with 413', async () => {
    const huge = resourceDocument('Conversation', { metadata: { blob: 'x'.repeat(1024 * 1024 + 10) } });
    const response = await api.post('/api/conversations', huge);
    expect(response.status).toBe(413);
  });
});

describe('routing', () => {
  it('answers unknown routes with a JSON:API 404', async () => {
    const response = await api.get('/api/nothing_here');
    expect(response.status).toBe(404);
    expect(errorCodes(response)).toEqual(['not_found']);
  });

  it('answers 405 with Allow on known paths', async () => {
    const response = await api.request('DELETE', '/api/conversations');
    expect(response.status).toBe(405);
    expect(response.headers.allow).toBe('GET, POST, HEAD');
    const login = await api.get('/api/users/login');
    expect(login.status).toBe(405);
    expect(login.headers.allow).toBe('POST');
  });

  it('refuses query parameters an endpoint does not take', async () => {
    const created = (await api.post('/api/conversations', body)).body.data.id;
    const response = await api.patch(`/api/conversations/${created}?sort=id`, resourceDocument('Conversation', {}, created));
    expect(response.status).toBe(400);
    expect(response.body.errors[0]).toMatchObject({ code: 'unknown_parameter', source: { parameter: 'sort' } });
  });

  it('links are absolute and use PUBLIC_URL-less request host', async () => {
    const response = await api.get('/api/conversations', { host: 'parley.example.com' });
    expect(response.body.links.self).toBe('http://parley.example.com/api/conversations');
  });
});

describe('the HTTP layer below the routes', () => {
  /** Sends raw bytes to the listening server and returns the raw answer. */
  async function raw(port: number, request: string): Promise<{ status: number; headers: string; body: string }> {
    const answer = await new Promise<string>((resolve, reject) => {
      let data = '';
      const socket = net.connect(port, '127.0.0.1', () => socket.write(request));
      socket.on('data', (chunk) => (data += chunk));
      socket.on('end', () => resolve(data));
      socket.on('error', reject);
    });
    const [head, body] = answer.split('\r\n\r\n');
    return { status: Number(head.split(' ')[1]), headers: head, body };
  }

  it('answers oversized headers and malformed HTTP with JSON:API errors', async () => {
    await t.app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = t.app.server.address() as net.AddressInfo;
    const big = await raw(port, `GET /api/conversations HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`);
    expect(big.status).toBe(431);
    expect(big.headers).toContain('application/vnd.api+json');
    expectJsonApi(JSON.parse(big.body));
    expect(JSON.parse(big.body).errors[0].code).toBe('headers_too_large');
    const garbage = await raw(port, 'NOT HTTP AT ALL\r\n\r\n');
    expect(garbage.status).toBe(400);
    expectJsonApi(JSON.parse(garbage.body));
  });
});
