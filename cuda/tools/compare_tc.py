#!/usr/bin/env python3
"""cuda/tools/compare_tc.py -- cuda-tc (or cuda-fa3) against PyTorch's FlashAttention-2 (and cuDNN) on one GPU, in one command.

    python3 cuda/tools/compare_tc.py --bin-dir build/gpu/bin [--repeat 30] [--dtypes f16,bf16]
                                     [--backend cuda-tc|cuda-fa3] [--dims 64,128]
                                     [--python [--calls 10]]
                                     [--tiles NAME,NAME...] [--json results.json]

--backend cuda-fa3 times cuda-fa3 instead (its bar: geomean >= 1.2x FLASH and >= 0.85x cuDNN, no
point below 1.0x FLASH); --dims picks the head dims among 64, 128 and 256 (both backends run all
three forward; the default is 64,128).

The grid is FlashAttention's own benchmark: 16k tokens per batch, hidden size 2048, so
d = 64 -> 32 heads, d = 128 -> 16 heads and d = 256 -> 8 heads, B = 16384 / N, N in {1024, 2048, 4096, 8192},
causal and not. Throughput counts FLOPs = 4 B H N^2 d, halved for causal.

For each shape, `flashattn bench --backends cuda-tc --json` times cuda-tc (inputs uploaded once
before timing; warm-up runs, then the median of --repeat runs, each ended by a device
synchronize), then this process times torch.nn.functional.scaled_dot_product_attention under
sdpa_kernel(FLASH_ATTENTION) and sdpa_kernel(CUDNN_ATTENTION) on random inputs of the same shape
(CUDA events around each call after warm-up, median of --repeat calls), alternating between the
two programs shape by shape on the same GPU. The table is printed last, with the geometric mean
of cuda-tc / PyTorch-flash over the fp16 grid (the bar: >= 0.8, and no configuration below 0.6).
That default favours ours against PyTorch on an H100: ours runs first, in a fresh process, nearest
to the full clock, PyTorch's after it, once the power limit has lowered the clock (docs/cuda_fa3.md,
"Timing under the power limit"). Ratios to quote come from --python --calls 10 --rounds 3.
--tiles NAME,... also times those variants of the backend (fp16, N = 2048 and 8192;
FLASHATTN_VARIANT=<backend>=NAME, names as in the error message of an unknown one, e.g. cuda-tc's
Br128w4-Bc64-s2 or cuda-fa3's d64-Bc128-pingpong).

--python times ours the way PyTorch is timed instead: flashattn.attention(q, k, v, backend=...)
on the same CUDA tensors, in this process (PYTHONPATH must hold the package), CUDA events around
each call. That is what a PyTorch user's call costs: O in the inputs' dtype as SDPA writes it
(`flashattn bench` writes the library's float32 O, twice the bytes), and the host's time to
launch inside the events for both, where bench's clock also runs until a device synchronize.
--calls N puts N calls between the events (ours with --python, and PyTorch's), so that the host's
launch hides behind the calls queued before it and each time is the device's, as in a training
step, where the host runs ahead of the GPU. --rounds R (with --python) has the three take turns R
times at each shape, each time the median of its rounds: under a long run of calls an H100 reaches
its power limit and lowers its clock (docs/cuda_fa3.md, "Timing under the power limit"), so whoever
is timed first, or after an idle gap, gets a faster clock.
"""
import argparse
import datetime
import json
import math
import statistics
import os
import subprocess
import sys
import time

SEQS = [1024, 2048, 4096, 8192]
DIMS = [64, 128, 256]
TOKENS, HIDDEN = 16384, 2048


def grid():
    for d in DIMS:
        for causal in (False, True):
            for n in SEQS:
                yield d, causal, n, TOKENS // n, HIDDEN // d


def flops(b, h, n, d, causal):
    return 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)


def run_flashattn_bench(bin_dir, b, h, n, d, causal, dtype, repeat, tile=None, backend="cuda-tc"):
    """One row of `flashattn bench --json` for `backend` (median_ms, min_ms, max_ms, ...)."""
    cmd = [os.path.join(bin_dir, "flashattn"), "bench", "--backends", backend, "--dtype", dtype,
           "--batch", str(b), "--heads", str(h), "--seq", str(n), "--dim", str(d),
           "--repeat", str(repeat), "--warmup", "3", "--json"] + (["--causal"] if causal else [])
    env = dict(os.environ)
    if tile:
        env["FLASHATTN_VARIANT"] = backend + "=" + tile
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    row = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")][0]
    row["tile"] = tile or "default"
    return row


SETTLE_SECONDS = 0.5


