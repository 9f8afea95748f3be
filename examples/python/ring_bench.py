"""examples/python/ring_bench.py — ring attention on W gloo ranks of this machine, timed.

    PYTHONPATH=build/release/python python3 examples/python/ring_bench.py --world-size 2 \\
        --heads 4 --dim 64 --seq 1024,4096 [--causal --layout zigzag] [--threads 1]

Launches W processes of itself (a gloo group through a FileStore in a temporary folder). For
each sequence length n it measures, as medians over --repeat runs:
  compute   one ring step's attention, a full (N_local x N_local) block, on every rank at once;
  transfer  one ring step's K/V exchange alone (batch_isend_irecv: send to r + 1, receive from
            r - 1), and the bandwidth it implies;
  ring      ring_attention's forward, slowest rank;
  single    flashattn.attention on the whole sequence in one process of the same threads (rank 0
            alone, the others waiting), the one-device time;
and prints the scaling model of docs/ring_attention.md beside them: the forward takes
W max(compute, transfer) for a non-causal ring, so the efficiency single / (W ring) is at best
compute / max(compute, transfer). Each rank plays one device with --threads cores: with W ranks
on fewer than W x threads cores they share cores and the times say so.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--heads-kv", type=int, default=None)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--seq", default="1024,4096", help="comma-separated whole-sequence lengths")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--layout", default="contiguous", choices=["contiguous", "zigzag"])
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def launch(args):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--rank", str(r),
                                   "--store", os.path.join(tmp, "store")], env=env)
                 for r in range(args.world_size)]
        return max(p.wait() for p in procs)


def median_time(fn, repeat, before=lambda: None):
    times = []
    for _ in range(repeat):
        before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rank_main(args):
    import torch
    import torch.distributed as dist

    import flashattn
    from flashattn import distributed as fd

    W, r = args.world_size, args.rank
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=r, world_size=W)
    torch.set_num_threads(args.threads)
    B, H, d = args.batch, args.heads, args.dim
    Hkv = args.heads_kv or H
    ring = fd._Ring(None)

    def slowest(seconds):  # the ring's time is its slowest rank's
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    if r == 0:
        print(f"W = {W} gloo ranks, {args.threads} thread(s) each; B = {B}, H = {H}, H_kv = {Hkv}, "
              f"d = {d}, float32, {'causal ' + args.layout if args.causal else 'non-causal'}; "
              f"medians of {args.repeat}")
        print("| n | N_local | compute/step ms | transfer/step ms | link GB/s | ring ms | "
              "single ms | model ring ms | efficiency single/(W ring) | model efficiency |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for n in map(int, args.seq.split(",")):
        gen = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(B, h, n, d, generator=gen) for h in (H, Hkv, Hkv))
        idx = fd.shard_indices(n, W, r, args.layout)
        ql, kl, vl = (x[:, :, idx].contiguous() for x in (q, k, v))
        attend = lambda: flashattn.attention(ql, kl, vl)  # noqa: E731 — one full ring step
        compute = slowest(median_time(attend, args.repeat, dist.barrier))
        kv = torch.stack((kl, vl))
        recv = torch.empty_like(kv)
        transfer = slowest(median_time(lambda: ring.wait(ring.start(kv, recv, 0)),
                                       args.repeat, dist.barrier))
        total = slowest(median_time(
            lambda: fd.ring_attention(ql, kl, vl, causal=args.causal, layout=args.layout),
            args.repeat, dist.barrier))
        single = 0.0
        dist.barrier()
        if r == 0:
            single = median_time(lambda: flashattn.attention(q, k, v, causal=args.causal),
                                 args.repeat)
        dist.barrier()
        if r == 0:
            # The model: W steps of max(compute, transfer). A causal zigzag step computes half
            # a block; the contiguous causal layout is unbalanced (its last rank computes
            # W - 1/2 blocks), which this simple model does not describe.
            step = compute / 2 if args.causal else compute
            modelled = not (args.causal and args.layout == "contiguous")
            model = W * max(step, transfer) if W > 1 else step
            model_efficiency = step / max(step, transfer) if W > 1 else 1.0
            shown = (lambda x, f: f.format(x)) if modelled else (lambda x, f: "n/a")
            print(f"| {n} | {n // W} | {compute * 1e3:.2f} | {transfer * 1e3:.3f} | "
                  f"{kv.numel() * 4 / transfer / 1e9:.2f} | {total * 1e3:.2f} | "
                  f"{single * 1e3:.2f} | {shown(model * 1e3, '{:.2f}')} | "
                  f"{single / (W * total):.2f} | {shown(model_efficiency, '{:.2f}')} |",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    arguments = parse()
    if arguments.rank is None:
        sys.exit(launch(arguments))
    rank_main(arguments)
