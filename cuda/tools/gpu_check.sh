#!/usr/bin/env bash
# cuda/tools/gpu_check.sh — everything the CUDA backends need checked on a machine with a GPU, in one go:
#   1. build (Release, sm_90a unless CUDA_ARCH says otherwise);
#   2. the CUDA test suite (tests/test_cuda.cpp) against the float64 reference;
#   3. compute-sanitizer memcheck, racecheck and synccheck over the suite's [sanitize] shapes;
#   4. cuda/tools/compare_torch.py: our backends vs PyTorch SDPA (EFFICIENT_ATTENTION, MATH) in fp32,
#      N and block-size sweeps, ncu HBM bytes of cuda-standard vs cuda-fa2;
#   5. cuda-tc: its suite, compute-sanitizer on small cases, cuda/tools/compare_tc.py (vs PyTorch's
#      FLASH_ATTENTION and cuDNN on FlashAttention's benchmark grid);
#   5b. the backward: compute-sanitizer over test_backward's "two runs" case (every fp32 backward of
#      the build) and over cuda-tc's backward (a NaN case, the deterministic mode);
#      cuda/tools/compare_backward.py in fp32 (cuda-fa2 / cuda-standard vs PyTorch EFFICIENT / MATH)
#      and fp16 (cuda-tc vs PyTorch FLASH / cuDNN);
#   6. the host CPU: omp vs PyTorch's CPU attention (docs/scripts/omp_vs_torch_cpu.sh), and
#      `flashattn bench` rows showing causal and block-sparse time falling with the work kept.
# PHASES selects steps (default "build tests sanitize compare"), e.g. PHASES="compare" with
# SKIP_BUILD=1 re-times an existing build.
# A short summary is printed last; full logs and CSVs go to $OUT (default build/gpu_check).
#
# Usage: cuda/tools/gpu_check.sh [DEPS_PREFIX]
#   DEPS_PREFIX (or $FLASHATTN_DEPS): a prefix with Eigen/Catch2/CLI11/nlohmann-json CMake
#   packages, passed as CMAKE_PREFIX_PATH. Environment: OUT, BUILD_DIR (default build/gpu),
#   CUDA_ARCH (default 90a), SKIP_BUILD=1 (use an existing build), QUICK=1 (bar shapes only),
#   FA2_VARIANTS=a,b (also time these cuda-fa2 configurations at the bar shapes),
#   COMPARE_ARGS="..." (more cuda/tools/compare_torch.py options, e.g. shorter sweeps),
#   STEP_TIMEOUT=seconds (limit for each test/sanitizer step; default none),
#   SANITIZERS="memcheck racecheck" (default: memcheck racecheck synccheck).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build/gpu_check}
BUILD_DIR=${BUILD_DIR:-build/gpu}
DEPS=${1:-${FLASHATTN_DEPS:-}}
mkdir -p "$OUT"
source cuda/tools/steps.sh  # step NAME LOGFILE COMMAND...

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv

# The Python package is built for the python3 on PATH (where torch is, on a GPU machine), with
# its pip-installed pybind11 when there is one.
PY=$(command -v python3 || true)
PYBIND=$([ -n "$PY" ] && "$PY" -m pybind11 --cmakedir 2>/dev/null || true)
if [ -z "${SKIP_BUILD:-}" ] && [[ " ${PHASES:-build} " == *" build "* ]]; then
    step "build" build.log bash -c "cmake -S . -B '$BUILD_DIR' -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90a} -DFLASHATTN_NVCC_SPLIT_COMPILE=0 \
        ${DEPS:+-DCMAKE_PREFIX_PATH=$DEPS} ${PY:+-DPython3_EXECUTABLE=$PY} \
        ${PYBIND:+-Dpybind11_DIR=$PYBIND} && \
        cmake --build '$BUILD_DIR' -j$(nproc)"
fi
BIN=$BUILD_DIR/bin

PHASES=${PHASES:-build tests sanitize compare}
has() { [[ " $PHASES " == *" $1 "* ]]; }
LIMIT=${STEP_TIMEOUT:+timeout $STEP_TIMEOUT}
if has tests; then
    # Every suite: CPU, the registry-wide variant/edge-case suites (which now include the CUDA
    # backends), test_cuda and test_cuda_tc.
    step "ctest (every suite, CUDA included)" ctest.log \
        $LIMIT ctest --test-dir "$BUILD_DIR" -j8 --output-on-failure
