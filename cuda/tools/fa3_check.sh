#!/usr/bin/env bash
# cuda/tools/fa3_check.sh — one call's worth of cuda-fa3 work on a Hopper machine (H100/H200):
#   1. build (Release, sm_90a) only the targets cuda-fa3 needs: flashattn and test_cuda_fa3;
#   2. its tests (the 2x rule against float64 on odd shapes, every compiled variant);
#   3. every variant beside cuda-tc, interleaved in one process, on FlashAttention's grid (fp16);
#   4. cuda/tools/compare_tc.py --backend cuda-fa3: against PyTorch's FLASH_ATTENTION and cuDNN
#      (bench's timing, a quick look that favours ours; the ratios the docs quote are timed with
#      the Python package built, compare_tc.py --python --calls 10 --rounds 3);
#   5. compute-sanitizer memcheck, racecheck, synccheck on small cases;
#   6. ncu (clocks left alone): tensor-pipe, memory and occupancy figures of cuda-fa3's and
#      cuda-tc's kernels at one d = 64 and one d = 128 shape.
# A short table is printed last; logs go to $OUT (default build/fa3_check).
#
# Usage: cuda/tools/fa3_check.sh DEPS_PREFIX
#   DEPS_PREFIX: Debian's header packages (cuda/tools/pack_deps.sh). Environment: OUT, BUILD_DIR
#   (default build/gpu), VARIANTS (default: every compiled one), DIMS (default 64,128), SEQS
#   (default "1024 2048 4096 8192"), REPEAT (default 20), ALL=1 (build every target and run the
#   whole ctest suite: for changes to stages other backends share), PHASES (default
#   "build tests variants compare sanitize"; "ncu" is extra).
set -uo pipefail
cd "$(dirname "$0")/../.."
DEPS=$(realpath "${1:?usage: cuda/tools/fa3_check.sh DEPS_PREFIX}")
OUT=${OUT:-$PWD/build/fa3_check}
BUILD_DIR=${BUILD_DIR:-build/gpu}
BIN=$BUILD_DIR/bin
REPEAT=${REPEAT:-20}
DIMS=${DIMS:-64,128}
SEQS=${SEQS:-1024 2048 4096 8192}
VARIANTS=${VARIANTS:-d64-Bc128 d64-Bc128-pingpong d64-Br192-Bc128 d128-Bc128-pingpong d128-Bc128}
PHASES=${PHASES:-build tests variants compare sanitize}
has() { [[ " $PHASES " == *" $1 "* ]]; }
mkdir -p "$OUT"
source cuda/tools/steps.sh  # step NAME LOGFILE COMMAND...

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
TARGETS="--target flashattn test_cuda_fa3"
[ -n "${ALL:-}" ] && TARGETS=""
if has build; then
    step build build.log bash -c "cmake -S . -B '$BUILD_DIR' -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHATTN_NVCC_SPLIT_COMPILE=0 -DCMAKE_PREFIX_PATH='$DEPS' \
        -DCatch2_DIR='$DEPS/lib/cmake/Catch2' \
        && cmake --build '$BUILD_DIR' -j$(nproc) $TARGETS"
    grep -E "^Catch2_DIR" "$BUILD_DIR/CMakeCache.txt"
    grep -A2 "fa3_forward_kernel" "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c || true
fi
if has tests; then
    if [ -n "${ALL:-}" ]; then
        step "ctest (every suite)" ctest.log timeout 360 ctest --test-dir "$BUILD_DIR" -j8 --output-on-failure
    else
        step "test_cuda_fa3" test_fa3.log timeout 150 "$BIN/test_cuda_fa3"
    fi
