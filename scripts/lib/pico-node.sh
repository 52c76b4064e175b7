# Sourced by the scripts that test the real `pico` binary (ds-conformance.sh, ds-client-e2e.sh):
# starts one node on file storage in a temp dir, on free loopback ports, and stops it by pid
# (and removes the dir) when the sourcing script exits.
#
#   start_pico TAG [extra serve flags...]
# needs PICO_BIN; sets PORT, ADMIN_PORT, DATA, LOG, SERVER_PID; fails, printing the log, if
# the node exits or is not ready within 10 s. TAG prefixes messages and the temp dir.
# With KAFKA_PORT set the node also serves Kafka there (else --no-kafka); with KEEP_DATA=1 an
# existing DATA dir is reused (a restart on the same storage).

free_port() {
  node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

SERVER_PID=
DATA=

stop_pico() {
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [[ -n $DATA ]]; then rm -rf "$DATA"; fi
}
trap stop_pico EXIT

start_pico() {
  local tag=$1
  shift
  PORT=$(free_port)
  ADMIN_PORT=$(free_port)
  if [[ ${KEEP_DATA:-0} != 1 || -z $DATA ]]; then
    DATA=$(mktemp -d "${TMPDIR:-/tmp}/pico-$tag.XXXXXX")
  fi
  LOG=$DATA/pico.log
  local kafka=(--no-kafka)
  if [[ -n ${KAFKA_PORT:-} ]]; then kafka=(--kafka-listen "127.0.0.1:$KAFKA_PORT"); fi
  "$PICO_BIN" serve \
    --meta-url "sqlite:$DATA/meta.db" \
    --storage="-2@file://$DATA/objects" \
    --listen "127.0.0.1:$PORT" \
    --admin-listen "127.0.0.1:$ADMIN_PORT" \
    "${kafka[@]}" \
    "$@" \
    >"$LOG" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$ADMIN_PORT/ready" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "$tag: pico exited during startup:" >&2
      cat "$LOG" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "$tag: pico not ready after 10 s; log:" >&2
  cat "$LOG" >&2
  exit 1
}
