/**
 * A local OpenAI-compatible model server for tests: POST /v1/chat/completions
 * answering with streamed SSE chunks (text deltas, tool-call deltas, a usage
 * chunk, `data: [DONE]`). Each test scripts its answers; without a script it
 * echoes the last user message. A scripted answer may call tools (`toolCalls`, streamed in pieces as a real
 * server does, each with an id `call_<n>`); the next request then carries the results as `tool` messages.
 * Analysis requests and turns take scripted answers of their own kind.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ScriptedAnswer {
  status?: number;
  headers?: Record<string, string>;
  text?: string;
  toolCalls?: { name: string; arguments: Record<string, unknown> }[];
  /** Wait for this promise before answering (a slow or hung model). */
  until?: Promise<void>;
  /** Send nothing at all (an empty answer). */
  empty?: boolean;
  /**
   * For an analysis request (one offering `record_analysis`, src/agents/analysis.ts); implied by a
   * `record_analysis` tool call. Scripted answers go to requests of their kind only, so that the analysis of a
   * conversation an earlier test closed never takes the answer a test scripted for a turn, nor the reverse.
   */
  analysis?: boolean;
}

export interface ReceivedRequest {
  at: number;
  body: {
    model: string;
    /** Tool results come back as `tool` messages naming their call (`tool_call_id`), after the assistant's `tool_calls`. */
    messages: {
      role: string;
      content: string;
      tool_call_id?: string;
      tool_calls?: { id: string; function: { name: string; arguments: string } }[];
    }[];
    tools?: { type: string; function: { name: string; parameters?: unknown } }[];
    stream?: boolean;
  };
}

export interface ModelServer {
  url: string;
  requests: ReceivedRequest[];
  /** Answers for the next requests, in order; `always` answers every request after them. */
  script(...answers: ScriptedAnswer[]): void;
  always(answer: ((req: ReceivedRequest) => ScriptedAnswer) | undefined): void;
  close(): Promise<void>;
}

export async function startModelServer(): Promise<ModelServer> {
  const queue: ScriptedAnswer[] = [];
  const requests: ReceivedRequest[] = [];
  let fallback: ((req: ReceivedRequest) => ScriptedAnswer) | undefined;
  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', async () => {
      if (req.url !== '/v1/chat/completions') {
        res.writeHead(404).end();
        return;
      }
      const received: ReceivedRequest = { at: performance.now(), body: JSON.parse(raw) };
      requests.push(received);
      const lastUser = [...received.body.messages].reverse().find((m) => m.role === 'user');
      const isAnalysis = ((received.body.tools ?? []) as { function?: { name?: string } }[]).some(
        (tool) => tool.function?.name === 'record_analysis',
      );
      const forAnalysis = (a: ScriptedAnswer) => a.analysis === true || (a.toolCalls ?? []).some((c) => c.name === 'record_analysis');
      const index = queue.findIndex((a) => forAnalysis(a) === isAnalysis);
      const scripted = index === -1 ? undefined : queue.splice(index, 1)[0];
      const answer = scripted ?? fallback?.(received) ?? { text: `You said: ${lastUser?.content ?? ''}` };
      if (answer.until) await answer.until;
      if (answer.status && answer.status !== 200) {
        res.writeHead(answer.status, { 'content-type': 'application/json', ...answer.headers });
        res.end(JSON.stringify({ error: { message: `scripted ${answer.status}`, type: 'test' } }));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      const base = { id: 'chatcmpl-test', object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model: 'test-model' };
      const send = (choices: unknown[], extra: Record<string, unknown> = {}) =>
        res.write(`data: ${JSON.stringify({ ...base, choices, ...extra })}\n\n`);
      if (!answer.empty) {
        send([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }]);
        // Several chunks per answer, as a real stream would send.
        for (const piece of (answer.text ?? '').match(/.{1,8}/gs) ?? [])
          send([{ index: 0, delta: { content: piece }, finish_reason: null }]);
        for (const [index, call] of (answer.toolCalls ?? []).entries()) {
          const args = JSON.stringify(call.arguments);
          send([
            {
              index: 0,
              delta: { tool_calls: [{ index, id: `call_${index}`, type: 'function', function: { name: call.name, arguments: '' } }] },
              finish_reason: null,
            },
          ]);
          for (const piece of args.match(/.{1,10}/gs) ?? [])
            send([{ index: 0, delta: { tool_calls: [{ index, function: { arguments: piece } }] }, finish_reason: null }]);
        }
        send([{ index: 0, delta: {}, finish_reason: answer.toolCalls?.length ? 'tool_calls' : 'stop' }]);
        send([], { usage: { prompt_tokens: 11, completion_tokens: 7, total_tokens: 18 } });
      }
      res.end('data: [DONE]\n\n');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    requests,
    script: (...answers) => queue.push(...answers),
    always: (answer) => (fallback = answer),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
