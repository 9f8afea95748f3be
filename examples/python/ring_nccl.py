#!/usr/bin/env python3
"""examples/python/ring_nccl.py — ring attention over NCCL on the GPUs of one host, checked and timed.

    PYTHONPATH=build/gpu/python python3 examples/python/ring_nccl.py OUT_DIR [--world-size W]

W processes (one per GPU; default: every GPU of the host) join an NCCL group through a file
store in OUT_DIR. For each case below each rank runs ring_attention's forward and backward on its
shard of the sequence; rank 0 gathers the shards and prints the largest error of O, dQ, dK and dV
against float64 on the CPU ("ring-f64"), beside that of flashattn.attention on the whole sequence
on one GPU in the same dtype ("one-f64"), and the difference of the two ("ring-one"). Then it
times forward + backward at a long sequence (bfloat16, B 1, H 16, d 128, n 32768 or the multiple
of 2 W below it; causal zigzag and non-causal contiguous): the ring on W GPUs against one GPU
alone, medians of 10 after 2 warm-ups, with the speed-up and the efficiency speed-up / W. The lines are printed and written
to OUT_DIR/ring_nccl.txt. docs/ring_attention.md has a run.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashattn
from flashattn.distributed import ring_attention, shard_indices

# B, H, H_kv, n per rank (n = W times it: zigzag cuts n into 2 W equal chunks), d, dtype, causal,
# layout. None of the shard lengths is a multiple of a tile.
CASES = [
    (1, 4, 2, 334, 64, torch.float16, True, "zigzag"),
    (2, 8, 8, 500, 128, torch.bfloat16, False, "contiguous"),
    (1, 4, 4, 258, 64, torch.float32, True, "contiguous"),
]


def reference(q, k, v, do, causal):
    """float64 O and gradients on the CPU (autograd through softmax attention)."""
    q, k, v, do = (x.detach().double().cpu() for x in (q, k, v, do))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = s.softmax(-1) @ vv
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def worker(rank, W, store, out):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=W)
    lines = []
    for ci, (B, H, Hkv, n_rank, d, dtype, causal, layout) in enumerate(CASES):
        n = W * n_rank
        gen = torch.Generator().manual_seed(100 + ci)
        q, k, v, do = (torch.randn(s, generator=gen) for s in
                       ((B, H, n, d), (B, Hkv, n, d), (B, Hkv, n, d), (B, H, n, d)))
        idx = shard_indices(n, W, rank, layout)
        ql, kl, vl = (x[:, :, idx].to("cuda", dtype).requires_grad_() for x in (q, k, v))
        o = ring_attention(ql, kl, vl, causal=causal, layout=layout)
        o.backward(do[:, :, idx].to("cuda", dtype))
        parts = [t.detach().float().contiguous() for t in (o, ql.grad, kl.grad, vl.grad)]
        gathered = [[torch.empty_like(t) for _ in range(W)] for t in parts]
        for t, g in zip(parts, gathered):
            dist.all_gather(g, t)
        if rank == 0:
            whole = []
            for g in gathered:
                full = torch.empty(g[0].shape[:2] + (n,) + g[0].shape[3:], device="cuda")
                for r in range(W):
                    full[:, :, shard_indices(n, W, r, layout).cuda()] = g[r]
                whole.append(full.cpu().double())
            tq, tk, tv = (x.to("cuda", dtype).requires_grad_() for x in (q, k, v))
            one = flashattn.attention(tq, tk, tv, causal=causal)
            one.backward(do.to("cuda", dtype))
            single = [t.detach().cpu().double() for t in (one, tq.grad, tk.grad, tv.grad)]
            ref = reference(q, k, v, do, causal)
            for name, a, b, r in zip(("O", "dQ", "dK", "dV"), whole, single, ref):
                lines.append(f"{ci} {str(dtype)[6:]:8s} causal={causal!s:5s} {layout:10s} {name:2s}"
                             f"  ring-f64 {float((a - r).abs().max()):.3e}"
                             f"  one-f64 {float((b - r).abs().max()):.3e}"
                             f"  ring-one {float((a - b).abs().max()):.3e}")
    # Timing: forward + backward of the ring (each rank its shard) against one GPU (rank 0 alone).
    n_long = 32768 - 32768 % (2 * W)  # 32768 itself for W = 2, 4, 8
    for (B, H, n, d, causal, layout) in ((1, 16, n_long, 128, True, "zigzag"),
                                         (1, 16, n_long, 128, False, "contiguous")):
        dtype = torch.bfloat16
        idx = shard_indices(n, W, rank, layout).cuda()
        q, k, v, do = (torch.randn(B, H, n, d, device="cuda", dtype=dtype) for _ in range(4))
        ql, kl, vl = (x[:, :, idx].contiguous().requires_grad_() for x in (q, k, v))
        dol = do[:, :, idx].contiguous()
        def ring_step():
            o = ring_attention(ql, kl, vl, causal=causal, layout=layout)
            o.backward(dol)
        def timed(fn, reps=10, everyone=True):
            ts = []
            for i in range(reps + 2):
                torch.cuda.synchronize(); dist.barrier()
                t0 = time.perf_counter()
                if everyone or rank == 0:
                    fn()
                torch.cuda.synchronize(); dist.barrier()
                if i >= 2:
                    ts.append(time.perf_counter() - t0)
            return statistics.median(ts) * 1e3, min(ts) * 1e3, max(ts) * 1e3
        ring = timed(ring_step)
        tq, tk, tv = (x.clone().requires_grad_() for x in (q, k, v))
        def one_step():
            o = flashattn.attention(tq, tk, tv, causal=causal)
            o.backward(do)
        single = timed(one_step, everyone=False)
        flops = 4 * B * H * n * n * d * 3.5 / (2 if causal else 1)
        lines.append(f"time bf16 B={B} H={H} n={n} d={d} causal={causal} {layout}: ring (W={W}) "
                     f"{ring[0]:.2f} ms ({ring[1]:.2f}-{ring[2]:.2f}), one GPU {single[0]:.2f} ms "
                     f"({single[1]:.2f}-{single[2]:.2f}); speed-up {single[0] / ring[0]:.2f}x, "
                     f"efficiency {single[0] / (W * ring[0]):.2f}; one GPU {flops / single[0] / 1e9:.0f} TFLOP/s")
    if rank == 0:
        with open(os.path.join(out, "ring_nccl.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="folder for the file store and ring_nccl.txt (created)")
    ap.add_argument("--world-size", type=int, default=None,
                    help="ranks, one per GPU (default: every GPU of this host)")
    a = ap.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    W = a.world_size if a.world_size is not None else gpus
    if W < 2 or W > gpus or not dist.is_nccl_available():
        ap.error(f"needs 2 or more CUDA GPUs and NCCL (this host has {gpus} GPU(s); "
                 f"--world-size {W})")
    os.makedirs(a.out, exist_ok=True)
    store = os.path.join(a.out, "store")
    if os.path.exists(store):
        os.remove(store)
    mp.spawn(worker, args=(W, store, a.out), nprocs=W, join=True)


if __name__ == "__main__":
    main()
