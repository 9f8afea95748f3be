#!/usr/bin/env bash
# cuda/tools/same_bits_check.sh — does a change that should not change results keep them? For a
# restructuring of the CUDA code (moves, a kernel written once over a policy): builds the working
# tree and a baseline source tree side by side on a GPU machine, then
#   1. the working tree's whole ctest suite;
#   2. `flashattn run` of both builds on the same random inputs, forward and backward, every CUDA
#      backend, odd shapes (causal, GQA, a block mask, negative scale): outputs compared byte for
#      byte (the deterministic backends must agree exactly; cuda-tc's backward adds dQ with atomics,
#      so it runs with FLASHATTN_DETERMINISTIC=1);
#   3. both builds' `flashattn bench`, alternated, on FlashAttention's grid: speed within noise.
# A short table is printed last; logs go to $OUT.
#
# Usage: cuda/tools/same_bits_check.sh BASE_SOURCE_DIR DEPS_PREFIX
#   BASE_SOURCE_DIR: the baseline's sources (e.g. `git archive <commit> | tar -x -C .carry/base`);
#   DEPS_PREFIX: Debian's header packages (cuda/tools/pack_deps.sh). Environment: OUT,
#   PHASES (default "build tests bits speed"), REPEAT (default 20).
set -uo pipefail
cd "$(dirname "$0")/../.."
BASE_SRC=$(realpath "${1:?usage: same_bits_check.sh BASE_SOURCE_DIR DEPS_PREFIX}")
export DEPS=$(realpath "${2:?usage: same_bits_check.sh BASE_SOURCE_DIR DEPS_PREFIX}")
OUT=${OUT:-$PWD/build/same_bits}
PHASES=${PHASES:-build tests bits speed}
REPEAT=${REPEAT:-20}
has() { [[ " $PHASES " == *" $1 "* ]]; }
mkdir -p "$OUT"
source cuda/tools/steps.sh  # step NAME LOGFILE COMMAND...
NEW=build/same_bits_new
BASE=build/same_bits_base
# The working tree's Python package is built too where python3 has pybind11 (the GPU image does),
# so that ctest runs its pytest suite on CUDA tensors; the baseline's never.
export PY=$(command -v python3 || true)
export PYBIND=$([ -n "$PY" ] && "$PY" -m pybind11 --cmakedir 2>/dev/null || true)
configure() {  # SOURCE BUILD [python]
    local python="-DFLASHATTN_PYTHON=OFF"
    [ "${3:-}" = python ] && [ -n "$PYBIND" ] &&
        python="-DPython3_EXECUTABLE=$PY -Dpybind11_DIR=$PYBIND"
    cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
        -DFLASHATTN_NVCC_SPLIT_COMPILE=0 $python -DCMAKE_PREFIX_PATH="$DEPS" \
        -DCatch2_DIR="$DEPS/lib/cmake/Catch2"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
if has build; then
    # The baseline needs only the command-line program; both builds share the cores.
    step "build baseline (flashattn)" build_base.log bash -c \
        "$(declare -f configure); configure '$BASE_SRC' '$BASE' && cmake --build '$BASE' -j8 --target flashattn" &
    step "build working tree" build_new.log bash -c \
        "$(declare -f configure); configure . '$NEW' python && cmake --build '$NEW' -j16"
    wait
    [ -x "$BASE/bin/flashattn" ] && SUMMARY+=("PASS  baseline binary present") ||
        SUMMARY+=("FAIL  baseline binary missing (build_base.log)")
fi
if has tests; then
    step "ctest (every suite)" ctest.log timeout 300 ctest --test-dir "$NEW" -j8 --output-on-failure
fi
if has bits; then
    step "same bits: forward and backward, every CUDA backend" bits.log timeout 240 \
        python3 cuda/tools/same_bits.py --new "$NEW/bin/flashattn" --base "$BASE/bin/flashattn" \
        --work "$OUT/bits" --variants cuda-fa2=ffma --variants cuda-fa3=d64-Bc128-pingpong \
        --variants cuda-fa3=d128-Bc128
fi
if has speed; then
    # Both builds, alternated three times, FlashAttention's grid (16k tokens, hidden 2048), fp16.
    echo "# build backend d causal N TFLOP/s (median of $REPEAT)" >"$OUT/speed.txt"
    for round in 1 2 3; do
        for d in 64 128; do
            for causal in "" "--causal"; do
                for n in 1024 4096; do
                    for build in base new; do
                        dir=$BASE; [ $build = new ] && dir=$NEW
                        "$dir/bin/flashattn" bench --backends cuda-tc,cuda-fa3 --dtype f16 \
                            --batch $((16384 / n)) --heads $((2048 / d)) --seq $n --dim $d \
                            --repeat "$REPEAT" $causal --json 2>>"$OUT/speed.err" |
                            python3 -c "
import json, sys
for j in map(json.loads, filter(lambda l: l.startswith('{'), sys.stdin)):
    print('$build', j['backend'], $d, '${causal:+causal}' or 'full', $n, '%.1f' % (j['gflops'] / 1e3))
" >>"$OUT/speed.txt"
                    done
                done
            done
        done
    done
    python3 - "$OUT/speed.txt" >"$OUT/speed_table.txt" <<'EOF'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith('#'): continue
    build, backend, d, causal, n, tflops = line.split()
    rows[(backend, d, causal, n, build)].append(float(tflops))
print('backend   d    mask    N     base TFLOP/s (min-max)   new TFLOP/s (min-max)   new/base')
for key in sorted({k[:4] for k in rows}):
    b, n = rows[key + ('base',)], rows[key + ('new',)]
    if not b or not n: continue
    print('%-9s %-4s %-7s %-5s %7.1f (%5.1f-%5.1f)      %7.1f (%5.1f-%5.1f)     %.3f' % (
        *key, statistics.median(b), min(b), max(b), statistics.median(n), min(n), max(n),
        statistics.median(n) / statistics.median(b)))
EOF
    SUMMARY+=("DONE  speed, both builds alternated (speed_table.txt)")
fi
echo
[ -f "$OUT/speed_table.txt" ] && cat "$OUT/speed_table.txt"
[ -f "$OUT/bits.log" ] && tail -n 25 "$OUT/bits.log"
printf '%s\n' "${SUMMARY[@]}"
