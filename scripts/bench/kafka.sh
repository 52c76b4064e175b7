#!/usr/bin/env bash
# Kafka produce figures, one run (issue 39): 1 KiB records, acks=all, on ONE moto S3 server.
#   - librdkafka (confluent-kafka, scripts/bench/kafka_produce.py) against PicoMQ and against
#     Tansu 0.6, same settings for both: MiB/s and ack p99 (goal: PicoMQ >= 2x Tansu);
#   - pico bench against the same PicoMQ node over Kafka and over its own batched HTTP ingest,
#     same shape (connections x records per request): the frontend's cost (goal: Kafka >= 0.8x).
#   - pico bench --protocol kafka against Tansu too (context: the same load generator on both).
# PicoMQ keeps its data and WAL on the S3 server (metadata in SQLite); Tansu its storage
# engine (s3://tansu/). The S3 server is wiped between the two brokers.
#
# usage: scripts/bench/kafka.sh
# env: PICO_BIN (default: builds target/release/pico), TANSU_BIN (default: cargo install
#      tansu@0.6.0 --features dynostore into $PICO_TOOLS_DIR/tansu, ~11 min once),
#      BENCH_DURATION (10s), BENCH_WARMUP (2s), BENCH_WORK (default target/bench),
#      KAFKA_CONNECTIONS (8), KAFKA_BATCH (64 records per request), KAFKA_LINGER_MS (5),
#      KAFKA_IN_FLIGHT (5, librdkafka's window per connection), KAFKA_PRODUCERS (2 librdkafka
#      processes), BENCH_PORT_BASE (take ports from there upwards; default any free port).
# Prints a Markdown table and writes it, with the raw JSON, under $BENCH_WORK/kafka-*/.
# Not part of CI (too slow); needs cargo, python3 (venv) and curl.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${BENCH_WORK:-$ROOT/target/bench}
TOOLS=${PICO_TOOLS_DIR:-$HOME/.cache/pico-tools}
DUR=${BENCH_DURATION:-10s}
WARM=${BENCH_WARMUP:-2s}
CONNS=${KAFKA_CONNECTIONS:-8}
BATCH=${KAFKA_BATCH:-64}
LINGER=${KAFKA_LINGER_MS:-5}
INFL=${KAFKA_IN_FLIGHT:-5}
PRODUCERS=${KAFKA_PRODUCERS:-2}
RUN=$WORK/kafka-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
log() { printf '[kafka %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
secs() { python3 -c 'import sys;v=sys.argv[1]
print(float(v[:-2])/1000 if v.endswith("ms") else float(v.rstrip("s")))' "$1"; }

# --- tools ----------------------------------------------------------------------------------
if [ -z "${PICO_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p pico-cli --bin pico >&2)
  PICO_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/pico
fi
if [ -z "${TANSU_BIN:-}" ]; then
  TANSU_BIN=$TOOLS/tansu/bin/tansu
  # Also where TEST-PEERS.md's install puts it.
  [ -x "$TANSU_BIN" ] || [ ! -x "$HOME/.cache/tansu/bin/tansu" ] || TANSU_BIN=$HOME/.cache/tansu/bin/tansu
  if [ ! -x "$TANSU_BIN" ]; then
    log "installing tansu 0.6.0 into $TOOLS/tansu (a long build, once per machine; resumable)"
    CARGO_TARGET_DIR=$TOOLS/tansu-target \
      cargo install tansu@0.6.0 --locked --features dynostore --root "$TOOLS/tansu" >&2
  fi
fi
MOTO_VENV=$TOOLS/moto
if [ ! -x "$MOTO_VENV/bin/moto_server" ]; then
  log "installing moto server into $MOTO_VENV"
  python3 -m venv "$MOTO_VENV"
  "$MOTO_VENV/bin/pip" install -q 'moto[s3]>=5.2.5' flask flask-cors
fi
KVENV=$TOOLS/kafka-venv
if [ ! -x "$KVENV/bin/python" ] || ! "$KVENV/bin/python" -c 'import confluent_kafka' 2>/dev/null; then
  log "installing confluent-kafka into $KVENV"
  python3 -m venv "$KVENV"
  "$KVENV/bin/pip" install -q --disable-pip-version-check 'confluent-kafka>=2.6'
fi
KPY=$KVENV/bin/python

PIDS=()
stop_pid() {
  kill -0 "$1" 2>/dev/null || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() { for p in "${PIDS[@]}"; do stop_pid "$p"; done; }
trap cleanup EXIT
# BENCH_PORT_BASE: ports from there upwards (a shared machine's range), else any free one.
free_port() {
  python3 - "${BENCH_PORT_BASE:-0}" "$RUN/ports" <<'PY'
import os, socket, sys
base, taken = int(sys.argv[1]), sys.argv[2]
used = set(open(taken).read().split()) if os.path.exists(taken) else set()
p = base
while True:
    if base == 0 or str(p) not in used:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            p = s.getsockname()[1]
            break
        except OSError:
            pass
        finally:
            s.close()
    p += 1
open(taken, "a").write(f"{p}\n")
print(p)
PY
}
wait_http() { for _ in $(seq 1 200); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }
wait_tcp() { for _ in $(seq 1 600); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# --- the S3 server --------------------------------------------------------------------------
S3_PORT=$(free_port)
"$MOTO_VENV/bin/moto_server" -H 127.0.0.1 -p "$S3_PORT" >"$RUN/moto.log" 2>&1 &
PIDS+=($!)
S3=http://127.0.0.1:$S3_PORT
wait_http "$S3/moto-api/" || { log "moto did not start"; cat "$RUN/moto.log" >&2; exit 1; }
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
mkbucket() { "$MOTO_VENV/bin/python" -c 'import boto3,sys;boto3.client("s3",endpoint_url=sys.argv[1]).create_bucket(Bucket=sys.argv[2])' "$S3" "$1"; }
s3uri() { echo "$1@s3://$2?region=us-east-1&endpoint=$S3&pathStyle=true"; }

# One librdkafka run: tag bootstrap topic.
rdkafka() {
  "$KPY" "$ROOT/scripts/bench/kafka_produce.py" create "$2" "$3"
  timeout 300 "$KPY" "$ROOT/scripts/bench/kafka_produce.py" run "$2" "$3" \
    --producers "$PRODUCERS" --batch "$BATCH" --linger-ms "$LINGER" --in-flight "$INFL" \
    --record-size 1024 --duration "$(secs "$DUR")" --warmup "$(secs "$WARM")" >"$RUN/$1.json"
}
# One pico bench run: tag endpoint protocol prefix.
pbench() {
  timeout 300 "$PICO_BIN" bench --protocol "$3" --endpoint "$2" --prefix "$4" -d "$DUR" \
    --warmup "$WARM" --output json --connections "$CONNS" -n "$BATCH" -b 1KiB >"$RUN/$1.json"
}

# --- PicoMQ: data and WAL on S3 -------------------------------------------------------------
mkbucket pico-data
mkbucket pico-wal
PORT=$(free_port) ADMIN=$(free_port) KPORT=$(free_port)
mkdir -p "$RUN/pico"
(cd "$RUN/pico" && exec "$PICO_BIN" serve --meta-url "sqlite:$RUN/pico/meta.db" \
  --storage="$(s3uri -2 pico-data)" --wal="$(s3uri -3 pico-wal)" \
  --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" \
  --kafka-listen "127.0.0.1:$KPORT") >"$RUN/pico/pico.log" 2>&1 &
NODE=$!
PIDS+=($NODE)
wait_http "http://127.0.0.1:$ADMIN/ready" || { log "pico not ready"; cat "$RUN/pico/pico.log" >&2; exit 1; }
log "PicoMQ: pico bench, batched HTTP ingest ($CONNS connections x $BATCH x 1 KiB)"
pbench pico-http "http://127.0.0.1:$PORT" pico bench/http
log "PicoMQ: pico bench --protocol kafka, same shape"
pbench pico-kafka "127.0.0.1:$KPORT" kafka bench-kafka
log "PicoMQ: librdkafka ($PRODUCERS producers, batch $BATCH, linger ${LINGER} ms, acks=all)"
rdkafka pico-rdkafka "127.0.0.1:$KPORT" rdk
curl -s "http://127.0.0.1:$ADMIN/metrics" >"$RUN/pico/metrics.txt" || true
stop_pid "$NODE"

# --- Tansu on the same S3 server, wiped first -------------------------------------------------
curl -fsS -X POST "$S3/moto-api/reset" >/dev/null
mkbucket tansu
TPORT=$(free_port)
mkdir -p "$RUN/tansu"
AWS_ENDPOINT=$S3 AWS_ALLOW_HTTP=true AWS_DEFAULT_REGION=us-east-1 \
  "$TANSU_BIN" broker --listener-url "tcp://127.0.0.1:$TPORT" \
  --advertised-listener-url "tcp://127.0.0.1:$TPORT" --storage-engine s3://tansu/ \
  >"$RUN/tansu/tansu.log" 2>&1 &
TANSU=$!
PIDS+=($TANSU)
wait_tcp "$TPORT" || { log "tansu not listening"; cat "$RUN/tansu/tansu.log" >&2; exit 1; }
log "Tansu: librdkafka, same settings"
rdkafka tansu-rdkafka "127.0.0.1:$TPORT" rdk
log "Tansu: pico bench --protocol kafka (context)"
pbench tansu-kafka "127.0.0.1:$TPORT" kafka bench-kafka || log "pico bench against Tansu failed (row n/a)"
stop_pid "$TANSU"

# --- the table ------------------------------------------------------------------------------
python3 - "$RUN" "$CONNS" "$BATCH" "$LINGER" "$INFL" "$PRODUCERS" <<'EOF' | tee "$RUN/table.md"
import json, os, sys
run, conns, batch, linger, infl, producers = sys.argv[1:]
def load(n):
    try:
        return json.load(open(os.path.join(run, n + ".json")))
    except Exception:
        return None
def fig(r):
    if not r:
        return "n/a", None, None
    w, l = r["write"], r.get("write_latency") or {}
    note = f", {w['errors']} errors" if w.get("errors") else ""
    p99 = l.get("p99_ms")
    return (f"{w['mib_per_sec']:.1f} MiB/s, {w['records_per_sec']:.0f} rec/s, p99 "
            + (f"{p99:.1f} ms" if p99 is not None else "n/a") + note), w["mib_per_sec"], p99
def ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "n/a"
pr, tr = fig(load("pico-rdkafka")), fig(load("tansu-rdkafka"))
pk, ph, tk = fig(load("pico-kafka")), fig(load("pico-http")), fig(load("tansu-kafka"))
tool = (load("pico-rdkafka") or load("tansu-rdkafka") or {}).get("tool", "librdkafka")
print(f"| load | PicoMQ | against | ratio | goal |")
print(f"|---|---|---|---|---|")
g1 = "met" if pr[1] and tr[1] and pr[1] >= 2 * tr[1] else "not met"
print(f"| {tool}, {producers} producers, batch {batch}, linger {linger} ms, {infl} in flight | {pr[0]} | Tansu 0.6: {tr[0]} | {ratio(pr[1], tr[1])} | ≥ 2× Tansu: **{g1}** |")
g2 = "met" if pk[1] and ph[1] and pk[1] >= 0.8 * ph[1] else "not met"
print(f"| pico bench, {conns} connections × {batch} × 1 KiB, Kafka vs HTTP | Kafka: {pk[0]} | HTTP ingest: {ph[0]} | {ratio(pk[1], ph[1])} | ≥ 0.8× HTTP: **{g2}** |")
print(f"| pico bench --protocol kafka, same shape | {pk[0]} | Tansu 0.6: {tk[0]} | {ratio(pk[1], tk[1])} | (context) |")
print(f"| librdkafka vs pico bench, PicoMQ over Kafka | {pr[0]} | pico bench: {pk[0]} | {ratio(pr[1], pk[1])} | (context) |")
EOF
