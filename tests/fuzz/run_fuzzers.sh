#!/usr/bin/env bash
# tests/fuzz/run_fuzzers.sh — builds the libFuzzer harnesses (CMake preset "fuzz": clang, ASan +
# UBSan) and runs each one for a bounded time, starting from the seed inputs in corpus/.
#
#   tests/fuzz/run_fuzzers.sh [SECONDS]        # default 60 seconds per harness
#
# New inputs the fuzzer finds go to a temporary directory, not into corpus/ (keep that small and
# reviewed). A finding stops the run with libFuzzer's report and a crash-* file in build/fuzz/;
# replay it with: build/fuzz/bin/fuzz_<harness> build/fuzz/crash-...
# Needs clang, libclang-rt-14-dev and libomp-dev (sh cmake/install-deps.sh --dev).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"

cmake --preset fuzz
cmake --build --preset fuzz

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for harness in npy backends paths; do
  echo "== fuzz_${harness}: ${seconds} s"
  mkdir -p "$work/$harness"
  # -timeout: one input taking 30 s is a finding (a hang); -rss_limit_mb: so is using 2 GiB.
  (cd build/fuzz && "bin/fuzz_${harness}" "$work/$harness" "../../tests/fuzz/corpus/${harness}" \
      -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
      2> "$work/${harness}.log") || { cat "$work/${harness}.log"; exit 1; }
  grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" "$work/${harness}.log" || true
done
echo "fuzzers: no findings"
