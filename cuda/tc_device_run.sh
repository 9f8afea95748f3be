#!/usr/bin/env bash
# cuda/tc_device_run.sh — everything cuda-tc needs checked on a GPU machine, in one command:
# build (Hopper), the cuda-tc test suite, compute-sanitizer (memcheck, racecheck, synccheck) on
# small cases, the side-by-side timing table against PyTorch (cuda/compare_tc.py), and optionally
# an Nsight Compute profile and the SASS of the default kernels. Logs are written to a scratch
# folder and packed into $OUT/logs.tar.gz (the device tool returns at most 8 files); the tables,
# the profile and the SASS are also copied to $OUT; a short summary is printed last.
#
#   OUT=/tmp/tc_out DEPS=/path/to/deps bash cuda/tc_device_run.sh [--no-tests] [--ncu] [--sass]
# DEPS: a prefix holding the Debian Eigen, Catch2 2.x (with lib/libCatch2WithMain.a, which its
# CMake package file requires), CLI11 and nlohmann-json packages.
set -uo pipefail
FINAL_OUT=${OUT:-/tmp/tc_out}
OUT=$(mktemp -d /tmp/tc_logs.XXXX)
mkdir -p "$FINAL_OUT"
RUN_TESTS=1 NCU=0 SASS=0
for arg in "$@"; do
  case $arg in
    --no-tests) RUN_TESTS=0 ;;
    --ncu) NCU=1 ;;
    --sass) SASS=1 ;;
  esac
done

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.txt" 2>&1
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${DEPS:+-DCMAKE_PREFIX_PATH=$DEPS} \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHATTN_NVCC_SPLIT_COMPILE=0 > "$OUT/cfg.log" 2>&1 \
  || { tail -30 "$OUT/cfg.log"; exit 1; }
start=$(date +%s)
# Keep going past a failing target: the timing needs only tc_bench.
cmake --build build -j16 -- -k > "$OUT/build.log" 2>&1 || grep -B2 -A6 "error" "$OUT/build.log" | head -60
[ -x build/bin/tc_bench ] || { tar -czf "$FINAL_OUT/logs.tar.gz" -C "$OUT" .; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

B=build/bin/tc_bench
SMALL="2,3,203,64,1,f16 1,2,517,128,0,bf16 1,2,300,256,1,f16 1,2,77,32,0,bf16 1,2,130,96,1,f16 1,1,1,64,0,f16"
if [ $RUN_TESTS = 1 ] && [ -x build/bin/test_cuda_tc ]; then
  (build/bin/test_cuda_tc > "$OUT/test.log" 2>&1; echo "test_cuda_tc rc=$?" >> "$OUT/test.log") &
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 $B --repeat 1 --warmup 0 --no-check $SMALL \
      > "$OUT/$tool.log" 2>&1
    echo "$tool rc=$?" >> "$OUT/$tool.log"
  done
  compute-sanitizer --tool memcheck --error-exitcode 9 build/bin/test_cuda_tc "cuda-tc: block masks*" \
    > "$OUT/memcheck_mask.log" 2>&1
  echo "memcheck block masks rc=$?" >> "$OUT/memcheck_mask.log"
  wait
fi

PYTHONUNBUFFERED=1 python3 cuda/compare_tc.py --tc-bench $B --repeat 30 --tiles \
  --json "$OUT/compare.json" > "$OUT/compare.txt" 2> "$OUT/compare.err"

if [ $NCU = 1 ]; then
  ncu --clock-control none -k regex:tc_forward -c 4 \
    --section SpeedOfLight --section Occupancy --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum \
    $B --repeat 1 --warmup 0 --no-check 4,32,4096,64,0,f16 4,16,4096,128,0,f16 4,32,4096,64,1,f16 4,16,4096,128,1,f16 \
    > "$OUT/ncu.txt" 2>&1
fi
if [ $SASS = 1 ]; then
  obj=$(find build -name "tc_attention.cu.o" | head -1)
  cuobjdump -sass "$obj" | awk '/Function :/ {keep = ($0 ~ /Li64ELi4ELi2ELi64ELi2EEELb0E/ || $0 ~ /Li128ELi8ELi1ELi64ELi2EEELb0E/) && $0 ~ /6__half/} keep' \
    | gzip > "$OUT/sass.txt.gz"
fi

echo "== summary =="
cat "$OUT/gpu.txt"
grep -h "rc=" "$OUT"/*.log 2>/dev/null
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT"/*check*.log 2>/dev/null
[ -f "$OUT/test.log" ] && grep -E "test cases|assertions|FAILED|failed" "$OUT/test.log" | head -20
[ -f "$OUT/ncu.txt" ] && grep -E "tc_forward|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|hmma_cycles|pipe_xu|bank_conflicts|wavefronts|local_op|Registers Per|Achieved Occupancy|Theoretical Occupancy" "$OUT/ncu.txt" | head -60
tail -5 "$OUT/compare.err"
cat "$OUT/compare.txt"
tar -czf "$FINAL_OUT/logs.tar.gz" -C "$OUT" .
cp "$OUT"/compare.txt "$OUT"/compare.json "$FINAL_OUT"/ 2>/dev/null
[ -f "$OUT/ncu.txt" ] && cp "$OUT/ncu.txt" "$FINAL_OUT"/
[ -f "$OUT/sass.txt.gz" ] && cp "$OUT/sass.txt.gz" "$FINAL_OUT"/
