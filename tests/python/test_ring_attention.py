"""tests/python/test_ring_attention.py — flashattn.distributed: ring attention on gloo CPU ranks.

Each world size (2 and 4) is launched once: W processes of tests/python/ring_worker.py join a gloo
group through a FileStore in a temporary folder and run every case, writing their shards of O,
LSE, dQ, dK, dV. Here the shards are put back together with shard_indices and checked against
the float64 reference of the whole sequence (tests/python/reference.py) by the rule of
docs/design.md (2x the error of float32 standard attention, + 1e-6), O, LSE and each gradient;
single-process flashattn.attention on the whole sequence, with autograd, must meet the same
bound (the ring is held to what one process gives). Cases: causal and not, both layouts, GQA,
N_local of 7, 13, 14, 33 and 34 (no tile multiple), d = 16 and 24, a sub-group of ranks 1 and 3
(group ranks differ from global ones) and a ring of one rank. Error cases check that a bad
argument on one rank raises on every rank (none left waiting), and the group still works after.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this PyTorch has no torch.distributed with gloo", allow_module_level=True)

sys.path.insert(0, os.path.dirname(__file__))
import reference  # noqa: E402
from test_flashattn import check_rule, lse_eps  # noqa: E402

import flashattn  # noqa: E402
from flashattn import distributed as fd  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "ring_worker.py")
SEED = int(os.environ.get("FLASHATTN_TEST_SEED", "2024"))
TIMEOUT_S = 120  # a hung ring fails the test instead of blocking CI


# --- in one process: sharding, the step plan, the checks -------------------------------------


@pytest.mark.parametrize("layout", fd.LAYOUTS)
@pytest.mark.parametrize("W", [1, 2, 3, 4, 8])
def test_shard_indices_partition_the_sequence(W, layout):
    n = 2 * W * 7
    shards = [fd.shard_indices(n, W, r, layout) for r in range(W)]
    assert all(s.dtype == torch.int64 and len(s) == n // W for s in shards)
    assert torch.equal(torch.sort(torch.cat(shards)).values, torch.arange(n))
    for r, s in enumerate(shards):
        assert torch.equal(s, torch.sort(s).values)  # increasing: a shard keeps token order
        if layout == "zigzag":  # chunks r and 2W - 1 - r of 2W chunks of 7
            c = 7
            expected = list(range(r * c, (r + 1) * c)) + list(range((2 * W - 1 - r) * c,
                                                                    (2 * W - r) * c))
            assert s.tolist() == expected
        else:
            assert s.tolist() == list(range(r * 2 * 7, (r + 1) * 2 * 7))


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    W, n = 4, 8 * 5
    for layout, balanced in (("zigzag", True), ("contiguous", False)):
        work = []
        for r in range(W):
            idx = fd.shard_indices(n, W, r, layout)
            work.append(int((idx[:, None] >= torch.arange(n)[None, :]).sum()))  # visible pairs
        assert (len(set(work)) == 1) == balanced, (layout, work)


def test_shard_indices_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"n = 10: layout 'zigzag' .* multiple of 8"):
        fd.shard_indices(10, 4, 0, "zigzag")
    with pytest.raises(ValueError, match=r"n = 10: layout 'contiguous' .* multiple of 4"):
        fd.shard_indices(10, 4, 0)
    with pytest.raises(ValueError, match=r"rank = 4: must be less than world_size = 4"):
        fd.shard_indices(16, 4, 4)
    with pytest.raises(ValueError, match=r"layout = 'diagonal'"):
        fd.shard_indices(16, 4, 0, "diagonal")
    with pytest.raises(TypeError, match=r"world_size must be an int"):
        fd.shard_indices(16, True, 0)
    with pytest.raises(ValueError, match=r"n = 0"):
        fd.shard_indices(0, 1, 0)


@pytest.mark.parametrize("layout", fd.LAYOUTS)
@pytest.mark.parametrize("W", [1, 2, 3, 5])
def test_each_steps_plan_covers_exactly_the_visible_pairs(W, layout):
    """The block plan of every (rank, source) pair against the causal mask of the whole sequence
    on the tokens the two ranks hold: the planned rectangle (lower triangle when causal) must be
    the set of visible (query, key) pairs, and a skipped step must have none."""
    n_local = 2 * 3
    n = W * n_local
    for rank in range(W):
        queries = fd.shard_indices(n, W, rank, layout)
        for src in range(W):
            keys = fd.shard_indices(n, W, src, layout)
            for causal in (False, True):
                visible = (keys[None, :] <= queries[:, None]) if causal else \
                    torch.ones(n_local, n_local, dtype=torch.bool)
                planned = torch.zeros(n_local, n_local, dtype=torch.bool)
                plan = fd._block_plan(causal, layout, rank, src, n_local)
                if plan is not None:
                    rows, cols, block_causal = plan
                    block = planned[rows, cols]
                    block[:] = True
                    if block_causal:
                        block[:] = torch.ones_like(block).tril()
                    planned[rows, cols] = block
                assert torch.equal(planned, visible), (rank, src, causal)


def test_the_transport_must_carry_the_tensors_device():
    with pytest.raises(ValueError, match=r"q is on cpu: the process group's backend is nccl"):
        fd._check_transport("nccl", torch.zeros(1))
    fd._check_transport("gloo", torch.zeros(1))  # the pair the tests run
    fd._check_transport("mpi", torch.zeros(1))   # not judged here: the backend's own rules


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(),
                                reason="needs a CUDA device and NCCL")


@needs_cuda
def test_a_ranks_check_of_cuda_tensors_chooses_their_backend():
    # Each rank checks its arguments before the ring starts; for CUDA tensors that includes the
    # backend flashattn.attention would choose for q's shape (B, H, N_local, d).
    q, k, v = (torch.randn(1, 4, 96, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    found = dict(fd._local_check(q, k, v, True, None, "contiguous", None, False, "nccl"))
    assert found["q shape"] == (1, 4, 96, 64)
    assert found["backend"] in ("cuda-fa3", "cuda-tc")
    found = dict(fd._local_check(q, k, v, True, None, "contiguous", "cuda-tc", False, "nccl"))
    assert found["backend"] == "cuda-tc"


_NCCL_ONE_RANK = r"""
import sys, numpy as np, torch, torch.distributed as dist
from flashattn.distributed import ring_attention
store, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
torch.cuda.set_device(0)
g = torch.Generator(device="cuda").manual_seed(seed)
shapes = ((1, 4, 203, 64), (1, 2, 203, 64), (1, 2, 203, 64), (1, 4, 203, 64))  # GQA, ragged N
q, k, v, do = (torch.randn(s, device="cuda", dtype=torch.float16, generator=g) for s in shapes)
saved = {n: x.float().cpu().numpy() for n, x in zip(("q", "k", "v", "do"), (q, k, v, do))}
for causal in (False, True):
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    o = ring_attention(*xs, causal=causal)
    o.backward(do)
    for n, x in zip(("o", "dq", "dk", "dv"), [o.detach()] + [x.grad for x in xs]):
        saved[f"{n}_{causal}"] = x.float().cpu().numpy()
