"""tests/python/test_cpp_operators.py — the operators' CUDA implementations in C++
(examples/python/torch_ops.cpp, module flashattn._torch_ops).

Where the module is built, the dispatcher's CUDA kernels of torch.ops.flashattn.attention_forward
and attention_backward are C++: a planned call goes from the dispatcher to the launch with no
Python (the fast path), and every other call is handed to the Python implementation. What is
checked here, on fresh random inputs at shapes that are no multiple of a tile:
  * the CUDA kernels registered are the C++ ones (where the build says it has them:
    FLASHATTN_EXPECT_TORCH_OPS=1, which tests/python/gpu_checks.sh sets when the module is there);
  * the fast path's outputs, in allocator blocks poisoned with NaN, agree with float64 standard
    attention and its backward (tests/python/reference.py), and are the bits, shapes, dtypes and
    strides of the Python implementation's, forward and backward (dQ's order fixed), contiguous
    tensors and projection views, GQA, causal, in 16 bits (cuda-fa3) and float32 (cuda-fa2, which
    reads and writes views in place too);
  * an input the in-place rule sends to a copy (a row stride of 2^31 elements, which cuda-fa2's
    copies cannot hold) is copied, not refused, by both implementations;
  * the contiguous-only backend (cuda-tc) and cuda-fa2 on contiguous tensors take the fast path
    too, cuda-tc also on views it reads copies of (O and the gradients cast or copied into
    outputs in their inputs' order), with the Python implementation's bits and strides; the calls
    it hands back (a block mask, a negative scale) still run, through the Python implementation
    called from C++ (the module counts the calls its fast path ran);
  * a bad call raises ValueError/TypeError through the C++ kernel as through Python, before and
    after a good call of a close signature (nothing of a refused call is kept);
  * FLASHATTN_DETERMINISTIC, read at each call, is part of the C++ signature too (its workspace);
  * an eager call that autograd records on CUDA tensors is the C++ node AttentionNode, whose
    gradients meet float64's and are attention_backward's bits, on the fast path and on calls it
    hands to Python, and whose bad calls raise ValueError/TypeError.
Needs a GPU, cuda-fa3 (an sm_90a build on a Hopper GPU) and PyTorch >= 2.4; skips otherwise.
"""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import reference  # noqa: E402

import flashattn  # noqa: E402

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(int(os.environ.get("FLASHATTN_TEST_SEED", "2026")))


@pytest.fixture(autouse=True)
def needs_cpp_operators():
    if not torch.cuda.is_available() or "cuda-fa3" not in flashattn.backends():
        pytest.skip("needs a Hopper GPU and an sm_90a build (cuda-fa3)")
    if flashattn._TORCH_OPS is None:
        if os.environ.get("FLASHATTN_EXPECT_TORCH_OPS") == "1":
            pytest.fail("the build has flashattn._torch_ops, but the package did not register it")
        pytest.skip("this build has no flashattn._torch_ops (PyTorch's C++ headers not found)")


def randn(shape, dtype, requires_grad=False):
    x = torch.tensor(RNG.standard_normal(shape).astype(np.float32), device="cuda", dtype=dtype)
    return x.requires_grad_(requires_grad)


def poison_allocator(*tensors):
    """Hands blocks of the tensors' sizes back to PyTorch's caching allocator filled with NaN, so
    that the next outputs of those sizes most likely lie in them: an element a kernel does not
    write then stays NaN."""
    held = [torch.full(x.shape, float("nan"), dtype=x.dtype, device="cuda") for x in tensors]
    del held


def relative_error(out, ref):
    """max |out - ref| / max |ref| (inf where out has a NaN or inf)."""
    out = out.double().cpu().numpy()
    if not np.isfinite(out).all():
        return np.inf
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


def op_forward(q, k, v, causal=False, scale=None, backend=None, mask=None, size=None):
    return torch.ops.flashattn.attention_forward.default(q, k, v, causal, scale, backend, mask,
                                                          size)


def test_the_cuda_kernels_are_the_cpp_ones():
    for name in ("attention_forward", "attention_backward"):
        table = torch._C._dispatch_dump(f"flashattn::{name}")
        cuda = [line for line in table.splitlines() if line.startswith("CUDA")]
        assert len(cuda) == 1 and "torch_ops.cpp" in cuda[0], table


