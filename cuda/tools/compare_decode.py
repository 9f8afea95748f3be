#!/usr/bin/env python3
"""cuda/tools/compare_decode.py — decoding (a few query rows against a long KV cache) side by side:
our split-KV forwards (`flashattn bench`, one process, interleaved) against PyTorch's SDPA
backends (FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION) on the same shapes, in fp16 or bf16.

Decoding is memory-bound: the least it can cost is one read of K and V, 2 B H_kv N_kv d bytes of
16-bit values. The table gives each time, the bandwidth it implies (K + V + Q + O bytes / time)
and that bandwidth as a share of the HBM peak (--peak-tbs; by default 3.35 TB/s, an H100 SXM's,
or 4.8 TB/s on an H200).

  python3 cuda/tools/compare_decode.py --bin-dir build/release/bin --dtype f16 --out $OUT
      [--batch 1|8] [--nq 1|4] [--quick]
"""
import argparse
import itertools
import json
import os
import subprocess

from compare_tc import time_torch  # CUDA-event timing of a PyTorch call, median of `repeat`

SHAPES = [  # (B, H, H_kv, N_q, N_kv, d)
    (b, 32, hk, nq, nkv, d)
    for b, hk, nq, nkv, d in itertools.product((1, 8), (8, 32), (1, 4), (8192, 32768, 131072),
                                               (64, 128))
]
TORCH_BACKENDS = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"]


def kv_bytes(B, H, Hk, Nq, Nkv, d, elem=2):
    """The bytes a decode step must move at least: K and V, Q read, O written (16-bit)."""
    return elem * (2 * B * Hk * Nkv * d + 2 * B * H * Nq * d)


def ours(bin_dir, backends, shape, dtype, repeat, splits=None):
    B, H, Hk, Nq, Nkv, d = shape
    cmd = [os.path.join(bin_dir, "flashattn"), "bench", "--backends", ",".join(backends),
           "--batch", str(B), "--heads", str(H), "--heads-kv", str(Hk), "--seq", str(Nq),
           "--seq-kv", str(Nkv), "--dim", str(d), "--dtype", dtype, "--repeat", str(repeat),
           "--json"]
    if splits:
        cmd += ["--splits", str(splits)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not rows:
        raise RuntimeError(" ".join(cmd) + "\n" + r.stderr[-1500:])
    return {row["backend"]: row for row in rows}


def torch_ms(shape, dtype, backend_name, repeat):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, Hk, Nq, Nkv, d = shape
    t = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, Nq, d, device="cuda", dtype=t, generator=g)
    k = torch.randn(B, Hk, Nkv, d, device="cuda", dtype=t, generator=g)
    v = torch.randn(B, Hk, Nkv, d, device="cuda", dtype=t, generator=g)
    try:
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return time_torch(torch, lambda: F.scaled_dot_product_attention(
                q, k, v, enable_gqa=Hk != H), repeat)
    except RuntimeError:
        return None  # this backend does not take the shape (e.g. GQA)
    finally:
        del q, k, v
        torch.cuda.empty_cache()


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
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    backends = args.backends.split(",")
    shapes = [s for s in SHAPES if (not args.quick or (s[0] == 1 and s[3] == 1 and s[5] == 128))
              and args.batch in (None, s[0]) and args.nq in (None, s[3])]
    import torch
    device = torch.cuda.get_device_name()
    if args.peak_tbs is None:
        args.peak_tbs = 4.8 if "H200" in device else 3.35
    print(f"# {device}, torch {torch.__version__}, {args.dtype}; % of a {args.peak_tbs} TB/s peak",
          flush=True)
    header = ("| B | H | H_kv | N_q | N_kv | d | " + " | ".join(f"{b} µs (S)" for b in backends) +
              " | best SDPA µs (backend) | ours / best SDPA | ours TB/s | % of peak |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    print(header, flush=True)
    records = []
    for shape in shapes:
        rows = ours(args.bin_dir, backends, shape, args.dtype, args.repeat)
        sdpa = {b: torch_ms(shape, args.dtype, b, args.repeat) for b in TORCH_BACKENDS}
        best_name, best = min(((b, t) for b, t in sdpa.items() if t is not None),
                              key=lambda x: x[1], default=(None, None))
        ours_best = min(rows[b]["median_ms"] for b in backends)
        tbs = kv_bytes(*shape) / (ours_best * 1e-3) / 1e12
        cells = [f"{1e3 * rows[b]['median_ms']:.1f} ({rows[b].get('splits', '?')})" for b in backends]
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