fi
if has sanitize; then
    for tool in ${SANITIZERS:-memcheck racecheck synccheck}; do
        step "compute-sanitizer $tool [sanitize]" "sanitizer_$tool.log" \
            $LIMIT compute-sanitizer --tool "$tool" --error-exitcode 1 "$BIN/test_cuda" "[sanitize]"
        step "compute-sanitizer $tool cuda-tc small" "sanitizer_tc_$tool.log" \
            $LIMIT compute-sanitizer --tool "$tool" --error-exitcode 1 "$BIN/test_cuda_tc" \
            "cuda-tc: bottom-right causal*"
    done
    for tool in ${SANITIZERS:-memcheck racecheck synccheck}; do
        step "compute-sanitizer $tool backward" "sanitizer_backward_$tool.log" \
            $LIMIT compute-sanitizer --tool "$tool" --error-exitcode 1 "$BIN/test_backward" \
            "backward: two runs*"
    done
    for tool in ${SANITIZERS:-memcheck racecheck synccheck}; do
        step "compute-sanitizer $tool cuda-tc backward" "sanitizer_tc_backward_$tool.log" \
            $LIMIT compute-sanitizer --tool "$tool" --error-exitcode 1 \
            "$BIN/test_cuda_tc_backward" "cuda-tc backward: a NaN*"
    done
    step "compute-sanitizer memcheck cuda-tc backward, deterministic" sanitizer_tc_det.log \
        $LIMIT compute-sanitizer --tool memcheck --error-exitcode 1 "$BIN/test_cuda_tc_backward" \
        "cuda-tc backward: FLASHATTN_DETERMINISTIC*"
    step "compute-sanitizer memcheck cuda-fa3" sanitizer_fa3.log \
        $LIMIT compute-sanitizer --tool memcheck --error-exitcode 1 "$BIN/test_cuda_fa3" "cuda-fa3: GQA*"
    step "compute-sanitizer memcheck cuda-tc block masks" sanitizer_tc_mask.log \
        $LIMIT compute-sanitizer --tool memcheck --error-exitcode 1 "$BIN/test_cuda_tc" "cuda-tc: block masks*"
fi
if has compare; then
    step "compare with PyTorch (fp32)" compare_torch.log \
        python3 cuda/tools/compare_torch.py --bin-dir "$BIN" --out "$OUT" ${QUICK:+--quick} \
        ${FA2_VARIANTS:+--variants "$FA2_VARIANTS"} ${COMPARE_ARGS:-}
    step "backward vs PyTorch (fp32)" compare_backward.log \
        python3 cuda/tools/compare_backward.py --bin-dir "$BIN" ${QUICK:+--quick} \
        --json "$OUT/compare_backward.json"
    step "backward vs PyTorch (fp16)" compare_backward_fp16.log \
        python3 cuda/tools/compare_backward.py --bin-dir "$BIN" --dtype fp16 ${QUICK:+--quick} \
        --json "$OUT/compare_backward_fp16.json"
    step "cuda-tc vs PyTorch flash/cuDNN (fp16, bf16)" compare_tc.log \
        bash -c "python3 cuda/tools/compare_tc.py --bin-dir '$BIN' --repeat ${TC_REPEAT:-20} \
                 --json '$OUT/compare_tc.json' > '$OUT/compare_tc.txt'"
    step "omp vs PyTorch CPU (16 threads)" omp_vs_torch.log \
        bash docs/scripts/omp_vs_torch_cpu.sh "$BIN/flashattn" "$(nproc)"
    step "causal and block-sparse bench rows" bench_variants.log bash -c "
        for args in '' '--causal' '--mask-block-q 128 --mask-block-kv 128 --block-density 0.5' \
                    '--mask-block-q 128 --mask-block-kv 128 --block-density 0.25'; do
            '$BIN/flashattn' bench --backends cuda-tc --dtype f16 --batch 4 --heads 16 \
                --seq 4096 --dim 64 --repeat 10 \$args 2>/dev/null | sed -n '1,5p' || true
            '$BIN/flashattn' bench --backends cuda-standard,cuda-fa1,cuda-fa2 --batch 4 --heads 16 \
                --seq 4096 --dim 64 --repeat 5 \$args | sed -n '1,8p'
        done"
fi

echo
for f in compare_torch.txt compare_tc.txt; do cat "$OUT/$f" 2>/dev/null; echo; done
tail -12 "$OUT/compare_backward.log" 2>/dev/null; echo
tail -20 "$OUT/compare_backward_fp16.log" 2>/dev/null; echo
tail -4 "$OUT/omp_vs_torch.log" 2>/dev/null
echo
printf '%s\n' "${SUMMARY[@]}"
! printf '%s\n' "${SUMMARY[@]}" | grep -q '^FAIL'
