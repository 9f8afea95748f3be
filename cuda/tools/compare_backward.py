#!/usr/bin/env python3
"""cuda/tools/compare_backward.py — the backward pass of our CUDA backends beside PyTorch's, fp32.

For each shape (FlashAttention's benchmark grid: 16k tokens, hidden 2048, d = 64 and 128, N = 1024
... 8192, causal and not; --quick: N = 1024 and 4096 only), it times
  * `flashattn bench --pass backward --json` for cuda-standard and cuda-fa2 (one process, rounds
    interleaved, the backward alone after its forward), and
  * PyTorch's SDPA backward in float32 with the EFFICIENT_ATTENTION and MATH backends (TF32 off):
    one forward with requires_grad, then torch.autograd.grad(O, (Q, K, V), dO) timed alone with
    CUDA events after warm-up, median of --repeat,
and prints TFLOP/s (FLOPs = 2.5 x 4 B H N^2 d, halved for causal) and the ratios ours / torch.

Usage: cuda/tools/compare_backward.py --bin-dir build/gpu/bin [--quick] [--repeat R] [--json FILE]
"""
import argparse
import json
import math
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

OURS = ["cuda-standard", "cuda-fa2"]


def shapes(quick):
    out = []
    for d in (64, 128):
        for N in ((1024, 4096) if quick else (1024, 2048, 4096, 8192)):
            for causal in (False, True):
                B, H = 16384 // N, 2048 // d
                out.append((B, H, N, d, causal))
    return out


def flops(B, H, N, d, causal):
    f = 2.5 * 4.0 * B * H * N * N * d
    return f / 2 if causal else f


def ours(bin_dir, B, H, N, d, causal, repeat):
    cmd = [f"{bin_dir}/flashattn", "bench", "--backends", ",".join(OURS), "--pass", "backward",
           "--batch", str(B), "--heads", str(H), "--seq", str(N), "--dim", str(d),
           "--repeat", str(repeat), "--json"] + (["--causal"] if causal else [])
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {run.stderr.strip()}")
    return {row["backend"]: row["median_ms"] for row in map(json.loads, run.stdout.splitlines())}


def torch_backward_ms(backend, B, H, N, d, causal, repeat):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(2022)
    q, k, v = (torch.randn(B, H, N, d, device="cuda", generator=gen, requires_grad=True)
               for _ in range(3))
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        dout = torch.randn(out.shape, device="cuda", generator=gen)
        step = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for _ in range(3):
            step()
        times = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    print(f"# device: {torch.cuda.get_device_name()}; torch {torch.__version__}; fp32 backward, "
          f"TFLOP/s (FLOPs = 2.5 x forward's); ratio = ours / torch")
    print(f"{'B':>3} {'H':>3} {'N':>5} {'d':>4} {'causal':>6} | {'standard':>8} {'fa2':>8} | "
          f"{'torch-eff':>9} {'torch-math':>10} | {'fa2/eff':>7} {'std/math':>8}")
    for B, H, N, d, causal in shapes(a.quick):
        f = flops(B, H, N, d, causal)
        ms = ours(a.bin_dir, B, H, N, d, causal, a.repeat)
        eff = torch_backward_ms(SDPBackend.EFFICIENT_ATTENTION, B, H, N, d, causal, a.repeat)
        try:
            math_ms = torch_backward_ms(SDPBackend.MATH, B, H, N, d, causal, a.repeat)
        except torch.OutOfMemoryError:
            math_ms = math.nan
        tf = lambda t: f / t / 1e9
        row = dict(B=B, H=H, N=N, d=d, causal=causal, standard_ms=ms["cuda-standard"],
                   fa2_ms=ms["cuda-fa2"], torch_efficient_ms=eff, torch_math_ms=math_ms)
        rows.append(row)
        print(f"{B:>3} {H:>3} {N:>5} {d:>4} {str(causal):>6} | {tf(ms['cuda-standard']):8.2f} "
              f"{tf(ms['cuda-fa2']):8.2f} | {tf(eff):9.2f} {tf(math_ms):10.2f} | "
              f"{eff / ms['cuda-fa2']:7.2f} {math_ms / ms['cuda-standard']:8.2f}", flush=True)
        torch.cuda.empty_cache()
    ratios = [r["torch_efficient_ms"] / r["fa2_ms"] for r in rows]
    print(f"# cuda-fa2 / torch EFFICIENT backward: geomean "
          f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}, min {min(ratios):.2f}")
    if a.json:
        with open(a.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
