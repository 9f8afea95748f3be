#!/usr/bin/env bash
# cuda/tools/fa2_margins.sh — how close each backend runs to the tests' 2x rule, over several seeds.
#
# Runs the CUDA suite and the registry-wide variant and edge-case suites once per seed with
# FLASHATTN_TEST_MARGINS=1 (tests/helpers.hpp prints error / bound for every check; 1.0 is at
# the bound, above 1 fails), and prints, per backend and range of head dims (cuda-fa2 runs its
# tensor-core kernel for 16 <= d <= 128 only), the worst O and LSE margins over all seeds and the
# problem where the worst O occurred. Extra environment (FLASHATTN_VARIANT=cuda-fa2=ffma, ...) is
# passed through, so the same script compares cuda-fa2's kernels.
#
# Usage: cuda/tools/fa2_margins.sh BUILD_DIR [SEEDS...]      (default seeds: 1 2 3)
# Example: FLASHATTN_VARIANT=cuda-fa2=ffma cuda/tools/fa2_margins.sh build/gpu 1 2 3 4
set -uo pipefail
BIN=${1:?usage: cuda/tools/fa2_margins.sh BUILD_DIR [SEEDS...]}/bin
shift
SEEDS=${*:-1 2 3}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
status=0
for seed in $SEEDS; do
    for suite in test_cuda test_variants test_edge_cases; do
        FLASHATTN_TEST_MARGINS=1 "$BIN/$suite" --rng-seed "$seed" >/dev/null 2>>"$LOG" ||
            { echo "$suite failed with seed $seed"; status=1; }
    done
done
python3 "$(dirname "$0")/margins_table.py" "$LOG"
exit $status
