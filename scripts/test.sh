#!/usr/bin/env bash
# Runs every test: the workspace's unit, integration and end-to-end tests (the e2e tests start
# the real `pico` binary), then the Durable Streams conformance suite (npm) against the real
# binary with subscriptions on. Needs cargo, node and npm; nothing beyond the package registries.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
cargo build -p pico-cli
SUBSCRIPTIONS=1 bash scripts/ds-conformance.sh
