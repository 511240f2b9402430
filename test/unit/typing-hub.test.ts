/**
 * The typing hub hands a signal to the organisation's listeners (members' streams) and to the listeners of its
 * conversation only (visitors' streams): a visitor's stream is never called for another conversation's signal,
 * however many visitors the organisation has (issue 26: fan-out independent of visitors' streams).
 */
import { describe, expect, it } from 'vitest';
import type { DatabaseHandle } from '../../src/db/connection.js';
import { TypingHub, type TypingSignal } from '../../src/events/typing.js';

function hub() {
  let deliver: (payload: string) => void = () => {};
  const database = {
    listen: async (_channel: string, onNotify: (payload: string) => void) => {
      deliver = onNotify;
      return async () => {};
    },
  } as unknown as DatabaseHandle;
  const typing = new TypingHub(database);
  const signal = (organisation_id: string, conversation_id: string) =>
    deliver(
      JSON.stringify({
        organisation_id,
        conversation_id,
        role: 'operator',
        user_id: 'u',
        name: null,
        occurred_at: '2026-11-28T00:00:00.000Z',
        expires_at: '2026-11-28T00:00:06.000Z',
      } satisfies TypingSignal),
    );
  return { typing, signal };
}

describe('typing hub', () => {
  it("calls a conversation's listeners for its signals only, and the organisation's listeners for every one", async () => {
    const { typing, signal } = hub();
    await typing.ready();
    const heard = { member: [] as string[], a: [] as string[], b: [] as string[], other: [] as string[] };
    typing.subscribe('org1', (s) => heard.member.push(s.conversation_id));
    const leaveA = typing.subscribe('org1', (s) => heard.a.push(s.conversation_id), 'conv-a');
    typing.subscribe('org1', (s) => heard.b.push(s.conversation_id), 'conv-b');
    typing.subscribe('org2', (s) => heard.other.push(s.conversation_id), 'conv-a');

    signal('org1', 'conv-a');
    signal('org1', 'conv-c');
    signal('org1', 'conv-b');
    expect(heard.member).toEqual(['conv-a', 'conv-c', 'conv-b']);
    expect(heard.a).toEqual(['conv-a']);
    expect(heard.b).toEqual(['conv-b']);
    expect(heard.other).toEqual([]);

    leaveA();
    signal('org1', 'conv-a');
    expect(heard.a).toEqual(['conv-a']);
    expect(heard.member).toHaveLength(4);
    await typing.close();
  });
});
