import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './support/app.js';
import { seedTenant, type Tenant } from './support/seed.js';
import { client, type Client } from './helpers/http.js';
import { insertCall, insertParticipant, insertTranscript } from './helpers/telephony.js';

let t: TestApp;
let tenant: Tenant;
let api: Client;
let callId: string;
let transcripts: string[];

beforeAll(async () => {
  t = await startTestApp();
  tenant = await seedTenant(t, 'Query');
  api = client(t.app, tenant.admin.token);
  callId = await insertCall(t.db, tenant.organisationId);
  transcripts = [];
  const speakers = ['caller', 'agent', 'operator', 'caller', 'agent', 'caller'];
  for (const [i, speaker] of speakers.entries()) {
    transcripts.push(await insertTranscript(t.db, tenant.organisationId, callId, i, { speaker, content: `line ${i} ${speaker}` }));
  }
});
afterAll(async () => t?.close());

const indexes = (response: { body: { data: { attributes: { content_index: number } }[] } }) =>
  response.body.data.map((r) => r.attributes.content_index);

describe('filter operators', () => {
  const cases: [string, number[]][] = [
    ['filter[speaker]=agent', [1, 4]],
    ['filter[speaker][eq]=agent', [1, 4]],
    ['filter[speaker][not_eq]=caller', [1, 2, 4]],
    ['filter[speaker][in]=agent,operator', [1, 2, 4]],
    ['filter[speaker][in][0]=operator&filter[speaker][in][1]=agent', [1, 2, 4]],
    ['filter[content_index][less_than]=2', [0, 1]],
    ['filter[content_index][greater_than]=3', [4, 5]],
    ['filter[content_index][less_than_or_equal]=1', [0, 1]],
    ['filter[content_index][greater_than_or_equal]=4', [4, 5]],
    ['filter[content][contains]=operator', [2]],
    ['filter[content][is_nil]=false', [0, 1, 2, 3, 4, 5]],
    ['filter[occurred_at][greater_than]=2026-01-01T10:00:03Z', [4, 5]],
    ['filter[occurred_at][less_than]=2026-01-01T12:00:01%2B02:00', [0]],
    ['filter[or][0][content_index]=0&filter[or][1][speaker]=operator', [0, 2]],
    ['filter[and][0][speaker]=caller&filter[and][1][content_index][greater_than]=0', [3, 5]],
    ['filter[not][speaker]=caller', [1, 2, 4]],
    ['filter[not][or][0][speaker]=caller&filter[not][or][1][speaker]=agent', [2]],
  ];
  for (const [query, expected] of cases) {
    it(query, async () => {
      const response = await api.get(`/api/call_transcripts?filter[call_id]=${callId}&${query}`);
      expect(response.status).toBe(200);
      expect(indexes(response)).toEqual(expected);
    });
  }

  it('refuses and/or groups that are not indexed', async () => {
    for (const query of ['filter[or][a][speaker]=agent', 'filter[and]=x', 'filter[or][0][speaker]=agent&filter[or][b][speaker]=caller']) {
      const response = await api.get(`/api/call_transcripts?${query}`);
      expect(response.status, query).toBe(400);
      expect(response.body.errors[0]).toMatchObject({ code: 'invalid_filter' });
    }
    const refused = await api.get('/api/call_transcripts?filter[or][a][speaker]=agent');
    expect(refused.body.errors[0].source.parameter).toBe('filter[or]');
  });

  it('refuses values of the wrong type, naming the parameter', async () => {
    const response = await api.get(
      '/api/call_transcripts?filter[content_index][less_than]=two&filter[occurred_at]=yesterday&filter[speaker]=robot&filter[call_id]=x&filter[content][like]=y',
    );
    expect(response.status).toBe(400);
    expect(response.body.errors.map((e: { source: { parameter: string } }) => e.source.parameter).sort()).toEqual(
      ['filter[call_id]', 'filter[content][like]', 'filter[content_index][less_than]', 'filter[occurred_at]', 'filter[speaker]'].sort(),
    );
  });
});