np.savez(out, **saved)
dist.destroy_process_group()
"""


@needs_cuda
def test_a_ring_of_one_nccl_rank_on_cuda_tensors_within_2x_of_pytorch(tmp_path):
    # The CUDA path end to end: an NCCL group of one process (its own, so that this one keeps no
    # process group), float16, GQA, N = 203, causal and not, forward and backward. O and the
    # gradients against float64 on the same rounded inputs, within 2x of the error of PyTorch's
    # SDPA on the same tensors (the rule of docs/design.md, as test_flashattn.py's CUDA cases).
    from torch.nn.attention.bias import causal_lower_right
    out = subprocess.run([sys.executable, "-c", _NCCL_ONE_RANK, str(tmp_path / "store"),
                          str(SEED), str(tmp_path / "ring.npz")],
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    got = np.load(tmp_path / "ring.npz")
    rounded = [got[n].astype(np.float64) for n in ("q", "k", "v", "do")]
    tensors = [torch.tensor(got[n], device="cuda", dtype=torch.float16)
               for n in ("q", "k", "v", "do")]
    for causal in (False, True):
        ref_o, _ = reference.attention(*rounded[:3], causal=causal)
        ref = [ref_o, *reference.attention_backward(*rounded, causal=causal)]
        xs = [t.clone().requires_grad_() for t in tensors[:3]]
        mask = causal_lower_right(203, 203) if causal else None
        o = torch.nn.functional.scaled_dot_product_attention(*xs, attn_mask=mask, enable_gqa=True)
        o.backward(tensors[3])
        theirs = [o.detach()] + [x.grad for x in xs]
        for name, b, r in zip(("o", "dq", "dk", "dv"), theirs, ref):
            eps = 1e-4 * max(1.0, float(np.abs(r).max()))
            check_rule(f"{name} causal={causal}", got[f"{name}_{causal}"].astype(np.float64),
                       b.double().cpu().numpy(), r, eps)


def test_import_flashattn_works_without_torch_and_distributed_says_what_it_needs():
    code = ("import sys; sys.modules['torch'] = None\n"  # `import torch` now fails
            "import flashattn\n"
            "assert 'attention' in dir(flashattn)\n"
            "try:\n"
            "    import flashattn.distributed\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "flashattn.distributed needs PyTorch" in out.stdout


def test_calling_without_an_initialized_process_group_says_so():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    x = torch.zeros(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        fd.ring_attention(x, x, x)


# --- W processes: results against float64, errors on every rank ------------------------------


def result_cases(W):
    """(id, case) pairs: both layouts, causal and not, two shapes; sub-groups for W = 4."""
    cases = []
    for layout in fd.LAYOUTS:
        for causal in (False, True):
            # N_local: 13 and 7 contiguous, 14 and 34 zigzag (two chunks of 7 and 17 tokens)
            for B, H, Hkv, n_local, d in ((1, 4, 2, 13, 16), (2, 3, 1, 33, 24)):
                if layout == "zigzag":
                    n_local = 14 if n_local == 13 else 34
                cases.append(dict(layout=layout, causal=causal, B=B, H=H, Hkv=Hkv,
                                  n=W * n_local, d=d, W=W))
    if W == 4:
        cases.append(dict(layout="zigzag", causal=True, B=1, H=2, Hkv=2, n=2 * 14, d=16, W=2,
                          ranks=[1, 3]))
        cases.append(dict(layout="contiguous", causal=True, B=1, H=2, Hkv=1, n=9, d=16, W=1,
                          ranks=[2]))
    for i, case in enumerate(cases):
        case.update(kind="result", id=f"W{W}-{i}", seed=SEED * 100 + 10 * W + i)
    return cases


# Error cases: (id, change, on which rank, expected exception, text its message must contain).
ERROR_CASES = [
    ("rows", ("rows", 1), 1, ValueError, "q shape differ across ranks"),
    ("dtype", ("q_dtype", "bfloat16"), 1, ValueError, "q dtype differ across ranks"),
    ("causal", ("causal", False), 0, ValueError, "causal differ across ranks"),
    ("numpy", ("k_numpy", None), 1, TypeError, "rank 1: k must be a torch.Tensor"),
    ("zigzag-odd", ("layout", "zigzag"), "all", ValueError, "N_local must be even"),
    ("layout", ("layout", "spiral"), 1, ValueError, "rank 1: layout = 'spiral'"),
    ("scores", ("q_filled", 1e38), 1, ValueError, "beyond what float32 holds"),
]


def error_cases(W):
    cases = [dict(kind="error", id=name, change=change, on_rank=rank, n_local=7 if
                  name == "zigzag-odd" else 6) for name, change, rank, _, _ in ERROR_CASES]
    return cases


def all_result_cases(W):
    """The result cases, then one after the error cases: the group must still work once every
    rank has raised."""
    cases = result_cases(W)
    last = dict(cases[5], id=f"W{W}-after-errors", seed=SEED * 100 + 99)
    return cases + [last]


def autocast_case(W):
    """Causal zigzag GQA shards run under CPU autocast (bfloat16): ring_attention casts them as
    flashattn.attention does (tests/python/ring_worker.py, run_autocast_case)."""
    return dict(kind="autocast", id=f"W{W}-autocast", layout="zigzag", causal=True, B=1, H=4,
                Hkv=2, n=W * 22, d=16, W=W, seed=SEED * 100 + 77)


def launch(W, tmp):
    """Runs W ranks on every case; returns the errors each rank saw, by case id."""
    results = all_result_cases(W)
    with open(tmp / "cases.json", "w") as f:
        json.dump(results[:-1] + error_cases(W) + [autocast_case(W)] + results[-1:], f)
    env = dict(os.environ, OMP_NUM_THREADS="1")  # W ranks share the machine's cores
    procs = [subprocess.Popen([sys.executable, WORKER, str(W), str(r), str(tmp / "store"),
                               str(tmp / "cases.json"), str(tmp)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(W)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"ring of {W} ranks did not finish within {TIMEOUT_S} s (a rank hung)")
    failed = [f"rank {r} exited with {p.returncode}:\n{log}"
              for r, (p, log) in enumerate(zip(procs, logs)) if p.returncode != 0]
    assert not failed, "\n".join(failed)  # every rank's log: the first to fail explains the rest
    errors = []
    for r in range(W):
        with open(tmp / f"errors_rank{r}.jsonl") as f:
            errors.append({e["id"]: e for e in map(json.loads, f)})
    return errors


_RUNS = {}  # W -> (folder, errors): each world size is launched once for all its tests


def ring_run(W, tmp_path_factory):
    if W not in _RUNS:
        tmp = tmp_path_factory.mktemp(f"ring{W}")
        _RUNS[W] = tmp, launch(W, tmp)
    return _RUNS[W]


def unsharded(case, tmp):
    """The ranks' shards of O, LSE, dQ, dK, dV put back in sequence order."""
    W, n = case["W"], case["n"]
    ranks = case.get("ranks") or list(range(W))
    parts = [np.load(tmp / f"case_{case['id']}_rank{r}.npz") for r in ranks]
    whole = {}
    for name in ("o", "lse", "dq", "dk", "dv"):
        shape = list(parts[0][name].shape)
        shape[2] = n
        whole[name] = np.full(shape, np.nan, np.float32)  # a token no rank wrote stays NaN
        for group_rank, part in enumerate(parts):
            idx = fd.shard_indices(n, W, group_rank, case["layout"]).numpy()
            assert np.array_equal(part["idx"], idx)
            whole[name][:, :, idx] = part[name]
    return whole


