// Registers the Durable Streams server conformance suite against CONFORMANCE_TEST_URL.
// SUBSCRIPTIONS=1 enables the 6 subscription tests; LONG_POLL_MS tells the suite the server's
// long-poll timeout (it only sizes a few per-test timeouts).
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("set CONFORMANCE_TEST_URL")

runConformanceTests({
  baseUrl,
  longPollTimeoutMs: process.env.LONG_POLL_MS ? Number(process.env.LONG_POLL_MS) : undefined,
  subscriptions: process.env.SUBSCRIPTIONS === "1",
})
