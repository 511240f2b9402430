import { describe, expect, it } from 'vitest';
import { cutToBytes } from '../../src/agents/runtime.js';

describe('cutToBytes', () => {
  it('keeps text that fits, and cuts between characters, never inside one', () => {
    expect(cutToBytes('abc', 3)).toBe('abc');
    expect(cutToBytes('aé', 2)).toBe('a');
    expect(cutToBytes('a😀b', 4)).toBe('a');
    expect(cutToBytes('a😀b', 5)).toBe('a😀');
  });

  it('stays within the bound when the text holds a real U+FFFD across the cut', () => {
    // é (2 bytes) + € (3) + U+FFFD (3): 7 bytes cut U+FFFD in two; it used to be kept whole (8 bytes).
    const cut = cutToBytes('é€\uFFFD and more', 7);
    expect(cut).toBe('é€');
    expect(Buffer.byteLength(cut)).toBeLessThanOrEqual(7);
  });

  it('never exceeds the bound, for any cut of mixed text', () => {
    const text = 'a\uFFFDé€😀\uFFFDz'.repeat(3);
    for (let max = 0; max <= Buffer.byteLength(text); max++) {
      const cut = cutToBytes(text, max);
      expect(Buffer.byteLength(cut)).toBeLessThanOrEqual(max);
      expect(text.startsWith(cut)).toBe(true);
      // The longest whole-character prefix: one more character would not fit.
      const next = text.slice(0, cut.length + (text.codePointAt(cut.length)! > 0xffff ? 2 : 1));
      if (cut.length < text.length) expect(Buffer.byteLength(next)).toBeGreaterThan(max);
    }
  });
});
