/** The service container: process-wide services that actions and writers need (declared with the resource vocabulary). */
export type { AppServices } from './resource.js';
