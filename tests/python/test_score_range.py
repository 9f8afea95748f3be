"""tests/python/test_score_range.py — scores float32 cannot hold are never returned as a fully
masked row (docs/design.md, Numerics): O = 0 and LSE = -inf mean "no visible key" and nothing else.

On the host (NumPy arrays, CPU tensors) the library checks its bound before any work
(common/score_range.hpp) and refuses the call with a ValueError naming the scale. CUDA tensors run
asynchronously, and their values cannot be read without waiting for the GPU, so nothing is
refused there: the kernels mark a row whose scores overflowed NaN (O and LSE). Both are checked
here on the same cases; the CUDA ones run only where a GPU is present.
Run: PYTHONPATH=<build>/python python3 -m pytest tests/python   (CTest does this).
"""
import numpy as np
import pytest

import flashattn

RNG = np.random.default_rng(11)
FLT_MAX = float(np.finfo(np.float32).max)


def _case(scale, magnitude, d=7, dyadic=False):
    q = RNG.uniform(-magnitude, magnitude, (1, 2, 13, d)).astype(np.float32)
    k = RNG.uniform(-magnitude, magnitude, (1, 1, 29, d)).astype(np.float32)
    if dyadic:  # multiples of 1/8 in [-2, 2]: |q.k| <= 4 d
        q, k = (np.round(x * 4) / 8 for x in (q, k))
    return scale, q, k


# name: (scale, q, k, refused on the host)
CASES = {
    "scale -3e38": (*_case(-3e38, 1.0), True),
    "scale +3e38": (*_case(3e38, 1.0), True),
    "scale -1e30, inputs 1e5": (*_case(-1e30, 1e5), True),
    "inputs 1e20 (q.k overflows before scaling)": (*_case(0.125, 1e20), True),
    "ordinary": (*_case(None, 3.0), False),
    "scale -1e36, small inputs (inside the limit)": (*_case(-1e36, 2.0, dyadic=True), False),
    "scale 1e36, small inputs (inside the limit)": (*_case(1e36, 2.0, dyadic=True), False),
    "inputs 1e18, default scale (inside)": (*_case(None, 1e18), False),
}


def _host_kinds():
    kinds = [("numpy", lambda x: x)]
    try:
        import torch
    except ImportError:
        return kinds
    return kinds + [("torch-cpu", torch.from_numpy)]


@pytest.mark.parametrize("name", list(CASES))
def test_the_host_refuses_scores_beyond_float32(name):
    scale, q, k, refused = CASES[name]
    for kind, make in _host_kinds():
        if refused:
            with pytest.raises(ValueError, match=r"^scale = .*float32") as raised:
                flashattn.attention(make(q), make(k), make(k), scale=scale)
            assert "overflow" in str(raised.value), f"{kind}: {raised.value}"
        else:
            o, lse = flashattn.attention(make(q), make(k), make(k), scale=scale, return_lse=True)
            assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(lse)).all(), kind


def test_a_nan_or_inf_input_is_left_out_of_the_bound():
    """A non-finite input is the caller's own value: it propagates (NaN stays NaN), not refused."""
    scale, q, k = _case(None, 1.0)
    q[0, 1, 3, 2], k[0, 0, 5, 1] = np.nan, np.inf
    o = flashattn.attention(q, k, k, scale=scale)
    assert np.isnan(o[0, 1, 3]).all()


# --- CUDA tensors: NaN rows instead of an error -----------------------------------------------


# The largest |scale q.k| at which the tensor-core kernels (cuda-tc, cuda-fa3: float16 and
# bfloat16) promise accurate rows. Their fast exponent rounds the shift m c to float32, so far
# beyond it, though inside the score limit, a row may come out NaN (docs/design.md, Numerics: "A
# limit of the tensor-core kernels"); it still must not read as fully masked.
TENSOR_CORE_ACCURATE = 1e4


def _expected_rows(q, k, scale, accurate_up_to=np.inf):
    """Per (b, h, i) row, from the scores in float64: "nan" where float32 must overflow (a score
    beyond +FLT_MAX, or every score beyond -FLT_MAX), "finite" where every score is inside the
    library's limit (FLT_MAX / 2, common/score_range.hpp: the kernels multiply by log2(e) and
    subtract the row maximum) and within accurate_up_to, None otherwise, where a kernel may
    overflow or not (or where some scores overflow below and the rest fit: those keys lose a
    weight that is 0 anyway). Every row must still not read as fully masked."""
    q, k = q.astype(np.float64), k.astype(np.float64)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    K = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    S = scale * np.einsum("bhid,bhjd->bhij", q, K)
    above, below = S > 1.01 * FLT_MAX, S < -1.01 * FLT_MAX
    inside = np.abs(S) < min(0.99 * flashattn._C.score_limit, accurate_up_to)
    rows = np.full(S.shape[:3], None, dtype=object)
    rows[above.any(-1) | below.all(-1)] = "nan"
    rows[inside.all(-1)] = "finite"
    return rows


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_tensors_mark_overflowed_rows_nan(name, dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not any(b.startswith("cuda-") for b in flashattn.backends()):
        pytest.skip("no CUDA device or CUDA backends")
    scale, q, k, refused = CASES[name]
    dt = getattr(torch, dtype)
    if max(np.abs(q).max(), np.abs(k).max()) > torch.finfo(dt).max:
        pytest.skip(f"the inputs do not fit in {dtype}")
    tq, tk = torch.tensor(q, device="cuda", dtype=dt), torch.tensor(k, device="cuda", dtype=dt)
    d = q.shape[-1] if dtype == "float32" else 64  # cuda-tc / cuda-fa3 take d = 64, not 7
    if d != q.shape[-1]:  # pad with zeros: the scores are the same
        tq = torch.nn.functional.pad(tq, (0, d - q.shape[-1]))
        tk = torch.nn.functional.pad(tk, (0, d - k.shape[-1]))
    if scale is None:  # the default scale of the unpadded problem
        scale = float(1 / np.sqrt(q.shape[-1]))
    o, lse = flashattn.attention(tq, tk, tk, scale=scale, return_lse=True)
    torch.cuda.synchronize()
    o, lse = o.float().cpu().numpy(), lse.cpu().numpy()
    rows = _expected_rows(tq.double().cpu().numpy(), tk.double().cpu().numpy(), scale,
                          np.inf if dtype == "float32" else TENSOR_CORE_ACCURATE)
    looks_masked = (o == 0).all(-1) & (lse == -np.inf)
    assert not looks_masked.any(), f"{name}: overflowed rows read as fully masked"
    for index, expected in np.ndenumerate(rows):
        if expected == "nan":
            assert np.isnan(o[index]).all() and np.isnan(lse[index]), (name, index)
        elif expected == "finite":
            assert np.isfinite(o[index]).all() and np.isfinite(lse[index]), (name, index)
    if refused:  # where the host refuses, some row must overflow on the GPU too
        assert (rows == "nan").any(), name
