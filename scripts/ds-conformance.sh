#!/usr/bin/env bash
# Durable Streams conformance: installs @durable-streams/server-conformance-tests (pinned in
# scripts/ds/package.json) into target/ds-conf, starts the real `pico` binary on file storage in a
# temp dir with a 1 s long-poll timeout on free loopback ports, runs the whole suite, prints its
# summary, stops the server and fails unless every test passed.
#
#   PICO_BIN        binary to test (default: $CARGO_TARGET_DIR/debug/pico, built if missing)
#   SUBSCRIPTIONS=1 include the 6 subscription tests (then 338/338 must pass; else 332 + 6 skipped)
#   DS_CONF_DIR     where npm installs the suite (default: target/ds-conf)
#   VITEST_ARGS     extra vitest arguments, e.g. `-t "SSE Mode"` (the count check is then skipped)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=${DS_CONF_DIR:-$TARGET/ds-conf}
PICO_BIN=${PICO_BIN:-$TARGET/debug/pico}
SUBSCRIPTIONS=${SUBSCRIPTIONS:-0}
LONG_POLL_SEC=1

if [[ ! -x $PICO_BIN ]]; then
  echo "ds-conformance: building pico ($PICO_BIN not found)" >&2
  cargo build -p pico-cli
fi

mkdir -p "$WORK"
cp scripts/ds/package.json scripts/ds/package-lock.json scripts/ds/conformance.test.mjs scripts/ds/vitest.config.mjs "$WORK/"
# The lockfile pins the tree (vitest, fast-check, the TS client); `npm ci` trips over an
# optional Windows-only dependency missing from npm 11 lockfiles, so install against it.
(cd "$WORK" && npm install --no-audit --no-fund --loglevel=error >/dev/null)

# shellcheck source=scripts/lib/pico-node.sh
source scripts/lib/pico-node.sh
start_pico ds-conformance --long-poll-timeout-sec "$LONG_POLL_SEC"

RESULTS=$WORK/results.json
rm -f "$RESULTS"
set +e
(cd "$WORK" && CONFORMANCE_TEST_URL="http://127.0.0.1:$PORT" SUBSCRIPTIONS="$SUBSCRIPTIONS" \
  LONG_POLL_MS=$((LONG_POLL_SEC * 1000)) \
  npx vitest run --reporter=default --reporter=json --outputFile.json="$RESULTS" ${VITEST_ARGS:-})
VITEST_RC=$?
set -e

if [[ ! -f $RESULTS ]]; then
  echo "ds-conformance: no results (vitest exit $VITEST_RC); server log:" >&2
  tail -n 50 "$LOG" >&2
  exit 1
fi
read -r PASSED FAILED SKIPPED TOTAL < <(node -e '
  const r = require(process.argv[1]);
  console.log(r.numPassedTests, r.numFailedTests, r.numPendingTests + r.numTodoTests, r.numTotalTests);
' "$RESULTS")
echo "ds-conformance: ${TOTAL} tests, subscriptions=${SUBSCRIPTIONS}"
echo "ds-conformance: ${PASSED} passed, ${FAILED} failed, ${SKIPPED} skipped"

if [[ -n ${VITEST_ARGS:-} ]]; then
  exit "$VITEST_RC"
fi
if [[ $SUBSCRIPTIONS == 1 ]]; then
  WANT_PASSED=338 WANT_SKIPPED=0
else
  WANT_PASSED=332 WANT_SKIPPED=6
fi
if [[ $VITEST_RC -ne 0 || $FAILED -ne 0 || $PASSED -ne $WANT_PASSED || $SKIPPED -ne $WANT_SKIPPED ]]; then
  echo "ds-conformance: FAILED (want ${WANT_PASSED} passed, ${WANT_SKIPPED} skipped)" >&2
  exit 1
fi
echo "ds-conformance: OK"
