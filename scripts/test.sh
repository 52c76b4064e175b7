#!/usr/bin/env bash
# Runs every test of the workspace. Needs nothing beyond the crate registry.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
