/**
 * VOICE_MAX_CALLS covers agent calls and the transcription forks of calls between people together
 * (docs/voice.md, "Calls between people"): an agent call past it is 486 while forks fill it, and a fork past it is
 * declined before anything is asked of rtpengine or the database, so the call between people goes on.
 */
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/index.js';
import type { Db } from '../../src/db/schema.js';
import type { AppServices } from '../../src/jsonapi/index.js';
import type { CallEvent } from '../../src/sip/call-events.js';
import { VoiceRuntime } from '../../src/voice/runtime.js';
import type { InviteInfo } from '../../src/voice/sip-endpoint.js';
import { CallTranscriber } from '../../src/voice/transcriber.js';

const AGENT = '3f1c1a52-8f0e-4a57-9a43-6f8e0d1b2c3d';
const ORG = '0b8f7a64-5a7e-4a4f-8e57-2d5c9d7f1a11';

/** Any use of the database fails the test: admission and declining must decide without it. */
const noDatabase = new Proxy({} as Db, {
  get: () => {
    throw new Error('the database was used');
  },
});

describe('VOICE_MAX_CALLS counts transcription forks', () => {
  it('refuses an agent call with 486 while forks fill the capacity, and looks up the agent once there is room', async () => {
    let forks = 2;
    const config = loadConfig({ VOICE_MAX_CALLS: '2', VOICE_SIP_TRUSTED: '127.0.0.1' } as NodeJS.ProcessEnv);
    const voice = new VoiceRuntime({ db: noDatabase, services: { records: {} } as AppServices, config, forks: () => forks });
    const info: InviteInfo = {
      callId: 'c1',
      user: `agent-${AGENT}`,
      from: '<sip:a@x>',
      to: '<sip:b@x>',
      remote: { address: '127.0.0.1', port: 5 },
    };
    expect(await voice.admit(info)).toEqual({ reject: 486, reason: 'Busy Here' });
    forks = 1;
    // Room again: admission goes on to read the agent (here: the database that must not be used).
    await expect(voice.admit(info)).rejects.toThrow('the database was used');
  });

  it('declines a fork past the capacity: rtpengine is never asked and nothing is forked', async () => {
    let room = false;
    const asked: string[] = [];
    const transcriber = new CallTranscriber({
      db: noDatabase,
      records: {} as never,
      stt: { name: 'fake', transcribe: async () => '' },
      ng: async (command) => {
        asked.push(command);
        return { result: 'error' };
      },
      address: '127.0.0.1',
      endpointMs: 600,
      maxUtteranceMs: 15_000,
      room: () => room,
    });
    const answered = { event: 'answered', organisation_id: ORG, call_id: 'people-1' } as CallEvent;
    transcriber.onCallEvents([answered]);
    expect(transcriber.forking).toBe(0);
    expect(transcriber.active()).toEqual([]);
    expect(asked).toEqual([]);
    // With room the fork is taken (and then fails here, on the database this test withholds).
    room = true;
    transcriber.onCallEvents([answered]);
    expect(transcriber.forking).toBe(1);
    await transcriber.stop();
    expect(transcriber.forking).toBe(0);
  });
});
