#!/usr/bin/env bash
# Instructions per small durable DS append, counted by callgrind: a release server (LTO off, so
# functions keep their names) under `wrk -t1 -c8` 100 B POSTs to one stream, counting switched
# on after a 5 s warm-up, for 15 s. Instruction counts do not depend on how fast the VM is, so
# two builds compare without interleaving; the run-to-run spread (how requests fall into group
# commits, per-second work spread over more or fewer requests) is about ±0.2k per append.
#
#   PICO_BIN=target/release/pico scripts/bench/callgrind_append.sh [OUT_DIR]
#
# Build: CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
#        cargo build --release -p pico-cli
# Prints `requests N instructions T per-append T/N`; the profile stays in OUT_DIR for
# `callgrind_annotate` (docs/design/http-hot-path.md, "Where the rest is").
set -euo pipefail
BIN=${PICO_BIN:?set PICO_BIN to a release pico built with LTO off}
OUT=${1:-$(mktemp -d /tmp/callgrind-append.XXXXXX)}
mkdir -p "$OUT"
for tool in valgrind callgrind_control callgrind_annotate wrk curl; do
  command -v "$tool" >/dev/null || { echo "callgrind_append: $tool is missing" >&2; exit 1; }
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port); ADMIN=$(free_port)
cat >"$OUT/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = string.rep("x", 100)
wrk.headers["Content-Type"] = "text/plain"
EOF
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT/callgrind.out" \
  "$BIN" serve --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" --no-kafka \
  --meta-url "sqlite:$OUT/meta.db" --storage="-2@file://$OUT/objects" >"$OUT/server.log" 2>&1 &
PID=$!
stop() { kill -INT "$PID" 2>/dev/null || true; sleep 3; kill -9 "$PID" 2>/dev/null || true; rm -rf "$OUT/objects"; }  # the WAL lives under it (the data bucket, id - 1)
trap stop EXIT
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$ADMIN/ready" >/dev/null 2>&1 && break
  kill -0 "$PID" 2>/dev/null || { echo "server exited; log:" >&2; tail -20 "$OUT/server.log" >&2; exit 1; }
  sleep 0.2
done
URL=http://127.0.0.1:$PORT/v1/stream/callgrind
curl -fs -X PUT -H 'Content-Type: text/plain' "$URL" >/dev/null
wrk -t1 -c8 -d5s -s "$OUT/post.lua" "$URL" >"$OUT/warm.txt"
callgrind_control -i on "$PID" >/dev/null
wrk -t1 -c8 -d15s -s "$OUT/post.lua" "$URL" >"$OUT/wrk.txt"
callgrind_control -i off "$PID" >/dev/null
callgrind_control -d "$PID" >/dev/null
sleep 1
REQ=$(awk '/requests in/ {print $1}' "$OUT/wrk.txt")
# The dump (callgrind.out.1) holds the counted part; the exit's file only the rest.
PROFILE=$OUT/callgrind.out.1
TOTAL=$(callgrind_annotate --auto=no "$PROFILE" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}')
echo "requests $REQ instructions $TOTAL per-append $((TOTAL / REQ)) (profile: $PROFILE)"
