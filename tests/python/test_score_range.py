"""tests/python/test_score_range.py — scores float32 cannot hold are refused, never returned as a
fully masked row (docs/design.md, Numerics).

The library checks the bound on host arrays (common/score_range.hpp, before every prepare). CUDA
tensors cannot be read there, so the package checks the same bound on the tensors
(flashattn._check_score_range) before any CUDA work. Here its decision is compared with the
library's on the same values, case by case (the library reached through NumPy arrays), so the two
implementations of the rule cannot drift apart; and on a GPU, CUDA tensors are refused the same way.
Run: PYTHONPATH=<build>/python python3 -m pytest tests/python   (CTest does this).
"""
import math

import numpy as np
import pytest

import flashattn

RNG = np.random.default_rng(11)


def _torch():
    return pytest.importorskip("torch")


def _case(scale, magnitude, d=7, dyadic=False):
    q = RNG.uniform(-magnitude, magnitude, (1, 2, 13, d)).astype(np.float32)
    k = RNG.uniform(-magnitude, magnitude, (1, 1, 29, d)).astype(np.float32)
    if dyadic:  # multiples of 1/8 in [-2, 2]: |q.k| <= 4 d
        q, k = (np.round(x * 4) / 8 for x in (q, k))
    return scale, q, k


CASES = {
    "scale -3e38": _case(-3e38, 1.0),
    "scale +3e38": _case(3e38, 1.0),
    "scale -1e30, inputs 1e5": _case(-1e30, 1e5),
    "inputs 1e20 (q.k overflows before scaling)": _case(0.125, 1e20),
    "ordinary": _case(None, 3.0),
    "scale -1e36, small inputs (inside the limit)": _case(-1e36, 2.0, dyadic=True),
    "scale 1e36, small inputs (inside the limit)": _case(1e36, 2.0, dyadic=True),
    "inputs 1e18, default scale (inside)": _case(None, 1e18),
}


def _library_refuses(scale, q, k):
    try:
        flashattn.attention(q, k, k, scale=scale)
    except ValueError as e:
        assert "float32" in str(e), str(e)
        return str(e)
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_the_package_decides_as_the_library(name):
    torch = _torch()
    scale, q, k = CASES[name]
    library = _library_refuses(scale, q, k)
    checked = flashattn._check_scale(scale)
    try:
        flashattn._check_score_range(torch.from_numpy(q), torch.from_numpy(k), checked)
        package = None
    except ValueError as e:
        package = str(e)
    assert (package is None) == (library is None), (package, library)
    if library is not None:  # both name the scale, as the library prints it
        assert package.split(":")[0] == library.split(":")[0]
        assert package.startswith("scale = ")


def test_a_nan_or_inf_row_is_left_out_of_the_bound():
    """A non-finite input is the caller's own value: it propagates (NaN stays NaN), not refused."""
    torch = _torch()
    scale, q, k = _case(None, 1.0)
    q[0, 1, 3, 2], k[0, 0, 5, 1] = np.nan, np.inf
    assert _library_refuses(scale, q, k) is None
    flashattn._check_score_range(torch.from_numpy(q), torch.from_numpy(k), math.nan)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_tensors_are_refused_before_any_work(dtype):
    torch = _torch()
    if not torch.cuda.is_available() or not any(b.startswith("cuda-") for b in flashattn.backends()):
        pytest.skip("no CUDA device or CUDA backends")
    q = torch.randn(1, 2, 13, 64, device="cuda", dtype=getattr(torch, dtype))
    with pytest.raises(ValueError, match=r"^scale = -3e\+38: .*float32"):
        flashattn.attention(q, q, q, scale=-3e38)
    with pytest.raises(ValueError, match=r"^scale = .*float32"):
        flashattn.attention(q * 1e4 if dtype == "float32" else q, q * 1e35 if dtype == "float32"
                            else q, q, scale=-1e4 if dtype == "float32" else -3e38)
    out = flashattn.attention(q, q, q, scale=-1e3)  # inside: computed, every row visible
    assert torch.isfinite(out).all()