def settle(torch):
    """Leave the GPU idle for a moment before timing. Right after a process freed large buffers
    (another shape's inputs, or `flashattn bench` exiting) and new ones were allocated, a kernel
    that streams HBM ran ~18% slower for a few milliseconds with the clocks unchanged (H100,
    2026-11-27; docs/decoding.md, "The first timing after a large shape"): whichever call was
    timed first paid it. The forward grid below does not pause: its inputs are the same size at
    every shape, so PyTorch's allocator frees nothing, and a run with a pause after each `flashattn
    bench` gave PyTorch's columns up to 17% lower at N = 1024 (docs/cuda_fa3.md): a pause favouring
    us if anything."""
    torch.cuda.synchronize()
    time.sleep(SETTLE_SECONDS)


def time_torch(torch, fn, repeat, warmup=5, calls=1):
    """Median over `repeat` timings of the ms per call, each timing `calls` calls back to back
    between two CUDA events. With one call the GPU idles while the host launches it, and that
    time is counted; with several, the later launches are queued while the earlier calls run, so
    the events measure the device's time (plus 1/calls of one launch)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls)
    return statistics.median(times)


def torch_rows(torch, d, causal, n, b, h, dtype, repeat, ours=None, calls=1, rounds=1):
    """PyTorch's FLASH and cuDNN times (ms) on random q, k, v of this shape; with `ours` (a
    backend name), flashattn.attention's on the same tensors too, timed the same way. With
    rounds > 1 the contenders take turns, round after round, and each one's time is the median of
    its rounds: under a long run of calls the GPU reaches its power limit and lowers its clock,
    and turns give each contender the same share of that."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    tdtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=tdtype) for _ in range(3))
    contenders = []
    if ours:
        import flashattn
        contenders.append(("ours", None, lambda: flashattn.attention(q, k, v, causal=causal,
                                                                      backend=ours)))
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    contenders += [("flash", SDPBackend.FLASH_ATTENTION, sdpa), ("cudnn", SDPBackend.CUDNN_ATTENTION, sdpa)]
    times = {name: [] for name, _, _ in contenders}
    for _ in range(rounds):
        for name, backend, fn in contenders:
            if times[name] is None:
                continue
            try:
                if backend is None:
                    times[name].append(time_torch(torch, fn, repeat, calls=calls))
                else:
                    with sdpa_kernel(backend):
                        times[name].append(time_torch(torch, fn, repeat, calls=calls))
            except RuntimeError as e:  # a backend that does not support this shape/dtype
                if backend is None:
                    raise
                times[name] = None
                print(f"# torch {name} d={d} causal={causal} N={n} {dtype}: {str(e).splitlines()[0]}", file=sys.stderr)
    del q, k, v
    return {name: statistics.median(t) if t else None for name, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default="build/release/bin", help="where `flashattn` is")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--tiles", default="", help="comma-separated variant names of --backend to time too (fp16)")
    ap.add_argument("--json", help="write every measured row to this file")
    ap.add_argument("--backend", default="cuda-tc", choices=["cuda-tc", "cuda-fa3"])
    ap.add_argument("--dims", default="64,128", help="head dims of the grid")
    ap.add_argument("--python", action="store_true",
                    help="time ours through flashattn.attention in this process, as PyTorch is "
                         "timed (16-bit O), instead of by `flashattn bench`")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --python: ours, FLASH and cuDNN take turns this many times at each "
                         "shape, each time the median of its rounds")
    ap.add_argument("--calls", type=int, default=1,
                    help="calls back to back between the CUDA events of one timing (ours with "
                         "--python, and PyTorch's): with more than one, the host's launch time "
                         "hides behind the calls before it, and the times are the device's")
    args = ap.parse_args()
    if args.calls < 1 or args.rounds < 1 or args.repeat < 1:
        ap.error("--calls, --rounds and --repeat must be at least 1")
    if args.rounds > 1 and not args.python:
        ap.error("--rounds takes turns between ours and PyTorch in one process: give --python too")
    dims = [int(x) for x in args.dims.split(",")]
    name = args.backend

    import torch

    dev = torch.cuda.get_device_name()
    print(f"# device: {dev}; torch {torch.__version__}; date {datetime.date.today()}; repeat {args.repeat}")
    print("# command: " + " ".join(sys.argv))
    dtypes = args.dtypes.split(",")
    rows = []
    for dtype in dtypes:
        for d in dims:
            for causal in (False, True):
                group = [(d, causal, n, b, h) for (d_, c_, n, b, h) in grid() if d_ == d and c_ == causal]
                for (d_, c_, n, b, h) in group:
                    if args.python:
                        tr = torch_rows(torch, d, causal, n, b, h, dtype, args.repeat, ours=name,
                                        calls=args.calls, rounds=args.rounds)
                        tc_row = dict(tile="python", median_ms=tr["ours"], min_ms=None, max_ms=None)
                    else:
                        tc_row = run_flashattn_bench(args.bin_dir, b, h, n, d, causal, dtype,
                                                     args.repeat, backend=name)
                        tr = torch_rows(torch, d, causal, n, b, h, dtype, args.repeat,
                                        calls=args.calls)
                    f = flops(b, h, n, d, causal)
                    rows.append(dict(d=d, causal=causal, n=n, b=b, h=h, dtype=dtype, tile=tc_row["tile"],
                                     tc_ms=tc_row["median_ms"], flash_ms=tr["flash"], cudnn_ms=tr["cudnn"],
                                     tc_tflops=f / tc_row["median_ms"] / 1e9,
                                     flash_tflops=f / tr["flash"] / 1e9 if tr["flash"] else None,
                                     cudnn_tflops=f / tr["cudnn"] / 1e9 if tr["cudnn"] else None,
                                     tc_min_ms=tc_row["min_ms"], tc_max_ms=tc_row["max_ms"]))

    tile_rows = []
    if args.tiles:
        for tile in filter(None, args.tiles.split(",")):
            for (d, c, n, b, h) in grid():
                if n not in (2048, 8192):
                    continue
                try:
                    tile_rows.append(run_flashattn_bench(args.bin_dir, b, h, n, d, c, "f16",
                                                         args.repeat, tile, backend=name))
                except subprocess.CalledProcessError:
                    pass  # this tile is not compiled for this d
        print(f"\n# {name} variants (fp16), TFLOP/s")
        print(f"{'d':>4} {'causal':>6} {'N':>5} {'tile':>18} {'TFLOP/s':>8}")
        for r in tile_rows:
            print(f"{r['dim']:>4} {str(r['causal']):>6} {r['seq_q']:>5} {r['tile']:>18} "
                  f"{r['gflops'] / 1e3:>8.1f}")

    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=dev, torch=torch.__version__, date=str(datetime.date.today()),
                           command=" ".join(sys.argv), rows=rows, tiles=tile_rows), fh, indent=1)

    def fmt(x, spec=".1f"):
        return "-" if x is None else format(x, spec)

    print(f"\n# {name} vs PyTorch SDPA on {dev} (TFLOP/s; ratio = {name} / torch)")
    print(f"{'dtype':>5} {'d':>4} {'causal':>6} {'N':>5} {'B':>3} {'H':>3} {'tile':>16} {name:>8} "
          f"{'flash':>8} {'cudnn':>8} {'/flash':>8} {'/cudnn':>8} {'ms spread':>15}")
    for r in rows:
        rf = r["tc_tflops"] / r["flash_tflops"] if r["flash_tflops"] else None
        rc = r["tc_tflops"] / r["cudnn_tflops"] if r["cudnn_tflops"] else None
        r["ratio_flash"], r["ratio_cudnn"] = rf, rc
        print(f"{r['dtype']:>5} {r['d']:>4} {str(r['causal']):>6} {r['n']:>5} {r['b']:>3} {r['h']:>3} {r['tile']:>16} "
              f"{r['tc_tflops']:>8.1f} {fmt(r['flash_tflops']):>8} {fmt(r['cudnn_tflops']):>8} "
              f"{fmt(rf, '.3f'):>8} {fmt(rc, '.3f'):>8} "
              f"{fmt(r['tc_min_ms'], '.3f'):>7}-{fmt(r['tc_max_ms'], '.3f'):<7}")
    for dtype in dtypes:
        ratios = [r["ratio_flash"] for r in rows if r["dtype"] == dtype and r["ratio_flash"]]
        cud = [r["ratio_cudnn"] for r in rows if r["dtype"] == dtype and r["ratio_cudnn"]]
        if ratios:
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            line = f"# {dtype}: {name} / torch-flash geomean {gm:.3f}, min {min(ratios):.3f}"
            gc = math.exp(sum(map(math.log, cud)) / len(cud)) if cud else None
            if cud:
                line += f"; {name} / cudnn geomean {gc:.3f}"
            if dtype == "f16" and name == "cuda-tc":
                line += "  [bar: geomean >= 0.8 and min >= 0.6: " + \
                        ("MET]" if gm >= 0.8 and min(ratios) >= 0.6 else "NOT MET]")
            if dtype == "f16" and name == "cuda-fa3":
                met = gm >= 1.2 and min(ratios) >= 1.0 and gc is not None and gc >= 0.85
                line += "  [bar: geomean >= 1.2 vs flash, >= 0.85 vs cudnn, min >= 1.0: " + \
                        ("MET]" if met else "NOT MET]")
            print(line)


if __name__ == "__main__":
    main()
