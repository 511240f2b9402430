import { defineConfig } from 'vitest/config';
import { E2E_TESTS } from './vitest.config.js';

/**
 * The end-to-end suites: Kamailio and SIPp against the SIP edge, the voice runtime, the console and widget in
 * Chromium. They need PostgreSQL and Debian's packages (.ci/run installs them) and skip, saying why, without.
 * One file at a time: each starts its own Kamailio, media or browser, and they measure timing on a 2-core machine.
 */
export default defineConfig({
  test: {
    include: E2E_TESTS,
    testTimeout: 60_000,
    hookTimeout: 120_000,
    pool: 'forks',
    fileParallelism: false,
    globalSetup: ['test/support/web-build.ts', 'test/support/database-template.ts'],
  },
});
