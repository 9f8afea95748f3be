#!/usr/bin/env python3
"""cuda/tools/compare_torch.py — our CUDA backends side by side with PyTorch's SDPA, in fp32, one process
per shape, on one GPU, plus the HBM traffic that ncu measures.

What it prints (full logs and CSVs go to --out):
  1. the bar shapes: cuda-fa2 / cuda-fa1 / cuda-standard against PyTorch's EFFICIENT_ATTENTION
     and MATH backends (fp32, TF32 off), as ratios (>1 means ours is faster);
  2. an N sweep (512 ... 8192; causal at 1024 and 4096) of all three backends (TFLOP/s), and a
     block-size sweep of cuda-fa1 (--sram-bytes = M: the paper's block-size figure, with ncu's
     HBM bytes for Theorem 2's trend);
  3. ncu dram bytes (read + write, all kernels of one execute) for cuda-standard vs cuda-fa2 at
     B=16, H=16, N=1024, d=64 (the paper reports 40.3 GB vs 4.4 GB at GPT-2 scale: 9.2x).

Our timings come from `flashattn bench --json` (all our backends in one process, interleaved). PyTorch is timed with CUDA events after
warm-up, median of many repeats; the inputs are 100+ MB per tensor at the bar shapes, far beyond
the 50 MB L2. FLOPs = 4*B*H*N^2*d (halved for causal).
"""
import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys

BAR_SHAPES = [  # (B, H, N, d), non-causal
    (4, 32, 4096, 64),
    (4, 16, 4096, 128),
]
OURS = ["cuda-fa2", "cuda-fa1", "cuda-standard"]


def log(msg):
    print(msg, flush=True)


def flops(B, H, N, d, causal=False):
    f = 4.0 * B * H * N * N * d
    return f / 2 if causal else f


