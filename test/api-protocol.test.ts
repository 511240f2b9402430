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
    expect(
      (await api.post('/api/conversations', body, { 'content-type': 'application/vnd.api+json; profile="https://example.com/profile"' }))
        .status,
    ).toBe(201);
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
  it('answers oversized headers and malformed HTTP with JSON:API errors', async () => {
    await t.app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = t.app.server.address() as net.AddressInfo;
    const big = await rawRequest(port, `GET /api/conversations HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`);
    expect(big.status).toBe(431);
    expect(big.headers).toContain('application/vnd.api+json');
    expectJsonApi(JSON.parse(big.body));
    expect(JSON.parse(big.body).errors[0].code).toBe('headers_too_large');
    const garbage = await rawRequest(port, 'NOT HTTP AT ALL\r\n\r\n');
    expect(garbage.status).toBe(400);
    expectJsonApi(JSON.parse(garbage.body));
  });
});

describe('media types outside /api', () => {
  it('serves every JSON:API document as exactly application/vnd.api+json with Vary: Accept, wherever its URL', async () => {
    const anonymous = client(t.app);
    for (const [method, url] of [
      ['GET', '/nowhere'],
      ['GET', '/api/nothing_here'],
      ['POST', '/healthz'],
      ['DELETE', '/metrics'],
    ] as const) {
      const response = await anonymous.request(method, url, method === 'POST' ? {} : undefined);
      expect(response.headers['content-type'], `${method} ${url}`).toBe('application/vnd.api+json');
      expect(String(response.headers.vary), `${method} ${url}`).toMatch(/\bAccept\b/);
      expectJsonApi(response.body);
    }
  });

  it('leaves the OpenAPI document, metrics and health bodies in their own media types', async () => {
    const anonymous = client(t.app);
    expect((await anonymous.get('/api/open_api')).headers['content-type']).toMatch(/^application\/vnd\.oai\.openapi\+json/);
    expect((await t.app.inject({ method: 'GET', url: '/metrics' })).headers['content-type']).toMatch(/^text\/plain/);
    expect((await anonymous.get('/healthz')).headers['content-type']).toMatch(/^application\/json/);
    expect((await anonymous.get('/readyz')).headers['content-type']).toMatch(/^application\/json/);
    const docs = await t.app.inject({ method: 'GET', url: '/docs/' });
    expect(docs.statusCode).toBeLessThan(400);
    expect(docs.headers['content-type']).toMatch(/^text\/html/);
  });
});

describe('405 on the operations and OpenAPI paths', () => {
  it('answers other methods with 405, Allow and a JSON:API error, without a credential', async () => {
    const anonymous = client(t.app);
    for (const url of ['/healthz', '/readyz', '/metrics', '/api/open_api']) {
      for (const method of ['POST', 'PATCH', 'PUT', 'DELETE'] as const) {
        const response = await anonymous.request(method, url, method === 'DELETE' ? undefined : {});
        expect(response.status, `${method} ${url}`).toBe(405);
        expect(response.headers.allow, `${method} ${url}`).toBe('GET, HEAD');
        expect(response.headers['content-type']).toBe('application/vnd.api+json');
        expectJsonApi(response.body);
        expect(errorCodes(response)).toEqual(['method_not_allowed']);
      }
      const options = await t.app.inject({ method: 'OPTIONS', url });
      expect(options.statusCode, `OPTIONS ${url}`).toBe(405);
      expect(options.headers.allow).toBe('GET, HEAD');
      expect(options.headers['content-type']).toBe('application/vnd.api+json');
      expectJsonApi(options.json());
      expect(options.json().errors[0].code).toBe('method_not_allowed');
      expect((await t.app.inject({ method: 'HEAD', url })).statusCode, `HEAD ${url}`).toBe(200);
    }
  });

  it('still answers OPTIONS on API collection paths with 405', async () => {
    const response = await t.app.inject({
      method: 'OPTIONS',
      url: '/api/conversations',
      headers: { authorization: `Bearer ${tenant.owner.token}` },
    });
    expect(response.statusCode).toBe(405);
    expect(response.headers.allow).toBe('GET, POST, HEAD');
    expectJsonApi(response.json());
  });
});

describe('Accept weights', () => {
  it('ignores q and what follows it when checking Accept', async () => {
    for (const accept of [
      'application/vnd.api+json;q=0.9',
      'application/vnd.api+json; q=0.5, */*;q=0.1',
      'application/vnd.api+json; profile="https://example.com/p"; q=0.8',
      'application/vnd.api+json;q=0.9;charset=utf-8',
      'APPLICATION/VND.API+JSON;Q=1',
    ]) {
      expect((await api.get('/api/conversations', { accept })).status, accept).toBe(200);
    }
    for (const accept of ['application/vnd.api+json; charset=utf-8', 'application/vnd.api+json; charset=utf-8;q=0.9']) {
      const response = await api.get('/api/conversations', { accept });
      expect(response.status, accept).toBe(406);
      expect(response.body.errors[0]).toMatchObject({ code: 'not_acceptable', source: { header: 'Accept' } });
    }
  });
});

