# Sourced by the Kafka end-to-end script: installs the Kafka client peers once per machine.
#   kcat (Debian; librdkafka 2.0.2, an old client) and a venv under $PICO_TOOLS_DIR
#   (default ~/.cache/pico-tools)/kafka-venv with confluent-kafka, kafka-python and aiokafka;
#   kafkajs 2 (npm) under $PICO_TOOLS_DIR/kafkajs.
# Sets KAFKA_PY (the venv's python), KCAT and KAFKAJS_DIR.

install_kafka_peers() {
  local tools=${PICO_TOOLS_DIR:-$HOME/.cache/pico-tools}
  local venv=$tools/kafka-venv
  if ! command -v kcat >/dev/null 2>&1; then
    echo "kafka-peers: installing kcat" >&2
    if ! { apt-get install -y -q kcat >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q kcat >/dev/null; }; }; then
      echo "kafka-peers: kcat could not be installed" >&2
      return 1
    fi
  fi
  KCAT=$(command -v kcat)
  if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import confluent_kafka, kafka, aiokafka' 2>/dev/null; then
    echo "kafka-peers: installing the Python Kafka clients into $venv" >&2
    mkdir -p "$tools"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
      'confluent-kafka>=2.6' 'kafka-python>=2.0' 'aiokafka>=0.11' >&2
  fi
  KAFKA_PY=$venv/bin/python
  KAFKAJS_DIR=$tools/kafkajs
  if [[ ! -f $KAFKAJS_DIR/node_modules/kafkajs/package.json ]]; then
    echo "kafka-peers: installing kafkajs into $KAFKAJS_DIR" >&2
    mkdir -p "$KAFKAJS_DIR"
    [[ -f $KAFKAJS_DIR/package.json ]] || echo '{"name":"pico-kafkajs-peer","private":true}' >"$KAFKAJS_DIR/package.json"
    (cd "$KAFKAJS_DIR" && npm install -q --no-audit --no-fund kafkajs@2 >&2)
  fi
}
