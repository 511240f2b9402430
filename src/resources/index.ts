import type { ResourceDef } from '../jsonapi/index.js';
import aiAgent from './ai-agent.js';
import apiKey from './api-key.js';
import call from './call.js';
import callParticipant from './call-participant.js';
import callTranscript from './call-transcript.js';
import conversation from './conversation.js';
import conversationItem from './conversation-item.js';
import gateway from './gateway.js';
import invitation from './invitation.js';
import knowledgeDocument from './knowledge-document.js';
import operatorStatus from './operator-status.js';
import operatorStatusEvent from './operator-status-event.js';
import organisation from './organisation.js';
import phoneNumber from './phone-number.js';
import sipUser from './sip-user.js';
import user from './user.js';
import webhookDelivery from './webhook-delivery.js';
import webhookEndpoint from './webhook-endpoint.js';

const declared = [
  apiKey,
  user,
  conversation,
  conversationItem,
  aiAgent,
  gateway,
  sipUser,
  phoneNumber,
  operatorStatus,
  operatorStatusEvent,
  call,
  callParticipant,
  callTranscript,
  organisation,
  webhookEndpoint,
  webhookDelivery,
  invitation,
  knowledgeDocument,
] as const;

/** Every resource, in the order of the spec's endpoint table. */
export const resources: ResourceDef[] = [...declared];

/** Writes through the records service are typed by these declarations (src/jsonapi/typed-writes.ts). */
type Declared = { [R in (typeof declared)[number] as R['type']]: R };
declare module '../jsonapi/typed-writes.js' {
  interface ResourceTypes extends Declared {}
}
