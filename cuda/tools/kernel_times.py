#!/usr/bin/env python3
"""cuda/tools/kernel_times.py — where one attention forward + backward spends its GPU time, kernel
by kernel: flashattn.attention against PyTorch's SDPA on one backend (cuDNN by default), the same
inputs, under torch.profiler.

q, k and v are viewed out of one (B, N, 3, H, d) projection as a transformer's are, and dO is a
(B, N, H, d) tensor viewed as (B, H, N, d), so both sides read strided inputs as in a model. Each
side runs --warmup calls, then --calls calls under the profiler; the table gives each kernel's
device time per call (microseconds) and how many times a call launches it. Rows that both sides
share (autograd accumulating into q.grad, k.grad, v.grad, the elementwise_kernel rows) are the
harness, not attention. A kernel started as a dependent launch (cuda/host/dependent_launch.hpp:
cuda-fa3's backward kernel and the dQ pass, the decoding kernel and its combine) may start before
the kernel ahead of it ends, and its time then includes its wait for it: run with
FLASHATTN_DEPENDENT_LAUNCH=0 for each kernel's own time.

With --seq-kv (a decoding step: --seq rows of queries against a longer K/V cache, --heads-kv heads
of K and V for GQA) only the forward runs, on contiguous (B, H, N, d) tensors, causal bottom-right
unless --no-causal, as cuda/tools/compare_decode.py calls it.

Usage:
  PYTHONPATH=build/gpu/python python3 cuda/tools/kernel_times.py [--batch 8 --heads 12 --seq 1024
      --dim 64] [--no-causal] [--dtype bfloat16|float16|float32] [--sdpa CUDNN_ATTENTION|FLASH_ATTENTION|
      EFFICIENT_ATTENTION]
  PYTHONPATH=build/gpu/python python3 cuda/tools/kernel_times.py --batch 1 --heads 32 --heads-kv 8
      --seq 1 --seq-kv 8192 --dim 128 --dtype float16 [--backend cuda-tc]
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashattn


def kernel_table(step, calls):
    """{kernel name: (device us per call, launches per call)} of `calls` calls of step()."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    rows = {}
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0) or 0
        if device_us > 0 and event.count >= calls:
            rows[event.key] = (device_us / calls, event.count // calls)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq-kv", type=int, help="a decoding step: keys in the cache (forward only)")
    ap.add_argument("--heads-kv", type=int, help="K/V heads (GQA), with --seq-kv")
    ap.add_argument("--backend", help="flashattn's backend (default: what Python picks)")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--sdpa", default=None,
                    choices=["CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"],
                    help="SDPA's backend (default: cuDNN, EFFICIENT_ATTENTION for float32, the "
                         "one PyTorch picks there)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    B, H, N, d, causal = a.batch, a.heads, a.seq, a.dim, not a.no_causal
    dtype = getattr(torch, a.dtype)
    a.sdpa = a.sdpa or ("EFFICIENT_ATTENTION" if dtype == torch.float32 else "CUDNN_ATTENTION")
    if a.heads_kv is not None and a.seq_kv is None:
        ap.error("--heads-kv goes with --seq-kv")
    if a.seq_kv is not None:
        H_kv = a.heads_kv or H
        if H_kv < 1 or H % H_kv:
            ap.error(f"--heads {H} is not a multiple of --heads-kv {H_kv}")
        q = torch.randn(B, H, N, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(B, H_kv, a.seq_kv, d, device="cuda", dtype=dtype) for _ in range(2))
        # SDPA's is_causal is top-left; a decoding step's mask is bottom-right (the last query row
        # sees every key), as flashattn's causal=True with N_q < N_kv.
        mask = None
        if causal and N > 1:
            mask = torch.ones(N, a.seq_kv, dtype=torch.bool, device="cuda").tril(a.seq_kv - N)

        def ours():
            flashattn.attention(q, k, v, causal=causal, backend=a.backend)

        def theirs():
            with sdpa_kernel(getattr(SDPBackend, a.sdpa)):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=H_kv != H)
        what = f"H_kv {H_kv}, N_q {N}, N_kv {a.seq_kv}, forward"
    else:
        x = torch.randn(B, N, 3, H, d, device="cuda", dtype=dtype)
        q, k, v = (x[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3))
        do = torch.randn(B, N, H, d, device="cuda", dtype=dtype).transpose(1, 2)

        def ours():
            flashattn.attention(q, k, v, causal=causal, backend=a.backend).backward(do)

        def theirs():
            with sdpa_kernel(getattr(SDPBackend, a.sdpa)):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)
        what = f"N {N}"

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: B {B}, H {H}, {what}, d {d}"
          f"{', causal' if causal else ''}, {a.dtype}; device us per call (of {a.calls})")
    for name, step in (("flashattn", ours), (f"SDPA {a.sdpa}", theirs)):
        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        rows = kernel_table(step, a.calls)
        total = sum(us for us, _ in rows.values())
        print(f"== {name}: {total:.1f} us in all")
        for kernel, (us, launches) in sorted(rows.items(), key=lambda r: -r[1][0]):
            print(f"  {us:9.1f}  x{launches}  {kernel[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
