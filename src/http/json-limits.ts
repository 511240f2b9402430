/**
 * Bounded work per request body, before it is parsed into objects. A body of
 * 1 MiB can hold 80,000 attributes (each an object key, then a validation
 * error) or nest thousands of levels: parsing it is cheap, everything after is
 * not. One pass over the text, with no allocation, counts what JSON.parse would
 * build and stops at the first limit passed: the values of one object or array,
 * the values of the whole document, the nesting depth. Strings are skipped
 * (their contents are never counted); the counts are upper bounds (an empty
 * object counts one value), and malformed text is left to JSON.parse.
 */
import { ApiError } from '../jsonapi/errors.js';

/**
 * The limits: far above any document the resources accept (a conversation's `metadata`, 16 KiB of JSON,
 * holds at most about 2,700 members; a workflow, 100 steps), far below what 1 MiB of body can carry.
 */
export const JSON_SHAPE_LIMITS = {
  /** Deepest nesting of objects and arrays. */
  maxDepth: 32,
  /** Members of one object or items of one array. */
  maxMembers: 4096,
  /** Objects, arrays and members of the whole document. */
  maxValues: 16_384,
};

/** The first limit `text` passes, as the error to answer, or undefined; `scanned` is how far it read (tests). */
export function jsonShapeProblem(text: string, limits = JSON_SHAPE_LIMITS, scanned?: { chars: number }): ApiError | undefined {
  // Members of each open container, innermost last; its length is the depth.
  const open: number[] = [];
  let values = 0;
  const stop = (i: number, error: ApiError) => {
    if (scanned) scanned.chars = i + 1;
    return error;
  };
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // A string: jump to its closing quote (native indexOf, not a loop per character); a quote after an odd
      // number of backslashes is escaped, part of the string.
      let end = i;
      for (;;) {
        end = text.indexOf('"', end + 1);
        if (end === -1) {
          end = text.length;
          break;
        }
        let backslashes = 0;
        while (text.charCodeAt(end - 1 - backslashes) === 0x5c) backslashes++;
        if (backslashes % 2 === 0) break;
      }
      i = end;
    } else if (c === 0x7b || c === 0x5b) {
      open.push(1);
      values += 2; // the container and its first member
      if (open.length > limits.maxDepth) {
        return stop(i, ApiError.of('invalid_body', `The body nests deeper than ${limits.maxDepth} levels.`, { pointer: '' }));
      }
    } else if (c === 0x7d || c === 0x5d) {
      open.pop();
    } else if (c === 0x2c && open.length > 0) {
      values++;
      if (++open[open.length - 1] > limits.maxMembers) {
        return stop(
          i,
          ApiError.of('body_too_complex', `An object or array in the body has more than ${limits.maxMembers} members.`, {
            pointer: '',
          }),
        );
      }
    }
    if (values > limits.maxValues) {
      return stop(i, ApiError.of('body_too_complex', `The body has more than ${limits.maxValues} values.`, { pointer: '' }));
    }
  }
  if (scanned) scanned.chars = text.length;
  return undefined;
}
