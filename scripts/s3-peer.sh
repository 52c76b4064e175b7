#!/usr/bin/env bash
# Zero disk on an S3-compatible server other than the one the rest of the tests use (moto):
# s3s-fs 0.14.1 (Rust, file-backed; ../shared/design/TEST-PEERS.md). Runs the zero-disk
# end-to-end tests of crates/pico-cli/tests/s3_e2e.rs (`survives_losing_its_disk`): a node with
# its metadata in Postgres and its data on this server, with the WAL on the same server (its
# own bucket, and the default: the data bucket's id − 1) and in Postgres; acknowledged appends,
# kill -9, the working directory deleted, a restart on other ports: every acknowledged record
# is there once, at its offset. s3s-fs's conditional writes are not atomic under races, so the
# fencing tests stay on moto.
#
# s3s-fs is installed once per machine under $PICO_TOOLS_DIR (~/.cache/pico-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${PICO_TOOLS_DIR:-$HOME/.cache/pico-tools}
if [[ ! -x $TOOLS/bin/s3s-fs ]]; then
  echo "s3-peer: installing s3s-fs into $TOOLS" >&2
  cargo install --quiet --locked --root "$TOOLS" s3s-fs --version 0.14.1 --features binary
fi
DATA=$(mktemp -d "${TMPDIR:-/tmp}/s3s-fs.XXXXXX")
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
"$TOOLS/bin/s3s-fs" --host 127.0.0.1 --port "$PORT" --access-key testing --secret-key testing \
  "$DATA" >"$DATA.log" 2>&1 &
PID=$!
stop() {
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  rm -rf "$DATA" "$DATA.log"
}
trap stop EXIT
for _ in $(seq 1 100); do
  curl -sS -o /dev/null "http://127.0.0.1:$PORT/" 2>/dev/null && break
  kill -0 "$PID" 2>/dev/null || { echo "s3-peer: s3s-fs exited:" >&2; cat "$DATA.log" >&2; exit 1; }
  sleep 0.1
done
echo "s3-peer: s3s-fs on http://127.0.0.1:$PORT (pid $PID)" >&2
PICO_TEST_S3_ENDPOINT="http://127.0.0.1:$PORT" AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing \
  AWS_REGION=us-east-1 cargo test -p pico-cli --test s3_e2e -- survives_losing_its_disk
# The node really wrote there: the tests' buckets hold objects (s3s-fs keeps them as files).
objects=$(find "$DATA" -type f | wc -l)
echo "s3-peer: $objects objects left on s3s-fs by the tests" >&2
[[ $objects -gt 0 ]] || { echo "s3-peer: nothing was written to s3s-fs" >&2; exit 1; }
