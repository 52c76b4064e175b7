// Writes ~4 MiB to a text/plain and to an application/json stream over several appends, then
// reads each back whole with the real Durable Streams client in catch-up (`live: false`) mode
// and compares byte for byte. Prints `ds-client-e2e: N passed, M failed`; exits 1 on a failure.
// The client stops at the first response of a catch-up read, with or without
// `Stream-Up-To-Date`: a server that caps a catch-up read hands it a prefix.
import { stream } from "@durable-streams/client"

const base = process.env.PICO_URL
if (!base) throw new Error("set PICO_URL")
const APPENDS = 16
const APPEND_BYTES = 256 * 1024

/** Deterministic printable text (a simple LCG), so a mismatch is reproducible. */
function text(seed, len) {
  const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;-\n"
  let x = seed >>> 0
  let out = ""
  for (let i = 0; i < len; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0
    out += alphabet[x % alphabet.length]
  }
  return out
}

async function http(method, url, contentType, body) {
  const res = await fetch(url, { method, headers: { "content-type": contentType }, body })
  if (!res.ok) throw new Error(`${method} ${url}: ${res.status} ${await res.text()}`)
}

function firstDiff(a, b) {
  const n = Math.min(a.length, b.length)
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i
  return n
}

async function textStream() {
  const url = `${base}/v1/stream/e2e-text-${process.pid}`
  await http("PUT", url, "text/plain")
  const parts = []
  for (let i = 0; i < APPENDS; i++) {
    parts.push(text(i + 1, APPEND_BYTES))
    await http("POST", url, "text/plain", parts[i])
  }
  const want = Buffer.from(parts.join(""))
  const body = Buffer.from(await (await stream({ url, live: false })).body())
  if (!body.equals(want)) {
    throw new Error(
      `body(): got ${body.length} bytes, want ${want.length}; first difference at byte ${firstDiff(body, want)}`,
    )
  }
  const got = await (await stream({ url, live: false })).text()
  if (got !== want.toString()) {
    throw new Error(`text(): got ${got.length} chars, want ${want.length}`)
  }
}

async function jsonStream() {
  const url = `${base}/v1/stream/e2e-json-${process.pid}`
  await http("PUT", url, "application/json")
  const want = []
  for (let i = 0; i < APPENDS; i++) {
    // An array body appends each element as its own message.
    const batch = []
    for (let j = 0; j < 64; j++) {
      batch.push({ i, j, s: text(i * 64 + j + 1, APPEND_BYTES / 64 - 32) })
    }
    want.push(...batch)
    await http("POST", url, "application/json", JSON.stringify(batch))
  }
  const got = await (await stream({ url, live: false })).json()
  const [g, w] = [JSON.stringify(got), JSON.stringify(want)]
  if (g !== w) {
    throw new Error(
      `json(): got ${got.length} items (${g.length} chars), want ${want.length} (${w.length}); first difference at char ${firstDiff(g, w)}`,
    )
  }
}

let passed = 0
let failed = 0
for (const [name, test] of [
  ["text/plain stream read whole with body() and text()", textStream],
  ["application/json stream read whole with json()", jsonStream],
]) {
  try {
    await test()
    passed++
    console.log(`ok   ${name}`)
  } catch (e) {
    failed++
    console.log(`FAIL ${name}: ${e.message}`)
  }
}
console.log(`ds-client-e2e: ${passed} passed, ${failed} failed`)
process.exit(failed === 0 ? 0 : 1)
