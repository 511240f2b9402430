/**
 * A real softphone calls an agent over G.722 (issue 23's test with a real SIP client): baresip, headless,
 * with a generated configuration in a temporary directory, its `aufile` module as the microphone (a WAVE:
 * silence while the agent greets, then a festival-spoken sentence) and its `sndfile` module recording what it
 * hears. The recording, recognised by the same local speech-to-text, holds the agent's greeting and its
 * answer; the API shows the caller's words as a CallTranscript (caller) and the agent's spoken answer as a
 * CallTranscript (agent). SIPp covers the same call without a softphone (voice-call.test.ts) and through the
 * SIP edge (voice-edge.test.ts); this one checks that an ordinary softphone's SIP, SDP and G.722 agree with
 * the runtime's.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Config } from '../../src/config/index.js';
import { parseWav, resampleTo16k, toWav } from '../../src/voice/codecs.js';
import { client, type Client } from '../helpers/http.js';
import { freeUdpPort } from '../sip/harness.js';
import type { TestApp } from '../support/app.js';
import type { Tenant } from '../support/seed.js';
import { concat, DESK, festival, haveProgram, recognise, silence, startDesk, wordsHeard } from './harness.js';

const MODULES = '/usr/lib/baresip/modules';
const skip = (() => {
  const missing = ['baresip', 'text2wave', 'pocketsphinx_continuous'].filter((p) => !haveProgram(p));
  if (missing.length) return `${missing.join(', ')} not installed (Debian: baresip festival pocketsphinx pocketsphinx-en-us)`;
  const modules = ['g722', 'g711', 'aufile', 'sndfile', 'aubridge', 'account', 'menu'].filter(
    (m) => !fs.existsSync(path.join(MODULES, `${m}.so`)),
  );
  if (modules.length) return `baresip modules ${modules.join(', ')} not found in ${MODULES}`;
  return undefined;
})();
if (skip) console.warn(`baresip voice test skipped: ${skip}`);

const { goodbye: GOODBYE, sentence: SENTENCE } = DESK;
/** The caller keeps quiet this long (the greeting and question take about 4 s as festival says them). */
const QUIET_MS = 9000;

