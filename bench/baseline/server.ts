/**
 * The practical limit: the list, get and create scenarios hand-written with
 * Fastify and node-postgres, no engine. It does the work Parley must do per
 * request (verify the JWT, check the key record and membership, the same SQL,
 * a JSON:API document) and nothing else.
 */
import { createHash } from 'node:crypto';
import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify';
import { jwtVerify } from 'jose';
import pg from 'pg';
import { uuidv7 } from 'uuidv7';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: Number(process.env.DATABASE_POOL_SIZE ?? 10) });
const base = `http://127.0.0.1:${process.env.PORT}`;
let key: Uint8Array;

interface Caller {
  org: string;
  user: string;
}

async function authenticate(request: FastifyRequest): Promise<Caller> {
  const token = (request.headers.authorization ?? '').slice(7);
  const { payload } = await jwtVerify(token, key, { algorithms: ['HS256'], issuer: 'parley', audience: 'parley-api' });
  const hash = createHash('sha256').update(token).digest('base64url');
  const { rows } = await pool.query(
    `SELECT m.role FROM api_keys k JOIN memberships m ON m.organisation_id = k.organisation_id AND m.user_id = k.user_id
     WHERE k.id = $1 AND k.organisation_id = $2 AND k.user_id = $3 AND k.token_hash = $4 AND k.revoked_at IS NULL
       AND (k.expires_at IS NULL OR k.expires_at > now())`,
    [payload.jti, payload.org, payload.sub, hash],
  );
  if (rows.length === 0) throw new Error('unauthenticated');
  return { org: String(payload.org), user: String(payload.sub) };
}

const one = (type: string, id: string | null) => ({ data: id ? { id, type, meta: {} } : null });

function conversation(row: Record<string, any>) {
  return {
    id: row.id,
    type: 'Conversation',
    attributes: {
      status: row.status,
      channel: row.channel,
      mode: row.mode,
      public_id: row.public_id,
      metadata: row.metadata,
      ai_agent_id: row.ai_agent_id,
    },
    relationships: {
      ai_agent: one('AiAgent', row.ai_agent_id),
      call: one('Call', row.call_id),
      organisation: one('Organisation', row.organisation_id),
      conversation_items: { links: { related: `${base}/api/conversations?filter%5Bid%5D=${row.id}&include=conversation_items` }, meta: {} },
    },
    links: { self: `${base}/api/conversations/${row.id}` },
    meta: {},
  };
}

function item(row: Record<string, any>) {
  return {
    id: row.id,
    type: 'ConversationItem',
    attributes: {
      role: row.role,
      modality: row.modality,
      content: row.content,
      metadata: row.metadata,
      item_id: row.item_id,
      content_index: row.content_index,
      occurred_at: row.occurred_at.toISOString(),
      conversation_id: row.conversation_id,
      organisation_id: row.organisation_id,
    },
    relationships: { conversation: one('Conversation', row.conversation_id), organisation: one('Organisation', row.organisation_id) },
    links: { self: `${base}/api/conversation_items/${row.id}` },
    meta: {},
  };
}

function plain(
  type: string,
  path: string,
  row: Record<string, any>,
  attributes: string[],
  relationships: Record<string, [string, string]>,
) {
  const attrs: Record<string, unknown> = {};
  for (const name of attributes) attrs[name] = row[name] instanceof Date ? row[name].toISOString() : row[name];
  const rels: Record<string, unknown> = {};
  for (const [name, [relType, column]] of Object.entries(relationships)) rels[name] = one(relType, row[column]);
  return { id: row.id, type, attributes: attrs, relationships: rels, links: { self: `${base}/api/${path}/${row.id}` }, meta: {} };
}

const listDocument = (data: unknown[], limit: number) => ({
  data,
  included: [],
  meta: { page: { limit } },
  links: { self: null, first: null, next: null, prev: null },
  jsonapi: { version: '1.0' },
});

const CONVERSATION_COLUMNS = `t.id, t.status, t.channel, t.mode, t.public_id, t.metadata, t.ai_agent_id, t.organisation_id,
  (SELECT r.id FROM calls r WHERE r.conversation_id = t.id AND r.organisation_id = t.organisation_id ORDER BY r.id LIMIT 1) AS call_id`;

const app = Fastify({ logger: false });
app.addContentTypeParser('application/vnd.api+json', { parseAs: 'string' }, app.getDefaultJsonParser('error', 'error'));
const send = (reply: FastifyReply, status: number, body: unknown) =>
  reply.code(status).header('Content-Type', 'application/vnd.api+json').send(body);