fi
if has variants; then
    # Each variant beside cuda-tc in one process (interleaved), FlashAttention's grid, fp16.
    echo "# variant d causal N tc_TFLOPs fa3_TFLOPs fa3/tc" >"$OUT/variants.txt"
    for variant in $VARIANTS; do
        d=${variant#d}; d=${d%%-*}
        [[ ",$DIMS," == *",$d,"* ]] || continue
        for causal in "" "--causal"; do
            label=${causal:+causal}; label=${label:-full}
            for n in $SEQS; do
                FLASHATTN_VARIANT=cuda-fa3=$variant "$BIN/flashattn" bench --backends cuda-tc,cuda-fa3 \
                    --dtype f16 --batch $((16384 / n)) --heads $((2048 / d)) --seq $n --dim $d \
                    --repeat "$REPEAT" $causal --json 2>>"$OUT/variants.err" |
                    python3 -c "
import json, sys
r = {j['backend']: j['gflops'] / 1e3 for j in map(json.loads, filter(lambda l: l.startswith('{'), sys.stdin))}
print('$variant $d $label $n %.1f %.1f %.3f' % (r['cuda-tc'], r['cuda-fa3'], r['cuda-fa3'] / r['cuda-tc']))
" >>"$OUT/variants.txt"
            done
        done
    done
    SUMMARY+=("DONE  variants beside cuda-tc (variants.txt)")
fi
if has compare; then
    step "compare_tc --backend cuda-fa3" compare.log timeout 240 bash -c "python3 cuda/tools/compare_tc.py \
        --bin-dir '$BIN' --backend cuda-fa3 --dims '$DIMS' --dtypes f16,bf16 --repeat '$REPEAT' \
        --json '$OUT/compare_fa3.json' >'$OUT/compare_fa3.txt'"
fi
if has sanitize; then
    # Every variant on ragged shapes; then GQA, scales and block masks (the block-mask loop).
    for tool in memcheck racecheck synccheck; do
        step "compute-sanitizer $tool (variants)" "sanitizer_$tool.log" timeout 240 compute-sanitizer \
            --tool "$tool" --error-exitcode 1 "$BIN/test_cuda_fa3" "cuda-fa3: every compiled tile shape*"
    done
    step "compute-sanitizer memcheck (persistent CTAs)" sanitizer_persistent.log timeout 240 \
        compute-sanitizer --tool memcheck --error-exitcode 1 "$BIN/test_cuda_fa3" "cuda-fa3: more work tiles*"
    for tool in memcheck racecheck; do
        step "compute-sanitizer $tool (GQA, masks)" "sanitizer_gqa_$tool.log" timeout 240 compute-sanitizer \
            --tool "$tool" --error-exitcode 1 "$BIN/test_cuda_fa3" "cuda-fa3: GQA*"
    done
fi

if has ncu; then
    for d in 64 128; do
        for backend in cuda-fa3 cuda-tc; do
            step "ncu $backend d=$d" "ncu_${backend}_d$d.log" ncu --clock-control none \
                --section SpeedOfLight --section Occupancy --section LaunchStats \
                --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes.sum \
                -k regex:"fa3_forward_kernel|tc_forward_kernel" -c 1 "$BIN/flashattn" bench --backends $backend \
                --dtype f16 --batch 2 --heads $((2048 / d)) --seq 8192 --dim $d --repeat 1 --warmup 0
        done
    done
    grep -hE "^  [a-z_]+.*fa3|^  .*tc|Duration|Compute \(SM\) Throughput|Memory Throughput|gmma|hmma|dram__bytes|Registers Per|Achieved Occupancy|Theoretical Occ" \
        "$OUT"/ncu_*.log >"$OUT/ncu_summary.txt" 2>/dev/null
fi

echo
[ -f "$OUT/variants.txt" ] && cat "$OUT/variants.txt"
[ -f "$OUT/ncu_summary.txt" ] && cat "$OUT/ncu_summary.txt"
[ -f "$OUT/compare_fa3.txt" ] && sed -n '/vs PyTorch SDPA/,$p' "$OUT/compare_fa3.txt"
printf '%s\n' "${SUMMARY[@]}"
