/**
 * The event catalogue: `<ResourceType>.created|updated|deleted` for every type whose changes are events, and
 * the further actions a type declares (`Conversation.analysed`; docs/events.md). Read at request time; the resources module imports the types that name it.
 */
import { EVENT_ACTIONS } from '../jsonapi/index.js';
import { resources } from './index.js';

let catalogue: Set<string> | undefined;

export function eventTypes(): ReadonlySet<string> {
  catalogue ??= new Set(
    resources.filter((r) => r.events !== false).flatMap((r) => [...EVENT_ACTIONS, ...(r.extraEvents ?? [])].map((a) => `${r.type}.${a}`)),
  );
  return catalogue;
}