def full_inputs(case):
    """The case's q, k, v, do, as tests/python/ring_worker.py draws them from the seed."""
    rng = np.random.default_rng(case["seed"])
    B, H, Hkv, n, d = case["B"], case["H"], case["Hkv"], case["n"], case["d"]
    return [rng.standard_normal(s).astype(np.float32)
            for s in ((B, H, n, d), (B, Hkv, n, d), (B, Hkv, n, d), (B, H, n, d))]


def single_process(q, k, v, do, causal):
    """flashattn.attention on the whole sequence, its gradients through autograd."""
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    o, lse = flashattn.attention(tq, tk, tv, causal=causal, return_lse=True)
    o.backward(torch.from_numpy(do))
    return dict(o=o.detach().numpy(), lse=lse.numpy(), dq=tq.grad.numpy(), dk=tk.grad.numpy(),
                dv=tv.grad.numpy())


def case_id(W, case):
    ranks = f"-ranks{''.join(map(str, case['ranks']))}" if case.get("ranks") else ""
    return (f"W{W}-{case['layout']}-{'causal' if case['causal'] else 'full'}-"
            f"n{case['n']}-d{case['d']}-H{case['H']}kv{case['Hkv']}{ranks}"
            f"{'-after-errors' if case['id'].endswith('after-errors') else ''}")