def projection(B, N, H, d, dtype):
    """q, k, v as views of one (B, N, 3 H d) projection, as a model cuts them."""
    x = randn((B, N, 3 * H * d), dtype)
    return [t.view(B, N, H, d).transpose(1, 2) for t in x.split(H * d, dim=2)]


@pytest.mark.parametrize("dtype, d, layout, causal", [
    (torch.bfloat16, 64, "contiguous", True),
    (torch.float16, 128, "contiguous", False),
    (torch.bfloat16, 64, "projection", True),
    (torch.float16, 256, "projection", False),
    (torch.float32, 64, "projection", True),    # cuda-fa2: views read and written in place
    (torch.float32, 37, "contiguous", False),   # cuda-fa2: rows copied a value at a time
])
def test_the_fast_path_gives_the_bits_of_the_python_implementation(dtype, d, layout, causal,
                                                                    monkeypatch):
    monkeypatch.setenv("FLASHATTN_DETERMINISTIC", "1")  # dQ's sum in a fixed order
    if layout == "contiguous":  # GQA, N_q != N_kv
        q, k, v = randn((2, 4, 203, d), dtype), randn((2, 2, 331, d), dtype), \
            randn((2, 2, 331, d), dtype)
    else:
        q, k, v = projection(2, 201, 3, d, dtype)
    options = (causal, 0.11, None, None, None)
    before = flashattn._TORCH_OPS.fast_calls()
    poison_allocator(q, q[..., 0].float())  # O and LSE's sizes
    o, lse = op_forward(q, k, v, *options)  # the dispatcher's CUDA kernel: C++
    assert flashattn._TORCH_OPS.fast_calls()[0] == before[0] + 1  # it took the fast path
    # Against float64 standard attention on the same (rounded) inputs, written independently.
    inputs = [x.double().cpu().numpy() for x in (q, k, v)]
    o_ref, lse_ref = reference.attention(*inputs, causal=causal, scale=0.11)
    bound, grad_bound = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 2e-2)
    assert relative_error(o, o_ref) < bound and relative_error(lse, lse_ref) < 1e-4
    # And the bits and strides of the Python implementation's call of the same kernel.
    o_py, lse_py = flashattn._forward_python(q, k, v, *options)
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert o.stride() == o_py.stride() and lse.stride() == lse_py.stride()
    assert torch.equal(o, o_py) and torch.equal(lse, lse_py)

    do = randn(q.shape, dtype)
    poison_allocator(q, k, v)  # the gradients' sizes
    grads = torch.ops.flashattn.attention_backward.default(q, k, v, o, lse, do, *options)
    refs = reference.attention_backward(*inputs, do.double().cpu().numpy(), causal=causal,
                                        scale=0.11)
    grads_py = flashattn._backward_python(q, k, v, o, lse, do, *options)
    for g, g_py, x, ref in zip(grads, grads_py, (q, k, v), refs):
        assert g.shape == x.shape and g.dtype == dtype and g.stride() == g_py.stride()
        assert relative_error(g, ref) < grad_bound
        assert torch.equal(g, g_py)


@pytest.mark.parametrize("dtype, backend", [(torch.float32, "cuda-fa2"),
                                            (torch.bfloat16, "cuda-fa3")])
