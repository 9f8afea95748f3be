"""tests/python/test_merge_partials.py — flashattn.merge_partials, the LSE merge of partial results.

The keys of a random problem are cut into S chunks of unequal sizes; each chunk's partial result
(O_s, LSE_s) comes from flashattn.attention(..., return_lse=True) on that chunk alone, and the
merge of the S parts must be the attention over all the keys: checked against the float64
reference (tests/python/reference.py) by the rule of docs/design.md, with float32 standard
attention on the whole problem as the yardstick. The causal mask of the whole problem is
bottom-right aligned, which for a chunk that is not the last is not the chunk's own bottom-right
mask, so each chunk runs with the whole problem's mask restricted to its keys, as a block mask of
1 x 1 blocks (Algorithm 5); with N_q > N_kv the first N_q - N_kv rows see no key at all.
"""
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import reference  # noqa: E402
from test_flashattn import check_rule, lse_eps  # noqa: E402

import flashattn  # noqa: E402
from flashattn import _flashattn as _C  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

RNG = np.random.default_rng(int(os.environ.get("FLASHATTN_TEST_SEED", "2024")) + 5)
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def chunk_bounds(n, S, cut=None):
    """S + 1 cut points 0 = c_0 < c_1 < ... < c_S = n at random (S non-empty chunks of unequal
    sizes), one of them `cut` when given and S > 1."""
    if S == 1:
        return [0, n]
    rest = [c for c in range(1, n) if c != cut]
    inner = set(RNG.choice(rest, size=S - 1 - (cut is not None), replace=False).tolist())
    return [0, *sorted(inner | ({cut} if cut is not None else set())), n]


def partials(q, k, v, causal, cuts):
    """(O_s, LSE_s) of each chunk of keys [cuts[s], cuts[s + 1]), under the whole problem's mask."""
    Nq, Nkv = q.shape[-2], k.shape[-2]
    ok = reference.visible(Nq, Nkv, causal).astype(np.uint8)  # (Nq, Nkv)
    outputs, lses = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        mask = dict(block_mask=ok[:, a:b], block_size=(1, 1)) if causal else {}
        o, lse = flashattn.attention(q, k[..., a:b, :], v[..., a:b, :], return_lse=True, **mask)
        outputs.append(o)
        lses.append(lse)
    return outputs, lses


# (B, H, H_kv, N_q, N_kv, d): ragged sizes, GQA, N_q < N_kv and N_q > N_kv (with causal, rows
# 0 .. N_q - N_kv - 1 of the second see no key in any chunk).
SHAPES = [(2, 3, 1, 13, 33, 16), (1, 2, 2, 40, 29, 24)]


@pytest.mark.parametrize("S", [1, 2, 3, 7])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_merged_chunks_are_the_attention_over_all_keys(shape, causal, S):
    B, H, Hkv, Nq, Nkv, d = shape
    q, k, v = randn(B, H, Nq, d), randn(B, Hkv, Nkv, d), randn(B, Hkv, Nkv, d)
    # A cut after key N_kv - N_q + 1: row 0 sees keys 0 .. N_kv - N_q only, so with causal some
    # row finds a chunk empty and keys in another (checked below).
    cuts = chunk_bounds(Nkv, S, cut=Nkv - Nq + 2 if Nkv > Nq else None)
    outputs, lses = partials(q, k, v, causal, cuts)
    O, lse = flashattn.merge_partials(outputs, lses)
    assert O.shape == q.shape and lse.shape == q.shape[:-1]
    assert O.dtype == np.float32 and lse.dtype == np.float32

    ref_O, ref_lse = reference.attention(q, k, v, np.float64, causal=causal)
    std_O, std_lse = reference.attention(q, k, v, np.float32, causal=causal)
    check_rule("O", O, std_O, ref_O, 1e-6)
    check_rule("LSE", lse, std_lse, ref_lse, lse_eps(ref_lse))

    if causal and S > 1:
        # The test covers what it says: some row sees nothing in some chunk but keys elsewhere.
        empty_here = np.stack([np.isneginf(x) for x in lses])  # (S, B, H, Nq)
        assert (empty_here.any(axis=0) & np.isfinite(ref_lse)).any()
    if causal and Nq > Nkv:
        blind = slice(0, Nq - Nkv)  # rows that see no key at all: O = 0, LSE = -inf exactly
        assert np.all(O[..., blind, :] == 0) and np.all(np.isneginf(lse[..., blind]))
        assert np.isfinite(lse[..., Nq - Nkv:]).all()


