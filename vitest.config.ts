import { configDefaults, defineConfig } from 'vitest/config';

/**
 * The slow end-to-end suites (Kamailio and SIPp, voice, a real browser) have their own configuration,
 * vitest.e2e.config.ts (`npm run test:e2e`), so that `npm test` stays short; CI runs both.
 */
export const E2E_TESTS = ['test/sip/**/*.test.ts', 'test/voice/**/*.test.ts', 'test/**/*.browser.test.ts'];

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    exclude: [...configDefaults.exclude, ...E2E_TESTS],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: 'forks',
    globalSetup: ['test/support/web-build.ts', 'test/support/database-template.ts'],
  },
});
