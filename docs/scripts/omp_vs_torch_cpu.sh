#!/usr/bin/env bash
# docs/scripts/omp_vs_torch_cpu.sh — the omp backend against PyTorch's CPU attention, on one host.
#
# Usage: docs/scripts/omp_vs_torch_cpu.sh PATH/TO/flashattn [THREADS [forward|backward]]
#        (THREADS default 16, pass default forward)
#
# Builds nothing: give it a built `flashattn` (e.g. build/release/bin/flashattn). It times
#   1. flashattn bench --backends omp --pass P --threads T --batch 1 --heads 16 --seq 4096 --dim 64
#      --json (1 warm-up run, then the median of 10 runs), and
#   2. torch.nn.functional.scaled_dot_product_attention on the CPU, float32, same shape,
#      torch.set_num_threads(T), 3 warm-up calls, then the median of 10 calls; for the backward,
#      one forward with requires_grad, then torch.autograd.grad(O, (Q, K, V), dO) timed alone,
# one after the other (two processes, so not interleaved), and prints both GFLOP/s
# (FLOPs = 4*B*H*N^2*d, 2.5x that for the backward, as `flashattn bench` counts them) and the
# ratio omp / torch.
# Needs python3 with torch. Record the output with the host's CPU model and the date in docs/.
set -euo pipefail

exe=${1:?usage: $0 PATH/TO/flashattn [THREADS]}
threads=${2:-16}
pass=${3:-forward}
B=1 H=16 N=4096 D=64 REPEAT=10

[ -x "$exe" ] || { echo "error: $exe is not an executable" >&2; exit 2; }
python3 -c "import torch" 2>/dev/null || { echo "error: python3 cannot import torch" >&2; exit 2; }
case "$pass" in forward|backward) ;; *) echo "error: pass = $pass: must be forward or backward" >&2; exit 2;; esac

cmd=("$exe" bench --backends omp --pass "$pass" --threads "$threads" --batch $B --heads $H --seq $N --dim $D
     --repeat $REPEAT --json)
echo "# ${cmd[*]}"
omp_json=$("${cmd[@]}")
echo "$omp_json"

python3 - "$omp_json" "$threads" $B $H $N $D $REPEAT "$pass" <<'PYTHON'
import json, statistics, sys, time
import torch

omp = json.loads(sys.argv[1].splitlines()[0])
threads, B, H, N, D, repeat = (int(x) for x in sys.argv[2:8])
backward = sys.argv[8] == "backward"
torch.set_num_threads(threads)
gen = torch.Generator().manual_seed(2022)
q, k, v = (torch.randn(B, H, N, D, generator=gen, dtype=torch.float32) for _ in range(3))
sdpa = torch.nn.functional.scaled_dot_product_attention
if backward:
    for t in (q, k, v):
        t.requires_grad_(True)
    out = sdpa(q, k, v)
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float32)
    step = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
else:
    step = lambda: sdpa(q, k, v)
with torch.set_grad_enabled(backward):
    for _ in range(3):
        step()
    times = []
    for _ in range(max(10, repeat)):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
median = statistics.median(times)
flops = 4.0 * B * H * N * N * D * (2.5 if backward else 1.0)
torch_gflops = flops / median / 1e6
print(f"# torch {torch.__version__} scaled_dot_product_attention {sys.argv[8]}, CPU float32, "
      f"{torch.get_num_threads()} threads, median of {len(times)} after 3 warm-up: "
      f"{median:.2f} ms (min {min(times):.2f}, max {max(times):.2f})")
print(f"device: {omp['device_name']}; date: {omp['date']}")
print(f"omp   {omp['median_ms']:10.2f} ms  {omp['gflops']:8.1f} GFLOP/s  ({omp['threads']} threads)")
print(f"torch {median:10.2f} ms  {torch_gflops:8.1f} GFLOP/s  ({torch.get_num_threads()} threads)")
print(f"omp / torch speed ratio: {omp['gflops'] / torch_gflops:.2f}x")
PYTHON
