/**
 * The agents' model: any OpenAI-compatible Chat Completions endpoint, through the official `openai` client,
 * streaming. The client itself retries a failed request (connection errors, 408/409/429/5xx) `LLM_MAX_RETRIES` times
 * with exponential backoff, honouring the provider's `Retry-After` (and `retry-after-ms`) on a 429. What the client
 * cannot retry, a stream that breaks or stalls after it started or that ends with nothing in it, is retried here as
 * many times, with backoff. The answer is only returned once the stream is complete, so a failed turn never leaves a
 * half-written item.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions';
import type { Config } from '../config/index.js';

export type ChatMessage = ChatCompletionMessageParam;

export interface ToolCall {
  /** The call's id, as the model named it (the tool's result message answers it); made up when it sent none. */
  id: string;
  name: string;
  /** Parsed JSON arguments ({} when the model sent none or sent invalid JSON). */
  arguments: Record<string, unknown>;
  /** The arguments as the model sent them, when they were not a JSON object (the call is refused then). */
  invalidArguments?: string;
}

export interface ModelAnswer {
  text: string;
  toolCalls: ToolCall[];
  model: string;
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  /** Attempts this answer took (1 when the first stream succeeded). */
  attempts: number;
  /** When the request that answered was sent and when its last chunk arrived (performance.now()). */
  requestSentAt: number;
  lastTokenAt: number;
}

export interface ChatModel {
  readonly name: string;
  complete(messages: ChatMessage[], tools: ChatCompletionTool[]): Promise<ModelAnswer>;
}

/** The model failed after every retry; the runtime ends the turn with a system item and a handoff. */
export class ModelFailure extends Error {
  constructor(
    message: string,
    readonly attempts: number,
  ) {
    super(message);
  }
}

/** Whether the configuration names a model endpoint at all. */
export const modelConfigured = (config: Config) => config.llmBaseUrl !== undefined || config.llmApiKey !== undefined;

export function createChatModel(config: Config): ChatModel | undefined {
  if (!modelConfigured(config)) return undefined;
  const client = new OpenAI({
    baseURL: config.llmBaseUrl,
    // Local OpenAI-compatible servers often want no key; the client insists on one.
    apiKey: config.llmApiKey ?? 'none',
    timeout: config.llmTimeoutMs,
    maxRetries: config.llmMaxRetries,
  });
  const model = config.llmModel;

  return {
    name: model,
    async complete(messages, tools) {
      const attempts = config.llmMaxRetries + 1;
      let lastError: unknown;
      for (let attempt = 1; attempt <= attempts; attempt++) {
        const requestSentAt = performance.now();
        // One deadline for the whole stream: the client's timeout covers the request, not a stalled body. A request
        // the client gave up on (after its own retries) is final: retrying it here would multiply them.
        const stream = await client.chat.completions
          .create(
            { model, messages, stream: true, stream_options: { include_usage: true }, ...(tools.length > 0 ? { tools } : {}) },
            { signal: AbortSignal.timeout(config.llmTimeoutMs) },
          )
          .catch((error: unknown) => {
            throw new ModelFailure(describe(error), attempt);
          });
        try {
          let text = '';
          let answeredBy = model;
          let usage: ModelAnswer['usage'];
          const calls = new Map<number, { id: string; name: string; args: string }>();
          for await (const chunk of stream) {
            if (chunk.model) answeredBy = chunk.model;
            if (chunk.usage)
              usage = {
                prompt_tokens: chunk.usage.prompt_tokens,
                completion_tokens: chunk.usage.completion_tokens,
                total_tokens: chunk.usage.total_tokens,
              };
            const delta = chunk.choices?.[0]?.delta;
            if (!delta) continue;
            if (delta.content) text += delta.content;
            for (const call of delta.tool_calls ?? []) {
              const entry = calls.get(call.index) ?? { id: '', name: '', args: '' };
              if (call.id) entry.id = call.id;
              if (call.function?.name) entry.name += call.function.name;
              if (call.function?.arguments) entry.args += call.function.arguments;
              calls.set(call.index, entry);
            }
          }
          const lastTokenAt = performance.now();
          const toolCalls = [...calls.values()]
            .filter((c) => c.name !== '')
            .map((c, index) => {
              const parsed = parseObject(c.args || '{}');
              return {
                id: c.id || `call_${index}`,
                name: c.name,
                arguments: parsed ?? {},
                ...(parsed === undefined ? { invalidArguments: c.args.slice(0, 2000) } : {}),
              };
            });
          if (text.trim() === '' && toolCalls.length === 0) throw new Error('The model returned an empty answer.');
          return {
            text: text.trim(),
            toolCalls,
            model: answeredBy,
            usage,
            attempts: attempt,
            requestSentAt,
            lastTokenAt,
          };
        } catch (error) {
          lastError = error;
          if (attempt < attempts) await sleep(Math.min(8000, 250 * 2 ** (attempt - 1)) * (0.75 + Math.random() / 2));
        }
      }
      throw new ModelFailure(describe(lastError), attempts);
    },
  };
}

/** The JSON object `raw` holds; undefined when it is not JSON or not an object. */
export function parseObject(raw: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(raw);
    return value && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

function describe(error: unknown): string {
  if (error instanceof OpenAI.APIError && error.status !== undefined)
    return `The model endpoint answered ${error.status}: ${error.message}`;
  if (error instanceof Error) return error.name === 'TimeoutError' ? 'The model did not finish in time.' : error.message;
  return String(error);
}