describe('the Host header', () => {
  it('refuses a Host that is not host[:port] with 400 before authentication', async () => {
    for (const host of [
      'evil"<>',
      'a b',
      'example.com:99999',
      'example.com:port',
      '[not-an-address]:80',
      'user@example.com',
      'example..com',
      '-',
    ]) {
      for (const caller of [api, client(t.app)]) {
        const response = await caller.get('/api/conversations', { host });
        expect(response.status, host).toBe(400);
        expect(response.body.errors[0]).toMatchObject({ code: 'bad_request', source: { header: 'Host' } });
      }
    }
  });

  it('accepts host names, IPv4 and IPv6 addresses with or without a port', async () => {
    for (const host of [
      'parley.example.com',
      'parley.example.com:8443',
      '127.0.0.1:3000',
      '[::1]:8080',
      '[2001:db8::1]',
      'my_service',
      'localhost.',
    ]) {
      const response = await api.get('/api/conversations', { host });
      expect(response.status, host).toBe(200);
      expect(response.body.links.self).toBe(`http://${host}/api/conversations`);
    }
  });

  it('checks X-Forwarded-Host and X-Forwarded-Proto behind a trusted proxy; PUBLIC_URL makes an empty Host acceptable', async () => {
    const proxied = await startTestApp({ TRUST_PROXY: 'true', PUBLIC_URL: 'https://parley.example' });
    try {
      const anonymous = client(proxied.app);
      const badHost = await anonymous.get('/api/conversations', { 'x-forwarded-host': 'evil"<>' });
      expect(badHost.status).toBe(400);
      expect(badHost.body.errors[0]).toMatchObject({ code: 'bad_request', source: { header: 'X-Forwarded-Host' } });
      const badProto = await anonymous.get('/api/conversations', { 'x-forwarded-proto': 'javascript' });
      expect(badProto.status).toBe(400);
      expect(badProto.body.errors[0]).toMatchObject({ code: 'bad_request', source: { header: 'X-Forwarded-Proto' } });
      expect(
        (await anonymous.get('/api/conversations', { 'x-forwarded-host': 'api.example.com', 'x-forwarded-proto': 'https' })).status,
      ).toBe(401);
      await proxied.app.listen({ port: 0, host: '127.0.0.1' });
      const { port } = proxied.app.server.address() as net.AddressInfo;
      const empty = await rawRequest(port, 'GET /api/conversations HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n');
      expect(empty.status).toBe(401);
      expectJsonApi(JSON.parse(empty.body));
    } finally {
      await proxied.close();
    }
  });
});

/** Sends raw bytes to a listening server and returns the raw answer. */
async function rawRequest(port: number, request: string): Promise<{ status: number; headers: string; body: string }> {
  const answer = await new Promise<string>((resolve, reject) => {
    let data = '';
    const socket = net.connect(port, '127.0.0.1', () => socket.write(request));
    socket.on('data', (chunk) => (data += chunk));
    socket.on('end', () => resolve(data));
    socket.on('error', reject);
  });
  const split = answer.indexOf('\r\n\r\n');
  return { status: Number(answer.split(' ')[1]), headers: answer.slice(0, split), body: answer.slice(split + 4) };
}

describe('requests with an empty or missing Host', () => {
  it('answers an HTTP/1.1 request with an empty or no Host with a JSON:API 400', async () => {
    if (!t.app.server.listening) await t.app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = t.app.server.address() as net.AddressInfo;
    for (const request of [
      'GET /api/conversations HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n',
      `GET /api/conversations HTTP/1.1\r\nHost:\r\nAuthorization: Bearer ${tenant.owner.token}\r\nConnection: close\r\n\r\n`,
      'GET /api/conversations HTTP/1.1\r\nConnection: close\r\n\r\n',
      'GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n',
    ]) {
      const answer = await rawRequest(port, request);
      expect(answer.status, request).toBe(400);
      expect(answer.headers).toMatch(/^content-type: application\/vnd\.api\+json\r?$/im);
      const document = JSON.parse(answer.body);
      expectJsonApi(document);
      expect(document.errors[0]).toMatchObject({ code: 'bad_request', source: { header: 'Host' } });
    }
    // HTTP/1.0 has no Host requirement; the health check still answers.
    expect((await rawRequest(port, 'GET /healthz HTTP/1.0\r\n\r\n')).status).toBe(200);
  });
});

describe('trailing slashes', () => {
  it('reach the same route as the path without one', async () => {
    const list = await api.get('/api/conversations/');
    expect(list.status).toBe(200);
    expect(Array.isArray(list.body.data)).toBe(true);
    expect((await api.get('/api/calls/')).status).toBe(200);
    // A path that names nothing: with or without the slash, no route.
    expect((await api.get('/api/nowhere/')).status).toBe(404);
    expect((await api.get('/api/nowhere')).status).toBe(404);
  });
});
