#!/usr/bin/env python3
"""cuda/tools/compare_backward.py — the backward pass of our CUDA backends beside PyTorch's.

For each shape (FlashAttention's benchmark grid: 16k tokens, hidden 2048, d = 64 and 128 (--dims
64,128,256 adds d = 256), N = 1024 ... 8192, causal and not; --quick: N = 1024 and 4096 only), it
times
  * `flashattn bench --pass backward --json` for our backends (one process, rounds interleaved,
    the backward alone after its forward): --dtype fp32: cuda-standard and cuda-fa2; fp16 / bf16:
    cuda-tc and cuda-fa3 (Hopper; left out where the binary has no cuda-fa3), and
  * PyTorch's SDPA backward: fp32 with the EFFICIENT_ATTENTION and MATH backends (TF32 off); fp16 /
    bf16 with FLASH_ATTENTION and CUDNN_ATTENTION: one forward with requires_grad, then
    torch.autograd.grad(O, (Q, K, V), dO) timed alone with CUDA events after warm-up, median of
    --repeat,
and prints TFLOP/s (FLOPs = 2.5 x 4 B H N^2 d, halved for causal) and the ratios ours / torch
(a ratio > 1: ours is faster). A backend without a backward at a shape (cuda-tc at d = 256) is left
out there: its cells read nan. That default favours ours against PyTorch: PyTorch's times hold the host's
launch of torch.autograd.grad, and ours run first in a fresh process; the ratios to quote come
from --python (below).

--python (fp16 / bf16) times cuda-fa3's backward the way PyTorch's is timed instead, through
flashattn.attention's autograd in this process (PYTHONPATH must hold the package; gradients in the
inputs' dtype, as SDPA writes them), and with --rounds R ours, FLASH and cuDNN take turns R times
at each shape, each time the median of its rounds; --calls C puts C backward calls between the
CUDA events of one timing, so that the host's time hides behind the calls queued before. Under a
long run of calls an H100 reaches its power limit and lowers its clock (docs/cuda_fa3.md, "Timing
under the power limit"): turns give every contender the same share of that.

Usage: cuda/tools/compare_backward.py --bin-dir build/gpu/bin [--dtype fp32|fp16|bf16] [--quick]
           [--dims 64,128] [--repeat R] [--json FILE] [--python --rounds 3 --calls 10]
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

from compare_tc import time_torch  # CUDA-event timing, `calls` calls per timing, median of `repeat`

# Per dtype: (our backends, PyTorch's SDPA backends, the pairs whose ratio is reported).
PLANS = {
    "fp32": (["cuda-standard", "cuda-fa2"], ["EFFICIENT_ATTENTION", "MATH"],
             [("cuda-fa2", "EFFICIENT_ATTENTION"), ("cuda-standard", "MATH")]),
    "fp16": (["cuda-tc", "cuda-fa3"], ["FLASH_ATTENTION", "CUDNN_ATTENTION"],
             [("cuda-fa3", "FLASH_ATTENTION"), ("cuda-fa3", "CUDNN_ATTENTION"),
              ("cuda-tc", "FLASH_ATTENTION"), ("cuda-tc", "CUDNN_ATTENTION")]),
}
PLANS["bf16"] = PLANS["fp16"]
OUR_DTYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}
TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def shapes(quick, dims):
    out = []
    for d in dims:
        for N in ((1024, 4096) if quick else (1024, 2048, 4096, 8192)):
            for causal in (False, True):
                B, H = 16384 // N, 2048 // d
                out.append((B, H, N, d, causal))
    return out


def flops(B, H, N, d, causal):
    f = 2.5 * 4.0 * B * H * N * N * d
    return f / 2 if causal else f


def ours(bin_dir, backends, dtype, B, H, N, d, causal, repeat):
    """Median ms per backend, from one bench run; where that fails, each backend alone, nan for
    those that refuse the shape."""
    try:
        return bench(bin_dir, backends, dtype, B, H, N, d, causal, repeat)
    except RuntimeError as refused:
        if len(backends) == 1:  # say why, so that a failure does not pass for a refusal
            print(f"# {backends[0]} left out at B={B} H={H} N={N} d={d} causal={causal}: "
                  f"{str(refused).splitlines()[-1]}", flush=True)
            return {backends[0]: math.nan}
        out = {}
        for name in backends:
            out.update(ours(bin_dir, [name], dtype, B, H, N, d, causal, repeat))
        return out


def bench(bin_dir, backends, dtype, B, H, N, d, causal, repeat):
    cmd = [f"{bin_dir}/flashattn", "bench", "--backends", ",".join(backends), "--pass", "backward",
           "--dtype", OUR_DTYPE[dtype],
           "--batch", str(B), "--heads", str(H), "--seq", str(N), "--dim", str(d),
           "--repeat", str(repeat), "--json"] + (["--causal"] if causal else [])
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {run.stderr.strip()}")
    return {row["backend"]: row["median_ms"] for row in map(json.loads, run.stdout.splitlines())}


def python_backward_ms(sdpa_backends, ours, dtype, B, H, N, d, causal, repeat, calls, rounds):
    """{name: ms} of the backward of `ours` (through flashattn.attention) and of each SDPA backend
    on the same q, k, v and dO, taking turns `rounds` times; each the median of its rounds."""
    import flashattn

    gen = torch.Generator(device="cuda").manual_seed(2022)
    t = TORCH_DTYPE[dtype]
    q, k, v = (torch.randn(B, H, N, d, device="cuda", generator=gen, dtype=t, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(B, H, N, d, device="cuda", generator=gen, dtype=t)
    steps = {}
    out = flashattn.attention(q, k, v, causal=causal, backend=ours)
    steps[ours] = (None, lambda o=out: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
    for name in sdpa_backends:
        try:
            with sdpa_kernel(getattr(SDPBackend, name)):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            steps[name] = (name, lambda o=o: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
        except RuntimeError:
            pass  # a backend that does not take this shape: nan below
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, (backend, step) in steps.items():
            if times[name] is None:
                continue
            if backend is None:
                times[name].append(time_torch(torch, step, repeat, calls=calls))
                continue
            try:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    times[name].append(time_torch(torch, step, repeat, calls=calls))
            except RuntimeError:  # its backward refuses the shape: nan below
                times[name] = None
    result = {name: statistics.median(ts) for name, ts in times.items() if ts}
    return {name: result.get(name, math.nan) for name in [ours] + list(sdpa_backends)}


def torch_backward_ms(backend, dtype, B, H, N, d, causal, repeat):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(2022)
    t = TORCH_DTYPE[dtype]
    q, k, v = (torch.randn(B, H, N, d, device="cuda", generator=gen, dtype=t, requires_grad=True)
               for _ in range(3))
    with sdpa_kernel(getattr(SDPBackend, backend)):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        dout = torch.randn(out.shape, device="cuda", generator=gen, dtype=t)
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


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--dtype", choices=sorted(PLANS), default="fp32")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dims", default="64,128", help="head dims, comma-separated (64,128,256)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json")
    ap.add_argument("--python", action="store_true",
                    help="time cuda-fa3 through flashattn.attention's autograd, as PyTorch is timed")
    ap.add_argument("--rounds", type=int, default=1, help="with --python: turns at each shape")
    ap.add_argument("--calls", type=int, default=1, help="with --python: calls per timing")
    a = ap.parse_args()
    if a.calls < 1 or a.rounds < 1 or a.repeat < 1:
        ap.error("--calls, --rounds and --repeat must be at least 1")
    if (a.rounds > 1 or a.calls > 1) and not a.python:
        ap.error("--rounds and --calls time ours through Python: give --python too")
    mine, theirs, pairs = PLANS[a.dtype]
    if a.python:
        if a.dtype == "fp32":
            print("error: --python times cuda-fa3, which runs fp16 and bf16", file=sys.stderr)
            return 2
        mine = ["cuda-fa3"]
    listed = subprocess.run([f"{a.bin_dir}/flashattn", "backends"], capture_output=True, text=True).stdout
    mine = [n for n in mine if n in listed]
    pairs = [(n, t) for n, t in pairs if n in mine]
    rows = []
    print(f"# device: {torch.cuda.get_device_name()}; torch {torch.__version__}; {a.dtype} "
          f"backward, TFLOP/s (FLOPs = 2.5 x forward's); ratio = ours / torch")
    short = lambda name: name.replace("_ATTENTION", "").lower()
    head = [f"{n:>10}" for n in mine] + [f"{short(t):>10}" for t in theirs] + \
           [f"{n.replace('cuda-', '')}/{short(t)}".rjust(12) for n, t in pairs]
    print(f"{'B':>3} {'H':>3} {'N':>5} {'d':>4} {'causal':>6} | " + " ".join(head))
    for B, H, N, d, causal in shapes(a.quick, [int(x) for x in a.dims.split(",")]):
        f = flops(B, H, N, d, causal)
        if a.python:
            ms = python_backward_ms(theirs, "cuda-fa3", a.dtype, B, H, N, d, causal, a.repeat,
                                    a.calls, a.rounds)
            theirs_left = []
        else:
            ms = ours(a.bin_dir, mine, a.dtype, B, H, N, d, causal, a.repeat)
            theirs_left = theirs
        for t in theirs_left:
            try:
                ms[t] = torch_backward_ms(t, a.dtype, B, H, N, d, causal, a.repeat)
            except (torch.OutOfMemoryError, RuntimeError):
                ms[t] = math.nan  # MATH out of memory, or a backend not built for this device
        row = dict(B=B, H=H, N=N, d=d, causal=causal, dtype=a.dtype, ms=ms)
        rows.append(row)
        tf = lambda t: f / t / 1e9
        cells = [f"{tf(ms[n]):10.2f}" for n in mine + theirs] + \
                [f"{ms[t] / ms[n]:12.2f}" for n, t in pairs]
        print(f"{B:>3} {H:>3} {N:>5} {d:>4} {str(causal):>6} | " + " ".join(cells), flush=True)
        torch.cuda.empty_cache()
    for n, t in pairs:
        ratios = [r["ms"][t] / r["ms"][n] for r in rows
                  if not math.isnan(r["ms"][t]) and not math.isnan(r["ms"][n])]
        if ratios:
            print(f"# {n} / torch {t} backward: geomean {geomean(ratios):.2f}, min {min(ratios):.2f}")
    if a.json:
        with open(a.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
