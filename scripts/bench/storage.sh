#!/usr/bin/env bash
# Zero-disk storage figures, one run: append acknowledgement latency of one sequential client
# and 64-connection throughput with the WAL on file://, on S3 and in Postgres, each next to its
# floor measured in the same run (one fdatasync'd write; one PutObject to the same S3 server;
# one single-row INSERT commit on the same Postgres), and the S3 requests a node makes per
# second idle and at 1k appends/s (what a user pays for). Next to each WAL's figures, the node's
# own floor: the same node's round trip for a HEAD (no WAL write), alternated with appends by one
# raw HTTP/1.1 client (floors.py http), so the table tells the machine's and the HTTP path's cost
# (idle threads and CPUs woken included) from what the WAL write adds.
#
# usage: scripts/bench/storage.sh
# env: PICO_BIN (default: builds target/release/pico), BENCH_ONLY (e.g. "postgres": only those
#      WALs, and no S3 request counts, for quick profiling), BENCH_DURATION (10s), BENCH_WORK
#      (default target/bench), PICO_TEST_POSTGRES_URL (postgres://postgres@127.0.0.1:5432/postgres),
#      BENCH_PORTS=LO-HI (the ports of moto and the nodes; default any free one),
#      BENCH_TRACE=1 (needs tcpdump, as root): after the figures, 3 s more of the Postgres floor
#      and of the Postgres-WAL node with one client, captured on loopback, and where an ack's time
#      goes (node in / Postgres / node out, floors.py pcap) next to the floor's Postgres time;
#      likewise for the S3 WAL (floors.py pcap-s3: node in / PUT / node out, the floor's PUTs)
# Prints a Markdown table and writes it, with the raw JSON, under $BENCH_WORK/storage-*/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${BENCH_WORK:-$ROOT/target/bench}
DUR=${BENCH_DURATION:-10s}
RUN=$WORK/storage-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
PG_ADMIN=${PICO_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_BASE=${PG_ADMIN%/*}
PG_PORT=$(python3 -c 'import sys,urllib.parse as u;print(u.urlparse(sys.argv[1]).port or 5432)' "$PG_ADMIN")
DB=pico_bench_$$
log() { printf '[storage %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
if [ "${BENCH_TRACE:-}" = 1 ] && ! command -v tcpdump >/dev/null; then
  log "BENCH_TRACE=1 needs tcpdump (apt-get install tcpdump)"; exit 1
fi

if [ -z "${PICO_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p pico-cli --bin pico >&2)
  PICO_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/pico
fi

PIDS=()
stop_pid() {
  kill -0 "$1" 2>/dev/null || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  for p in "${PIDS[@]}"; do stop_pid "$p"; done
  psql -q "$PG_ADMIN" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# BENCH_PORTS=LO-HI: the servers' ports from that range (a shared machine's share), else any.
free_port() { python3 -c 'import random,socket,sys
r=sys.argv[1].split("-") if sys.argv[1] else ["0","0"]
lo,hi=int(r[0]),int(r[1])
for p in ([0] if not lo else random.sample(range(lo,hi+1),hi-lo+1)):
    s=socket.socket()
    try: s.bind(("127.0.0.1",p))
    except OSError: continue
    print(s.getsockname()[1]); break
else: sys.exit("no free port in "+sys.argv[1])' "${BENCH_PORTS:-}"; }
wait_http() { for _ in $(seq 1 200); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }
j() { python3 -c 'import json,sys;d=json.load(open(sys.argv[2]))
for k in sys.argv[1].split(".")[1:]: d=d[k]
print(d)' "$1" "$2"; }

# --- the S3 server: moto, its own instance, its request log kept to count requests ----------
MOTO_VENV=${PICO_TOOLS_DIR:-$HOME/.cache/pico-tools}/moto
if [ ! -x "$MOTO_VENV/bin/moto_server" ]; then
  log "installing moto server into $MOTO_VENV"
  python3 -m venv "$MOTO_VENV"
  "$MOTO_VENV/bin/pip" install -q 'moto[s3]>=5.2.5' flask flask-cors
fi
S3_PORT=$(free_port)
"$MOTO_VENV/bin/moto_server" -H 127.0.0.1 -p "$S3_PORT" >"$RUN/moto.log" 2>&1 &
PIDS+=($!)
S3=http://127.0.0.1:$S3_PORT
wait_http "$S3/moto-api/" || { log "moto did not start"; cat "$RUN/moto.log" >&2; exit 1; }
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
PY=$MOTO_VENV/bin/python
s3_requests() { grep -c ' HTTP/1.1' "$RUN/moto.log" || true; }
mkbucket() { "$PY" -c 'import boto3,sys;boto3.client("s3",endpoint_url=sys.argv[1]).create_bucket(Bucket=sys.argv[2])' "$S3" "$1"; }
s3uri() { echo "$1@s3://$2?region=us-east-1&endpoint=$S3&pathStyle=true"; }

psql -q "$PG_ADMIN" -c "CREATE DATABASE $DB" >/dev/null
PG=$PG_BASE/$DB

# --- floors ---------------------------------------------------------------------------------
log "floor: 100-byte write + fdatasync, sequential"
python3 "$ROOT/scripts/bench/floors.py" fsync --file "$RUN/fsync.tmp" --count 500 >"$RUN/floor-file.json"
log "floor: one PutObject of 256 B to moto, sequential"
"$PY" "$ROOT/scripts/bench/floors.py" put --endpoint "$S3" --bucket floor --count 500 >"$RUN/floor-s3.json"
# The same PUT without boto3's own ~2 ms (signing, checksum, Expect: 100-continue): shown next
# to the floor, the ratio stays against the floor above.
python3 "$ROOT/scripts/bench/floors.py" put-raw --endpoint "$S3" --bucket floor --count 500 >"$RUN/floor-s3-raw.json"
log "floor: one single-row INSERT commit on Postgres, 1 client (pgbench)"
psql -q "$PG" -c "CREATE TABLE floor (id bigserial primary key, body bytea)" >/dev/null
echo "INSERT INTO floor (body) VALUES ('\\x$(printf '%0200d' 0)');" >"$RUN/insert.sql"
# Without TLS, as the node connects (sqlx is built without it): libpq's default `prefer` would
# add 10-30 µs of encryption per round trip to the floor only.
(cd "$RUN" && PGSSLMODE=disable pgbench -n -c 1 -T 5 -f insert.sql -l --log-prefix=pgfloor "$PG" >"$RUN/pgbench.txt" 2>&1)
python3 "$ROOT/scripts/bench/floors.py" pgbench-log "$RUN"/pgfloor* >"$RUN/floor-pg.json"
# The same INSERT as a prepared statement (the node's WAL statement is one): pgbench's default
# simple protocol parses and plans every INSERT, 10-20 µs a statement on a loaded 2-CPU VM
# (design/wal-postgres.md). Shown next to the floor; the ratio stays against the floor above.
(cd "$RUN" && PGSSLMODE=disable pgbench -n -c 1 -T 5 -M prepared -f insert.sql -l --log-prefix=pgprep "$PG" >"$RUN/pgbench-prepared.txt" 2>&1)
python3 "$ROOT/scripts/bench/floors.py" pgbench-log "$RUN"/pgprep* >"$RUN/floor-pg-prepared.json"
# And with the backend left idle before each statement, as the node's HTTP legs (~30 µs) leave
# it: on a VM whose idle vCPUs halt, the wake costs each statement 30-45 µs that pgbench's
# back-to-back loop never pays (design/wal-postgres.md). Shown next to the floor, not as it.
python3 "$ROOT/scripts/bench/floors.py" pg-stmts --db "$DB" --count 3000 --gap-us 30 --gap sleep \
  "xins=INSERT INTO floor (body) VALUES ('\\x$(printf '%0200d' 0)')" >"$RUN/floor-pg-idle.json" || true

# --- PicoMQ with each WAL -------------------------------------------------------------------
PORT= ADMIN= NODE=
start_node() { # tag meta storage wal
  local tag=$1 dir=$RUN/$1
  mkdir -p "$dir"
  PORT=$(free_port) ADMIN=$(free_port)
  (cd "$dir" && exec "$PICO_BIN" serve --meta-url "$2" --storage="$3" --wal="$4" \
    --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" --no-kafka) >"$dir/pico.log" 2>&1 &
  NODE=$!
  PIDS+=($NODE)
  wait_http "http://127.0.0.1:$ADMIN/ready" || { log "$tag: node not ready"; cat "$dir/pico.log" >&2; exit 1; }
}
bench() { # tag out extra-args...
  local tag=$1 out=$2; shift 2
  "$PICO_BIN" bench --endpoint "http://127.0.0.1:$PORT" --prefix "bench/$tag" -d "$DUR" --warmup 2s \
    --output json "$@" >"$out"
}
TRACE=
trace_start() { # pcap filter: capture loopback (the figures above are taken without it)
  tcpdump -Z root -i lo -n -s 96 -w "$1" "$2" 2>"$1.log" &
  TRACE=$!
  PIDS+=($TRACE)
  for _ in $(seq 1 50); do grep -q listening "$1.log" 2>/dev/null && return 0; sleep 0.1; done
}
trace_stop() { sleep 0.5; stop_pid "$TRACE"; }
for wal in ${BENCH_ONLY:-file s3 postgres}; do
  case $wal in
    file) start_node file "sqlite:$RUN/file/meta.db" "-2@file://$RUN/file/objects" "-3@file://$RUN/file/wal" ;;
    s3) mkbucket data-s3; mkbucket wal-s3
        start_node s3 "$PG" "$(s3uri -2 data-s3)" "$(s3uri -3 wal-s3)" ;;
    postgres) mkbucket data-pg
        start_node postgres "$PG" "$(s3uri -2 data-pg)" "$PG" ;;
  esac
  log "$wal WAL: one sequential client"
  bench "$wal-1" "$RUN/$wal-1.json" --connections 1 -n 1 -b 100
  # Where an ack's time goes: the node's own WAL write time (pico_wal_commit_seconds, the
  # Wal::append call of each group commit) over the same run; the rest is HTTP and engine.
  curl -fsS "http://127.0.0.1:$ADMIN/metrics" >"$RUN/$wal-1.metrics" || true
  # The node's own floor: the same node's round trip for a request that writes nothing (a
  # HEAD), alternated with appends by one raw HTTP/1.1 client, so the table can tell the
  # machine's and the node's HTTP cost from the WAL write's.
  log "$wal WAL: the node's own round trip (HEAD vs append, one client)"
  python3 "$ROOT/scripts/bench/floors.py" http --endpoint "http://127.0.0.1:$PORT" \
    --stream "bench/$wal-head" --count 1000 --seconds 5 >"$RUN/$wal-http.json"
  log "$wal WAL: 64 connections"
  bench "$wal-64" "$RUN/$wal-64.json" --connections 64 -n 1 -b 100
  if [ "$wal" = s3 ]; then
    log "s3: requests while idle (20 s, after 5 s to settle)"
    sleep 5; before=$(s3_requests); sleep 20; after=$(s3_requests)
    echo "$(( after - before ))" >"$RUN/s3-idle.count"
    # 16 connections: on a WAL write of ~7 ms, 4 sequential ones top out near 500/s.
    log "s3: requests at 1k appends/s (16 connections, 100 B)"
    before=$(s3_requests)
    "$PICO_BIN" bench --endpoint "http://127.0.0.1:$PORT" --prefix bench/s3-rate -d "$DUR" --warmup 0s \
      --output json --connections 16 -n 1 -b 100 --target-mibps 0.095367 >"$RUN/s3-1k.json"
    after=$(s3_requests)
    echo "$(( after - before ))" >"$RUN/s3-1k.count"
  fi
  if [ "$wal" = s3 ] && [ "${BENCH_TRACE:-}" = 1 ]; then
    log "s3: where the time goes (loopback capture: the floor's 300 PUTs, then the node 3 s)"
    trace_start "$RUN/trace-s3-floor.pcap" "tcp port $S3_PORT"
    "$PY" "$ROOT/scripts/bench/floors.py" put --endpoint "$S3" --bucket floor --count 300 >"$RUN/trace-s3-floor.put.json"
    trace_stop
    trace_start "$RUN/trace-s3-node.pcap" "tcp port $S3_PORT or tcp port $PORT"
    "$PICO_BIN" bench --endpoint "http://127.0.0.1:$PORT" --prefix bench/trace-s3 -d 3s --warmup 0s \
      --output json --connections 1 -n 1 -b 100 >"$RUN/trace-s3-node.json"
    trace_stop
    python3 "$ROOT/scripts/bench/floors.py" pcap-s3 "$RUN/trace-s3-floor.pcap" --s3-port "$S3_PORT" >"$RUN/trace-s3-floor.json"
    python3 "$ROOT/scripts/bench/floors.py" pcap-s3 "$RUN/trace-s3-node.pcap" --s3-port "$S3_PORT" \
      --http-port "$PORT" --wal-bucket wal-s3 >"$RUN/trace-s3-node.json.legs"
  fi
  if [ "$wal" = postgres ] && [ "${BENCH_TRACE:-}" = 1 ]; then
    log "postgres: where the time goes (loopback capture, 3 s each)"
    trace_start "$RUN/trace-floor.pcap" "tcp port $PG_PORT"
    (cd "$RUN" && PGSSLMODE=disable pgbench -n -c 1 -T 3 -f insert.sql "$PG" >"$RUN/pgbench-trace.txt" 2>&1)
    trace_stop
    trace_start "$RUN/trace-node.pcap" "tcp port $PG_PORT or tcp port $PORT"
    "$PICO_BIN" bench --endpoint "http://127.0.0.1:$PORT" --prefix bench/trace -d 3s --warmup 0s \
      --output json --connections 1 -n 1 -b 100 >"$RUN/trace-node.json"
    trace_stop
    python3 "$ROOT/scripts/bench/floors.py" pcap "$RUN/trace-floor.pcap" --pg-port "$PG_PORT" >"$RUN/trace-floor.json"
    python3 "$ROOT/scripts/bench/floors.py" pcap "$RUN/trace-node.pcap" --pg-port "$PG_PORT" \
      --http-port "$PORT" >"$RUN/trace-node.json.legs"
  fi
  stop_pid "$NODE"
done

# --- the table ------------------------------------------------------------------------------
python3 - "$RUN" "$DUR" <<'EOF' | tee "$RUN/table.md"
import json, sys, os
run, dur = sys.argv[1], sys.argv[2]
secs = float(dur.rstrip("s")) if not dur.endswith("ms") else float(dur[:-2]) / 1000
L = lambda n: json.load(open(os.path.join(run, n)))
def wal_write_p50(wal):
    # The node's pico_wal_commit_seconds median over the 1-client run (a summary quantile).
    try:
        for line in open(os.path.join(run, f"{wal}-1.metrics")):
            if line.startswith('pico_wal_commit_seconds{quantile="0.5"}'):
                return float(line.split()[-1]) * 1000
    except OSError:
        pass
    return float("nan")
print("| WAL | ack p50 / p99, 1 client | node's WAL write p50 | floor p50 / p99 (what) | p50 ratio | 64 connections |")
print("|---|---|---|---|---|---|")
names = {"file": "fdatasync of 100 B", "s3": "PutObject of 256 B", "postgres": "1-row INSERT commit"}
floors = {"file": "floor-file.json", "s3": "floor-s3.json", "postgres": "floor-pg.json"}
for wal in ("file", "s3", "postgres"):
    if not os.path.exists(os.path.join(run, f"{wal}-1.json")):
        continue
    one, many, fl = L(f"{wal}-1.json"), L(f"{wal}-64.json"), L(floors[wal])
    p50, p99 = one["write_latency"]["p50_ms"], one["write_latency"]["p99_ms"]
    print(f"| {wal} | {p50:.3f} / {p99:.2f} ms | {wal_write_p50(wal):.3f} ms | {fl['p50_ms']:.3f} / {fl['p99_ms']:.2f} ms ({names[wal]}) "
          f"| {p50 / fl['p50_ms'] if fl['p50_ms'] else float('nan'):.2f}× | {many['write']['records_per_sec']:.0f} appends/s |")
if os.path.exists(os.path.join(run, "floor-s3-raw.json")) and os.path.exists(os.path.join(run, "s3-1.json")):
    fr = L("floor-s3-raw.json")
    print(f"\nS3 floor from a raw socket, as the node sends its PUT (one write, If-None-Match: *, no client library): "
          f"{fr['p50_ms']:.3f} / {fr['p99_ms']:.2f} ms (the ack is {L('s3-1.json')['write_latency']['p50_ms'] / fr['p50_ms'] if fr['p50_ms'] else float('nan'):.2f}× it)")
if os.path.exists(os.path.join(run, "floor-pg-prepared.json")) and os.path.exists(os.path.join(run, "postgres-1.json")):
    fp = L("floor-pg-prepared.json")
    print(f"\nPostgres floor as a prepared statement (as the node sends its own): {fp['p50_ms']:.3f} / {fp['p99_ms']:.2f} ms "
          f"(the ack is {L('postgres-1.json')['write_latency']['p50_ms'] / fp['p50_ms'] if fp['p50_ms'] else float('nan'):.2f}× it)")
if os.path.exists(os.path.join(run, "floor-pg-idle.json")) and os.path.exists(os.path.join(run, "postgres-1.json")) \
        and os.path.getsize(os.path.join(run, "floor-pg-idle.json")) > 0:
    fi = L("floor-pg-idle.json")["xins"]["p50_us"] / 1000
    print(f"Postgres floor, prepared, the backend idle 30 µs before each statement (as the node leaves it): p50 {fi:.3f} ms "
          f"(the ack is {L('postgres-1.json')['write_latency']['p50_ms'] / fi if fi else float('nan'):.2f}× it)")
heads = [w for w in ("file", "s3", "postgres") if os.path.exists(os.path.join(run, f"{w}-http.json"))]
if heads:
    print()
    print("The node's own round trip: one raw HTTP/1.1 client alternating an append with a HEAD")
    print("of the same stream (no WAL write): what a request costs before any storage (p50 / p99):")
    print()
    print("| WAL | HEAD (no WAL) | append, same client | append − HEAD | floor p50 + HEAD p50 |")
    print("|---|---|---|---|---|")
    for wal in heads:
        h = L(f"{wal}-http.json")
        hd, ap, fl = h["no WAL (HEAD)"], h["append (POST)"], L(floors[wal])
        print(f"| {wal} | {hd['p50_ms']*1000:.0f} / {hd['p99_ms']*1000:.0f} µs | {ap['p50_ms']*1000:.0f} / {ap['p99_ms']*1000:.0f} µs "
              f"| {(ap['p50_ms'] - hd['p50_ms'])*1000:.0f} µs | {(fl['p50_ms'] + hd['p50_ms'])*1000:.0f} µs |")
def legs_table(wal, acks, legs, other):
    print()
    print(f"{wal} WAL, one client, where an ack's time goes (loopback capture, p50 / p99):")
    print()
    print("| leg | p50 | p99 |")
    print("|---|---|---|")
    print(f"| client: ack (request sent -> response read) | {acks['p50_ms']*1000:.0f} µs | {acks['p99_ms']*1000:.0f} µs |")
    for k, v in legs.items():
        if isinstance(v, dict):
            print(f"| {k} | {v['p50_ms']*1000:.0f} µs | {v['p99_ms']*1000:.0f} µs |")
    print(f"\n(the node's other {wal} traffic meanwhile: {legs[other]} segments)")
if os.path.exists(os.path.join(run, "trace-node.json.legs")):
    legs = L("trace-node.json.legs")
    legs["floor: postgres: statement -> answer"] = L("trace-floor.json")["postgres: statement -> answer"]
    legs_table("Postgres", L("trace-node.json")["write_latency"], legs, "other_postgres_segments")
if os.path.exists(os.path.join(run, "trace-s3-node.json.legs")):
    legs = L("trace-s3-node.json.legs")
    for k, v in L("trace-s3-floor.json").items():
        legs[f"floor (boto3): {k}"] = v
    legs_table("S3", L("trace-s3-node.json")["write_latency"], legs, "other_s3_segments")
if not os.path.exists(os.path.join(run, "s3-1k.count")):
    sys.exit(0)
idle = int(open(os.path.join(run, "s3-idle.count")).read())
busy = int(open(os.path.join(run, "s3-1k.count")).read())
rate = L("s3-1k.json")["write"]["records_per_sec"]
print()
print(f"S3 requests/s with data and WAL on S3: idle {idle / 20:.2f}; at {rate:.0f} appends/s {busy / secs:.1f}")
EOF
