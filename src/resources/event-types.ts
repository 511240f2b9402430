/**
 * The event catalogue, made by the engine (src/jsonapi/outbox.ts) from the registry the caller holds, not from the
 * resources module, which imports the types that read it (no import loop).
 */
export { eventTypes } from '../jsonapi/index.js';
