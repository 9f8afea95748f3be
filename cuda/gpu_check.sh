#!/usr/bin/env bash
# cuda/gpu_check.sh — everything the CUDA backends need checked on a machine with a GPU, in one go:
#   1. build (Release, sm_90a unless CUDA_ARCH says otherwise);
#   2. the CUDA test suite (tests/test_cuda.cpp) against the float64 reference;
#   3. compute-sanitizer memcheck, racecheck and synccheck over the suite's [sanitize] shapes;
#   4. cuda/compare_torch.py: our backends vs PyTorch SDPA (EFFICIENT_ATTENTION, MATH) in fp32,
#      N and block-size sweeps, ncu HBM bytes of cuda-standard vs cuda-fa2.
# A short summary is printed last; full logs and CSVs go to $OUT (default build/gpu_check).
#
# Usage: cuda/gpu_check.sh [DEPS_PREFIX]
#   DEPS_PREFIX (or $FLASHATTN_DEPS): a prefix with Eigen/Catch2/CLI11/nlohmann-json CMake
#   packages, passed as CMAKE_PREFIX_PATH. Environment: OUT, BUILD_DIR (default build/gpu),
#   CUDA_ARCH (default 90a), SKIP_BUILD=1 (use an existing build), QUICK=1 (bar shapes only),
#   FA2_VARIANTS=a,b (also time these cuda-fa2 configurations at the bar shapes),
#   COMPARE_ARGS="..." (more compare_torch.py options, e.g. shorter sweeps),
#   STEP_TIMEOUT=seconds (limit for each test/sanitizer step; default none),
#   SANITIZERS="memcheck racecheck" (default: memcheck racecheck synccheck).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/build/gpu_check}
BUILD_DIR=${BUILD_DIR:-build/gpu}
DEPS=${1:-${FLASHATTN_DEPS:-}}
mkdir -p "$OUT"
declare -a SUMMARY

step() {  # step NAME LOGFILE COMMAND...: run, log, remember PASS/FAIL
    local name=$1 logfile=$2
    shift 2
    local start=$SECONDS
    echo "== $name"
    if "$@" >"$OUT/$logfile" 2>&1; then
        SUMMARY+=("PASS  $name ($((SECONDS - start)) s, $logfile)")
    else
        SUMMARY+=("FAIL  $name ($((SECONDS - start)) s, $logfile)")
        tail -40 "$OUT/$logfile"
    fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv

if [ -z "${SKIP_BUILD:-}" ]; then
    step "build" build.log bash -c "cmake -S . -B '$BUILD_DIR' -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90a} ${DEPS:+-DCMAKE_PREFIX_PATH=$DEPS} && \
        cmake --build '$BUILD_DIR' -j$(nproc)"
fi
BIN=$BUILD_DIR/bin

LIMIT=${STEP_TIMEOUT:+timeout $STEP_TIMEOUT}
step "CUDA tests (test_cuda, all)" test_cuda.log $LIMIT "$BIN/test_cuda" --durations yes
for tool in ${SANITIZERS:-memcheck racecheck synccheck}; do
    step "compute-sanitizer $tool [sanitize]" "sanitizer_$tool.log" \
        $LIMIT compute-sanitizer --tool "$tool" --error-exitcode 1 "$BIN/test_cuda" "[sanitize]"
done
step "compare with PyTorch" compare_torch.log \
    python3 cuda/compare_torch.py --bin-dir "$BIN" --out "$OUT" ${QUICK:+--quick} \
    ${FA2_VARIANTS:+--variants "$FA2_VARIANTS"} ${COMPARE_ARGS:-}

echo
cat "$OUT/compare_torch.txt" 2>/dev/null
echo
printf '%s\n' "${SUMMARY[@]}"
! printf '%s\n' "${SUMMARY[@]}" | grep -q '^FAIL'
