import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';

let t: TestApp;
beforeAll(async () => {
  t = await startTestApp();
});
afterAll(async () => t?.close());

describe('operations endpoints', () => {
  it('healthz and readyz answer without a credential', async () => {
    expect((await t.app.inject({ url: '/healthz' })).json()).toEqual({ status: 'ok' });
    const ready = await t.app.inject({ url: '/readyz' });
    expect(ready.statusCode).toBe(200);
    expect(ready.json().status).toBe('ok');
  });

  it('metrics count requests per route and status', async () => {
    await t.app.inject({ url: '/api/conversations' });
    const metrics = await t.app.inject({ url: '/metrics' });
    expect(metrics.statusCode).toBe(200);
    expect(metrics.body).toContain('parley_http_request_duration_seconds_count{method="GET",route="/api/conversations",status="401"} 1');
    expect(metrics.body).toMatch(
      /parley_http_request_duration_seconds_bucket\{le="0\.002",method="GET",route="\/api\/conversations",status="401"\}/,
    );
  });
});

describe('metrics are not public', () => {
  it('are refused to a client elsewhere without a token, and with METRICS_TOKEN require it from anyone', async () => {
    const remote = await t.app.inject({ url: '/metrics', remoteAddress: '203.0.113.7' });
    expect(remote.statusCode).toBe(403);
    expect(remote.body).not.toContain('parley_http_request_duration_seconds');
    const forwarded = await t.app.inject({ url: '/metrics', remoteAddress: '203.0.113.7', headers: { 'x-forwarded-for': '127.0.0.1' } });
    expect(forwarded.statusCode).toBe(403);

    const guarded = await startTestApp({ METRICS_TOKEN: 'metrics-secret-123' });
    try {
      expect((await guarded.app.inject({ url: '/metrics' })).statusCode).toBe(403);
      const wrong = { authorization: 'Bearer metrics-secret-124' };
      expect((await guarded.app.inject({ url: '/metrics', remoteAddress: '203.0.113.7', headers: wrong })).statusCode).toBe(403);
      const right = await guarded.app.inject({
        url: '/metrics',
        remoteAddress: '203.0.113.7',
        headers: { authorization: 'Bearer metrics-secret-123' },
      });
      expect(right.statusCode).toBe(200);
      expect(right.body).toContain('parley_http_request_duration_seconds');
    } finally {
      await guarded.close();
    }
  });
});

describe('readiness without a database', () => {
  it('answers 503 once the database is gone', async () => {
    const broken = await startTestApp();
    await broken.database.close();
    const ready = await broken.app.inject({ url: '/readyz' });
    expect(ready.statusCode).toBe(503);
    expect(ready.json().errors[0].code).toBe('unavailable');
    await broken.close();
  });
});
