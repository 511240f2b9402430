// The bare `node:http` + `pg` reference server that Parley's performance target is measured against
// (docs/benchmarks.md): no framework, the same per-request work as Parley's hot paths (bearer token -> SHA-256
// -> key and membership in one query, the same tenant-scoped SQL, a JSON:API document), written independently
// of the project's own Fastify baseline (bench/baseline/server.ts). `npm run bench` starts it beside Parley and
// that baseline on the same data. Part of Parley, under the same licence as the rest of this repository.
// Usage: DATABASE_URL=... PORT=... node bench/bare-server.mjs
// Serves GET /api/conversations (page 1, page[after]=<id>, filter[status]=<status>), GET /api/conversation_items/{id} and
// POST /api/conversation_items for any secret API key of the database it reads.
import { createHash, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import pg from 'pg';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 10 });
const base = `http://127.0.0.1:${process.env.PORT}`;

async function principal(req) {
  const m = /^Bearer (.+)$/.exec(req.headers.authorization || '');
  if (!m) return null;
  const hash = createHash('sha256').update(m[1]).digest('base64url');
  const { rows } = await pool.query(
    `SELECT k.organisation_id, k.user_id, m.role FROM api_keys k JOIN memberships m
       ON m.organisation_id = k.organisation_id AND m.user_id = k.user_id
     WHERE k.token_hash = $1 AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())`,
    [hash],
  );
  return rows[0] ?? null;
}

const one = (type, id) => ({ data: id ? { type, id } : null });
const conversation = (r) => ({
  type: 'Conversation',
  id: r.id,
  attributes: {
    status: r.status,
    channel: r.channel,
    mode: r.mode,
    public_id: r.public_id,
    metadata: r.metadata,
    ai_agent_id: r.ai_agent_id,
  },
  relationships: {
    ai_agent: one('AiAgent', r.ai_agent_id),
    call: one('Call', r.call_id),
    organisation: one('Organisation', r.organisation_id),
    conversation_items: { links: { related: `${base}/api/conversations?filter[id]=${r.id}&include=conversation_items` } },
  },
  links: { self: `${base}/api/conversations/${r.id}` },
});
const item = (r) => ({
  type: 'ConversationItem',
  id: r.id,
  attributes: {
    role: r.role,
    modality: r.modality,
    content: r.content,
    metadata: r.metadata,
    item_id: r.item_id,
    content_index: r.content_index,
    occurred_at: r.occurred_at,
    conversation_id: r.conversation_id,
    organisation_id: r.organisation_id,
  },
  relationships: { conversation: one('Conversation', r.conversation_id), organisation: one('Organisation', r.organisation_id) },
  links: { self: `${base}/api/conversation_items/${r.id}` },
});
const ITEM_COLS = 'id, role, modality, content, metadata, item_id, content_index, occurred_at, conversation_id, organisation_id';

function send(res, status, doc) {
  const body = JSON.stringify({ ...doc, jsonapi: { version: '1.0' } });
  res.writeHead(status, { 'content-type': 'application/vnd.api+json' });
  res.end(body);
}

async function handle(req, res) {
  const who = await principal(req);
  if (!who) return send(res, 401, { errors: [{ status: '401' }] });
  const url = new URL(req.url, base);
  if (req.method === 'GET' && url.pathname === '/api/conversations') {
    const after = url.searchParams.get('page[after]');
    const status = url.searchParams.get('filter[status]');
    const values = [who.organisation_id];
    let where = 'c.organisation_id = $1';
    if (status) where += ` AND c.status = $${values.push(status)}`;
    if (after) where += ` AND c.id > $${values.push(after)}`;
    const { rows } = await pool.query(
      `SELECT c.id, c.status, c.channel, c.mode, c.public_id, c.metadata, c.ai_agent_id, c.organisation_id,
              (SELECT id FROM calls WHERE conversation_id = c.id) AS call_id
       FROM conversations c WHERE ${where} ORDER BY c.id LIMIT 26`,
      values,
    );
    const page = rows.slice(0, 25);
    const filter = status ? `filter[status]=${encodeURIComponent(status)}&` : '';
    const next = rows.length > 25 ? `${base}/api/conversations?${filter}page[after]=${page.at(-1).id}` : null;
    return send(res, 200, { data: page.map(conversation), included: [], meta: {}, links: { self: `${base}${req.url}`, next } });
  }
  const get = /^\/api\/conversation_items\/([0-9a-f-]{36})$/.exec(url.pathname);
  if (req.method === 'GET' && get) {
    const { rows } = await pool.query(`SELECT ${ITEM_COLS} FROM conversation_items WHERE id = $1 AND organisation_id = $2`, [
      get[1],
      who.organisation_id,
    ]);
    return rows[0] ? send(res, 200, { data: item(rows[0]), included: [], meta: {} }) : send(res, 404, { errors: [{ status: '404' }] });
  }
  if (req.method === 'POST' && url.pathname === '/api/conversation_items') {
    let raw = '';
    for await (const chunk of req) raw += chunk;
    const a = JSON.parse(raw).data.attributes;
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const c = await client.query(
        'SELECT status, next_content_index FROM conversations WHERE id = $1 AND organisation_id = $2 FOR UPDATE',
        [a.conversation_id, who.organisation_id],
      );
      if (!c.rows[0]) {
        await client.query('ROLLBACK');
        return send(res, 422, { errors: [{ status: '422' }] });
      }
      const idx = c.rows[0].next_content_index;
      await client.query('UPDATE conversations SET next_content_index = $2 WHERE id = $1', [a.conversation_id, idx + 1]);
      const { rows } = await client.query(
        `INSERT INTO conversation_items (id, organisation_id, conversation_id, content, role, modality, content_index, item_id, metadata, occurred_at)
         VALUES ($1, $2, $3, $4, $5, 'text', $6, $7, '{}', now()) RETURNING ${ITEM_COLS}`,
        [randomUUID(), who.organisation_id, a.conversation_id, a.content, a.role, idx, `item_${randomUUID().replaceAll('-', '')}`],
      );
      await client.query('COMMIT');
      res.setHeader('location', `${base}/api/conversation_items/${rows[0].id}`);
      return send(res, 201, { data: item(rows[0]), included: [], meta: {} });
    } catch (e) {
      await client.query('ROLLBACK').catch(() => {});
      throw e;
    } finally {
      client.release();
    }
  }
  send(res, 404, { errors: [{ status: '404' }] });
}

// A client that goes away mid-request (autocannon at the end of each run) is not an error of the server.
createServer((req, res) =>
  handle(req, res).catch((e) => {
    if (e.code !== 'ECONNRESET') console.error(e);
    send(res, 500, { errors: [{ status: '500' }] });
  }),
).listen(Number(process.env.PORT), '127.0.0.1', () => console.log('baseline ready'));