RESULT_PARAMS = [(W, i) for W in (2, 4) for i in range(len(all_result_cases(W)))]


@pytest.mark.parametrize("W,i", RESULT_PARAMS,
                         ids=[case_id(W, all_result_cases(W)[i]) for W, i in RESULT_PARAMS])
def test_ring_attention_and_its_gradients_equal_whole_sequence_attention(W, i,
                                                                         tmp_path_factory):
    tmp, _ = ring_run(W, tmp_path_factory)
    case = all_result_cases(W)[i]
    q, k, v, do = full_inputs(case)
    causal = case["causal"]
    ring = unsharded(case, tmp)
    ref_o, ref_lse = reference.attention(q, k, v, np.float64, causal=causal)
    std_o, std_lse = reference.attention(q, k, v, np.float32, causal=causal)
    ref_grads = reference.attention_backward(q, k, v, do, np.float64, causal=causal)
    std_grads = reference.attention_backward(q, k, v, do, np.float32, causal=causal)
    one = single_process(q, k, v, do, causal)
    for result, who in ((ring, "ring"), (one, "single process")):
        check_rule(f"{who}: O", result["o"], std_o, ref_o, 1e-6)
        check_rule(f"{who}: LSE", result["lse"], std_lse, ref_lse, lse_eps(ref_lse))
        for name, ref, std in zip(("dq", "dk", "dv"), ref_grads, std_grads):
            check_rule(f"{who}: {name}", result[name], std, ref, 1e-6)


