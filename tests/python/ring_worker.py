"""tests/python/ring_worker.py — one rank of a gloo process group, for test_ring_attention.py.

    ring_worker.py WORLD_SIZE RANK STORE_FILE CASES_JSON OUT_DIR

Joins the group through a FileStore (no TCP port to pick), runs every case of CASES_JSON that
involves this rank, and writes what it got into OUT_DIR: per result case, this rank's shard of O,
LSE and the gradients (case_<id>_rank<r>.npz); per error case, the exception it saw (a JSON line
in errors_rank<r>.jsonl). The inputs of a case are drawn from its seed, the same on every rank and
in the test, which checks the results; this file only runs the ring.
"""
import json
import sys

import numpy as np
import torch
import torch.distributed as dist

from flashattn.distributed import ring_attention, shard_indices


def full_inputs(case):
    """q, k, v, do of the whole sequence, float32 NumPy, from the case's seed."""
    rng = np.random.default_rng(case["seed"])
    B, H, Hkv, n, d = case["B"], case["H"], case["Hkv"], case["n"], case["d"]
    return [rng.standard_normal(s).astype(np.float32)
            for s in ((B, H, n, d), (B, Hkv, n, d), (B, Hkv, n, d), (B, H, n, d))]


def run_result_case(case, group, out_dir, rank):
    W, r = dist.get_world_size(group), dist.get_rank(group)
    q, k, v, do = full_inputs(case)
    idx = shard_indices(case["n"], W, r, case["layout"]).numpy()
    ql, kl, vl = (torch.from_numpy(x[:, :, idx]).requires_grad_() for x in (q, k, v))
    o, lse = ring_attention(ql, kl, vl, causal=case["causal"], layout=case["layout"],
                            group=group, return_lse=True)
    o.backward(torch.from_numpy(do[:, :, idx]))
    np.savez(f"{out_dir}/case_{case['id']}_rank{rank}.npz", idx=idx, o=o.detach().numpy(),
             lse=lse.numpy(), dq=ql.grad.numpy(), dk=kl.grad.numpy(), dv=vl.grad.numpy())


def run_autocast_case(case, group, out_dir, rank):
    """ring_attention under CPU autocast (bfloat16) on float32 shards, and on shards cast to
    bfloat16 by hand without autocast: O's dtype, the gradients' dtypes, and whether the two runs
    gave the same bits (O, and the gradients once cast back to float32)."""
    W, r = dist.get_world_size(group), dist.get_rank(group)
    q, k, v, do = full_inputs(case)
    idx = shard_indices(case["n"], W, r, case["layout"]).numpy()
    do_l = torch.from_numpy(do[:, :, idx]).to(torch.bfloat16)
    xs = [torch.from_numpy(x[:, :, idx]).requires_grad_() for x in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = ring_attention(*xs, causal=case["causal"], layout=case["layout"], group=group)
    o.backward(do_l)
    cast = [x.detach().to(torch.bfloat16).requires_grad_() for x in xs]
    o_cast = ring_attention(*cast, causal=case["causal"], layout=case["layout"], group=group)
    o_cast.backward(do_l)
    np.savez(f"{out_dir}/case_{case['id']}_rank{rank}.npz", idx=idx,
             o_dtype=str(o.dtype), grad_dtypes=[str(x.grad.dtype) for x in xs],
             same_o=torch.equal(o, o_cast),
             same_grads=[torch.equal(x.grad, c.grad.float()) for x, c in zip(xs, cast)],
             o=o.detach().float().numpy())


def bad_arguments(case, rank):
    """The arguments of an error case as this rank passes them: every rank a good shard, except
    where the case changes one rank's (or every rank's) argument."""
    n_local = case.get("n_local", 6)
    x = torch.randn(1, 2, n_local, 8)
    args = dict(q=x, k=x.clone(), v=x.clone(), causal=True, layout="contiguous")
    if case["on_rank"] in (rank, "all"):
        name, value = case["change"]
        if name == "rows":  # q, k and v agree on this rank, not with the other ranks
            args["q"], args["k"], args["v"] = (torch.randn(1, 2, n_local + value, 8)
                                               for _ in range(3))
        elif name == "q_dtype":
            args["q"], args["k"], args["v"] = (a.to(getattr(torch, value)) for a in
                                               (args["q"], args["k"], args["v"]))
        elif name == "k_numpy":
            args["k"] = args["k"].numpy()
        elif name == "q_filled":  # scores beyond float32 against any key of the sequence
            args["q"] = torch.full_like(args["q"], value)
        else:
            args[name] = value
    return args


def main():
    W, rank, store, cases_file, out_dir = sys.argv[1:6]
    W, rank = int(W), int(rank)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=W)
    with open(cases_file) as f:
        cases = json.load(f)
    # Sub-groups are made by every rank, in one order (torch.distributed's rule for new_group).
    groups = {}
    for case in cases:
        key = tuple(case.get("ranks") or ())
        if key and key not in groups:
            groups[key] = dist.new_group(list(key))
    errors = []
    for case in cases:
        ranks = case.get("ranks")
        if ranks and rank not in ranks:
            continue
        group = groups[tuple(ranks)] if ranks else None
        if case["kind"] == "result":
            run_result_case(case, group, out_dir, rank)
        elif case["kind"] == "autocast":
            run_autocast_case(case, group, out_dir, rank)
        else:
            try:
                args = bad_arguments(case, rank)
                ring_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)
                errors.append({"id": case["id"], "raised": None})
            except Exception as error:  # noqa: BLE001 — recorded for the test to judge
                errors.append({"id": case["id"], "raised": type(error).__name__,
                               "message": str(error)})
    with open(f"{out_dir}/errors_rank{rank}.jsonl", "w") as f:
        for e in errors:
            f.write(json.dumps(e) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
