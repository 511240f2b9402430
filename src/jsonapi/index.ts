/**
 * The engine's front door for resource declarations (src/resources): the declaration vocabulary, the errors a
 * hook may raise, who is asking and who is writing, and the few helpers an escape hatch needs. Resources
 * import from here only, so the engine's inner modules can change without touching every declaration.
 */
export {
  type ActionContext,
  type ActionResult,
  type AppServices,
  type AttributeDef,
  attr,
  defineResource,
  rel,
  type ResourceDef,
  type Scope,
} from './resource.js';
export { ApiError, type ErrorObject, errorObject, forbidden, notFound } from './errors.js';
export { type Principal, type PrincipalRole, ROLES, type Role } from './principal.js';
export { systemActor } from './actor.js';
export { rowScope } from './scope.js';
export { insertRecord, insertRecordFrom } from './write.js';
export { eventTypes } from './outbox.js';
