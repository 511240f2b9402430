/** The operator console: a Preact single-page application served by `serve` under /console. */
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

export default defineConfig({
  root: fileURLToPath(new URL('./console', import.meta.url)),
  base: '/console/',
  // JSX through esbuild's automatic runtime (no Babel).
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  logLevel: 'warn',
  build: {
    outDir: fileURLToPath(new URL('../dist/public/console', import.meta.url)),
    emptyOutDir: true,
    target: 'es2020',
    sourcemap: true,
  },
});