describe.skipIf(skip !== undefined)('a softphone calls an agent (baresip -> voice runtime, G.722)', () => {
  let desk: Awaited<ReturnType<typeof startDesk>>;
  let t: TestApp;
  let tenant: Tenant;
  let admin: Client;
  let agentId: string;
  let config: Config;
  let dir: string;

  beforeAll(async () => {
    desk = await startDesk('Softphone');
    ({ t, tenant, agentId, config } = desk);
    admin = client(t.app, tenant.admin.token);
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-baresip-'));
  }, 120_000);

  afterAll(async () => {
    await desk?.close();
    if (dir && !process.env.VOICE_TEST_KEEP) fs.rmSync(dir, { recursive: true, force: true });
  });

  /** Runs baresip with a generated configuration: it dials `uri` at once and quits after `seconds`. */
  async function baresip(uri: string, microphone: string, seconds: number): Promise<{ code: number | null; log: string; heard: string }> {
    const home = path.join(dir, 'home');
    const recordings = path.join(dir, 'recordings');
    fs.mkdirSync(home, { recursive: true });
    fs.mkdirSync(recordings, { recursive: true });
    const sipPort = await freeUdpPort();
    fs.writeFileSync(
      path.join(home, 'config'),
      [
        'poll_method epoll',
        `sip_listen 127.0.0.1:${sipPort}`,
        'sip_transports udp',
        `audio_source aufile,${microphone}`,
        // No loudspeaker: the bridge player with no source on its device discards what it is given; sndfile
        // records the decoded stream before it (its "dec" file).
        'audio_player aubridge,nowhere',
        'audio_alert aubridge,nowhere',
        'ausrc_srate 16000',
        'auplay_srate 16000',
        'ausrc_channels 1',
        'auplay_channels 1',
        'audio_buffer 20-160',
        `rtp_ports ${10000 + (sipPort % 20000)}-${10100 + (sipPort % 20000)}`,
        'rtp_stats no',
        `module_path ${MODULES}`,
        'module g722.so',
        'module g711.so',
        'module aufile.so',
        'module aubridge.so',
        'module sndfile.so',
        'module_app account.so',
        // The `dial` command (given with -e).
        'module_app menu.so',
        `snd_path ${recordings}`,
        '',
      ].join('\n'),
    );
    // One account, no registration (it calls the runtime directly), G.722 only.
    fs.writeFileSync(path.join(home, 'accounts'), `<sip:softphone@127.0.0.1:${sipPort}>;regint=0;audio_codecs=G722/16000/1\n`);
    fs.writeFileSync(path.join(home, 'contacts'), '');
    const child = spawn('baresip', ['-f', home, '-e', `/dial ${uri}`, '-t', String(seconds)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    child.stdout.on('data', (d: Buffer) => (log += d.toString()));
    child.stderr.on('data', (d: Buffer) => (log += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c)));
    const decoded = fs.readdirSync(recordings).filter((f) => f.endsWith('-dec.wav'));
    return { code, log, heard: decoded.length ? path.join(recordings, decoded[0]) : '' };
  }

  it('is greeted, its sentence is transcribed, and it hears the answer; the API shows both transcripts', async () => {
    const microphone = path.join(dir, 'microphone.wav');
    fs.writeFileSync(microphone, toWav(concat(silence(QUIET_MS), festival(SENTENCE), silence(20_000)), 16000));
    const run = await baresip(`sip:agent-${agentId}@127.0.0.1:${config.voice.sipPort}`, microphone, 45);
    expect(run.heard, run.log).not.toBe('');

    // What the softphone heard: before it spoke (the greeting and question), and after (the answer).
    const { rate, pcm } = parseWav(fs.readFileSync(run.heard));
    const heard = resampleTo16k(pcm, rate);
    const split = Math.round((QUIET_MS / 1000) * 16000);
    // From 200 ms before the first sound of each part: seconds of leading silence (the call being set up, the
    // caller speaking) make the recogniser hear words in it ("is it or not" for "good morning", measured).
    const fromSound = (pcm: Int16Array) => pcm.subarray(Math.max(0, pcm.findIndex((v) => Math.abs(v) > 1000) - 3200));
    const greeting = await recognise(fromSound(heard.subarray(0, split)));
    const answer = await recognise(fromSound(heard.subarray(split)));

    // The organisation's only call, once its end is recorded (a turn in flight is finished first).
    let call: { id: string; attributes: { status: string } } | undefined;
    for (const deadline = Date.now() + 20_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 200))) {
      const calls = await admin.get('/api/calls');
      expect(calls.status).toBe(200);
      expect(calls.body.data.length).toBeLessThanOrEqual(1);
      call = calls.body.data[0];
      if (call && call.attributes.status !== 'in_progress') break;
    }
    expect(call, run.log).toBeDefined();
    if (!call) return;
    const response = await admin.get(`/api/call_transcripts?filter[call_id]=${call.id}&sort=content_index`);
    const lines = (response.body.data as { attributes: { speaker: string; content: string; metadata: Record<string, unknown> } }[]).map(
      (l) => l.attributes,
    );
    const summary = JSON.stringify({ greeting, answer, lines: lines.map((l) => [l.speaker, l.content]), log: run.log.slice(-2000) });
    expect(
      wordsHeard(greeting, ['good', 'morning', 'this', 'order', 'desk', 'how', 'can', 'help', 'you']).length,
      summary,
    ).toBeGreaterThanOrEqual(5);
    expect(
      wordsHeard(answer, ['thank', 'you', 'for', 'calling', 'order', 'arrive', 'tomorrow', 'morning', 'goodbye']).length,
      summary,
    ).toBeGreaterThanOrEqual(5);
    expect(
      lines.map((l) => l.speaker),
      summary,
    ).toEqual(['agent', 'caller', 'agent']);
    expect(wordsHeard(lines[1].content, SENTENCE.split(' ')).length, summary).toBeGreaterThanOrEqual(5);
    expect(lines[2].content).toBe(GOODBYE);
    expect(lines[2].metadata.spoken).toBe(true);
    expect(call.attributes.status).toBe('completed');
  }, 240_000);
});