def test_a_row_stride_past_an_int_is_read_from_a_copy(dtype, backend, monkeypatch):
    """q of one row (N_q = 1) whose row stride, 2^31 elements, is never stepped over: cuda-fa2's
    copies hold the row stride in an int (require_input_layout refuses more), so the rule of what
    is read in place (readable_in_place, `_readable_in_place`; one rule for cuda-fa2 and cuda-fa3)
    sends such an input to a contiguous copy instead of a refusal. Both implementations, forward
    and backward, give the bits of the same call on a contiguous q, and float64's values."""
    monkeypatch.setenv("FLASHATTN_DETERMINISTIC", "1")
    d = 64
    base = randn((2 * d,), dtype)
    q = base.as_strided((1, 2, 1, d), (2**32, d, 2**31, 1))
    k, v = randn((1, 2, 150, d), dtype), randn((1, 2, 150, d), dtype)
    do = randn((1, 2, 1, d), dtype)
    qc = torch.empty(q.shape, dtype=dtype, device="cuda").copy_(q)
    assert qc.stride() != q.stride() and torch.equal(q, qc)
    options = (False, None, backend, None, None)
    inputs = [x.double().cpu().numpy() for x in (qc, k, v)]
    o_ref, _ = reference.attention(*inputs)
    refs = reference.attention_backward(*inputs, do.double().cpu().numpy())
    bound, grad_bound = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 2e-2)
    o_c, lse_c = op_forward(qc, k, v, *options)
    grads_c = torch.ops.flashattn.attention_backward.default(qc, k, v, o_c, lse_c, do, *options)
    for forward, backward in ((op_forward, torch.ops.flashattn.attention_backward.default),
                              (flashattn._forward_python, flashattn._backward_python)):
        o, lse = forward(q, k, v, *options)
        assert relative_error(o, o_ref) < bound
        assert torch.equal(o, o_c) and torch.equal(lse, lse_c)
        grads = backward(q, k, v, o, lse, do, *options)
        for g, g_c, ref in zip(grads, grads_c, refs):
            assert relative_error(g, ref) < grad_bound
            assert torch.equal(g, g_c)


def test_contiguous_only_backends_take_the_fast_path_where_nothing_is_copied():
    """cuda-fa2 (float32) and cuda-tc (a decoding forward, which writes O in q's dtype) on
    contiguous tensors: the C++ kernel runs them itself, with the Python implementation's
    results."""
    ops = flashattn._TORCH_OPS
    q, k, v = randn((2, 4, 97, 64), torch.float32), randn((2, 2, 130, 64), torch.float32), \
        randn((2, 2, 130, 64), torch.float32)
    before = ops.fast_calls()
    o, lse = op_forward(q, k, v, True)
    o_py, lse_py = flashattn._forward_python(q, k, v, True, None, None, None, None)
    assert torch.equal(o, o_py) and torch.equal(lse, lse_py) and o.is_contiguous()
    do = randn(q.shape, torch.float32)
    grads = torch.ops.flashattn.attention_backward.default(q, k, v, o, lse, do, True, None, None,
                                                           None, None)
    grads_py = flashattn._backward_python(q, k, v, o, lse, do, True, None, None, None, None)
    for g, g_py in zip(grads, grads_py):  # dQ's float32 atomics may add in another order
        assert g.dtype == torch.float32 and g.is_contiguous()
        torch.testing.assert_close(g, g_py, rtol=1e-5, atol=1e-6)
    assert ops.fast_calls() == (before[0] + 1, before[1] + 1)

    q1 = randn((1, 8, 1, 128), torch.bfloat16)  # one query row: cuda-tc splits the keys
    k1, v1 = randn((1, 2, 5000, 128), torch.bfloat16), randn((1, 2, 5000, 128), torch.bfloat16)
    before = ops.fast_calls()
    o, lse = op_forward(q1, k1, v1)
    o_py, lse_py = flashattn._forward_python(q1, k1, v1, False, None, None, None, None)
    assert ops.fast_calls()[0] == before[0] + 1
    assert o.dtype == torch.bfloat16 and torch.equal(o, o_py) and torch.equal(lse, lse_py)


