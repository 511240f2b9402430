/**
 * The event catalogue: `<ResourceType>.created|updated|deleted` for every type whose changes are events, and
 * the further actions a type declares (`Conversation.analysed`; docs/events.md). Made from the registry the
 * caller holds, not from the resources module, which imports the types that read it (no import loop).
 */
import { type ActionContext, EVENT_ACTIONS } from '../jsonapi/index.js';

type Registry = ActionContext['registry'];

const catalogues = new WeakMap<Registry, ReadonlySet<string>>();

export function eventTypes(registry: Registry): ReadonlySet<string> {
  let catalogue = catalogues.get(registry);
  if (!catalogue) {
    const types = [...registry.values()].filter((r) => r.events !== false);
    catalogue = new Set(types.flatMap((r) => [...EVENT_ACTIONS, ...(r.extraEvents ?? [])].map((a) => `${r.type}.${a}`)));
    catalogues.set(registry, catalogue);
  }
  return catalogue;
}
