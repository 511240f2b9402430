/** The visitor chat widget: one self-contained script (/widget.js) that other websites embed. */
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

export default defineConfig({
  logLevel: 'warn',
  build: {
    outDir: fileURLToPath(new URL('../dist/public', import.meta.url)),
    emptyOutDir: false,
    target: 'es2020',
    lib: {
      entry: fileURLToPath(new URL('./widget/widget.ts', import.meta.url)),
      formats: ['iife'],
      name: 'ParleyWidget',
      fileName: () => 'widget.js',
    },
  },
});