describe('keyset paging', () => {
  it('visits every record once, in order, while records are being added', async () => {
    const fresh = await seedTenant(t, 'Walk');
    const walker = client(t.app, fresh.admin.token);
    const call = await insertCall(t.db, fresh.organisationId);
    for (let i = 0; i < 12; i++) await insertParticipant(t.db, fresh.organisationId, call, { role: i % 3 === 0 ? 'agent' : 'caller' });
    const seen: string[] = [];
    let next: string | null = '/api/call_participants?sort=role&page[limit]=5';
    let added = 0;
    while (next) {
      const page = await walker.get(next.replace(/^https?:\/\/[^/]+/, ''));
      seen.push(...page.body.data.map((r: { id: string }) => r.id));
      next = page.body.links.next;
      // New records sort after the cursor (role 'operator' > 'caller'), so the walk must reach them too.
      if (next && added < 3) {
        await insertParticipant(t.db, fresh.organisationId, call, { role: 'operator' });
        added += 1;
      }
    }
    expect(new Set(seen).size).toBe(seen.length);
    expect(seen).toHaveLength(12 + added);
    const all = await walker.get('/api/call_participants?sort=role&page[limit]=100');
    expect(seen).toEqual(all.body.data.map((r: { id: string }) => r.id));
  });

  it('walks backwards with prev links and refuses foreign cursors', async () => {
    const first = await api.get(`/api/call_transcripts?filter[call_id]=${callId}&page[limit]=2`);
    const second = await api.get(first.body.links.next.replace(/^https?:\/\/[^/]+/, ''));
    expect(indexes(second)).toEqual([2, 3]);
    const back = await api.get(second.body.links.prev.replace(/^https?:\/\/[^/]+/, ''));
    expect(indexes(back)).toEqual([0, 1]);
    expect(back.body.links.prev).toBeNull();
    const cursor = new URL(second.body.links.prev).searchParams.get('page[before]');
    const mismatched = await api.get(`/api/call_transcripts?sort=-speaker,content&page[after]=${cursor}`);
    expect(mismatched.status).toBe(400);
    expect(mismatched.body.errors[0].source.parameter).toBe('page[after]');
    expect((await api.get('/api/call_transcripts?page[after]=bm9wZQ')).status).toBe(400);
  });

  it('accepts only cursors it issued, for the sort they were issued for', async () => {
    const first = await api.get(`/api/call_transcripts?sort=occurred_at&page[limit]=2`);
    const cursor = new URL(first.body.links.next).searchParams.get('page[after]')!;
    expect((await api.get(`/api/call_transcripts?sort=occurred_at&page[after]=${cursor}`)).status).toBe(200);
    // Same shape (one key and id), other sort: refused, not silently empty.
    const swapped = await api.get(`/api/call_transcripts?sort=content&page[after]=${cursor}`);
    expect(swapped.status).toBe(400);
    expect(swapped.body.errors[0]).toMatchObject({ code: 'invalid_pagination', source: { parameter: 'page[after]' } });
    // A hand-made cursor with a value of the wrong type, and a tampered one: 400, never a 500.
    const [payload, mac] = cursor.split('.');
    const decoded = JSON.parse(Buffer.from(payload, 'base64url').toString());
    const forged = Buffer.from(JSON.stringify([decoded[0], ['notadate'], decoded[2]])).toString('base64url');
    for (const bad of [`${forged}.${mac}`, forged, `${payload}.${'A'.repeat(22)}`, `${payload}x.${mac}`]) {
      const response = await api.get(`/api/call_transcripts?sort=occurred_at&page[after]=${bad}`);
      expect(response.status, bad).toBe(400);
      expect(response.body.errors[0].code).toBe('invalid_pagination');
    }
  });

  it('combines offset paging with counts and refuses mixing', async () => {
    const page = await api.get(`/api/call_transcripts?filter[call_id]=${callId}&page[offset]=4&page[limit]=5&page[count]=true`);
    expect(indexes(page)).toEqual([4, 5]);
    expect(page.body.meta.page).toEqual({ limit: 5, offset: 4, total: 6 });
    expect(page.body.links.next).toBeNull();
    const mixed = await api.get('/api/call_transcripts?page[offset]=1&page[after]=abc');
    expect(mixed.status).toBe(400);
    expect((await api.get('/api/call_transcripts?page[offset]=10001')).status).toBe(400);
  });
});