@pytest.mark.parametrize("dtype, backend", [(torch.bfloat16, "cuda-tc")])
def test_contiguous_only_backends_copy_in_cpp_what_they_cannot_read(dtype, backend, monkeypatch):
    """q, k, v viewed out of one projection and a dO transposed as a model's next step leaves it:
    cuda-tc reads contiguous copies, and writes float32 results that are cast or copied into
    outputs in their inputs' order. The fast path makes those copies itself: its results meet
    float64's and are the Python implementation's bits and strides (dQ's order fixed), and both
    directions count as fast calls."""
    monkeypatch.setenv("FLASHATTN_DETERMINISTIC", "1")
    q, k, v = projection(2, 187, 3, 64, dtype)
    options = (True, None, backend, None, None)
    ops = flashattn._TORCH_OPS
    before = ops.fast_calls()
    poison_allocator(q, q[..., 0].float())
    o, lse = op_forward(q, k, v, *options)
    do = randn((2, 187, 3, 64), dtype).transpose(1, 2)  # (B, H, N, d) of (B, N, H, d) memory
    poison_allocator(q, k, v)
    grads = torch.ops.flashattn.attention_backward.default(q, k, v, o, lse, do, *options)
    assert ops.fast_calls() == (before[0] + 1, before[1] + 1)
    inputs = [x.double().cpu().numpy() for x in (q, k, v)]
    o_ref, lse_ref = reference.attention(*inputs, causal=True)
    bound, grad_bound = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 2e-2)
    assert relative_error(o, o_ref) < bound and relative_error(lse, lse_ref) < 1e-4
    refs = reference.attention_backward(*inputs, do.double().cpu().numpy(), causal=True)
    o_py, lse_py = flashattn._forward_python(q, k, v, *options)
    assert o.stride() == o_py.stride() and o.stride(1) < o.stride(2) and o.dtype == dtype
    assert torch.equal(o, o_py) and torch.equal(lse, lse_py)
    grads_py = flashattn._backward_python(q, k, v, o, lse, do, *options)
    for g, g_py, x, ref in zip(grads, grads_py, (q, k, v), refs):
        assert g.dtype == dtype and g.stride() == g_py.stride() and g.stride(1) < g.stride(2)
        assert relative_error(g, ref) < grad_bound
        assert torch.equal(g, g_py)


def test_calls_the_fast_path_hands_back_run_in_python():
    """A block mask and a negative scale (folded into a copy of Q) go from the C++ kernel to the
    Python implementation: the results are that implementation's, and the fast path counts
    none."""
    q, k, v = randn((1, 2, 150, 64), torch.bfloat16), randn((1, 2, 170, 64), torch.bfloat16), \
        randn((1, 2, 170, 64), torch.bfloat16)
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool, device="cuda")
    qt = randn((1, 150, 2, 64), torch.float32).transpose(1, 2)  # (B, H, N, d), not contiguous
    for args in ((q, k, v, False, None, None, mask, [128, 128]),
                 (q, k, v, True, -0.2, None, None, None),
                 (qt, k.float(), v.float(), True, -0.3, None, None, None)):
        before = flashattn._TORCH_OPS.fast_calls()
        o, lse = op_forward(*args)
        assert flashattn._TORCH_OPS.fast_calls() == before
        o_py, lse_py = flashattn._forward_python(*args)
        assert torch.equal(o, o_py) and torch.equal(lse, lse_py)


@pytest.mark.parametrize("bad, error, words", [
    (dict(k=(1, 2, 150, 32)), ValueError, "k"),  # another head dimension
    (dict(q_dtype=torch.float16), TypeError, "dtypes"),
    (dict(scale=float("inf")), ValueError, "scale"),
    (dict(backend="no-such-backend"), ValueError, "no-such-backend"),
])
def test_a_bad_call_raises_through_the_cpp_kernel(bad, error, words):
    """The planner runs every check of a signature not seen before: a bad call right after a good
    one of a close signature raises, each time, and the good one still runs."""
    shapes = dict(q=(1, 2, 150, 64), k=(1, 2, 170, 64))
    good = [randn(shapes["q"], torch.bfloat16), randn(shapes["k"], torch.bfloat16),
            randn(shapes["k"], torch.bfloat16)]
    op_forward(*good)
    q = randn(shapes["q"], bad.get("q_dtype", torch.bfloat16))
    k = randn(bad.get("k", shapes["k"]), torch.bfloat16)
    v = randn(bad.get("k", shapes["k"]), torch.bfloat16)
    for _ in range(2):
        with pytest.raises(error, match=words):
            op_forward(q, k, v, False, bad.get("scale"), bad.get("backend"))
    o, _ = op_forward(*good)
    assert torch.isfinite(o).all()


