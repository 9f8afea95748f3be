#!/usr/bin/env python3
"""cuda/tools/compare_decode.py — decoding (a few query rows against a long KV cache) side by side:
our split-KV forwards (`flashattn bench`, one process, interleaved) against PyTorch's SDPA
backends (FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION) on the same shapes, in fp16 or bf16.

Decoding is memory-bound: the least it can cost is one read of K and V, 2 B H_kv N_kv d bytes of
16-bit values. The table gives each time, the bandwidth it implies (K + V + Q + O bytes / time)
and that bandwidth as a share of the HBM peak (--peak-tbs; by default 3.35 TB/s, an H100 SXM's,
or 4.8 TB/s on an H200).

By default ours are timed by `flashattn bench` (host clock around execute(), which waits for the
kernels) and SDPA by CUDA events around one call: both include the host's launch time, which at
short caches is most of a step. --graph times device time alone, the same way for both: the calls
captured in a CUDA graph (ours through flashattn.attention; PYTHONPATH must hold the package),
over copies of K/V that together exceed L2, so that every call reads HBM.

  python3 cuda/tools/compare_decode.py --bin-dir build/release/bin --dtype f16 --out $OUT
      [--batch 1|8] [--nq 1|4] [--quick] [--prefill-column] [--graph]
"""
import argparse
import itertools
import json
import os
import subprocess

from compare_tc import settle, time_torch  # a pause before timing; CUDA-event timing, median of `repeat`

SHAPES = [  # (B, H, H_kv, N_q, N_kv, d)
    (b, 32, hk, nq, nkv, d)
    for b, hk, nq, nkv, d in itertools.product((1, 8), (8, 32), (1, 4), (8192, 32768, 131072),
                                               (64, 128))
]
TORCH_BACKENDS = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"]


def kv_bytes(B, H, Hk, Nq, Nkv, d, elem=2):
    """The bytes a decode step must move at least: K and V, Q read, O written (16-bit)."""
    return elem * (2 * B * Hk * Nkv * d + 2 * B * H * Nq * d)


# cuda-tc's default prefill tile per head dim (cuda/tc/forward.cu): --prefill-column runs it at
# the decoding shapes too, beside the decoding kernel that is the default there.
PREFILL_TILE = {32: "Br128w4-Bc64-s2", 64: "Br128w4-Bc64-s2", 96: "Br128w8-Bc64-s2",
                128: "Br128w8-Bc64-s2", 256: "Br128w8-Bc32-s2"}


def ours(bin_dir, backends, shape, dtype, repeat, splits=None, variant=None):
    B, H, Hk, Nq, Nkv, d = shape
    cmd = [os.path.join(bin_dir, "flashattn"), "bench", "--backends", ",".join(backends),
           "--batch", str(B), "--heads", str(H), "--heads-kv", str(Hk), "--seq", str(Nq),
           "--seq-kv", str(Nkv), "--dim", str(d), "--dtype", dtype, "--repeat", str(repeat),
           "--json"]
    if splits:
        cmd += ["--splits", str(splits)]
    env = dict(os.environ, FLASHATTN_VARIANT=variant) if variant else None
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not rows:
        raise RuntimeError(" ".join(cmd) + "\n" + r.stderr[-1500:])
    return {row["backend"]: row for row in rows}