def test_rows_of_n_by_d_inputs_merge_like_the_four_dimensional_ones():
    q, k, v = randn(9, 3), randn(17, 3), randn(17, 3)
    outputs, lses = partials(q, k, v, False, chunk_bounds(17, 3))
    O, lse = flashattn.merge_partials(outputs, lses)
    assert O.shape == (9, 3) and lse.shape == (9,)
    O4, lse4 = flashattn.merge_partials([o[None, None] for o in outputs],
                                        [x[None, None] for x in lses])
    assert np.array_equal(O, O4[0, 0]) and np.array_equal(lse, lse4[0, 0])
    ref_O, ref_lse = reference.attention(q[None, None], k[None, None], v[None, None])
    std_O, _ = reference.attention(q[None, None], k[None, None], v[None, None], np.float32)
    check_rule("O", O, std_O[0, 0], ref_O[0, 0], 1e-6)


def test_the_parts_are_folded_in_the_order_given():
    """merge_partial_row folds s = 0, 1, ...: the result is the library's fold, bit for bit."""
    outputs = [randn(2, 1, 5, 4) for _ in range(4)]
    lses = [randn(2, 1, 5) * 30 for _ in range(4)]
    O, lse = flashattn.merge_partials(outputs, lses)
    # The same fold, two parts at a time, through the same function.
    O2, lse2 = outputs[0], lses[0]
    O2, lse2 = flashattn.merge_partials([O2], [lse2])
    for o, x in zip(outputs[1:], lses[1:]):
        O2, lse2 = flashattn.merge_partials([O2, o], [lse2, x])
    assert np.array_equal(O, O2) and np.array_equal(lse, lse2)


# --- NaN ------------------------------------------------------------------------------------


def test_a_nan_in_a_chunks_values_reaches_the_merged_output_as_in_whole_attention():
    q, k, v = randn(1, 2, 11, 5), randn(1, 2, 23, 5), randn(1, 2, 23, 5)
    v[0, 1, 14, 2] = np.nan  # in the second of the chunks [0, 9), [9, 20), [20, 23)
    O, lse = flashattn.merge_partials(*partials(q, k, v, False, [0, 9, 20, 23]))
    whole_O, whole_lse = flashattn.attention(q, k, v, return_lse=True)
    assert np.array_equal(np.isnan(O), np.isnan(whole_O))
    assert np.isnan(O[0, 1, :, 2]).all() and np.isnan(O).sum() == 11  # head 1, column 2 only
    assert np.isfinite(lse).all() and np.isfinite(whole_lse).all()


def test_a_nan_lse_makes_its_row_nan_and_leaves_the_others():
    outputs = [randn(1, 1, 4, 3) for _ in range(3)]
    lses = [randn(1, 1, 4) for _ in range(3)]
    clean_O, clean_lse = flashattn.merge_partials(outputs, lses)
    lses[1][0, 0, 2] = np.nan
    O, lse = flashattn.merge_partials(outputs, lses)
    assert np.isnan(lse[0, 0, 2]) and np.isnan(O[0, 0, 2]).all()
    others = [0, 1, 3]
    assert np.array_equal(O[0, 0, others], clean_O[0, 0, others])
    assert np.array_equal(lse[0, 0, others], clean_lse[0, 0, others])


def test_parts_that_saw_no_key_add_nothing():
    o, x = randn(3, 6), randn(3)
    empty_O, empty_lse = np.zeros((3, 6), np.float32), np.full(3, -np.inf, np.float32)
    O, lse = flashattn.merge_partials([empty_O, o, empty_O], [empty_lse, x, empty_lse])
    assert np.array_equal(lse, x)
    np.testing.assert_allclose(O, o, rtol=2e-7, atol=0)
    O, lse = flashattn.merge_partials([empty_O, empty_O], [empty_lse, empty_lse])
    assert np.all(O == 0) and np.all(np.isneginf(lse))


# --- torch tensors --------------------------------------------------------------------------


@needs_torch
def test_cpu_tensors_give_cpu_tensors_with_the_numpy_result():
    q, k, v = randn(2, 2, 7, 16), randn(2, 1, 19, 16), randn(2, 1, 19, 16)
    outputs, lses = partials(q, k, v, False, chunk_bounds(19, 3))
    O, lse = flashattn.merge_partials(outputs, lses)
    tO, tlse = flashattn.merge_partials([torch.from_numpy(o) for o in outputs],
                                        tuple(torch.from_numpy(x) for x in lses))
    assert isinstance(tO, torch.Tensor) and tO.dtype == torch.float32 and tO.device.type == "cpu"
    assert tuple(tlse.shape) == lse.shape
    assert np.array_equal(tO.numpy(), O) and np.array_equal(tlse.numpy(), lse)
    # Non-contiguous parts (a transposed view) are read as what they hold.
    t = [torch.from_numpy(np.ascontiguousarray(o.transpose(0, 2, 1, 3))).transpose(1, 2)
         for o in outputs]
    assert np.array_equal(flashattn.merge_partials(t, [torch.from_numpy(x) for x in lses])[0]
                          .numpy(), O)


