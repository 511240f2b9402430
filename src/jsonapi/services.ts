/** The service container: process-wide services that actions and writers need. */
import type { Redis } from 'ioredis';
import type { Config } from '../config/index.js';
import type { Records } from './records.js';

export interface AppServices {
  config: Config;
  /** HS256 key for every JWT the service issues and verifies. */
  signingKey: Uint8Array;
  /** Shared counters (rate limits, login throttling) when REDIS_URL is set. */
  redis?: Redis;
  /** The one write path; set once the resources are registered (see createRecords). */
  records?: Records;
  /**
   * Runs an agent test suite (src/agents/suite.ts) as a dry run and returns its report; set by the application
   * (the agents live outside the resources). Throws an ApiError for an unknown agent or a bad suite.
   */
  agentTests?: (organisationId: string, agentId: string, suite: unknown) => Promise<unknown>;
}
