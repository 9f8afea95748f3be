"""tests/python/test_flashattn.py — `import flashattn` against an independent NumPy float64 reference.

The rule is the library's (docs/design.md, "Correctness rule"): with ref64 the float64 reference
(tests/python/reference.py, NumPy, written apart from the library) and std32 the library's
`standard` backend in float32 on the same inputs, every output must satisfy
    max|out - ref64| <= 2 * max|std32 - ref64| + eps.
Shapes are not multiples of any block size; inputs are fresh random arrays per test.
Run: PYTHONPATH=<build>/python python3 -m pytest tests/python   (CTest does this).
"""
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import reference  # noqa: E402

import flashattn  # noqa: E402

CPU_BACKENDS = [b["name"] for b in flashattn.backend_info() if b["device"] == "cpu"]
RNG = np.random.default_rng(int(os.environ.get("FLASHATTN_TEST_SEED", "2024")))

# (B, H, H_kv, N_q, N_kv, d): ragged, N_q != N_kv both ways, GQA and MQA, B*H > 1.
SHAPES = [
    (1, 1, 1, 1, 1, 1),
    (1, 2, 1, 7, 113, 3),
    (2, 4, 2, 113, 7, 59),
    (1, 3, 3, 57, 91, 24),
    (2, 6, 1, 33, 33, 16),
]


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def inputs(B, H, Hkv, Nq, Nkv, d):
    return randn(B, H, Nq, d), randn(B, Hkv, Nkv, d), randn(B, Hkv, Nkv, d)


