/**
 * Calls between people are transcribed per leg (docs/voice.md, "Calls between people"): rtpengine forks each
 * leg's audio to Parley, which writes `CallTranscript`s. `organisations.transcribe_calls` is the organisation's
 * choice, on by default (CONTRACT section 14); off, nothing is forked. Speakers gain `callee` (the answering
 * party of a call between people, when it is not an operator).
 */
export const up = /* sql */ `
ALTER TABLE organisations ADD COLUMN transcribe_calls boolean NOT NULL DEFAULT true;
`;
