#!/usr/bin/env bash
# End to end with the real Durable Streams TypeScript client: installs @durable-streams/client
# (pinned in scripts/ds-client/package.json) into $CARGO_TARGET_DIR/ds-client, starts the `pico`
# binary on file storage in a temp dir on free loopback ports, runs scripts/ds-client/e2e.mjs
# (multi-MiB streams read whole in catch-up mode), stops the server and fails on any mismatch.
#
#   PICO_BIN       binary to test (default: $CARGO_TARGET_DIR/debug/pico, built if missing)
#   DS_CLIENT_DIR  where npm installs the client (default: $CARGO_TARGET_DIR/ds-client)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=${DS_CLIENT_DIR:-$TARGET/ds-client}
PICO_BIN=${PICO_BIN:-$TARGET/debug/pico}

if [[ ! -x $PICO_BIN ]]; then
  echo "ds-client-e2e: building pico ($PICO_BIN not found)" >&2
  cargo build -p pico-cli
fi

mkdir -p "$WORK"
cp scripts/ds-client/package.json scripts/ds-client/package-lock.json scripts/ds-client/e2e.mjs "$WORK/"
(cd "$WORK" && npm install --no-audit --no-fund --loglevel=error >/dev/null)

# shellcheck source=scripts/lib/pico-node.sh
source scripts/lib/pico-node.sh
start_pico ds-client-e2e

set +e
(cd "$WORK" && PICO_URL="http://127.0.0.1:$PORT" node e2e.mjs)
RC=$?
set -e
if [[ $RC -ne 0 ]]; then
  echo "ds-client-e2e: FAILED; server log tail:" >&2
  tail -n 20 "$LOG" >&2
fi
exit "$RC"
