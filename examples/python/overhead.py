#!/usr/bin/env python3
"""examples/python/overhead.py — how long a call takes to return on the host: flashattn.attention
against PyTorch's scaled_dot_product_attention, on a small problem whose kernels are short.

A CUDA call only queues work, so what a training step pays for each attention call on the host is
the time until the call returns: argument checks, the operator's dispatch, allocations, launches.
This measures that time, per call, for both, interleaved (one call of each per round), and prints
the median and the 10th/90th percentiles in microseconds. The GPU is synchronized every --sync
rounds, outside the timed calls, so the launch queue never fills (a full queue would make a call
wait for the GPU and be counted as host time).

--operator also times the two operators the way a compiled model calls them (the overloads
torch.ops.flashattn.attention_forward.default and attention_backward.default, through PyTorch's
dispatcher), the backward on one forward's O and LSE: rows "op forward" and "op backward".

--training makes each call a training step's attention: q, k, v viewed out of one (B, N, 3, H, d)
tensor that requires grad (as a model's qkv projection gives them), the forward, and its backward
(torch.autograd.backward with a fixed gradient of O), under --autocast if asked (GPT presets run
under bfloat16 autocast). Its time to return is the host's share of a layer's attention in an
eager training step, forward and backward.

--profile then runs the flashattn calls once more under cProfile (after the timed rounds, so the
profiler's own cost stays out of the table) and prints the 25 functions with the largest
cumulative time, before the table: where the host time that remains goes.

Usage:
  PYTHONPATH=build/gpu/python python3 examples/python/overhead.py [--dtype bfloat16] [--grad]
      [--batch 1 --heads 4 --seq 128 --dim 64] [--rounds 3000] [--operator] [--profile]
      [--training [--autocast bfloat16]]
"""
import argparse
import contextlib
import cProfile
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flashattn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--grad", action="store_true",
                    help="inputs that require grad (the call also records the autograd graph)")
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--sync", type=int, default=50, help="synchronize every N rounds (untimed)")
    ap.add_argument("--operator", action="store_true",
                    help="also time the forward and backward operators called directly, as a "
                         "compiled model calls them (PyTorch >= 2.4)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile --rounds flashattn calls (cProfile, top 25 by cumulative "
                         "time)")
    ap.add_argument("--training", action="store_true",
                    help="each call a forward and its backward on q, k, v viewed out of one "
                         "(B, N, 3, H, d) tensor that requires grad")
    ap.add_argument("--autocast", default="none", choices=["none", "float16", "bfloat16"],
                    help="run the calls under torch.autocast to this dtype")
    a = ap.parse_args()
    if a.training and a.operator:
        ap.error("--training times eager calls; --operator the operators: one at a time")
    if min(a.batch, a.heads, a.seq, a.dim, a.rounds, a.sync) < 1 or a.warmup < 0:
        ap.error("--batch, --heads, --seq, --dim, --rounds and --sync must be at least 1, "
                 "--warmup at least 0")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device: the time to return matters for asynchronous CUDA calls")

    shape = (a.batch, a.heads, a.seq, a.dim)
    dtype = getattr(torch, a.dtype)
    if a.training:
        calls = training_calls(shape, dtype, a.causal)
    else:
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=a.grad)
                   for _ in range(3))
        calls = {
            "flashattn": lambda: flashattn.attention(q, k, v, causal=a.causal),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=a.causal),
        }
    if a.operator:
        if not hasattr(torch.ops.flashattn, "attention_forward"):
            ap.error(f"--operator: PyTorch {torch.__version__} has no flashattn operators (2.4 or "
                     f"newer)")
        forward = torch.ops.flashattn.attention_forward.default
        backward = torch.ops.flashattn.attention_backward.default
        with torch.no_grad():
            o, lse = forward(q, k, v, a.causal, None, None, None, None)
        do = torch.randn_like(o)
        calls["op forward"] = lambda: forward(q, k, v, a.causal, None, None, None, None)
        calls["op backward"] = lambda: backward(q, k, v, o, lse, do, a.causal, None, None, None,
                                                None)
    autocast = (torch.autocast("cuda", dtype=getattr(torch, a.autocast))
                if a.autocast != "none" else contextlib.nullcontext())
    times = {name: [] for name in calls}
    clock = time.perf_counter_ns
    with autocast:
        for round_ in range(a.warmup + a.rounds):
            if round_ % a.sync == 0:
                torch.cuda.synchronize()
            for name, call in calls.items():
                start = clock()
                out = call()
                elapsed = clock() - start
                del out  # freed (for reuse on the stream) outside the timed region
                if round_ >= a.warmup:
                    times[name].append(elapsed / 1000)
        torch.cuda.synchronize()
        if a.profile:
            profile(calls["flashattn"], a.rounds, a.sync)

    what = ("forward + backward on views of one (B, N, 3, H, d) tensor" if a.training
            else "requires_grad" if a.grad else "")
    print(f"time to return of one call, microseconds: {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}; q, k, v {shape} {a.dtype}{', causal' if a.causal else ''}"
          f"{', ' + what if what else ''}"
          f"{', autocast ' + a.autocast if a.autocast != 'none' else ''}; {a.rounds} calls each, "
          f"interleaved")
    medians = {}
    for name, values in times.items():
        deciles = statistics.quantiles(values, n=10)
        medians[name] = statistics.median(values)
        print(f"  {name:11s} median {medians[name]:7.1f}   p10 {deciles[0]:7.1f}   "
              f"p90 {deciles[-1]:7.1f}")
    extra = medians["flashattn"] - medians["sdpa"]
    print(f"  flashattn - sdpa: {extra:+.1f} us per call (target: at most +10)")
    return 0


def training_calls(shape, dtype, causal):
    """A training step's attention for each contender: q, k, v viewed out of one (B, N, 3, H, d)
    tensor that requires grad (a model's qkv projection, split and transposed), the forward, and
    the backward with a fixed gradient of O. Each call accumulates into that tensor's .grad, the
    same work for both."""
    B, H, N, d = shape
    x = torch.randn((B, N, 3, H, d), device="cuda", dtype=dtype, requires_grad=True)
    grad_o = torch.randn(shape, device="cuda", dtype=dtype)

    def step(attend):
        def call():
            q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
            torch.autograd.backward(attend(q, k, v), grad_o)
        return call

    return {
        "flashattn": step(lambda q, k, v: flashattn.attention(q, k, v, causal=causal)),
        "sdpa": step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)),
    }


def profile(call, rounds, sync):
    """call() `rounds` times under cProfile, synchronizing every `sync` calls outside the profile;
    prints the 25 functions with the largest cumulative time."""
    profiler = cProfile.Profile()
    for round_ in range(rounds):
        if round_ % sync == 0:
            torch.cuda.synchronize()
        profiler.enable()
        out = call()
        profiler.disable()
        del out
    torch.cuda.synchronize()
    print(f"flashattn calls under cProfile ({rounds} calls; the profiler slows each Python call):")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    sys.exit(main())
