/**
 * The workflow interpreter (docs/agents.md, "The workflow", where each step is described; the JSON Schema is in
 * src/resources/ai-agent-workflow.ts): given the agent's workflow, where the conversation stands in it, and the
 * user's new message, decides what this turn does. The interpreter is pure; the runtime carries out its
 * decision (model call, items, metadata) and stores the new state with the reply, in one transaction.
 */
import type { Workflow, WorkflowStep } from '../resources/ai-agent-workflow.js';

export interface WorkflowState {
  /** The next step to run. */
  step?: number;
  /** The metadata key awaiting the user's next message (a question was asked). */
  awaiting?: string;
  /** User messages the current model step has answered. */
  model_turns?: number;
  /** An `end` step ran. */
  ended?: boolean;
}

export type TurnDecision =
  /** Scripted text only (messages and a question, or an end). */
  | { kind: 'scripted'; texts: string[]; close: boolean }
  /** The model answers; `texts` are scripted lines that come first in the reply. */
  | { kind: 'model'; texts: string[]; instructions?: string }
  | { kind: 'handoff'; texts: string[]; reason: string; rule: 'workflow' | 'no_model' };

export interface TurnPlan {
  decision: TurnDecision;
  /** Answers to store in the conversation's metadata. */
  answers: Record<string, string>;
  state: WorkflowState;
}

export const HANDOFF_TEXT = 'I am passing you to a colleague, who will be with you shortly.';

function matches(step: Extract<WorkflowStep, { type: 'handoff' }>, message: string, metadata: Record<string, unknown>): boolean {
  if (!step.when) return true;
  const subject = step.when.field === undefined ? message : metadata[step.when.field];
  if (typeof subject !== 'string') return false;
  return new RegExp(step.when.matches, 'i').test(subject);
}

export function planTurn(input: {
  workflow: Workflow;
  state: WorkflowState;
  message: string;
  metadata: Record<string, unknown>;
  modelConfigured: boolean;
}): TurnPlan {
  const steps = input.workflow.steps ?? [];
  const state: WorkflowState = { ...input.state };
  const answers: Record<string, string> = {};
  const metadata = { ...input.metadata };
  if (state.awaiting) {
    answers[state.awaiting] = input.message;
    metadata[state.awaiting] = input.message;
    delete state.awaiting;
  }
  const texts: string[] = [];
  const plan = (decision: TurnDecision, next: WorkflowState): TurnPlan => ({ decision, answers, state: next });
  let index = state.step ?? 0;
  for (; !state.ended && index < steps.length; index++) {
    const step = steps[index];
    switch (step.type) {
      case 'message':
        texts.push(step.text);
        continue;
      case 'question':
        texts.push(step.text);
        return plan({ kind: 'scripted', texts, close: false }, { ...state, step: index + 1, awaiting: step.store_as });
      case 'model': {
        // Without a model, the scripted steps alone answer: a model step is passed over.
        if (!input.modelConfigured) continue;
        const used = (state.model_turns ?? 0) + 1;
        const done = step.max_turns !== undefined && used >= step.max_turns;
        const next: WorkflowState = done ? { ...state, step: index + 1, model_turns: 0 } : { ...state, step: index, model_turns: used };
        return plan({ kind: 'model', texts, instructions: step.instructions }, next);
      }
      case 'handoff':
        if (!matches(step, input.message, metadata)) continue;
        if (step.text) texts.push(step.text);
        return plan({ kind: 'handoff', texts, reason: step.reason, rule: 'workflow' }, { ...state, step: index + 1 });
      case 'end':
        if (step.text) texts.push(step.text);
        return plan({ kind: 'scripted', texts, close: step.close === true }, { ...state, step: index + 1, ended: true });
    }
  }
  const after: WorkflowState = { ...state, step: index };
  if (texts.length > 0) return plan({ kind: 'scripted', texts, close: false }, after);
  if (input.modelConfigured) return plan({ kind: 'model', texts }, after);
  return plan(
    { kind: 'handoff', texts, reason: 'The agent has no scripted step left and no model is configured.', rule: 'no_model' },
    after,
  );
}