def run_ours(bin_dir, backends, B, H, N, d, causal=False, repeat=20, warmup=3, extra=(), env=None):
    """JSON rows of our backends from `flashattn bench --json` (interleaved, same inputs)."""
    args = ["--backends", ",".join(backends), "--batch", str(B), "--heads", str(H), "--seq",
            str(N), "--dim", str(d), "--repeat", str(repeat), "--warmup", str(warmup),
            "--json"] + list(extra)
    if causal:
        args.append("--causal")
    cmd = [os.path.join(bin_dir, "flashattn"), "bench"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not rows:
        raise RuntimeError("flashattn bench failed: " + " ".join(cmd) + "\n" + r.stderr.strip())
    return [row for row in rows if row.get("kind", "attention") == "attention"]


def torch_time(B, H, N, d, backend_name, causal=False, repeat=20, warmup=3, spread=None):
    """Median ms of F.scaled_dot_product_attention in fp32 with one SDPA backend, or None.
    With a dict `spread`, its "min_ms" and "max_ms" are set to the fastest and slowest repeat."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.backends.cuda.matmul.allow_tf32 = False  # MATH in true fp32, like cuda-standard
    torch.backends.cudnn.allow_tf32 = False
    backend = getattr(SDPBackend, backend_name)
    g = torch.Generator(device="cuda").manual_seed(0)
    try:
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float32, generator=g)
                   for _ in range(3))
        with sdpa_kernel(backend):
            for _ in range(warmup):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.cuda.synchronize()
            times = []
            for _ in range(repeat):
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                stop.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(stop))
        if spread is not None:
            spread.update(min_ms=min(times), max_ms=max(times))
        return statistics.median(times)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
        log(f"  torch {backend_name} B={B} H={H} N={N} d={d}: {str(e).splitlines()[0]}")
        return None
    finally:
        torch.cuda.empty_cache()


def ncu_dram_bytes(bin_dir, backend, B, H, N, d, extra=(), out_dir=None):
    """dram__bytes_read.sum + dram__bytes_write.sum over every kernel of one execute()."""
    cmd = ["ncu", "--clock-control", "none", "--metrics",
           "dram__bytes_read.sum,dram__bytes_write.sum", "--csv", "--print-units", "base",
           os.path.join(bin_dir, "flashattn"), "bench", "--backends", backend, "--batch",
           str(B), "--heads", str(H), "--seq", str(N), "--dim", str(d), "--repeat", "1",
           "--warmup", "0"] + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if out_dir:
        with open(os.path.join(out_dir, "ncu.log"), "a") as f:
            f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr + "\n")
    total, kernels = 0.0, set()
    lines = [l for l in r.stdout.splitlines() if l.startswith('"')]
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if row.get("Metric Name") in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            total += float(row["Metric Value"].replace(",", ""))
            kernels.add(row["Kernel Name"][:60])
    if not kernels:
        raise RuntimeError("ncu returned no metrics:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    return total, sorted(kernels)


def table(title, header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = [title, "  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(str(x).rjust(w) for x, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def write_report(out_dir, report, records):
    """(Re)writes the text report and the raw records: a run cut short keeps what it measured."""
    with open(os.path.join(out_dir, "compare_torch.json"), "w") as f:
        json.dump(records, f, indent=1)
    with open(os.path.join(out_dir, "compare_torch.csv"), "w", newline="") as f:
        keys = sorted({k for r in records for k in r})
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(records)
    with open(os.path.join(out_dir, "compare_torch.txt"), "w") as f:
        f.write("\n\n".join(report) + "\n")


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin-dir", required=True, help="build/<preset>/bin")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="logs and CSVs")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="bar shapes only (no sweeps, no ncu)")
    ap.add_argument("--variants", default="",
                    help="comma-separated cuda-fa2 variant names (FLASHATTN_VARIANT=cuda-fa2=NAME) to time at the bar shapes")
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--sweep-n", default="512,1024,2048,4096,8192", help="N sweep, non-causal")
    ap.add_argument("--sweep-n-causal", default="1024,4096", help="N sweep, causal")
    ap.add_argument("--sweep-m-kib", default="16,32,64,128,224", help="cuda-fa1 M sweep (KiB)")
    ap.add_argument("--sweep-repeat", type=int, default=10)
    a = ap.parse_args()
    ints = lambda text: [int(x) for x in text.split(",") if x]
    os.makedirs(a.out, exist_ok=True)
    import torch
    device = torch.cuda.get_device_name(0)
    log(f"device: {device}; torch {torch.__version__}")
    report = [f"device: {device}, torch {torch.__version__}, fp32, medians of {a.repeat} runs"]
    records = []

    # 1. Bar shapes.
    bar_rows, spread_rows = [], []
    for (B, H, N, d) in BAR_SHAPES:
        log(f"bar shape B={B} H={H} N={N} d={d}")
        ours = {r["backend"]: r for r in run_ours(a.bin_dir, OURS, B, H, N, d, repeat=a.repeat)}
        spreads = {n: {"min_ms": ours[n]["min_ms"], "max_ms": ours[n]["max_ms"]} for n in OURS}
        spreads["torch-efficient"], spreads["torch-math"] = {}, {}
        eff = torch_time(B, H, N, d, "EFFICIENT_ATTENTION", repeat=a.repeat,
                         spread=spreads["torch-efficient"])
        math = torch_time(B, H, N, d, "MATH", repeat=a.repeat, spread=spreads["torch-math"])
        fa2, fa1, std = (ours[n]["median_ms"] for n in OURS)
        f = flops(B, H, N, d)
        spread_row = [f"{B}x{H}x{N}x{d}"]
        for name, ms in [("cuda-fa2", fa2), ("cuda-fa1", fa1), ("cuda-standard", std),
                         ("torch-efficient", eff), ("torch-math", math)]:
            lo, hi = spreads[name].get("min_ms"), spreads[name].get("max_ms")
            records.append({"table": "bar", "backend": name, "B": B, "H": H, "N": N, "d": d,
                            "median_ms": ms, "min_ms": lo, "max_ms": hi,
                            "tflops": None if ms is None else f / ms / 1e9})
            spread_row.append("-" if lo is None else f"{lo:.3f}-{hi:.3f}")
        spread_rows.append(spread_row)
        bar_rows.append([f"{B}x{H}x{N}x{d}", fmt(fa2, ".3f"), fmt(fa1, ".3f"), fmt(std, ".3f"),
                         fmt(eff, ".3f"), fmt(math, ".3f"), fmt(f / fa2 / 1e9, ".1f"),
                         fmt(eff and eff / fa2), fmt(math and math / fa2), fmt(std / fa1)])
        for variant in filter(None, a.variants.split(",")):
            covers = int(variant[1:variant.index("_")])  # "d64_..." is for 32 < d <= 64
            if not covers // 2 < d <= covers:
                continue
            r = run_ours(a.bin_dir, ["cuda-fa2"], B, H, N, d, repeat=a.repeat,
                         env={"FLASHATTN_VARIANT": "cuda-fa2=" + variant})[0]
            records.append({"table": "variant", "backend": "cuda-fa2:" + variant, "B": B, "H": H,
                            "N": N, "d": d, "median_ms": r["median_ms"],
                            "tflops": f / r["median_ms"] / 1e9})
    bar = table("bar shapes, non-causal (ms; ratios > 1: ours faster)",
                ["B x H x N x d", "fa2", "fa1", "standard", "torch-eff", "torch-math",
                 "fa2 TFLOP/s", "eff/fa2 (>=0.8)", "math/fa2 (>=1.5)", "std/fa1 (>=1)"], bar_rows)
    report.append(bar)
    report.append(table(f"spread of the same runs: fastest-slowest of {a.repeat} (ms)",
                        ["B x H x N x d", "fa2", "fa1", "standard", "torch-eff", "torch-math"],
                        spread_rows))
    variants = [r for r in records if r["table"] == "variant"]
    if variants:
        report.append(table("cuda-fa2 variants (FLASHATTN_VARIANT=cuda-fa2=NAME)",
                            ["variant", "shape", "ms", "TFLOP/s"],
                            [[r["backend"], f'{r["B"]}x{r["H"]}x{r["N"]}x{r["d"]}',
                              fmt(r["median_ms"], ".3f"), fmt(r["tflops"], ".1f")]
                             for r in variants]))
    write_report(a.out, report, records)

    if not a.quick:
        # 2a. N sweep, all three backends and PyTorch's efficient kernel.
        sweep_rows = []
        for causal, Ns in ((False, ints(a.sweep_n)), (True, ints(a.sweep_n_causal))):
            for N in Ns:
                B, H, d = 4, 16, 64
                log(f"N sweep N={N} causal={causal}")
                ours = {r["backend"]: r for r in run_ours(a.bin_dir, OURS, B, H, N, d, causal,
                                                          repeat=a.sweep_repeat)}
                eff = torch_time(B, H, N, d, "EFFICIENT_ATTENTION", causal, repeat=a.sweep_repeat)
                f = flops(B, H, N, d, causal)
                row = [str(N), "yes" if causal else "no"]
                for n in OURS:
                    ms = ours[n]["median_ms"]
                    records.append({"table": "sweep_n", "backend": n, "B": B, "H": H, "N": N,
                                    "d": d, "causal": causal, "median_ms": ms,
                                    "tflops": f / ms / 1e9, "extra_bytes": ours[n]["extra_bytes"]})
                    row.append(f"{ms:.3f} ({f / ms / 1e9:.1f})")
                records.append({"table": "sweep_n", "backend": "torch-efficient", "B": B, "H": H,
                                "N": N, "d": d, "causal": causal, "median_ms": eff})
                row.append(fmt(eff, ".3f"))
                sweep_rows.append(row)
        report.append(table("N sweep, B=4 H=16 d=64: ms (TFLOP/s)",
                            ["N", "causal"] + OURS + ["torch-eff"], sweep_rows))
        write_report(a.out, report, records)

        # 2b. cuda-fa1 block-size sweep through M (--sram-bytes), with HBM traffic.
        fa1_rows = []
        B, H, N, d = 4, 16, 4096, 64
        for kib in ints(a.sweep_m_kib):
            extra = ["--sram-bytes", str(kib * 1024)]
            log(f"fa1 block sweep M={kib} KiB")
            r = run_ours(a.bin_dir, ["cuda-fa1"], B, H, N, d, repeat=a.sweep_repeat,
                         extra=extra)[0]
            Bc = -(-kib * 1024 // 4 // (4 * d))
            Br = min(Bc, d)
            dram = None
            if not a.no_ncu:
                try:
                    dram, _ = ncu_dram_bytes(a.bin_dir, "cuda-fa1", B, H, N, d, extra, a.out)
                except Exception as e:  # ncu missing or not permitted: keep the timings
                    log(f"  ncu: {e}")
            records.append({"table": "sweep_fa1_block", "backend": "cuda-fa1", "M_bytes":
                            kib * 1024, "Br": Br, "Bc": Bc, "median_ms": r["median_ms"],
                            "dram_bytes": dram})
            fa1_rows.append([f"{kib} KiB", f"{Br}x{Bc}", f'{r["median_ms"]:.3f}',
                             fmt(dram and dram / 1e9, ".2f")])
        report.append(table(f"cuda-fa1 block-size sweep, B={B} H={H} N={N} d={d}",
                            ["M", "Br x Bc", "ms", "HBM GB (ncu)"], fa1_rows))
        write_report(a.out, report, records)

    # 3. ncu: HBM bytes of standard vs fa2 (the paper's 9.2x).
    if not a.no_ncu:
        B, H, N, d = 16, 16, 1024, 64
        try:
            std, std_k = ncu_dram_bytes(a.bin_dir, "cuda-standard", B, H, N, d, (), a.out)
            fa2, fa2_k = ncu_dram_bytes(a.bin_dir, "cuda-fa2", B, H, N, d, (), a.out)
            records.append({"table": "ncu", "backend": "cuda-standard", "dram_bytes": std})
            records.append({"table": "ncu", "backend": "cuda-fa2", "dram_bytes": fa2})
            report.append(table(f"ncu dram bytes (read+write, all kernels of one execute), "
                                f"B={B} H={H} N={N} d={d}",
                                ["backend", "GB", "kernels"],
                                [["cuda-standard", f"{std / 1e9:.3f}", "; ".join(std_k)],
                                 ["cuda-fa2", f"{fa2 / 1e9:.3f}", "; ".join(fa2_k)],
                                 ["standard/fa2 (>= 9.2)", f"{std / fa2:.1f}", ""]]))
        except Exception as e:
            report.append(f"ncu failed: {e}")

    write_report(a.out, report, records)
    print("\n" + "\n\n".join(report))


if __name__ == "__main__":
    sys.exit(main())
