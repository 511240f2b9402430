/**
 * An agent's `safety_guardrails`, one rule a line (docs/agents.md, "Guardrails"): `# a comment`, `block: <phrase>`
 * (case-insensitive), `/<regex>/<flags>` (`i` by default), or any other line, an instruction the model is given.
 * Phrases and expressions are checked on the user's input (before the turn runs, so a blocked message never
 * reaches the model or a workflow answer) and on the model's output (before the reply is stored).
 *
 * Always, whatever the lines: a model reply that quotes the agent's own instructions (its system prompt, these
 * instruction lines, a step's instructions) is refused, as the rule `(instructions quoted)`. The prompt is the
 * agent's configuration, not the visitor's to read.
 */
export interface Guardrails {
  /** `rule`: the line as written, recorded in the refusal's `metadata.guardrail.rule`. */
  rules: { rule: string; test(text: string): boolean }[];
  instructions: string[];
}

export interface GuardrailTrip {
  rule: string;
  stage: 'input' | 'output';
}

const normalise = (text: string) => text.toLowerCase().replace(/\s+/g, ' ');

export function parseGuardrails(source: string | null | undefined): Guardrails {
  const rules: Guardrails['rules'] = [];
  const instructions: string[] = [];
  for (const raw of (source ?? '').split(/\r?\n/)) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const phrase = /^block:\s*(.+)$/i.exec(line);
    if (phrase) {
      const needle = normalise(phrase[1].trim());
      rules.push({ rule: line, test: (text) => normalise(text).includes(needle) });
      continue;
    }
    const regex = /^\/(.+)\/([a-z]*)$/.exec(line);
    const expression = regex ? compileRegExp(regex[1], regex[2] === '' ? 'i' : regex[2].replace(/[gy]/g, '')) : undefined;
    if (expression) rules.push({ rule: line, test: (text) => expression.test(text) });
    else instructions.push(line);
  }
  return { rules, instructions };
}

/** The expression; undefined when it is not one after all (the line is then an instruction). */
export function compileRegExp(source: string, flags: string): RegExp | undefined {
  try {
    return new RegExp(source, flags);
  } catch {
    return undefined;
  }
}

/** The first rule the text trips, if any. */
export function checkGuardrails(guardrails: Guardrails, text: string, stage: GuardrailTrip['stage']): GuardrailTrip | undefined {
  const hit = guardrails.rules.find((r) => r.test(text));
  return hit ? { rule: hit.rule, stage } : undefined;
}

/** The rule recorded when a reply quotes the agent's instructions. */
export const QUOTED_INSTRUCTIONS_RULE = '(instructions quoted)';
/** A quote is this many characters of an instruction, copied (after case and white space are normalised). */
const QUOTE_CHARS = 48;
/** Windows of an instruction are tried at this step: any copied run of QUOTE_CHARS + QUOTE_STEP characters contains one. */
const QUOTE_STEP = 16;
/** Shorter instructions (a single guardrail line) count as quoted when they appear whole; shorter still, never. */
const SHORTEST_QUOTED = 20;

/**
 * Whether `reply` quotes any of `instructions`: a whole instruction of up to QUOTE_CHARS characters, or a
 * window of QUOTE_CHARS characters of a longer one. Bounded work: an instruction of n characters tries n / 16
 * windows.
 */
export function quotesInstructions(reply: string, instructions: string[]): GuardrailTrip | undefined {
  const text = normalise(reply);
  for (const raw of instructions) {
    const instruction = normalise(raw).trim();
    if (instruction.length < SHORTEST_QUOTED) continue;
    // One window, the whole instruction, when it is at most QUOTE_CHARS long.
    for (let at = 0; at <= Math.max(0, instruction.length - QUOTE_CHARS); at += QUOTE_STEP) {
      if (text.includes(instruction.slice(at, at + QUOTE_CHARS))) return { rule: QUOTED_INSTRUCTIONS_RULE, stage: 'output' };
    }
  }
  return undefined;
}

export const REFUSAL_TEXT = 'Sorry, I cannot help with that. Is there something else I can do for you?';
