# Sourced by scripts/test.sh: an S3-compatible server (moto, in memory) for the tests that need
# one. Installs moto >= 5.2.5 into a venv outside the clone once per machine, starts it on a
# free loopback port, waits until it answers, and stops it by pid when the sourcing script exits.
#
#   start_moto
# sets MOTO_PID and exports PICO_TEST_S3_ENDPOINT, plus test credentials and region for the SDK.
# 5.2.5 at least: 5.2.1 answers a multipart complete with XML that aws-sdk-s3 rejects.

MOTO_VENV="${PICO_TOOLS_DIR:-$HOME/.cache/pico-tools}/moto"
MOTO_PID=

moto_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

install_moto() {
  if [[ -x $MOTO_VENV/bin/moto_server ]] &&
    "$MOTO_VENV/bin/python" -c 'import sys
from importlib.metadata import version
v = tuple(int(x) for x in version("moto").split(".")[:3] if x.isdigit())
sys.exit(0 if v >= (5, 2, 5) else 1)' 2>/dev/null; then
    return 0
  fi
  echo "moto: installing into $MOTO_VENV" >&2
  python3 -m venv "$MOTO_VENV"
  "$MOTO_VENV/bin/pip" install -q 'moto[s3]>=5.2.5' flask flask-cors
}

stop_moto() {
  if [[ -n $MOTO_PID ]] && kill -0 "$MOTO_PID" 2>/dev/null; then
    kill "$MOTO_PID" 2>/dev/null || true
    wait "$MOTO_PID" 2>/dev/null || true
  fi
  MOTO_PID=
}

start_moto() {
  install_moto
  local port log
  port=$(moto_free_port)
  log=$(mktemp "${TMPDIR:-/tmp}/moto.XXXXXX.log")
  "$MOTO_VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$log" 2>&1 &
  MOTO_PID=$!
  trap stop_moto EXIT
  for _ in $(seq 1 300); do
    if curl -fsS -o /dev/null "http://127.0.0.1:$port/moto-api/" 2>/dev/null ||
      curl -sS -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null; then
      export PICO_TEST_S3_ENDPOINT="http://127.0.0.1:$port"
      export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-testing}"
      export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-testing}"
      export AWS_REGION="${AWS_REGION:-us-east-1}"
      echo "moto: S3 server on $PICO_TEST_S3_ENDPOINT (pid $MOTO_PID)" >&2
      return 0
    fi
    if ! kill -0 "$MOTO_PID" 2>/dev/null; then
      echo "moto: server exited during startup:" >&2
      cat "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "moto: server not answering after 30 s; log:" >&2
  cat "$log" >&2
  return 1
}
