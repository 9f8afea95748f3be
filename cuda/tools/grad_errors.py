#!/usr/bin/env python3
"""cuda/tools/grad_errors.py — how far O, dQ, dK and dV land from float64, ours beside each of PyTorch's
SDPA backends, on the same rounded inputs.

The tests hold every backend to the project's rule (within 2x of PyTorch's error against float64,
tests/python/test_flashattn.py); this prints how close to it a shape runs, so that a training
run whose loss drifts from SDPA's further than SDPA's drifts from its MATH backend can be traced
to the attention's rounding (or cleared of it). For each shape and seed: fresh inputs (N(0, 1)
q, k, v and dO, rounded to the dtype), the float64 reference of the forward and of its gradients
(PyTorch autograd in float64 on those rounded values), and each implementation's relative
error ||x - ref|| / ||ref|| (Frobenius) per output. Prints a table of the medians over the draws
and the ratio ours / each SDPA backend.

Usage (a CUDA GPU, PyTorch >= 2.5):
  PYTHONPATH=build/gpu/python python3 cuda/tools/grad_errors.py [--dtype bfloat16] [--seeds 3]
      [--shape B,H,N,d[,causal] ...]
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

OUTPUTS = ("O", "dQ", "dK", "dV")
SDPA_BACKENDS = {"FLASH": SDPBackend.FLASH_ATTENTION, "cuDNN": SDPBackend.CUDNN_ATTENTION,
                 "EFFICIENT": SDPBackend.EFFICIENT_ATTENTION, "MATH": SDPBackend.MATH}


def reference(q, k, v, do, causal):
    """O and its gradients in float64 (the definition: softmax(q k^T / sqrt(d)) v)."""
    xs = [t.double().requires_grad_() for t in (q, k, v)]
    s = xs[0] @ xs[1].transpose(-1, -2) / xs[0].shape[-1] ** 0.5
    if causal:  # N_q = N_kv here: both alignments agree
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    o = torch.softmax(s, dim=-1) @ xs[2]
    o.backward(do.double())
    return [o.detach()] + [x.grad for x in xs]


def run(attend, q, k, v, do):
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attend(*xs)
    o.backward(do)
    return [o.detach()] + [x.grad for x in xs]


def relative_error(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--seeds", type=int, default=3, help="fresh inputs per shape (default 3)")
    ap.add_argument("--ours", action="append", default=None,
                    help="our backend (repeatable; default: the default choice and cuda-tc)")
    ap.add_argument("--spread", type=float, default=1.0,
                    help="q is N(0, spread^2): larger spreads make peakier softmax rows (default 1)")
    ap.add_argument("--shape", action="append", default=None,
                    help="B,H,N,d or B,H,N,d,causal (repeatable; default: the small GPT's and "
                         "GPT-2 small's shapes, causal)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    dt = getattr(torch, a.dtype)
    a.ours = a.ours or ["default", "cuda-tc"]
    shapes = a.shape or ["32,4,256,64,causal", "8,12,1024,64,causal", "4,16,2048,128,causal",
                         "4,16,2048,128"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {a.dtype}, {a.seeds} seeds; "
          f"relative error ||x - float64|| / ||float64||, median over the draws")
    print("| B, H, N, d | causal | implementation | O | dQ | dK | dV |")
    print("|---|---|---|---:|---:|---:|---:|")
    for text in shapes:
        parts = text.split(",")
        B, H, N, d = (int(x) for x in parts[:4])
        causal = len(parts) > 4 and parts[4] == "causal"
        errors = {}
        for seed in range(a.seeds):
            g = torch.Generator(device="cuda").manual_seed(seed)
            q, k, v, do = (torch.randn(B, H, N, d, generator=g, device="cuda") for _ in range(4))
            q, k, v, do = (q * a.spread).to(dt), k.to(dt), v.to(dt), do.to(dt)
            ref = reference(q, k, v, do, causal)
            candidates = {}
            for backend in a.ours:
                candidates[f"flashattn {backend}"] = (lambda b: lambda q_, k_, v_: flashattn.attention(
                    q_, k_, v_, causal=causal, backend=None if b == "default" else b))(backend)
            for name, backend in SDPA_BACKENDS.items():
                candidates[name] = (lambda b: lambda q_, k_, v_: _sdpa(b, q_, k_, v_, causal))(backend)
            for name, attend in candidates.items():
                try:
                    got = run(attend, q, k, v, do)
                except RuntimeError:  # this SDPA backend does not take the shape here
                    continue
                errors.setdefault(name, []).append([relative_error(x, r) for x, r in zip(got, ref)])
        medians = {name: [statistics.median(e[i] for e in runs) for i in range(4)]
                   for name, runs in errors.items()}
        for name, m in medians.items():
            print(f"| {B}, {H}, {N}, {d} | {'yes' if causal else 'no'} | {name} | "
                  + " | ".join(f"{x:.2e}" for x in m) + " |")
        for mine in (n for n in medians if n.startswith("flashattn")):
            for name, m in medians.items():
                if not name.startswith("flashattn"):
                    print(f"| {B}, {H}, {N}, {d} | {'yes' if causal else 'no'} | {mine} / {name} | "
                          + " | ".join(f"{o / t:.2f}" for o, t in zip(medians[mine], m)) + " |")
    return 0


def _sdpa(backend, q, k, v, causal):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


if __name__ == "__main__":
    sys.exit(main())
