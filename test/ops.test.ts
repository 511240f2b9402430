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
