#!/usr/bin/env bash
# Cluster figures (issue 38), one run on this machine; not run by CI:
#   1. metadata propose latency p50/p99, one sequential proposer: Postgres, and SQLite for
#      reference (crates/pico-sql/examples/meta_bench.rs `propose`);
#   2. a command committed through one metadata log until another log on the same database has
#      applied it, woken by LISTEN/NOTIFY and by polling alone (1 s and 100 ms; `wake`);
#   3. restart-to-ready with many streams: the metadata log filled through its bulk path
#      (CreateStream commands, 5,000 per row; `fill`), its open time (snapshot + replay; `open`),
#      and a `pico serve` on it from spawn to `/ready` 200;
#   4. append throughput of 1, 2 and 3 nodes on one Postgres database (metadata and WAL), one
#      `pico bench` per node on streams of its own, run at the same time and summed.
#
# usage: scripts/bench/cluster.sh [propose] [wake] [restart] [append]   (default: all)
# env: PICO_BIN, META_BENCH (default: built in release), BENCH_DURATION (10s), BENCH_WORK
#      (default target/bench), BENCH_RESTART_STREAMS ("100000 1000000"), BENCH_CONNECTIONS (16,
#      split over the nodes), BENCH_STREAMS (96, split), PICO_TEST_POSTGRES_URL
#      (postgres://postgres@127.0.0.1:5432/postgres)
# Prints `figure value` lines and writes them, with logs and bench JSON, under
# $BENCH_WORK/cluster-*/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${BENCH_WORK:-$ROOT/target/bench}
DUR=${BENCH_DURATION:-10s}
RUN=$WORK/cluster-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
PG_ADMIN=${PICO_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_BASE=${PG_ADMIN%/*}
RESTART_STREAMS=${BENCH_RESTART_STREAMS:-100000 1000000}
CONNS=${BENCH_CONNECTIONS:-16}
STREAMS=${BENCH_STREAMS:-96}
SECTIONS=${*:-propose wake restart append}
log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fig() { printf '%s %s\n' "$1" "$2" | tee -a "$RUN/figures.txt"; }

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${PICO_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p pico-cli --bin pico >&2)
  PICO_BIN=$TARGET/release/pico
fi
if [ -z "${META_BENCH:-}" ]; then
  (cd "$ROOT" && cargo build --release -p pico-sql --example meta_bench >&2)
  META_BENCH=$TARGET/release/examples/meta_bench
fi

PIDS=()
DBS=()
stop_pid() {
  kill -0 "$1" 2>/dev/null || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  for p in "${PIDS[@]}"; do stop_pid "$p"; done
  for d in "${DBS[@]}"; do
    psql -q "$PG_ADMIN" -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
# A fresh database (dropped at exit); its URL in PG.
newdb() {
  local name=pico_cluster_bench_$$_${#DBS[@]}
  psql -q "$PG_ADMIN" -c "CREATE DATABASE $name" >/dev/null
  DBS+=("$name")
  PG=$PG_BASE/$name
}
# `meta_bench` output line `key value` -> value.
val() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }

# Starts node $1 on database $2 with data in $3; sets NODE_PID, NODE_PORT, NODE_ADMIN.
start_node() {
  NODE_PORT=$(free_port)
  NODE_ADMIN=$(free_port)
  "$PICO_BIN" serve --node-id "$1" --listen "127.0.0.1:$NODE_PORT" \
    --admin-listen "127.0.0.1:$NODE_ADMIN" --meta-url "$2" --wal "$2" \
    --storage="-2@file://$3/objects" --no-kafka >"$RUN/node-$1-$NODE_PORT.log" 2>&1 &
  NODE_PID=$!
  PIDS+=("$NODE_PID")
}
# Waits (bounded by $2 seconds) for /ready 200 on admin port $1.
wait_ready() {
  local until=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$until" ]; do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/ready")" = 200 ] && return 0
    sleep 0.05
  done
  return 1
}
now_ms() { date +%s%3N; }

for section in $SECTIONS; do
  case $section in
  propose)
    log "propose latency (Postgres, then SQLite)"
    newdb
    "$META_BENCH" propose "$PG" 3000 >"$RUN/propose-pg.txt"
    fig propose_pg_p50_us "$(val propose_p50_us "$RUN/propose-pg.txt")"
    fig propose_pg_p99_us "$(val propose_p99_us "$RUN/propose-pg.txt")"
    "$META_BENCH" propose "sqlite:$RUN/meta.db?mode=rwc" 3000 >"$RUN/propose-sqlite.txt"
    fig propose_sqlite_p50_us "$(val propose_p50_us "$RUN/propose-sqlite.txt")"
    fig propose_sqlite_p99_us "$(val propose_p99_us "$RUN/propose-sqlite.txt")"
    ;;
  wake)
    log "committed on one log -> applied on another (LISTEN/NOTIFY, polling)"
    newdb
    "$META_BENCH" wake "$PG" 300 >"$RUN/wake.txt"
    for k in notify poll_1s poll_100ms; do
      for w in commit propose; do
        for q in p50 p99; do
          fig "${k}_${w}_to_applied_elsewhere_${q}_us" \
            "$(val "${k}_${w}_to_applied_elsewhere_${q}_us" "$RUN/wake.txt")"
        done
      done
    done
    ;;
  restart)
    for n in $RESTART_STREAMS; do
      log "restart-to-ready with $n streams"
      newdb
      data=$RUN/restart-$n
      mkdir -p "$data"
      if ! timeout 3600 "$META_BENCH" fill "$PG" "$n" >"$RUN/fill-$n.txt"; then
        log "filling $n streams failed or took over an hour; skipped"
        continue
      fi
      fig "restart_${n}_fill_ms" "$(val fill_ms "$RUN/fill-$n.txt")"
      timeout 1800 "$META_BENCH" open "$PG" >"$RUN/open-$n.txt"
      fig "restart_${n}_meta_open_ms" "$(val open_ms "$RUN/open-$n.txt")"
      # Twice: the first start registers the node (and may write a snapshot); the second is
      # the restart.
      for round in first restart; do
        t0=$(now_ms)
        start_node 1 "$PG" "$data"
        if wait_ready "$NODE_ADMIN" 1800; then
          fig "restart_${n}_${round}_to_ready_ms" $(( $(now_ms) - t0 ))
        else
          log "node not ready with $n streams within 30 min"
        fi
        rss=$(awk '/VmRSS/ {print $2}' "/proc/$NODE_PID/status" 2>/dev/null || echo 0)
        fig "restart_${n}_${round}_rss_kib" "$rss"
        stop_pid "$NODE_PID"
      done
    done
    ;;
  append)
    for k in 1 2 3; do
      log "append throughput, $k node(s)"
      newdb
      data=$RUN/append-$k
      mkdir -p "$data"
      ports=()
      admins=()
      pids=()
      for id in $(seq 1 "$k"); do
        start_node "$id" "$PG" "$data"
        ports+=("$NODE_PORT")
        admins+=("$NODE_ADMIN")
        pids+=("$NODE_PID")
      done
      for a in "${admins[@]}"; do wait_ready "$a" 120 || { log "a node did not start"; exit 1; }; done
      bench_pids=()
      for i in $(seq 0 $((k - 1))); do
        # Each bench creates its own streams through its node, so they are opened there.
        timeout 600 "$PICO_BIN" --endpoint "http://127.0.0.1:${ports[$i]}" bench \
          --connections $((CONNS / k)) --streams $((STREAMS / k)) -n 1 -b 100 \
          --duration "$DUR" --warmup 3s --prefix "n$((i + 1))" --output json \
          >"$RUN/append-$k-node$((i + 1)).json" 2>"$RUN/append-$k-node$((i + 1)).err" &
        bench_pids+=($!)
      done
      for p in "${bench_pids[@]}"; do wait "$p"; done
      total=0
      errors=0
      for i in $(seq 1 "$k"); do
        r=$(python3 -c 'import json,sys;print(int(json.load(open(sys.argv[1]))["write"]["records_per_sec"]))' "$RUN/append-$k-node$i.json")
        e=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["write"]["errors"])' "$RUN/append-$k-node$i.json")
        total=$((total + r))
        errors=$((errors + e))
      done
      fig "append_${k}_nodes_records_per_sec" "$total"
      fig "append_${k}_nodes_errors" "$errors"
      for p in "${pids[@]}"; do stop_pid "$p"; done
    done
    ;;
  *)
    log "unknown section $section (propose wake restart append)"
    exit 2
    ;;
  esac
done
log "figures in $RUN/figures.txt"
