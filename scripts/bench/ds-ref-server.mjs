// The Durable Streams Node reference server (npm @durable-streams/server), for comparisons.
// compare.sh copies this file next to its node_modules. PORT, DATA_DIR (file-backed when set),
// LONG_POLL_MS.
import { DurableStreamTestServer } from "@durable-streams/server"
const opts = { host: "127.0.0.1", port: Number(process.env.PORT ?? 4437),
               longPollTimeout: Number(process.env.LONG_POLL_MS ?? 30000) }
if (process.env.DATA_DIR) opts.dataDir = process.env.DATA_DIR
const server = new DurableStreamTestServer(opts)
await server.start()
console.log("listening", server.url)
process.on("SIGTERM", async () => { await server.stop(); process.exit(0) })