def max_error(out, ref):
    """max |out - ref| where both are finite; a NaN or inf mismatch is an infinite error."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if not np.array_equal(np.isnan(out), np.isnan(ref)):
        return math.inf
    both = np.isfinite(out) & np.isfinite(ref)
    if not np.array_equal(out[~both & ~np.isnan(out)], ref[~both & ~np.isnan(ref)]):
        return math.inf  # infinities must match
    return float(np.max(np.abs(out[both] - ref[both]), initial=0.0))


def check_rule(name, out, yardstick, ref, eps):
    bound = 2 * max_error(yardstick, ref) + eps
    error = max_error(out, ref)
    assert error <= bound, f"{name}: error {error:.3g} > bound {bound:.3g}"


def lse_eps(ref_lse):
    finite = np.abs(ref_lse[np.isfinite(ref_lse)])
    return 1e-6 * max(1.0, float(finite.max(initial=0.0)))


# --- the float64 reference itself ---------------------------------------------------------


def test_reference_backward_matches_finite_differences():
    """The gradients of reference.attention_backward are those of sum(O o dO), numerically."""
    q, k, v = (x.astype(np.float64) for x in inputs(1, 2, 1, 5, 6, 3))
    do = RNG.standard_normal((1, 2, 5, 3))
    mask, size = np.array([[1, 0], [1, 1], [0, 1]]), (2, 3)
    for causal, block_mask in ((False, None), (True, None), (False, mask)):
        kw = dict(causal=causal, block_mask=block_mask, block_size=size if block_mask is not None else None)
        grads = reference.attention_backward(q, k, v, do, **kw)
        for x, g in zip((q, k, v), grads):
            h = 1e-6
            for idx in np.ndindex(*x.shape):
                saved = x[idx]
                x[idx] = saved + h
                up = (reference.attention(q, k, v, **kw)[0] * do).sum()
                x[idx] = saved - h
                down = (reference.attention(q, k, v, **kw)[0] * do).sum()
                x[idx] = saved
                assert abs((up - down) / (2 * h) - g[idx]) <= 1e-6 * max(1.0, abs(g[idx]))


# --- forward --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_float64(backend, shape, causal):
    q, k, v = inputs(*shape)
    o, lse = flashattn.attention(q, k, v, causal=causal, backend=backend, return_lse=True)
    assert o.shape == q.shape and o.dtype == np.float32 and lse.shape == q.shape[:-1]
    ref_o, ref_lse = reference.attention(q, k, v, causal=causal)
    std_o, std_lse = flashattn.attention(q, k, v, causal=causal, backend="standard",
                                         return_lse=True)
    check_rule("O", o, std_o, ref_o, 1e-6)
    check_rule("LSE", lse, std_lse, ref_lse, lse_eps(ref_lse))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_two_dimensional_arrays_scale_and_masks(backend):
    q, k, v = randn(37, 11), randn(53, 11), randn(53, 11)
    mask = RNG.integers(0, 2, size=(8, 6)).astype(bool)
    mask[2] = False  # query rows 10..14 see nothing: O = 0, LSE = -inf
    for kw in (dict(scale=-0.7), dict(causal=True, scale=0.3),
               dict(block_mask=mask, block_size=(5, 9)),
               dict(block_mask=mask.astype(np.uint8), block_size=(5, 9), causal=True)):
        o, lse = flashattn.attention(q, k, v, backend=backend, return_lse=True, **kw)
        assert o.shape == (37, 11) and lse.shape == (37,)
        ref_o, ref_lse = reference.attention(q[None, None], k[None, None], v[None, None], **kw)
        std_o, std_lse = flashattn.attention(q, k, v, backend="standard", return_lse=True, **kw)
        check_rule(f"O {kw}", o, std_o, ref_o[0, 0], 1e-6)
        check_rule(f"LSE {kw}", lse, std_lse, ref_lse[0, 0], lse_eps(ref_lse))
        if "block_mask" in kw:
            assert np.all(o[10:15] == 0) and np.all(lse[10:15] == -np.inf)


# --- backward -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", [b["name"] for b in flashattn.backend_info()
                                     if b["device"] == "cpu" and b["backward"]])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_matches_float64(backend, shape, causal):
    q, k, v = inputs(*shape)
    do = randn(*q.shape)
    o, lse = flashattn.attention(q, k, v, causal=causal, backend=backend, return_lse=True)
    grads = flashattn.attention_backward(q, k, v, o, lse, do, causal=causal, backend=backend)
    ref = reference.attention_backward(q, k, v, do, causal=causal)
    std_o, std_lse = flashattn.attention(q, k, v, causal=causal, backend="standard",
                                         return_lse=True)
    std = flashattn.attention_backward(q, k, v, std_o, std_lse, do, causal=causal,
                                       backend="standard")
    eps = 1e-6 * max(1.0, *(float(np.abs(r).max()) for r in ref))
    for name, g, s, r, x in zip(("dQ", "dK", "dV"), grads, std, ref, (q, k, v)):
        assert g.shape == x.shape and g.dtype == np.float32
        check_rule(name, g, s, r, eps)


def test_backward_with_gqa_mask_and_two_dimensional_arrays():
    q, k, v = randn(41, 13), randn(29, 13), randn(29, 13)
    do = randn(41, 13)
    mask = np.ones((9, 4), dtype=bool)
    mask[1, 2] = False
    kw = dict(block_mask=mask, block_size=(5, 8), causal=True, scale=0.4)
    o, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    dq, dk, dv = flashattn.attention_backward(q, k, v, o, lse, do, **kw)
    ref = reference.attention_backward(q[None, None], k[None, None], v[None, None],
                                       do[None, None], **kw)
    for g, r in zip((dq, dk, dv), ref):
        assert max_error(g, r[0, 0]) < 1e-4 * max(1.0, float(np.abs(r).max()))


# --- errors ---------------------------------------------------------------------------------


def good():
    return randn(2, 4, 9, 8), randn(2, 2, 11, 8), randn(2, 2, 11, 8)


@pytest.mark.parametrize("call, error, message", [
    (lambda q, k, v: flashattn.attention(q.astype(np.float64), k, v), TypeError, "q.dtype"),
    (lambda q, k, v: flashattn.attention(q.tolist(), k, v), TypeError, "q must be"),
    (lambda q, k, v: flashattn.attention(q, k[:, :, :, :7], v), ValueError, "k has shape"),
    (lambda q, k, v: flashattn.attention(q[0], k, v), ValueError, "must be (B, H, N, d) or (N, d)"),
    (lambda q, k, v: flashattn.attention(q[0, 0], k, v), ValueError, "dimensions"),
    (lambda q, k, v: flashattn.attention(q, k[:1], v[:1]), ValueError, "batch"),
    (lambda q, k, v: flashattn.attention(q[:, :3], k, v), ValueError, "multiple of the heads"),
    (lambda q, k, v: flashattn.attention(q[:, :, :0], k, v), ValueError, "at least 1"),
    (lambda q, k, v: flashattn.attention(q, k, v, scale=math.inf), ValueError, "scale"),
    (lambda q, k, v: flashattn.attention(q, k, v, scale="1"), TypeError, "scale"),
    (lambda q, k, v: flashattn.attention(q, k, v, backend="nope"), ValueError, "backend = 'nope'"),
    (lambda q, k, v: flashattn.attention(q, k, v, backend=3), TypeError, "backend"),
    (lambda q, k, v: flashattn.attention(q, k, v, causal="yes"), TypeError, "causal"),
    (lambda q, k, v: flashattn.attention(q, k, v, block_mask=np.ones((3, 3), bool)),
     ValueError, "block_size"),
    (lambda q, k, v: flashattn.attention(q, k, v, block_size=(2, 2)), ValueError, "block_mask"),
    (lambda q, k, v: flashattn.attention(q, k, v, block_mask=np.ones((3, 3), bool),
                                         block_size=(4, 2)), ValueError, "(Tr, Tc) = (3, 6)"),
    (lambda q, k, v: flashattn.attention(q, k, v, block_mask=np.ones((5, 6)), block_size=(2, 2)),
     TypeError, "block_mask.dtype"),
    (lambda q, k, v: flashattn.attention(q, k, v, block_mask=np.full((5, 6), 2, np.uint8),
                                         block_size=(2, 2)), ValueError, "0 or 1"),
    (lambda q, k, v: flashattn.attention(q, k, v, block_mask=np.ones((5, 6), bool),
                                         block_size=(0, 2)), ValueError, "block_size[0]"),
    (lambda q, k, v: flashattn.attention_backward(q, k, v, q, q[..., 0], q[:, :, :3]),
     ValueError, "do has shape"),
    (lambda q, k, v: flashattn.attention_backward(q, k, v, q, q, q), ValueError, "lse has shape"),
])
def test_bad_calls_raise_naming_the_argument(call, error, message):
    q, k, v = good()
    with pytest.raises(error) as raised:
        call(q, k, v)
    assert message in str(raised.value), str(raised.value)


def test_non_contiguous_inputs_are_accepted():
    q, k, v = good()
    qt = np.asfortranarray(q)
    o1 = flashattn.attention(qt, k, v, backend="scalar")
    o2 = flashattn.attention(q, k, v, backend="scalar")
    assert np.array_equal(o1, o2)


def test_backends_list():
    names = flashattn.backends()
    assert names[:3] == ["standard", "scalar", "omp"]
    info = {b["name"]: b for b in flashattn.backend_info()}
    assert info["omp"]["backward"] and info["omp"]["dtypes"] == ["f32", "f16", "bf16"]


# --- PyTorch (skipped where torch is not importable) ---------------------------------------


def test_torch_forward_and_autograd_match_float64():
    torch = pytest.importorskip("torch")
    q, k, v = inputs(2, 4, 2, 37, 53, 16)
    do = randn(*q.shape)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    o = flashattn.attention(tq, tk, tv, causal=True)
    o.backward(torch.tensor(do))
    ref_o, _ = reference.attention(q, k, v, causal=True)
    ref = reference.attention_backward(q, k, v, do, causal=True)
    assert max_error(o.detach().numpy(), ref_o) < 1e-5
    for t, r in zip((tq, tk, tv), ref):
        assert max_error(t.grad.numpy(), r) < 1e-4 * max(1.0, float(np.abs(r).max()))
    # The same numbers as PyTorch's own attention, within float32 rounding (PyTorch >= 2.0; Debian
    # 12's python3-torch is 1.13, without scaled_dot_product_attention).
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return
    sq, sk, sv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    so = torch.nn.functional.scaled_dot_product_attention(
        sq, sk.repeat_interleave(2, dim=1), sv.repeat_interleave(2, dim=1),
        is_causal=False, attn_mask=torch.tensor(reference.visible(37, 53, True)))
    assert max_error(o.detach().numpy(), so.detach().numpy()) < 1e-5


def test_torch_gradcheck_small():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.randn(1, 2, 5, 3, dtype=torch.float32, requires_grad=True) for _ in range(3))

    # gradcheck wants float64; ours is float32, so compare the analytic gradient with central
    # differences of our own forward at a step float32 resolves, within float32 accuracy.
    def loss(q_, k_, v_):
        return flashattn.attention(q_, k_, v_, causal=True, backend="scalar").sum()

    loss(q, k, v).backward()
    for x in (q, k, v):
        numeric = torch.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            with torch.no_grad():
                saved = x[idx].item()
                x[idx] = saved + 1e-2
                up = loss(q, k, v).item()
                x[idx] = saved - 1e-2
                down = loss(q, k, v).item()
                x[idx] = saved
            numeric[idx] = (up - down) / 2e-2
        assert torch.allclose(x.grad, numeric, atol=2e-3, rtol=2e-3)


def test_torch_errors():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.tensor(x) for x in good())
    with pytest.raises(TypeError, match="different dtypes"):
        flashattn.attention(q, k.double(), v)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        flashattn.attention(q, k.numpy(), v)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        flashattn.attention(q.double(), k.double(), v.double())
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="different devices"):
            flashattn.attention(q.cuda(), k, v)


# --- PyTorch CUDA tensors (skipped without a GPU) -------------------------------------------


def cuda_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or "cuda-fa2" not in flashattn.backends():
        pytest.skip("no CUDA device, or a build without the CUDA backends")
    return torch


@pytest.mark.parametrize("causal", [False, True])
def test_torch_cuda_forward_and_gradients_match_float64(causal):
    """float32 CUDA tensors run on cuda-fa2 in place; the 2x rule against float64, the yardstick
    being `standard` in float32 on the CPU."""
    torch = cuda_or_skip()
    q, k, v = inputs(2, 4, 2, 37, 53, 16)
    do = randn(*q.shape)
    tq, tk, tv = (torch.tensor(x, device="cuda", requires_grad=True) for x in (q, k, v))
    o, lse = flashattn.attention(tq, tk, tv, causal=causal, return_lse=True)
    assert o.device == tq.device and o.dtype == torch.float32 and lse.device == tq.device
    o.backward(torch.tensor(do, device="cuda"))
    ref_o, ref_lse = reference.attention(q, k, v, causal=causal)
    std_o, std_lse = flashattn.attention(q, k, v, causal=causal, backend="standard",
                                         return_lse=True)
    check_rule("O", o.detach().cpu().numpy(), std_o, ref_o, 1e-6)
    check_rule("LSE", lse.cpu().numpy(), std_lse, ref_lse, lse_eps(ref_lse))
    ref = reference.attention_backward(q, k, v, do, causal=causal)
    std = flashattn.attention_backward(q, k, v, std_o, std_lse, do, causal=causal,
                                       backend="standard")
    eps = 1e-6 * max(1.0, *(float(np.abs(r).max()) for r in ref))
    for name, t, s_, r in zip(("dQ", "dK", "dV"), (tq, tk, tv), std, ref):
        assert t.grad.device == tq.device
        check_rule(name, t.grad.cpu().numpy(), s_, r, eps)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("shape, causal, scale", [
    ((2, 4, 2, 37, 53, 64), False, None),
    ((2, 4, 2, 37, 53, 64), True, None),
    ((1, 2, 1, 200, 331, 128), True, None),
    ((1, 3, 3, 129, 77, 32), False, -0.3),
    ((2, 6, 1, 65, 300, 96), True, 0.2),
])
def test_torch_cuda_forward_and_gradients_within_2x_of_pytorch(dtype_name, shape, causal,
                                                                    scale):
    """CUDA tensors run in place (float16/bfloat16 on cuda-tc, float32 on cuda-fa2). O and the
    autograd gradients, against float64 on the same (rounded) inputs, stay within 2x of the error
    of PyTorch's SDPA (whichever kernel it picks; TF32 off) on the same tensors, on ragged shapes,
    causal and GQA."""
    torch = cuda_or_skip()
    from torch.nn.attention.bias import causal_lower_right
    F = torch.nn.functional
    dt = getattr(torch, dtype_name)
    B, H, Hkv, Nq, Nkv, d = shape
    q, k, v = inputs(B, H, Hkv, Nq, Nkv, d)
    tensors = [torch.tensor(x, device="cuda", dtype=dt) for x in (q, k, v, randn(B, H, Nq, d))]
    rounded = [t.double().cpu().numpy() for t in tensors]
    ref_o, _ = reference.attention(*rounded[:3], causal=causal, scale=scale)
    ref = [ref_o, *reference.attention_backward(*rounded, causal=causal, scale=scale)]

    def run(attend):
        xs = [t.clone().requires_grad_() for t in tensors[:3]]
        o = attend(*xs)
        o.backward(tensors[3])
        return [o.detach()] + [x.grad for x in xs]

    ours = run(lambda q_, k_, v_: flashattn.attention(q_, k_, v_, causal=causal, scale=scale))
    mask = causal_lower_right(Nq, Nkv) if causal else None  # our causal is bottom-right
    theirs = run(lambda q_, k_, v_: F.scaled_dot_product_attention(
        q_, k_, v_, attn_mask=mask, scale=scale, enable_gqa=Hkv != H))
    for name, a, b, r in zip(("O", "dQ", "dK", "dV"), ours, theirs, ref):
        assert a.dtype == dt and a.device == tensors[0].device and a.shape == b.shape
        eps = (1e-6 if dt == torch.float32 else 1e-4) * max(1.0, float(np.abs(r).max()))
        check_rule(name, a.double().cpu().numpy(), b.double().cpu().numpy(), r, eps)


def test_torch_cuda_errors():
    torch = cuda_or_skip()
    q, k, v = (torch.tensor(x, device="cuda") for x in good())
    with pytest.raises(TypeError, match="computes in f32"):
        flashattn.attention(q.half(), k.half(), v.half(), backend="cuda-fa2")
    with pytest.raises(ValueError, match="dim = 8"):  # cuda-tc: d in 32, 64, 96, 128, 256
        flashattn.attention(q.half(), k.half(), v.half())
    with pytest.raises(ValueError, match="takes no CUDA tensors"):
        flashattn.attention(q, k, v, backend="omp")
    with pytest.raises(ValueError, match="different devices"):
        flashattn.attention(q, k.cpu(), v)
