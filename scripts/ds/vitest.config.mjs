// Only the wrapper file is a test (vitest would otherwise also look for *.test.* files under
// node_modules when run from this directory). Per-test timeouts are the suite's own.
import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["conformance.test.mjs"],
  },
})
