/**
 * The voice runtime (docs/voice.md) records what each spoken line took and whether it was heard:
 * `call_transcripts.metadata` holds, for an agent's line, the turn's latency budget (end of caller
 * speech -> final transcript -> reply -> first audio packet sent) and, when the caller barged in, how
 * much of it was spoken; for a caller's line, the speech-to-text engine and the utterance's length.
 */
export const up = /* sql */ `
ALTER TABLE call_transcripts ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}'::jsonb;
`;
