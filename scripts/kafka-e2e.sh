#!/usr/bin/env bash
# End to end with real Kafka clients against the real `pico` binary (issue 39): starts a node
# with its Kafka listener on a free loopback port, then
#   - kcat (librdkafka 2.0.2) produces 100k messages and consumes them back byte-exact, and
#     20k more as gzip and as lz4 batches;
#   - confluent-kafka: an idempotent producer (acks=all), a consumer group of 2 on a
#     4-partition topic that rebalances when one member leaves, cross-protocol reads and
#     appends against the HTTP listener, batches of every compression codec consumed back and
#     read over HTTP; kafka-python and aiokafka produce and consume;
#   - kafkajs: an idempotent producer and a consumer group, checked field by field and over HTTP;
#   - the node restarts on the same storage and the group resumes from its committed offsets.
# Clients come from scripts/lib/kafka-peers.sh (kcat from apt, a venv for the Python clients,
# kafkajs from npm).
#
#   PICO_BIN  binary to test (default: $CARGO_TARGET_DIR/debug/pico, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PICO_BIN=${PICO_BIN:-$TARGET/debug/pico}
if [[ ! -x $PICO_BIN ]]; then
  echo "kafka-e2e: building pico ($PICO_BIN not found)" >&2
  cargo build -p pico-cli
fi

# shellcheck source=scripts/lib/kafka-peers.sh
source scripts/lib/kafka-peers.sh
install_kafka_peers
# shellcheck source=scripts/lib/pico-node.sh
source scripts/lib/pico-node.sh
KAFKA_PORT=$(free_port)
start_pico kafka-e2e
BOOT=127.0.0.1:$KAFKA_PORT
PASSED=0
FAILED=0
ok() { echo "ok: $1"; PASSED=$((PASSED + 1)); }
fail() { echo "FAILED: $1" >&2; FAILED=$((FAILED + 1)); }

# kcat: 100k messages of varied printable bytes, produced and consumed back byte-exact.
python3 - "$DATA/in.txt" <<'PY'
import random, sys
r = random.Random(39)
alphabet = bytes(range(0x20, 0x7f))
with open(sys.argv[1], "wb") as f:
    for i in range(100_000):
        n = r.randint(1, 120)
        f.write(f"{i}:".encode() + bytes(r.choice(alphabet) for _ in range(n)) + b"\n")
PY
if timeout 300 "$KCAT" -P -b "$BOOT" -t kcat100k -l "$DATA/in.txt" 2>"$DATA/kcat-p.log"; then
  timeout 300 "$KCAT" -C -b "$BOOT" -t kcat100k -o beginning -c 100000 -e -q -f '%s\n' \
    >"$DATA/out.txt" 2>"$DATA/kcat-c.log" || true
  if cmp -s "$DATA/in.txt" "$DATA/out.txt"; then
    ok "kcat 100k messages byte-exact"
  else
    fail "kcat round trip differs ($(wc -l <"$DATA/out.txt") lines back)"
    tail -n 5 "$DATA/kcat-c.log" >&2
  fi
else
  fail "kcat produce"
  tail -n 5 "$DATA/kcat-p.log" >&2
fi

# kcat with gzip and lz4 batches (stored as sent): consumed back byte-exact.
for codec in gzip lz4; do
  head -n 20000 "$DATA/in.txt" >"$DATA/z.txt"
  if timeout 120 "$KCAT" -P -b "$BOOT" -t "kcat-$codec" -z "$codec" -l "$DATA/z.txt" \
    2>"$DATA/kcat-z.log"; then
    timeout 120 "$KCAT" -C -b "$BOOT" -t "kcat-$codec" -o beginning -c 20000 -e -q -f '%s\n' \
      >"$DATA/z-out.txt" 2>>"$DATA/kcat-z.log" || true
    if cmp -s "$DATA/z.txt" "$DATA/z-out.txt"; then
      ok "kcat -z $codec 20k messages byte-exact"
    else
      fail "kcat -z $codec round trip differs ($(wc -l <"$DATA/z-out.txt") lines back)"
      tail -n 5 "$DATA/kcat-z.log" >&2
    fi
  else
    fail "kcat -z $codec produce"
    tail -n 5 "$DATA/kcat-z.log" >&2
  fi
done

run_py() {
  if "$KAFKA_PY" scripts/kafka/e2e.py "$1" "$BOOT" "http://127.0.0.1:$PORT"; then
    ok "python clients ($1)"
  else
    fail "python clients ($1)"
  fi
}
run_py before

if node scripts/kafka/kafkajs.cjs "$KAFKAJS_DIR" "$BOOT" "http://127.0.0.1:$PORT"; then
  ok "kafkajs"
else
  fail "kafkajs"
fi

# Restart on the same storage and Kafka port: committed offsets must survive.
kill "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
KEEP_DATA=1 start_pico kafka-e2e
run_py after

if [[ $FAILED -ne 0 ]]; then
  echo "kafka-e2e: server log tail:" >&2
  tail -n 30 "$LOG" >&2
fi
echo "kafka-e2e: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