def time_graph(torch, calls, repeat):
    """Device time per call with no host time in it: the calls (one per K/V copy) captured in one
    CUDA graph, the graph replayed `repeat` times; the median replay over the number of calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (workspace, library handles)
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    return time_torch(torch, graph.replay, repeat) / len(calls)


def decode_inputs(torch, shape, dtype, graph):
    """q and the K/V copies of one shape. With --graph, enough copies that one replay streams at
    least 256 MiB of K/V: calls back to back on the same K/V would find it in L2 and time a cache,
    not HBM."""
    B, H, Hk, Nq, Nkv, d = shape
    t = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, Nq, d, device="cuda", dtype=t, generator=g)
    copies = max(1, -(-(256 << 20) // kv_bytes(*shape))) if graph else 1
    kv = [(torch.randn(B, Hk, Nkv, d, device="cuda", dtype=t, generator=g),
           torch.randn(B, Hk, Nkv, d, device="cuda", dtype=t, generator=g)) for _ in range(copies)]
    # The previous shape's inputs were just freed (empty_cache) and these allocated: B = 8,
    # H_kv = 32, N_kv = 8k, d = 64 after a 131k shape took 215 us timed at once, 182 us after
    # the pause (H100, 2026-11-27).
    settle(torch)
    return q, kv


def timed(torch, fn, kv, repeat, graph):
    if graph:
        return time_graph(torch, [lambda k=k, v=v: fn(k, v) for k, v in kv], repeat)
    k, v = kv[0]
    return time_torch(torch, lambda: fn(k, v), repeat)


def torch_ms(shape, dtype, backend_name, repeat, graph=False):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, Hk = shape[1], shape[2]
    q, kv = decode_inputs(torch, shape, dtype, graph)
    try:
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return timed(torch, lambda k, v: F.scaled_dot_product_attention(
                q, k, v, enable_gqa=Hk != H), kv, repeat, graph)
    except RuntimeError:
        return None  # this backend does not take the shape (e.g. GQA)
    finally:
        q = kv = None  # freed before the next shape's inputs
        torch.cuda.empty_cache()


def ours_graph(shape, dtype, backend, repeat, variant=None):
    """One of our backends called from Python (flashattn.attention on the CUDA tensors), timed
    as the SDPA backends are with --graph; a row shaped like `flashattn bench --json`'s."""
    import flashattn
    import torch

    q, kv = decode_inputs(torch, shape, dtype, True)
    saved = os.environ.get("FLASHATTN_VARIANT")
    if variant:
        os.environ["FLASHATTN_VARIANT"] = variant
    try:
        ms = timed(torch, lambda k, v: flashattn.attention(q, k, v, backend=backend), kv,
                   repeat, True)
    finally:
        if variant:
            if saved is None:
                del os.environ["FLASHATTN_VARIANT"]
            else:
                os.environ["FLASHATTN_VARIANT"] = saved
        q = kv = None  # freed before the next shape's inputs
        torch.cuda.empty_cache()
    return {"backend": backend, "median_ms": ms, "splits": "-"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--backends", default="cuda-tc")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--peak-tbs", type=float,
                    help="HBM peak in TB/s for the %% column (default: 4.8 on an H200, else 3.35, "
                         "an H100 SXM's)")
    ap.add_argument("--quick", action="store_true", help="only B = 1, N_q = 1, d = 128")
    ap.add_argument("--batch", type=int, choices=[1, 8], help="only this batch size")
    ap.add_argument("--nq", type=int, choices=[1, 4], help="only this many query rows")
    ap.add_argument("--prefill-column", action="store_true",
                    help="also time cuda-tc with its prefill tile (FLASHATTN_VARIANT) at each shape")
    ap.add_argument("--graph", action="store_true",
                    help="time device time alone: ours through flashattn.attention and every SDPA "
                         "backend as calls captured in a CUDA graph over K/V copies larger than L2 "
                         "(needs the Python package on PYTHONPATH); S is then not shown")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    backends = args.backends.split(",")
    shapes = [s for s in SHAPES if (not args.quick or (s[0] == 1 and s[3] == 1 and s[5] == 128))
              and args.batch in (None, s[0]) and args.nq in (None, s[3])]
    import torch
    device = torch.cuda.get_device_name()
    if args.peak_tbs is None:
        args.peak_tbs = 4.8 if "H200" in device else 3.35
    timing = ("device time: calls in a CUDA graph" if args.graph else
              "ours: flashattn bench (execute() to its end); SDPA: CUDA events around one call")
    print(f"# {device}, torch {torch.__version__}, {args.dtype}; % of a {args.peak_tbs} TB/s peak; "
          f"{timing}", flush=True)
    extra = ["cuda-tc prefill tile µs (S)"] if args.prefill_column else []
    header = ("| B | H | H_kv | N_q | N_kv | d | " +
              " | ".join([f"{b} µs (S)" for b in backends] + extra) +
              " | best SDPA µs (backend) | ours / best SDPA | ours TB/s | % of peak |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    print(header, flush=True)
    records = []
    def run_ours(shape, names, variant=None):
        if args.graph:
            return {b: ours_graph(shape, args.dtype, b, args.repeat, variant) for b in names}
        return ours(args.bin_dir, names, shape, args.dtype, args.repeat, variant=variant)

    for shape in shapes:
        rows = run_ours(shape, backends)
        sdpa = {b: torch_ms(shape, args.dtype, b, args.repeat, args.graph) for b in TORCH_BACKENDS}
        best_name, best = min(((b, t) for b, t in sdpa.items() if t is not None),
                              key=lambda x: x[1], default=(None, None))
        ours_best = min(rows[b]["median_ms"] for b in backends)
        tbs = kv_bytes(*shape) / (ours_best * 1e-3) / 1e12
        cells = [f"{1e3 * rows[b]['median_ms']:.1f} ({rows[b].get('splits', '?')})" for b in backends]
        if args.prefill_column:
            pre = run_ours(shape, ["cuda-tc"], "cuda-tc=" + PREFILL_TILE[shape[5]])["cuda-tc"]
            cells.append(f"{1e3 * pre['median_ms']:.1f} ({pre.get('splits', '?')})")
            rows["cuda-tc prefill tile"] = pre
        theirs = (f"{1e3 * best:.1f} ({best_name}) | {best / ours_best:.2f}×" if best
                  else "- (no SDPA backend took it) | -")
        line = ("| " + " | ".join(str(x) for x in shape) + " | " + " | ".join(cells) +
                f" | {theirs} | {tbs:.2f} | {100 * tbs / args.peak_tbs:.0f}% |")
        print(line, flush=True)
        lines.append(line)
        records.append({"shape": shape, "ours": rows, "sdpa_ms": sdpa})
    with open(os.path.join(args.out, f"decode_{args.dtype}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, f"decode_{args.dtype}.json"), "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
