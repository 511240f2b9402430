/** The password-check gate (src/auth/passwords.ts): bounded running and waiting, and waiters whose client has gone. */
import { describe, expect, it } from 'vitest';
import { HashGate } from '../../src/auth/passwords.js';

/** Work that ends when the test says so, and records that it ran. */
function held(ran: string[], name: string) {
  let finish!: () => void;
  const done = new Promise<void>((resolve) => (finish = resolve));
  return {
    work: async () => {
      ran.push(name);
      await done;
      return name;
    },
    finish,
  };
}

describe('HashGate', () => {
  it('runs one at a time with one waiting, refuses beyond, and passes the slot on in order', async () => {
    const gate = new HashGate(1, 1);
    const ran: string[] = [];
    const a = held(ran, 'a');
    const b = held(ran, 'b');
    const first = gate.run(a.work);
    const second = gate.run(b.work);
    expect(await gate.run(async () => 'c')).toBeUndefined();
    a.finish();
    expect(await first).toEqual({ value: 'a' });
    b.finish();
    expect(await second).toEqual({ value: 'b' });
    expect(ran).toEqual(['a', 'b']);
  });

  it('drops a waiter whose signal aborts: it never runs, and its place in the queue is free at once', async () => {
    const gate = new HashGate(1, 1);
    const ran: string[] = [];
    const a = held(ran, 'a');
    const first = gate.run(a.work);
    const gone = new AbortController();
    const abandoned = gate.run(held(ran, 'abandoned').work, gone.signal);
    gone.abort();
    expect(await abandoned).toBeUndefined();
    // The queue had room for one: the abandoned waiter no longer takes it.
    const c = held(ran, 'c');
    const third = gate.run(c.work);
    a.finish();
    expect(await first).toEqual({ value: 'a' });
    c.finish();
    expect(await third).toEqual({ value: 'c' });
    expect(ran).toEqual(['a', 'c']);
    // And an already aborted signal is refused without queueing.
    expect(await gate.run(async () => 'late', AbortSignal.abort())).toBeUndefined();
  });
});
