"""tests/python/test_eager_calls.py — an eager call on tensors: the implementation without the
operator's dispatch, and its checks run once per signature (docs/python.md, "Where a call's host
time goes").

What must hold, shown here on CPU tensors (CUDA tensors take the same code up to the device):
  * a call whose signature was planned before gives the bits of a call planned afresh, forward,
    backward and autograd;
  * a bad call after a good one of the same shapes (another dtype, device, layout, option type or
    value) raises what it raises with nothing kept: errors are never kept;
  * autograd through the eager path is flashattn's own backward: the graph's node is
    _AttentionFunction, and the gradients meet the 2x rule against float64 and are those of
    attention_backward;
  * the operator is still taken where something acts on operators (a tensor subclass, a dispatch
    mode). PyTorch < 2.4 has no operator, so a stand-in is put in its place to see which way a
    call goes.
Run: PYTHONPATH=<build>/python python3 -m pytest tests/python   (CTest does this).
"""
import decimal
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import reference  # noqa: E402

import flashattn  # noqa: E402

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(int(os.environ.get("FLASHATTN_TEST_SEED", "2024")) + 11)


def tensors(*shapes, dtype=torch.float32):
    return [torch.tensor(RNG.standard_normal(s).astype(np.float32)).to(dtype) for s in shapes]


