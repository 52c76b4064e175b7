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
#   - the node restarts on the same storage and the group resumes from its committed offsets;
#   - cluster: two nodes on a fresh Postgres database (PICO_TEST_POSTGRES_URL, default the local
#     server; skipped without one unless PICO_TEST_REQUIRE_ALL=1): Metadata lists both brokers,
#     and an idempotent confluent-kafka producer follows its topic across a transfer to the
#     other node (NOT_LEADER_OR_FOLLOWER, then Metadata names the new leader).
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

# Cluster: two nodes sharing a fresh Postgres database (metadata log and WAL) and one data
# directory, each with its Kafka listener.
PG_ADMIN=${PICO_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}
CLUSTER_DB=pico_kafka_e2e_$$
CLUSTER_PIDS=()
stop_cluster() {
  for p in "${CLUSTER_PIDS[@]}"; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  CLUSTER_PIDS=()
  psql -q "$PG_ADMIN" -c "DROP DATABASE IF EXISTS $CLUSTER_DB WITH (FORCE)" >/dev/null 2>&1 || true
}
if psql -q "$PG_ADMIN" -c "CREATE DATABASE $CLUSTER_DB" >/dev/null 2>&1; then
  trap 'stop_cluster; stop_pico' EXIT
  CLUSTER_URL=${PG_ADMIN%/*}/$CLUSTER_DB
  CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/pico-kafka-cluster.XXXXXX")
  BOOTS=()
  ADMINS=()
  for id in 1 2; do
    kport=$(free_port)
    admin=$(free_port)
    "$PICO_BIN" serve --node-id "$id" --listen "127.0.0.1:$(free_port)" \
      --admin-listen "127.0.0.1:$admin" --kafka-listen "127.0.0.1:$kport" \
      --meta-url "$CLUSTER_URL" --wal "$CLUSTER_URL" --storage="-2@file://$CLUSTER_DIR/objects" \
      >"$CLUSTER_DIR/node-$id.log" 2>&1 &
    CLUSTER_PIDS+=($!)
    BOOTS+=("127.0.0.1:$kport")
    ADMINS+=("http://127.0.0.1:$admin")
    for _ in $(seq 1 300); do
      curl -fsS "http://127.0.0.1:$admin/ready" >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
  if "$KAFKA_PY" scripts/kafka/cluster.py "${BOOTS[0]}" "${BOOTS[1]}" "${ADMINS[0]}"; then
    ok "cluster: metadata lists both brokers; a producer follows its topic to the new leader"
  else
    fail "cluster: metadata and leader re-routing"
    for id in 1 2; do
      echo "kafka-e2e: cluster node $id log tail:" >&2
      tail -n 20 "$CLUSTER_DIR/node-$id.log" >&2
    done
  fi
  stop_cluster
  rm -rf "$CLUSTER_DIR"
elif [[ ${PICO_TEST_REQUIRE_ALL:-} == 1 ]]; then
  fail "cluster: no Postgres at $PG_ADMIN (PICO_TEST_REQUIRE_ALL=1)"
else
  echo "SKIPPED (cluster: no Postgres at $PG_ADMIN)" >&2
fi

if [[ $FAILED -ne 0 ]]; then
  echo "kafka-e2e: server log tail:" >&2
  tail -n 30 "$LOG" >&2
fi
echo "kafka-e2e: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
