/** `parley sip serve`: the SIP edge (Kamailio in the foreground, fed from Parley's PostgreSQL database). */
import pino from 'pino';
import { createServices } from '../app.js';
import { loadConfig } from '../config/index.js';
import { openDatabase } from '../db/connection.js';
import { migrate } from '../db/migrate.js';
import { edgeSources, loadSipSettings } from '../sip/config.js';
import { sipEdgeUnavailable, startSipEdge } from '../sip/edge.js';
import { VoiceRuntime } from '../voice/runtime.js';
import { createStt } from '../voice/stt.js';
import { CallTranscriber } from '../voice/transcriber.js';
import { stopOnSignal } from './command.js';

export async function sipServe(): Promise<void> {
  const config = loadConfig();
  const settings = loadSipSettings();
  const unavailable = sipEdgeUnavailable(config.databaseUrl, settings);
  if (unavailable) throw new Error(unavailable);
  const database = await openDatabase(config);
  await migrate(database.db);
  const services = await createServices(database, config);
  const log = (level: string, message: string, detail?: Record<string, unknown>) =>
    console.error(JSON.stringify({ time: new Date().toISOString(), level, msg: message, ...detail }));
  const edge = await startSipEdge({
    settings,
    databaseUrl: config.databaseUrl,
    db: database.db,
    records: services.records!,
    listen: (channel, onNotify, onResumed) => database.listen(channel, onNotify, onResumed),
    runDir: config.sipRunDir,
    log,
    onKamailioLog: (line) => console.error(line),
    onRtpengineLog: (line) => console.error(`rtpengine ${line}`),
  });
  console.log(
    `Parley SIP edge: Kamailio on ${settings.listen}, SIP domain ${settings.domain}, media on rtpengine (RTP ${settings.media.rtpPortMin}-${settings.media.rtpPortMax}) (run directory ${edge.runDir})`,
  );
  // The voice runtime answers the calls Kamailio relays to AI agents (route[VOICE]); it takes requests
  // from Kamailio's own addresses only (VOICE_SIP_TRUSTED overrides) and applies the edge's call events
  // in this process, so a call's records are one Call (docs/voice.md, "Behind the SIP edge").
  let voice: VoiceRuntime | undefined;
  let transcriber: CallTranscriber | undefined;
  if (config.voice.runtime) {
    const trusted = config.voice.sipTrusted.length ? config.voice.sipTrusted : edgeSources(settings.listens);
    voice = new VoiceRuntime({
      db: database.db,
      services,
      config: { ...config, voice: { ...config.voice, sipTrusted: trusted } },
      callEvents: edge.events,
      forks: () => transcriber?.forking ?? 0,
      listen: (channel, onNotify, onResumed) => database.listen(channel, onNotify, onResumed),
      logger: pino({ level: config.logLevel }, pino.destination(2)),
    });
    try {
      await voice.start();
    } catch (error) {
      await edge.stop().catch(() => {});
      throw new Error(
        `the voice runtime cannot listen on ${settings.voiceAddress} (VOICE_SIP_HOST/VOICE_SIP_PORT): ${error instanceof Error ? error.message : String(error)}`,
      );
    }
    console.log(`Parley voice runtime: AI agent calls on ${settings.voiceAddress} (taken from ${trusted.join(', ')})`);
    // Calls between people: each leg's audio forked by rtpengine and transcribed, for organisations whose
    // transcribe_calls is on (docs/voice.md, "Calls between people").
    transcriber = new CallTranscriber({
      db: database.db,
      records: services.records!,
      stt: createStt(config.voice),
      ng: edge.rtpengine.ng,
      address: edge.rtpengine.media.address,
      endpointMs: config.voice.endpointMs,
      maxUtteranceMs: config.voice.maxUtteranceMs,
      // Forks use the voice runtime's capacity (docs/voice.md, "Calls between people"): past it, none is added.
      room: () => (voice?.activeCalls ?? 0) + (transcriber?.forking ?? 0) < config.voice.maxCalls,
      logger: pino({ level: config.logLevel }, pino.destination(2)),
    });
    edge.events.observe(transcriber.onCallEvents);
    transcriber.start();
  }
  // On SIGTERM/SIGINT Kamailio gets SIGTERM (its dialogs and queued events are written; calls still talking
  // stay open for the next start). Should this process die without that (SIGKILL), Kamailio's supervisor
  // sees its pipe close and stops Kamailio's whole process group (src/sip/kamailio.ts).
  const stopping = stopOnSignal(async (signal) => {
    log('info', 'stopping Kamailio', { signal });
    // Agent calls are hung up (BYE through Kamailio, which still runs) and recorded before Kamailio stops.
    await voice?.stop().catch((error: unknown) => log('error', 'stopping the voice runtime failed', { error: String(error) }));
    // Before rtpengine stops: the utterances under way are transcribed and written.
    await transcriber?.stop().catch((error: unknown) => log('error', 'stopping the transcriber failed', { error: String(error) }));
    await edge.stop();
    await database.close();
  });
  // Either process ending by itself ends `sip serve` (status 1), so that the service manager restarts the
  // whole edge: Kamailio without rtpengine would refuse every call, rtpengine without Kamailio gets none.
  const exit = await Promise.race([
    edge.kamailio.exited.then((code) => ({ process: 'Kamailio', code })),
    edge.rtpengine.exited.then((code) => ({ process: 'rtpengine', code })),
  ]);
  if (!stopping()) {
    log('error', `${exit.process} exited`, { exit: exit.code });
    await voice?.stop().catch(() => {});
    await transcriber?.stop().catch(() => {});
    await edge.stop().catch(() => {});
    await database.close();
    process.exit(1);
  }
}