def test_the_deterministic_setting_is_part_of_the_signature(monkeypatch):
    """FLASHATTN_DETERMINISTIC changes the backward's workspace: a plan kept without it must not
    serve a call with it. With it, two backwards give the same bits."""
    q, k, v = (randn((2, 3, 333, 64), torch.bfloat16) for _ in range(3))
    o, lse = op_forward(q, k, v, True)
    do = randn(q.shape, torch.bfloat16)
    backward = torch.ops.flashattn.attention_backward.default
    backward(q, k, v, o, lse, do, True, None, None, None, None)  # planned without the setting
    monkeypatch.setenv("FLASHATTN_DETERMINISTIC", "1")
    first = backward(q, k, v, o, lse, do, True, None, None, None, None)
    second = backward(q, k, v, o, lse, do, True, None, None, None, None)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# --- the C++ autograd node of eager calls (AttentionNode) -------------------------------------


def eager_gradients(q, k, v, do, **options):
    """flashattn.attention on leaves that require grad, then backward(do): (node name, O, LSE,
    dQ, dK, dV)."""
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o, lse = flashattn.attention(*xs, return_lse=True, **options)
    o.backward(do)
    return (o.grad_fn.name() if o.grad_fn is not None else None, o, lse,
            *[x.grad for x in xs])


@pytest.mark.parametrize("dtype, d, layout, causal, scale", [
    (torch.bfloat16, 64, "projection", True, None),   # cuda-fa3 on strided views: fast path
    (torch.float16, 128, "contiguous", False, 0.11),  # GQA, N_q != N_kv
    (torch.bfloat16, 64, "contiguous", True, -0.2),   # negative scale: the Python implementation
    (torch.float32, 64, "projection", False, None),   # cuda-fa2 on the views: fast path
])
def test_eager_autograd_on_cuda_runs_the_cpp_node(dtype, d, layout, causal, scale, monkeypatch):
    """An eager call that autograd records on CUDA tensors is a C++ node: its gradients meet
    float64 standard attention's and are, bit for bit, attention_backward's on the node's own O
    and LSE (dQ's order fixed), whether its calls took the fast path or were handed to Python."""
    monkeypatch.setenv("FLASHATTN_DETERMINISTIC", "1")
    if layout == "contiguous":
        q, k, v = randn((2, 4, 203, d), dtype), randn((2, 2, 331, d), dtype), \
            randn((2, 2, 331, d), dtype)
    else:
        q, k, v = projection(2, 201, 3, d, dtype)
    do = randn(q.shape, dtype)
    ops = flashattn._TORCH_OPS
    before = ops.fast_calls()
    poison_allocator(q, k, v, q[..., 0].float())
    name, o, lse, dq, dk, dv = eager_gradients(q, k, v, do, causal=causal, scale=scale)
    assert "AttentionNode" in name, name
    # Both directions on the fast path, or both handed to the Python implementation.
    n = 1 if scale is None or scale > 0 else 0
    after = ops.fast_calls()
    assert (after[0] - before[0], after[1] - before[1]) == (n, n)
    inputs = [x.double().cpu().numpy() for x in (q, k, v)]
    refs = reference.attention_backward(*inputs, do.double().cpu().numpy(), causal=causal,
                                        scale=scale)
    direct = flashattn.attention_backward(q, k, v, o.detach(), lse, do, causal=causal,
                                          scale=scale)
    for g, g_direct, x, ref in zip((dq, dk, dv), direct, (q, k, v), refs):
        assert g.shape == x.shape and g.dtype == dtype
        assert relative_error(g, ref) < 2e-2
        assert torch.equal(g, g_direct)


def test_eager_autograd_on_cuda_raises_as_the_operator_does():
    """A bad call that requires grad raises ValueError/TypeError through the C++ node, nothing
    recorded, and a good call right after still trains."""
    q = randn((1, 2, 150, 64), torch.bfloat16, requires_grad=True)
    k = randn((1, 2, 170, 32), torch.bfloat16, requires_grad=True)  # another head dimension
    v = randn((1, 2, 170, 64), torch.bfloat16, requires_grad=True)
    with pytest.raises(ValueError, match="k"):
        flashattn.attention(q, k, v)
    with pytest.raises(ValueError, match="no-such-backend"):
        flashattn.attention(q, v, v, backend="no-such-backend")
    with pytest.raises(TypeError, match="dtypes"):
        flashattn.attention(q, v.float(), v)
    assert q.grad is None
    flashattn.attention(q, v, v, causal=True).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(v.grad).all()
