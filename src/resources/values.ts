/** Value sets of enumerated attributes (CONTRACT section 5). */
export const CONVERSATION_CHANNELS = ['chat', 'voice', 'sms'] as const;
export const CONVERSATION_MODES = ['text', 'voice'] as const;
export const CONVERSATION_STATUSES = ['active', 'pending', 'closed'] as const;
export const ITEM_ROLES = ['user', 'assistant', 'operator', 'system', 'tool'] as const;
export const ITEM_MODALITIES = ['text', 'audio'] as const;
export const GATEWAY_PROVIDERS = ['generic', 'twilio', 'telnyx', 'vonage', 'plivo', 'bandwidth', 'sinch', 'signalwire'] as const;
export const OPERATOR_STATUSES = ['available', 'busy', 'wrap_up', 'away', 'offline'] as const;
export const OPERATOR_STATUS_SOURCES = ['widget', 'api', 'system'] as const;
export const CALL_DIRECTIONS = ['inbound', 'outbound'] as const;
export const CALL_STATUSES = ['initiated', 'ringing', 'in_progress', 'completed', 'busy', 'no_answer', 'failed', 'canceled'] as const;
export const TERMINAL_CALL_STATUSES = ['completed', 'busy', 'no_answer', 'failed', 'canceled'] as const;
export const PARTICIPANT_ROLES = ['caller', 'callee', 'agent', 'operator'] as const;
/** `callee`: the answering party of a call between people when it is not an operator (per-leg transcription). */
export const TRANSCRIPT_SPEAKERS = ['caller', 'callee', 'agent', 'operator'] as const;
export const API_KEY_TYPES = ['publishable', 'secret'] as const;