@needs_torch
def test_tensors_that_require_grad_are_refused_unless_grad_is_off():
    o = torch.randn(4, 3, requires_grad=True)
    lse = torch.randn(4)
    with pytest.raises(TypeError, match="not differentiable"):
        flashattn.merge_partials([o, o.detach()], [lse, lse])
    with torch.no_grad():
        O, _ = flashattn.merge_partials([o, o.detach()], [lse, lse])
    torch.testing.assert_close(O, o.detach(), rtol=2e-7, atol=0)


@needs_torch
@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_merge_on_their_device_or_say_the_build_has_no_cuda():
    q, k, v = randn(1, 2, 9, 16), randn(1, 2, 21, 16), randn(1, 2, 21, 16)
    outputs, lses = partials(q, k, v, False, chunk_bounds(21, 3))
    O, lse = flashattn.merge_partials(outputs, lses)
    cuda = lambda xs: [torch.from_numpy(x).cuda() for x in xs]  # noqa: E731
    if not any(b.startswith("cuda-") for b in flashattn.backends()):  # a build without CUDA
        with pytest.raises(RuntimeError, match="no CUDA"):
            flashattn.merge_partials(cuda(outputs), cuda(lses))
        return
    tO, tlse = flashattn.merge_partials(cuda(outputs), cuda(lses))
    assert tO.is_cuda and tlse.is_cuda
    np.testing.assert_allclose(tO.cpu().numpy(), O, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tlse.cpu().numpy(), lse, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="different devices"):
        flashattn.merge_partials([cuda(outputs)[0], torch.from_numpy(outputs[1])], cuda(lses)[:2])


# --- bad arguments --------------------------------------------------------------------------


def test_bad_arguments_are_refused_naming_the_argument():
    o, x = randn(2, 3, 5, 4), randn(2, 3, 5)
    cases = [
        (ValueError, r"outputs has 2 parts and lses 1", ([o, o], [x])),
        (ValueError, r"at least one part", ([], [])),
        (ValueError, r"outputs\[1\] has shape \(2, 3, 6, 4\)", ([o, randn(2, 3, 6, 4)], [x, x])),
        (ValueError, r"lses\[0\] has shape \(2, 3, 4\)", ([o, o], [randn(2, 3, 4), x])),
        (ValueError, r"outputs\[0\] has shape \(5,\)", ([randn(5)], [randn(5)])),
        (TypeError, r"outputs\[1\]\.dtype is float64", ([o, o.astype(np.float64)], [x, x])),
        (TypeError, r"lses\[1\]\.dtype is float16", ([o, o], [x, x.astype(np.float16)])),
        (TypeError, r"outputs must be a list or tuple", (o, [x])),
        (TypeError, r"lses\[0\] must be a numpy.ndarray", ([o], [x.tolist()])),
    ]
    for error, message, (outputs, lses) in cases:
        with pytest.raises(error, match=message):
            flashattn.merge_partials(outputs, lses)


@needs_torch
def test_mixed_numpy_and_torch_or_other_dtypes_are_type_errors():
    o, x = randn(5, 4), randn(5)
    with pytest.raises(TypeError, match=r"outputs\[1\] is a ndarray: .* all torch tensors"):
        flashattn.merge_partials([torch.from_numpy(o), o], [torch.from_numpy(x)] * 2)
    with pytest.raises(TypeError, match=r"lses\[0\]\.dtype is torch.float64"):
        flashattn.merge_partials([torch.from_numpy(o)], [torch.from_numpy(x).double()])
    with pytest.raises(TypeError, match=r"outputs\[0\]\.dtype is torch.bfloat16"):
        flashattn.merge_partials([torch.from_numpy(o).bfloat16()], [torch.from_numpy(x)])


def test_the_compiled_module_checks_shapes_itself():
    with pytest.raises(ValueError, match=r"lse_parts has shape \(2, 4\): must be \(2, 5\)"):
        _C.merge_partials(randn(2, 5, 3), randn(2, 4))
    with pytest.raises(ValueError, match=r"O_parts has shape \(5, 3\): must be 3-dimensional"):
        _C.merge_partials(randn(5, 3), randn(5))
    with pytest.raises(ValueError, match=r"S = 0 parts"):
        _C.merge_partials(np.zeros((0, 5, 3), np.float32), np.zeros((0, 5), np.float32))
    with pytest.raises(TypeError):  # float64 is not converted silently
        _C.merge_partials(np.zeros((1, 5, 3)), np.zeros((1, 5), np.float32))


def test_merge_of_one_part_is_that_part():
    o, x = randn(1, 2, 3, 7), randn(1, 2, 3)
    O, lse = flashattn.merge_partials((o,), (x,))
    assert np.array_equal(O, o) and np.array_equal(lse, x)
    assert not math.isnan(float(lse.sum()))