@pytest.mark.parametrize("W", [2, 4])
def test_under_autocast_the_ring_casts_its_shards_as_attention_does(W, tmp_path_factory):
    """Under CPU autocast (bfloat16) every rank's float32 shards run in bfloat16: O in bfloat16,
    the gradients back in float32, each the bits of the ring on shards cast by hand; and the
    whole O within bfloat16's rounding of float64 attention on the rounded inputs."""
    tmp, _ = ring_run(W, tmp_path_factory)
    case = autocast_case(W)
    parts = [np.load(tmp / f"case_{case['id']}_rank{r}.npz") for r in range(W)]
    for r, part in enumerate(parts):
        assert str(part["o_dtype"]) == "torch.bfloat16", f"rank {r}"
        assert list(part["grad_dtypes"]) == ["torch.float32"] * 3, f"rank {r}"
        assert bool(part["same_o"]) and all(part["same_grads"]), f"rank {r}"
    q, k, v, _ = (torch.from_numpy(x).to(torch.bfloat16).double().numpy()
                  for x in full_inputs(case))
    ref_o, _ = reference.attention(q, k, v, np.float64, causal=True)
    o = np.full(ref_o.shape, np.nan)
    for r, part in enumerate(parts):
        o[:, :, fd.shard_indices(case["n"], W, r, "zigzag").numpy()] = part["o"]
    assert np.abs(o - ref_o).max() < 2e-2 * np.abs(ref_o).max()


@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("name,change,on_rank,error,text", ERROR_CASES,
                         ids=[c[0] for c in ERROR_CASES])
def test_a_bad_argument_on_any_rank_raises_on_every_rank(W, name, change, on_rank, error, text,
                                                         tmp_path_factory):
    _, errors = ring_run(W, tmp_path_factory)
    for rank in range(W):
        seen = errors[rank][name]
        assert seen["raised"] == error.__name__, f"rank {rank}: {seen}"
        assert text in seen["message"], f"rank {rank}: {seen['message']}"
    assert len({errors[r][name]["message"] for r in range(W)}) == 1  # the same words everywhere
