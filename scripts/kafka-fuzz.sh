#!/usr/bin/env bash
# Coverage-guided fuzzing of the Kafka request path for a bounded time (issue 39): libFuzzer
# through cargo-fuzz, target `request` in crates/pico-kafka/fuzz (its own workspace), which
# feeds each input as one request frame through pico-kafka's version check, structural pass
# (validate.rs), the kafka-protocol decoder and the handlers, against an in-memory node.
# Fails on a crash: a panic, an abort (e.g. an allocation the request cannot back) or more
# than FUZZ_RSS_MB of memory; the input is kept under $WORK/artifacts and printed.
#
# cargo-fuzz is installed once per machine under $PICO_TOOLS_DIR (~/.cache/pico-tools).
# AddressSanitizer needs `-Zsanitizer`: RUSTC_BOOTSTRAP=1 lets this stable toolchain accept it
# for this build only. The corpus is kept between runs under the target dir, so coverage grows
# across CI runs on one machine; the checked-in seeds (one valid request per API and version)
# start it.
#
# env: FUZZ_SECONDS (90), FUZZ_RSS_MB (4096), CARGO_TARGET_DIR (the fuzz build goes to
#      $CARGO_TARGET_DIR/kafka-fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS=${PICO_TOOLS_DIR:-$HOME/.cache/pico-tools}
SECONDS_BUDGET=${FUZZ_SECONDS:-90}
RSS_MB=${FUZZ_RSS_MB:-4096}
FUZZ_DIR=crates/pico-kafka/fuzz
WORK=${CARGO_TARGET_DIR:-$ROOT/target}/kafka-fuzz
mkdir -p "$WORK/corpus" "$WORK/artifacts"

if [[ ! -x $TOOLS/bin/cargo-fuzz ]]; then
  echo "kafka-fuzz: installing cargo-fuzz into $TOOLS" >&2
  cargo install --quiet --locked --root "$TOOLS" cargo-fuzz --version 0.13.2
fi
FLAGS=(--fuzz-dir "$FUZZ_DIR" --target-dir "$WORK/build" -O --codegen-units 16)
export RUSTC_BOOTSTRAP=1
"$TOOLS/bin/cargo-fuzz" build request "${FLAGS[@]}"

echo "kafka-fuzz: fuzzing the Kafka request path for ${SECONDS_BUDGET}s" >&2
status=0
"$TOOLS/bin/cargo-fuzz" run request "${FLAGS[@]}" "$WORK/corpus" "$FUZZ_DIR/seeds" -- \
  -max_total_time="$SECONDS_BUDGET" -rss_limit_mb="$RSS_MB" -timeout=30 \
  -artifact_prefix="$WORK/artifacts/" -print_final_stats=1 >"$WORK/fuzz.log" 2>&1 || status=$?
grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$WORK/fuzz.log" >&2 || true
if [[ $status -ne 0 ]]; then
  echo "kafka-fuzz: FAILED (exit $status); the end of the log:" >&2
  tail -n 60 "$WORK/fuzz.log" >&2
  echo "kafka-fuzz: crashing inputs: $(ls "$WORK/artifacts" 2>/dev/null | tr '\n' ' ')" >&2
  echo "kafka-fuzz: reproduce with: RUSTC_BOOTSTRAP=1 cargo fuzz run request ${FLAGS[*]} $WORK/artifacts/<file>" >&2
  exit 1
fi
echo "kafka-fuzz: ok, no crash in ${SECONDS_BUDGET}s" >&2