app.get('/api/conversations', async (request, reply) => {
  const caller = await authenticate(request);
  const query = request.query as Record<string, string>;
  const limit = 25;
  if (query.filter === 'status') {
    // filter[status]=active&sort=-mode&include=ai_agent
    const { rows } = await pool.query(
      `SELECT ${CONVERSATION_COLUMNS} FROM conversations t WHERE t.organisation_id = $1 AND t.status = $2
       ORDER BY t.mode DESC NULLS FIRST, t.id ASC LIMIT $3`,
      [caller.org, 'active', limit + 1],
    );
    const data = rows.slice(0, limit).map(conversation);
    const agentIds = [...new Set(rows.map((r) => r.ai_agent_id).filter(Boolean))];
    const agents = agentIds.length
      ? (await pool.query(`SELECT * FROM ai_agents t WHERE t.id = ANY($1::uuid[]) AND t.organisation_id = $2`, [agentIds, caller.org])).rows
      : [];
    const included = agents.map((a) =>
      plain(
        'AiAgent',
        'ai_agents',
        a,
        ['name', 'voice', 'tone', 'languages', 'workflow', 'system_prompt', 'safety_guardrails', 'published'],
        { organisation: ['Organisation', 'organisation_id'] },
      ),
    );
    return send(reply, 200, { ...listDocument(data, limit), included });
  }
  const after = query.after;
  const { rows } = await pool.query(
    `SELECT ${CONVERSATION_COLUMNS} FROM conversations t WHERE t.organisation_id = $1 ${after ? 'AND t.id > $3::uuid' : ''}
     ORDER BY t.id ASC NULLS LAST LIMIT $2`,
    after ? [caller.org, limit + 1, after] : [caller.org, limit + 1],
  );
  return send(reply, 200, listDocument(rows.slice(0, limit).map(conversation), limit));
});

app.get('/api/operator_status_events', async (request, reply) => {
  const caller = await authenticate(request);
  const { rows } = await pool.query(`SELECT t.* FROM operator_status_events t WHERE t.organisation_id = $1 ORDER BY t.id ASC LIMIT 26`, [
    caller.org,
  ]);
  const data = rows.slice(0, 25).map((r) =>
    plain(
      'OperatorStatusEvent',
      'operator_status_events',
      r,
      ['sip_user_id', 'agent_name', 'status', 'source', 'changed_by_user_id', 'previous_status', 'occurred_at'],
      {
        changed_by_user: ['User', 'changed_by_user_id'],
        organisation: ['Organisation', 'organisation_id'],
        sip_user: ['SipUser', 'sip_user_id'],
      },
    ),
  );
  return send(reply, 200, listDocument(data, 25));
});

app.get('/api/call_transcripts', async (request, reply) => {
  const caller = await authenticate(request);
  const callId = (request.query as Record<string, string>).call_id;
  const { rows } = await pool.query(
    `SELECT t.* FROM call_transcripts t WHERE t.organisation_id = $1 AND t.call_id = $2::uuid ORDER BY t.call_id, t.content_index, t.id LIMIT 26`,
    [caller.org, callId],
  );
  const data = rows.slice(0, 25).map((r) =>
    plain('CallTranscript', 'call_transcripts', r, ['content', 'speaker', 'item_id', 'content_index', 'occurred_at', 'call_id'], {
      call: ['Call', 'call_id'],
      organisation: ['Organisation', 'organisation_id'],
    }),
  );
  return send(reply, 200, listDocument(data, 25));
});

app.get('/api/conversation_items/:id', async (request, reply) => {
  const caller = await authenticate(request);
  const { rows } = await pool.query(`SELECT t.* FROM conversation_items t WHERE t.id = $1 AND t.organisation_id = $2`, [
    (request.params as { id: string }).id,
    caller.org,
  ]);
  if (rows.length === 0) return send(reply, 404, { errors: [{ status: '404' }] });
  return send(reply, 200, { data: item(rows[0]), included: [], meta: {}, jsonapi: { version: '1.0' } });
});

app.post('/api/conversation_items', async (request, reply) => {
  const caller = await authenticate(request);
  const attributes = (request.body as { data: { attributes: Record<string, any> } }).data.attributes;
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const conversation = await client.query(
      `SELECT status, next_content_index FROM conversations WHERE id = $1 AND organisation_id = $2 FOR UPDATE`,
      [attributes.conversation_id, caller.org],
    );
    const index = conversation.rows[0].next_content_index;
    await client.query(`UPDATE conversations SET next_content_index = GREATEST(next_content_index, $1) WHERE id = $2`, [
      index + 1,
      attributes.conversation_id,
    ]);
    const id = uuidv7();
    const now = new Date();
    await client.query(
      `INSERT INTO conversation_items (id, organisation_id, conversation_id, content, role, modality, content_index, item_id, metadata, occurred_at, created_at, updated_at)
       VALUES ($1, $2, $3, $4, $5, 'text', $6, $7, '{}', $8, $8, $8)`,
      [id, caller.org, attributes.conversation_id, attributes.content, attributes.role, index, `item_${id.replaceAll('-', '')}`, now],
    );
    // Read back on the same connection, before COMMIT, as Parley does: a second pool
    // connection per request would deadlock the pool once every connection waits for one.
    const { rows } = await client.query(`SELECT t.* FROM conversation_items t WHERE t.id = $1 AND t.organisation_id = $2`, [
      id,
      caller.org,
    ]);
    await client.query('COMMIT');
    const doc = { data: item(rows[0]), included: [], meta: {}, jsonapi: { version: '1.0' } };
    return send(reply.header('Location', doc.data.links.self), 201, doc);
  } catch (error) {
    await client.query('ROLLBACK');
    throw error;
  } finally {
    client.release();
  }
});

const { rows } = await pool.query(`SELECT value FROM settings WHERE key = 'signing_secret'`);
key = process.env.SIGNING_SECRET ? new TextEncoder().encode(process.env.SIGNING_SECRET) : Buffer.from(rows[0].value, 'base64url');
await app.listen({ port: Number(process.env.PORT), host: '127.0.0.1' });
console.log(`baseline listening on ${base}`);