def max_error(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    both = np.isfinite(out) & np.isfinite(ref)
    return float(np.max(np.abs(out[both] - ref[both]), initial=0.0))


def raised(call):
    """(type, message) of what call() raises; fails if it returns."""
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    return type(info.value), str(info.value)


# (q shape, k/v shape, options, dtype): GQA and ragged, 2-D with a negative scale, 16-bit.
CASES = [
    ((2, 4, 37, 16), (2, 2, 53, 16), dict(causal=True), torch.float32),
    ((9, 16), (11, 16), dict(scale=-0.3), torch.float32),
    ((1, 2, 7, 8), (1, 1, 11, 8), dict(causal=True), torch.float16),
    ((1, 3, 13, 24), (1, 3, 5, 24), dict(scale=0.2), torch.bfloat16),
]


# --- a kept plan ------------------------------------------------------------------------------


@pytest.mark.parametrize("qs, ks, options, dtype", CASES)
def test_a_kept_plan_gives_the_bits_of_a_fresh_one(qs, ks, options, dtype):
    q, k, v, do = tensors(qs, ks, ks, qs, dtype=dtype)
    flashattn._PLANS.clear()
    planned_o, planned_lse = flashattn.attention(q, k, v, return_lse=True, **options)
    assert len(flashattn._PLANS) == 1
    kept_o, kept_lse = flashattn.attention(q, k, v, return_lse=True, **options)
    assert len(flashattn._PLANS) == 1
    assert torch.equal(kept_o, planned_o) and torch.equal(kept_lse, planned_lse)
    assert kept_o.dtype == dtype and kept_o.shape == q.shape and kept_lse.shape == q.shape[:-1]

    # The kept plan is what the checks derive again.
    scale = options.get("scale")
    causal = options.get("causal", False)
    (key, plan), = flashattn._PLANS.items()
    assert plan == flashattn._forward_plan(q, k, v, causal, scale, None, None, None)

    planned = flashattn.attention_backward(q, k, v, kept_o, kept_lse, do, **options)
    kept = flashattn.attention_backward(q, k, v, kept_o, kept_lse, do, **options)
    assert len(flashattn._PLANS) == 2
    for a, b, x in zip(planned, kept, (q, k, v)):
        assert torch.equal(a, b) and a.dtype == x.dtype and a.shape == x.shape


def test_the_workspace_settings_are_part_of_the_signature(monkeypatch):
    """The C++ side reads FLASHATTN_VARIANT and FLASHATTN_DETERMINISTIC at each call and sizes a
    workspace by them: a change of either is another signature."""
    q, k, v = tensors((1, 2, 9, 8), (1, 1, 11, 8), (1, 1, 11, 8))
    flashattn._PLANS.clear()
    flashattn.attention(q, k, v)
    monkeypatch.setenv("FLASHATTN_DETERMINISTIC", "1")
    flashattn.attention(q, k, v)
    monkeypatch.setenv("FLASHATTN_VARIANT", "cuda-tc=none")  # not read by a host backend
    flashattn.attention(q, k, v)
    assert len(flashattn._PLANS) == 3
    # Read at each call: a new value is another signature, and unsetting both is the first again.
    monkeypatch.setenv("FLASHATTN_VARIANT", "cuda-tc=other")
    flashattn.attention(q, k, v)
    assert len(flashattn._PLANS) == 4
    monkeypatch.delenv("FLASHATTN_VARIANT")
    monkeypatch.delenv("FLASHATTN_DETERMINISTIC")
    flashattn.attention(q, k, v)
    assert len(flashattn._PLANS) == 4
    assert flashattn._settings() == (None, None)


def test_the_kept_plans_are_bounded():
    flashattn._PLANS.clear()
    for n in range(1, flashattn._PLANS_LIMIT + 40):
        q, = tensors((n, 4))
        flashattn.attention(q, q, q)
        assert len(flashattn._PLANS) <= flashattn._PLANS_LIMIT


# --- bad calls after good ones ----------------------------------------------------------------

# (what, options of the good call, the bad call on (q, k, v) of the good call's shapes, error)
BAD_FORWARD = [
    ("k of another dtype", {}, lambda q, k, v: flashattn.attention(q, k.double(), v),
     TypeError),
    ("all float64", {}, lambda q, k, v: flashattn.attention(q.double(), k.double(), v.double()),
     TypeError),
    ("k on the meta device", {}, lambda q, k, v: flashattn.attention(q, k.to("meta"), v),
     ValueError),
    ("v sparse", {}, lambda q, k, v: flashattn.attention(q, k, v.to_sparse()), TypeError),
    ("k a NumPy array", {}, lambda q, k, v: flashattn.attention(q, k.numpy(), v), TypeError),
    ("causal as an int", dict(causal=True),
     lambda q, k, v: flashattn.attention(q, k, v, causal=1), TypeError),
    ("scale a Decimal equal to a good float", dict(scale=0.5),
     lambda q, k, v: flashattn.attention(q, k, v, scale=decimal.Decimal("0.5")), TypeError),
    ("scale True after 1.0", dict(scale=1.0),
     lambda q, k, v: flashattn.attention(q, k, v, scale=True), TypeError),
    ("scale NaN", {}, lambda q, k, v: flashattn.attention(q, k, v, scale=float("nan")),
     ValueError),
    ("an unknown backend", {}, lambda q, k, v: flashattn.attention(q, k, v, backend="nope"),
     ValueError),
    ("block_size without block_mask", {},
     lambda q, k, v: flashattn.attention(q, k, v, block_size=(2, 3)), ValueError),
    ("return_lse as an int", {}, lambda q, k, v: flashattn.attention(q, k, v, return_lse=1),
     TypeError),
    ("a short v", {}, lambda q, k, v: flashattn.attention(q, k, v[:, :, :5]), ValueError),
]


@pytest.mark.parametrize("what, good, bad, error", BAD_FORWARD, ids=[c[0] for c in BAD_FORWARD])
def test_a_bad_forward_after_a_good_one_raises_as_with_nothing_kept(what, good, bad, error):
    q, k, v = tensors((1, 2, 9, 8), (1, 1, 11, 8), (1, 1, 11, 8))
    flashattn._PLANS.clear()
    fresh = raised(lambda: bad(q, k, v))
    flashattn.attention(q, k, v, **good)
    flashattn.attention(q, k, v, **good)  # from the kept plan
    assert raised(lambda: bad(q, k, v)) == fresh
    assert fresh[0] is error


# (what, the bad backward on the good call's q, k, v, o, lse, do, error)
BAD_BACKWARD = [
    ("o of another dtype", lambda q, k, v, o, lse, do:
     flashattn.attention_backward(q, k, v, o.double(), lse, do), TypeError),
    ("lse of an int dtype", lambda q, k, v, o, lse, do:
     flashattn.attention_backward(q, k, v, o, lse.int(), do), TypeError),
    ("lse of another shape", lambda q, k, v, o, lse, do:
     flashattn.attention_backward(q, k, v, o, lse[..., :3], do), ValueError),
    ("do on the meta device", lambda q, k, v, o, lse, do:
     flashattn.attention_backward(q, k, v, o, lse, do.to("meta")), ValueError),
    ("q of another dtype", lambda q, k, v, o, lse, do:
     flashattn.attention_backward(q.half(), k, v, o, lse, do), TypeError),
]


@pytest.mark.parametrize("what, bad, error", BAD_BACKWARD, ids=[c[0] for c in BAD_BACKWARD])
def test_a_bad_backward_after_a_good_one_raises_as_with_nothing_kept(what, bad, error):
    q, k, v, do = tensors((1, 2, 9, 8), (1, 1, 11, 8), (1, 1, 11, 8), (1, 2, 9, 8))
    o, lse = flashattn.attention(q, k, v, return_lse=True)
    flashattn._PLANS.clear()
    fresh = raised(lambda: bad(q, k, v, o, lse, do))
    flashattn.attention_backward(q, k, v, o, lse, do)
    flashattn.attention_backward(q, k, v, o, lse, do)  # from the kept plan
    assert raised(lambda: bad(q, k, v, o, lse, do)) == fresh
    assert fresh[0] is error


# --- autograd ---------------------------------------------------------------------------------


@pytest.mark.parametrize("causal, scale", [(True, None), (False, -0.4)])
def test_autograd_through_the_eager_path_matches_float64(causal, scale):
    """The 2x rule per gradient against float64, the yardstick being `standard` in float32; the
    gradients are attention_backward's, bit for bit, on the first call and from a kept plan."""
    q, k, v, do = tensors((2, 4, 37, 16), (2, 2, 53, 16), (2, 2, 53, 16), (2, 4, 37, 16))
    arrays = [x.numpy() for x in (q, k, v, do)]
    ref = reference.attention_backward(*arrays, causal=causal, scale=scale)
    std_o, std_lse = flashattn.attention(*arrays[:3], causal=causal, scale=scale,
                                         backend="standard", return_lse=True)
    std = flashattn.attention_backward(*arrays[:3], std_o, std_lse, arrays[3], causal=causal,
                                       scale=scale, backend="standard")
    flashattn._PLANS.clear()
    for _ in range(2):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        o, lse = flashattn.attention(*xs, causal=causal, scale=scale, return_lse=True)
        assert type(o.grad_fn).__name__ == "_AttentionFunctionBackward"
        assert not lse.requires_grad
        o.backward(do)
        direct = flashattn.attention_backward(q, k, v, o.detach(), lse, do, causal=causal,
                                              scale=scale)
        for name, x, g, s, r in zip(("dQ", "dK", "dV"), xs, direct, std, ref):
            assert torch.equal(x.grad, g), name
            eps = 1e-6 * max(1.0, float(np.abs(r).max()))
            bound = 2 * max_error(s, r) + eps
            assert max_error(x.grad.numpy(), r) <= bound, name


def test_without_grad_the_forward_records_nothing():
    q, k, v = (x.requires_grad_() for x in tensors((1, 2, 9, 8), (1, 1, 11, 8), (1, 1, 11, 8)))
    with torch.no_grad():
        o = flashattn.attention(q, k, v, scale=-0.5)
    assert o.grad_fn is None and not o.requires_grad


# --- which way a call goes ----------------------------------------------------------------------


class _Subclass(torch.Tensor):
    pass


def test_the_operator_is_taken_where_something_acts_on_operators(monkeypatch):
    """Plain tensors run the implementation directly, forward, autograd and attention_backward; a
    tensor subclass or a dispatch mode gets the operator (here a stand-in that records its calls
    and runs the implementation)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    taken = []

    def stand_in(impl, name):
        def operator(*args):
            taken.append(name)
            return impl(*args)
        return operator

    monkeypatch.setattr(flashattn, "_FORWARD_OP", stand_in(flashattn._forward_impl, "forward"))
    monkeypatch.setattr(flashattn, "_BACKWARD_OP",
                        stand_in(flashattn._backward_impl, "backward"))
    monkeypatch.setattr(flashattn, "_dispatch_mode_count", torch._C._len_torch_dispatch_stack)

    q, k, v, do = tensors((1, 2, 9, 8), (1, 1, 11, 8), (1, 1, 11, 8), (1, 2, 9, 8))
    o, lse = flashattn.attention(q, k, v, return_lse=True)
    flashattn.attention_backward(q, k, v, o, lse, do)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    flashattn.attention(*xs).backward(do)
    assert taken == []

    flashattn.attention(q.as_subclass(_Subclass), k, v)
    assert taken == ["forward"]

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with PassThrough():
        flashattn.attention(q, k, v)
        flashattn.attention_backward(q, k, v, o, lse, do)
    assert taken == ["forward", "forward", "backward"]
