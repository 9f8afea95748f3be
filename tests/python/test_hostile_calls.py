"""tests/python/test_hostile_calls.py — bad arguments, as a hostile caller would pass them.

The contract (docs/design.md, "Python contract"): every public call with a bad argument raises
TypeError (wrong type or dtype) or ValueError (wrong shape, size or value) naming the argument, on
NumPy arrays, CPU tensors and CUDA tensors alike, and before any array is copied or any CUDA work
is queued. Never IndexError, OverflowError, pybind11's "incompatible function arguments", a crash,
or garbage. The compiled module (flashattn._flashattn) is importable on its own and checks its
arrays too: a short V or a mask smaller than its tile grid must not be read past its end.

The same table of cases runs on NumPy arrays, on CPU tensors (where torch is installed) and on
CUDA tensors (where a GPU is present). Checks are shared by the three: they run before the code
chooses between host and device, which test_checks_come_before_any_work shows on the host.
Run: PYTHONPATH=<build>/python python3 -m pytest tests/python   (CTest does this).
"""
import decimal
import fractions
import importlib.util
import math

import numpy as np
import pytest

import flashattn
from flashattn import _flashattn as _C

RNG = np.random.default_rng(7)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# q (2, 4, 9, 8); k, v (2, 2, 11, 8): GQA, N_q != N_kv, so a mask over blocks (2, 3) is (5, 4).
def good_arrays():
    q, k, v = randn(2, 4, 9, 8), randn(2, 2, 11, 8), randn(2, 2, 11, 8)
    o, lse = flashattn.attention(q, k, v, return_lse=True, backend="standard")
    return dict(q=q, k=k, v=v, o=o, lse=lse, do=randn(*q.shape))


def good_mask():
    return np.ones((5, 4), dtype=bool)


# --- the kinds of arrays: NumPy, CPU tensors, CUDA tensors -----------------------------------


def torch_or_skip():
    return pytest.importorskip("torch")


def kind_numpy():
    return lambda x: x


def kind_torch_cpu():
    torch = torch_or_skip()
    return lambda x: torch.tensor(x) if isinstance(x, np.ndarray) else x


def kind_torch_cuda():
    torch = torch_or_skip()
    if not torch.cuda.is_available() or "cuda-fa2" not in flashattn.backends():
        pytest.skip("no CUDA device, or a build without the CUDA backends")
    return lambda x: torch.tensor(x, device="cuda") if isinstance(x, np.ndarray) else x


KINDS = {"numpy": kind_numpy, "torch-cpu": kind_torch_cpu, "torch-cuda": kind_torch_cuda}


def call(fn, arrays, make, **options):
    """fn = "forward" or "backward" on `arrays` (numpy, made into the kind by `make`)."""
    a = {name: make(x) for name, x in arrays.items()}
    if fn == "forward":
        return flashattn.attention(a["q"], a["k"], a["v"], **options)
    return flashattn.attention_backward(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"],
                                        **options)


# --- the table: (what, function, change to the good arrays, options, error, message) ----------

def _replace(**new):
    return lambda arrays: {**arrays, **{k: (f(arrays) if callable(f) else f)
                                        for k, f in new.items()}}


def _keep(arrays):
    return arrays


MASK = dict(block_mask=good_mask(), block_size=(2, 3))

CASES = [
    # ranks and sizes: a 1-D or 3-D tensor reached an IndexError inside the shape check
    ("1-D q", "forward", _replace(q=lambda a: a["q"].reshape(-1)), {}, ValueError, "q has shape"),
    ("0-D q", "forward", _replace(q=lambda a: a["q"].reshape(-1)[:1].reshape(())), {}, ValueError,
     "q has shape"),
    ("3-D q", "forward", _replace(q=lambda a: a["q"][0]), {}, ValueError, "q has shape"),
    ("5-D q", "forward", _replace(q=lambda a: a["q"][None]), {}, ValueError, "q has shape"),
    ("1-D k", "forward", _replace(k=lambda a: a["k"].reshape(-1)), {}, ValueError, "k has shape"),
    ("1-D v", "forward", _replace(v=lambda a: a["v"].reshape(-1)), {}, ValueError, "v has shape"),
    ("3-D v", "forward", _replace(v=lambda a: a["v"][0]), {}, ValueError, "v has shape"),
    ("2-D q, 4-D k", "forward", _replace(q=lambda a: a["q"][0, 0]), {}, ValueError, "dimensions"),
    ("q with N_q = 0", "forward", _replace(q=lambda a: a["q"][:, :, :0]), {}, ValueError,
     "q has shape"),
    ("q with d = 0", "forward", _replace(q=lambda a: a["q"][..., :0]), {}, ValueError,
     "q has shape"),
    ("k with B = 0", "forward", _replace(k=lambda a: a["k"][:0]), {}, ValueError, "k has shape"),
    ("v with N_kv = 0", "forward", _replace(v=lambda a: a["v"][:, :, :0]), {}, ValueError,
     "v has shape"),
    ("short v", "forward", _replace(v=lambda a: a["v"][:, :, :5]), {}, ValueError, "v "),
    ("k of another head dimension", "forward",
     _replace(k=lambda a: a["k"][..., :3], v=lambda a: a["v"][..., :3]), {}, ValueError,
     "head dimension"),
    ("v of another head dimension", "forward", _replace(v=lambda a: a["v"][..., :3]), {},
     ValueError, "v "),
    ("batch mismatch", "forward", _replace(k=lambda a: a["k"][:1], v=lambda a: a["v"][:1]), {},
     ValueError, "batch"),
    ("heads not a multiple", "forward", _replace(q=lambda a: a["q"][:, :3]), {}, ValueError,
     "multiple of the heads"),
    ("d beyond 256", "forward",
     _replace(q=randn(1, 1, 3, 300), k=randn(1, 1, 3, 300), v=randn(1, 1, 3, 300)), {},
     ValueError, "dim = 300"),
    # dtypes and types
    ("float64 q", "forward", _replace(q=lambda a: a["q"].astype(np.float64)), {}, TypeError,
     "q"),
    ("int32 k", "forward", _replace(k=lambda a: a["k"].astype(np.int32)), {}, TypeError, "k"),
    ("q a list", "forward", _replace(q=lambda a: a["q"].tolist()), {}, TypeError, "q must be"),
    ("v None", "forward", _replace(v=None), {}, TypeError, "v must be"),
    ("q a number", "forward", _replace(q=1.0), {}, TypeError, "q must be"),
    # scale: OverflowError (2**2000), inf after float32 rounding (1e39), NaN, wrong types
    ("scale 2**2000", "forward", _keep, dict(scale=2**2000), ValueError, "scale = "),
    ("scale -2**2000", "forward", _keep, dict(scale=-2**2000), ValueError, "scale = "),
    ("scale Fraction beyond double", "forward", _keep, dict(scale=fractions.Fraction(10**400)),
     ValueError, "scale = "),
    ("scale 1e39", "forward", _keep, dict(scale=1e39), ValueError, "scale = 1e+39"),
    ("scale -1e39", "forward", _keep, dict(scale=-1e39), ValueError, "scale = -1e+39"),
    ("scale inf", "forward", _keep, dict(scale=math.inf), ValueError, "scale = inf"),
    ("scale nan", "forward", _keep, dict(scale=math.nan), ValueError, "scale = nan"),
    ("scale numpy inf", "forward", _keep, dict(scale=np.float64("inf")), ValueError, "scale"),
    ("scale a str", "forward", _keep, dict(scale="1"), TypeError, "scale"),
    ("scale a bool", "forward", _keep, dict(scale=True), TypeError, "scale"),
    ("scale a numpy bool", "forward", _keep, dict(scale=np.bool_(True)), TypeError, "scale"),
    ("scale complex", "forward", _keep, dict(scale=1j), TypeError, "scale"),
    ("scale a Decimal", "forward", _keep, dict(scale=decimal.Decimal("0.5")), TypeError, "scale"),
    ("scale an array", "forward", _keep, dict(scale=np.array([0.5])), TypeError, "scale"),
    ("scale a list", "forward", _keep, dict(scale=[0.5]), TypeError, "scale"),
    # flags and backend names
    ("causal an int", "forward", _keep, dict(causal=1), TypeError, "causal"),
    ("causal None", "forward", _keep, dict(causal=None), TypeError, "causal"),
    ("return_lse a str", "forward", _keep, dict(return_lse="yes"), TypeError, "return_lse"),
    ("backend an int", "forward", _keep, dict(backend=3), TypeError, "backend"),
    ("backend bytes", "forward", _keep, dict(backend=b"omp"), TypeError, "backend"),
    ("backend empty", "forward", _keep, dict(backend=""), ValueError, "backend = ''"),
    ("backend unknown", "forward", _keep, dict(backend="OMP"), ValueError, "backend = 'OMP'"),
    # block sizes: beyond int64 reached pybind11's "incompatible function arguments"
    ("block_size 2**63", "forward", _keep, dict(block_mask=np.ones((1, 1), bool),
                                                  block_size=(2**63, 2**63)),
     ValueError, "block_size[0]"),
    ("block_size[1] 2**64", "forward", _keep, dict(block_mask=np.ones((5, 1), bool),
                                                     block_size=(2, 2**64)),
     ValueError, "block_size[1]"),
    ("block_size 0", "forward", _keep, dict(MASK, block_size=(0, 3)), ValueError,
     "block_size[0]"),
    ("block_size negative", "forward", _keep, dict(MASK, block_size=(2, -3)), ValueError,
     "block_size[1]"),
    ("block_size bools", "forward", _keep, dict(MASK, block_size=(True, 3)), TypeError,
     "block_size[0]"),
    ("block_size floats", "forward", _keep, dict(MASK, block_size=(2.0, 3)), TypeError,
     "block_size[0]"),
    ("block_size one int", "forward", _keep, dict(MASK, block_size=2), TypeError, "block_size"),
    ("block_size three ints", "forward", _keep, dict(MASK, block_size=(2, 3, 4)), TypeError,
     "block_size"),
    ("block_size a str", "forward", _keep, dict(MASK, block_size="23"), TypeError, "block_size"),
    ("block_size without a mask", "forward", _keep, dict(block_size=(2, 3)), ValueError,
     "block_mask"),
    # block masks: one smaller than the tile grid segfaulted in the compiled module
    ("mask without block_size", "forward", _keep, dict(block_mask=good_mask()), ValueError,
     "block_size"),
    ("mask smaller than the grid", "forward", _keep,
     dict(block_mask=np.ones((1, 1), bool), block_size=(2, 3)), ValueError, "block_mask has shape"),
    ("mask larger than the grid", "forward", _keep,
     dict(block_mask=np.ones((6, 4), bool), block_size=(2, 3)), ValueError, "block_mask has shape"),
    ("mask transposed", "forward", _keep,
     dict(block_mask=np.ones((4, 5), bool), block_size=(2, 3)), ValueError, "block_mask has shape"),
    ("mask 1-D", "forward", _keep, dict(block_mask=np.ones(20, bool), block_size=(2, 3)),
     ValueError, "block_mask has shape"),
    ("mask 3-D", "forward", _keep, dict(block_mask=np.ones((1, 5, 4), bool), block_size=(2, 3)),
     ValueError, "block_mask has shape"),
    ("mask 0-D", "forward", _keep, dict(block_mask=True, block_size=(2, 3)), ValueError,
     "block_mask has shape"),
    ("mask float", "forward", _keep, dict(block_mask=np.ones((5, 4)), block_size=(2, 3)),
     TypeError, "block_mask.dtype"),
    ("mask int64", "forward", _keep,
     dict(block_mask=np.ones((5, 4), np.int64), block_size=(2, 3)), TypeError, "block_mask.dtype"),
    ("mask of 2s", "forward", _keep,
     dict(block_mask=np.full((5, 4), 2, np.uint8), block_size=(2, 3)), ValueError, "0 or 1"),
    ("mask ragged list", "forward", _keep,
     dict(block_mask=[[True, False], [True]], block_size=(2, 3)), TypeError, "block_mask"),
    ("mask an object", "forward", _keep, dict(block_mask=object(), block_size=(2, 3)), TypeError,
     "block_mask"),
    ("mask a str", "forward", _keep, dict(block_mask="1", block_size=(2, 3)), TypeError,
     "block_mask"),
    # the backward's own arguments
    ("o of another shape", "backward", _replace(o=lambda a: a["o"][:, :, :3]), {}, ValueError,
     "o has shape"),
    ("do of another shape", "backward", _replace(do=lambda a: a["do"][..., :3]), {}, ValueError,
     "do has shape"),
    ("1-D do", "backward", _replace(do=lambda a: a["do"].reshape(-1)), {}, ValueError,
     "do has shape"),
    ("lse with d", "backward", _replace(lse=lambda a: a["q"]), {}, ValueError, "lse has shape"),
    ("lse short", "backward", _replace(lse=lambda a: a["lse"][..., :2]), {}, ValueError,
     "lse has shape"),
    ("lse int32", "backward", _replace(lse=lambda a: a["lse"].astype(np.int32)), {}, TypeError,
     "lse.dtype"),
    ("lse a list", "backward", _replace(lse=lambda a: a["lse"].tolist()), {}, TypeError, "lse"),
    ("lse None", "backward", _replace(lse=None), {}, TypeError, "lse"),
    ("o float64", "backward", _replace(o=lambda a: a["o"].astype(np.float64)), {}, TypeError,
     "o"),
    ("do None", "backward", _replace(do=None), {}, TypeError, "do"),
    ("backward scale 2**2000", "backward", _keep, dict(scale=2**2000), ValueError, "scale"),
    ("backward block_size 2**63", "backward", _keep,
     dict(block_mask=np.ones((1, 1), bool), block_size=(2**63, 1)), ValueError, "block_size[0]"),
    ("backward mask too small", "backward", _keep,
     dict(block_mask=np.ones((2, 2), bool), block_size=(2, 3)), ValueError, "block_mask has shape"),
    ("backward causal an int", "backward", _keep, dict(causal=0), TypeError, "causal"),
    ("backward backend unknown", "backward", _keep, dict(backend="x"), ValueError, "backend"),
]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("what, fn, change, options, error, message", CASES,
                         ids=[c[0] for c in CASES])
def test_bad_argument_raises_naming_it(kind, what, fn, change, options, error, message):
    make = KINDS[kind]()
    arrays = change(good_arrays())
    with pytest.raises(error) as raised:
        call(fn, arrays, make, **options)
    assert message in str(raised.value), f"{what}: {raised.value}"


def test_checks_come_before_any_work(monkeypatch):
    """Every case of the table fails before an array is converted or a backend called: the checks
    are shared by NumPy arrays, CPU tensors and CUDA tensors and run before the code chooses
    between host and device, so a CUDA tensor fails the same way before any CUDA work."""
    def no_work(*args, **kwargs):
        raise AssertionError("work was started before the arguments were checked")

    arrays = good_arrays()  # o and lse from a real forward, before the module is disabled
    for name in ("attention", "attention_backward", "attention_device",
                 "attention_backward_device"):
        monkeypatch.setattr(_C, name, no_work)
    monkeypatch.setattr(flashattn, "_float32", no_work)
    monkeypatch.setattr(flashattn, "_host_float32", no_work)
    kinds = ["numpy"] + (["torch-cpu"] if _has_torch() else [])
    for kind in kinds:
        make = KINDS[kind]()
        for what, fn, change, options, error, message in CASES:
            with pytest.raises(error):
                call(fn, change(dict(arrays)), make, **options)


def _has_torch():
    return importlib.util.find_spec("torch") is not None


@pytest.mark.parametrize("kind", list(KINDS))
def test_odd_but_valid_arguments_work(kind):
    """What a hostile sweep also tries and must succeed: numpy scalars and Fractions as the scale,
    a mask as a list or of uint8, huge block sizes (one block), non-contiguous arrays."""
    make = KINDS[kind]()
    a = good_arrays()
    # The plain call to compare with: standard attention on the host, or for CUDA tensors the
    # default CUDA backend (standard has no device entry), with the same arguments made odd.
    base = call("forward", a, make, **({} if kind == "torch-cuda" else dict(backend="standard")))
    as_numpy = (lambda t: t) if kind == "numpy" else (lambda t: t.detach().cpu().numpy())
    tolerance = dict(rtol=1e-5, atol=1e-6)
    for options in (dict(scale=np.float32(0.25)), dict(scale=fractions.Fraction(1, 4)),
                    dict(scale=0), dict(scale=-0.3), dict(scale=np.float64(1e-30))):
        out = call("forward", a, make, **options)
        assert np.all(np.isfinite(as_numpy(out)))
    for mask, size in ((good_mask().tolist(), (2, 3)), (good_mask().astype(np.uint8), (2, 3)),
                       (np.ones((1, 1), bool), (2**63 - 1, 2**63 - 1)),
                       (np.ones((1, 1), bool), (np.int64(2**62), np.uint64(2**63 - 1)))):
        out = call("forward", a, make, block_mask=mask, block_size=size)
        np.testing.assert_allclose(as_numpy(out), as_numpy(base), **tolerance)
    # Non-contiguous (Fortran order, reversed strides) and, for NumPy, big-endian float32.
    strided = {name: np.asfortranarray(x) for name, x in a.items()}
    out = call("forward", strided, make if kind == "numpy" else _make_strided(make))
    np.testing.assert_allclose(as_numpy(out), as_numpy(base), **tolerance)
    if kind == "numpy":
        swapped = {name: x.astype(">f4") for name, x in a.items()}
        np.testing.assert_allclose(call("forward", swapped, make), base, **tolerance)
        grads = call("backward", swapped, make)
        np.testing.assert_allclose(grads[0], call("backward", a, make)[0], **tolerance)


def _make_strided(make):
    """Tensors whose memory is in the reverse order of their dimensions (not contiguous)."""
    def strided(x):
        t = make(np.ascontiguousarray(x.transpose()))
        return t.permute(*reversed(range(t.dim())))
    return strided


def test_torch_specific_bad_arguments():
    torch = torch_or_skip()
    a = {name: torch.tensor(x) for name, x in good_arrays().items()}
    q, k, v = a["q"], a["k"], a["v"]
    cases = [
        (lambda: flashattn.attention(q, k.numpy(), v), TypeError, "k must be a torch.Tensor"),
        (lambda: flashattn.attention(q.numpy(), k, v), TypeError, "q must be a torch.Tensor"),
        (lambda: flashattn.attention(q, k.half(), v), TypeError, "different dtypes"),
        (lambda: flashattn.attention(q.int(), k.int(), v.int()), TypeError, "q.dtype"),
        (lambda: flashattn.attention(q.to_sparse(), k, v), TypeError, "q is a torch.sparse_coo"),
        (lambda: flashattn.attention(q, k, v.to("meta")), ValueError, "v is on device meta"),
        (lambda: flashattn.attention(q.reshape(-1), k, v), ValueError, "q has shape"),
        (lambda: flashattn.attention(q, k, v, block_mask=torch.ones(5, 4).to_sparse(),
                                     block_size=(2, 3)), TypeError, "block_mask"),
        (lambda: flashattn.attention(q, k, v, block_mask=torch.ones(5, 4), block_size=(2, 3)),
         TypeError, "block_mask.dtype"),
        (lambda: flashattn.attention(q, k, v, block_mask=torch.ones(2, 2, dtype=torch.bool),
                                     block_size=(2, 3)), ValueError, "block_mask has shape"),
        (lambda: flashattn.attention_backward(q, k, v, a["o"], a["lse"].numpy(), a["do"]),
         TypeError, "lse"),
        (lambda: flashattn.attention_backward(q, k, v, a["o"], a["lse"].int(), a["do"]),
         TypeError, "lse.dtype"),
        (lambda: flashattn.attention_backward(q, k, v, a["o"], a["lse"].to_sparse(), a["do"]),
         TypeError, "lse is a torch.sparse_coo"),
        (lambda: flashattn.attention_backward(q, k, v, a["o"].double(), a["lse"], a["do"]),
         TypeError, "different dtypes"),
    ]
    for run, error, message in cases:
        with pytest.raises(error) as raised:
            run()
        assert message in str(raised.value), str(raised.value)
    # A tensor mask (bool) works like the NumPy one; autograd inputs are checked the same way.
    mask = torch.ones(5, 4, dtype=torch.bool)
    out = flashattn.attention(q, k, v, block_mask=mask, block_size=(2, 3))
    assert torch.allclose(out, flashattn.attention(q, k, v), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="q has shape"):
        flashattn.attention(q.reshape(-1).requires_grad_(), k, v)
    with pytest.raises(ValueError, match="scale = "):
        flashattn.attention(q.requires_grad_(), k, v, scale=2**2000)


def test_torch_cuda_bad_arguments_fail_before_cuda_work(monkeypatch):
    """On CUDA tensors, every case of the table raises before a device entry is called."""
    make = kind_torch_cuda()
    torch = torch_or_skip()

    def no_work(*args, **kwargs):
        raise AssertionError("a device entry was called with a bad argument")

    monkeypatch.setattr(_C, "attention_device", no_work)
    monkeypatch.setattr(_C, "attention_backward_device", no_work)
    for what, fn, change, options, error, message in CASES:
        with pytest.raises(error):
            call(fn, change(good_arrays()), make, **options)
    q = torch.randn(2, 4, 9, 8, device="cuda")
    with pytest.raises(ValueError, match="different devices"):
        flashattn.attention(q, q.cpu(), q)


def test_random_hostile_sweep_raises_only_value_or_type_errors():
    """Random combinations of bad and good arguments: each call succeeds or raises ValueError or
    TypeError (never IndexError, OverflowError, MemoryError, RuntimeError, ...)."""
    rng = np.random.default_rng(11)
    kinds = [kind_numpy()] + ([kind_torch_cpu()] if _has_torch() else [])
    shapes = [(2, 4, 9, 8), (9, 8), (8,), (), (2, 4, 9), (1, 1, 1, 1, 1), (0, 8), (2, 0, 9, 8),
              (2, 2, 11, 8), (2, 2, 11, 3), (11, 8), (3, 1, 11, 8), (2, 3, 9, 8)]
    dtypes = [np.float32, np.float32, np.float64, np.int8, np.float16, np.bool_]
    scales = [None, 0.5, -1e30, 3.4e38, 1e39, 2**2000, math.nan, -math.inf, "x", True, 1j]
    sizes = [None, (2, 3), (1, 1), (2**63, 1), (0, 1), (2**62, 2**62), (1,), "ab", 2]
    masks = [None, np.ones((5, 4), bool), np.ones((1, 1), bool), np.ones((9, 11), np.uint8),
             np.ones((5, 4)), [[1]], "m", np.ones(3, bool)]
    backends = [None, "omp", "scalar", "standard", "nope", 7]
    choose = lambda pool: pool[rng.integers(len(pool))]  # noqa: E731

    def array():
        return RNG.standard_normal(choose(shapes)).astype(choose(dtypes))

    for _ in range(600):
        make = choose(kinds)
        arrays = {name: array() for name in ("q", "k", "v", "o", "do")}
        arrays["lse"] = RNG.standard_normal(choose(shapes)[:-1] or (1,)).astype(choose(dtypes))
        options = dict(scale=choose(scales), block_size=choose(sizes), block_mask=choose(masks),
                       backend=choose(backends), causal=choose([False, True, 1]))
        fn = choose(["forward", "backward"])
        try:
            call(fn, arrays, make, **options)
        except (ValueError, TypeError):
            pass


# --- the compiled module, called directly --------------------------------------------------


def direct_arrays():
    return randn(1, 2, 9, 8), randn(1, 1, 11, 8), randn(1, 1, 11, 8)


NAN = math.nan


@pytest.mark.parametrize("args, message", [
    (lambda q, k, v: (q, k, v[:, :, :5]), "v has shape (1, 1, 5, 8): must be (1, 1, 11, 8)"),
    (lambda q, k, v: (q, k[..., :3], v), "k has shape (1, 1, 11, 3): must be (1, 1, 11, 8)"),
    (lambda q, k, v: (q, k[..., :3], v[..., :3]), "k has shape"),
    (lambda q, k, v: (q, np.concatenate([k, k]), v), "k has shape (2, 1, 11, 8)"),
    (lambda q, k, v: (q[0], k, v), "q has shape (2, 9, 8): must be 4-dimensional"),
    (lambda q, k, v: (q, k[0, 0], v), "k has shape (11, 8): must be 4-dimensional"),
    (lambda q, k, v: (q[:, :, :0], k, v), "seq_q = 0"),
    (lambda q, k, v: (q, k, v.reshape(1, 1, 8, 11)), "v has shape"),
])
def test_module_checks_array_sizes(args, message):
    q, k, v = args(*direct_arrays())
    with pytest.raises(ValueError) as raised:
        _C.attention(q, k, v, False, NAN, "omp", None, 0, 0, "f32")
    assert message in str(raised.value), str(raised.value)


@pytest.mark.parametrize("mask, size, message", [
    (np.ones((1, 1), np.uint8), (2, 3), "block_mask has shape (1, 1): must be (5, 4)"),
    (np.ones((4, 5), np.uint8), (2, 3), "block_mask has shape (4, 5)"),
    (np.ones(20, np.uint8), (2, 3), "block_mask has shape (20,)"),
    (np.ones((1, 5, 4), np.uint8), (2, 3), "block_mask has shape (1, 5, 4)"),
    (np.ones((5, 4), np.uint8), (0, 3), "block mask block_q = 0"),
    (np.ones((5, 4), np.uint8), (2, -1), "block mask block_kv = -1"),
])
def test_module_checks_the_block_mask(mask, size, message):
    """A mask smaller than its tile grid segfaulted; larger or of another rank was misread."""
    q, k, v = direct_arrays()
    for entry in ("forward", "backward", "validate"):
        with pytest.raises(ValueError) as raised:
            if entry == "forward":
                _C.attention(q, k, v, False, NAN, "scalar", mask, *size, "f32")
            elif entry == "backward":
                _C.attention_backward(q, k, v, q, q[..., 0], q, False, NAN, "omp", mask, *size,
                                      "f32")
            else:
                _C.validate(_C.Shape(1, 2, 1, 9, 11, 8), False, NAN, mask, *size)
        assert message in str(raised.value), f"{entry}: {raised.value}"


@pytest.mark.parametrize("change, message", [
    (dict(o=lambda q: q[:, :, :3]), "o has shape (1, 2, 3, 8): must be (1, 2, 9, 8)"),
    (dict(dO=lambda q: q[..., :2]), "do has shape"),
    (dict(lse=lambda q: q[..., 0][..., :4]), "lse has shape (1, 2, 4): must be (1, 2, 9)"),
    (dict(lse=lambda q: q), "lse has shape (1, 2, 9, 8)"),
    (dict(v=lambda q: q[:, :1, :3]), "v has shape"),
])
def test_module_backward_checks_array_sizes(change, message):
    q, k, v = direct_arrays()
    a = dict(q=q, k=k, v=v, o=q, lse=q[..., 0].copy(), dO=q)
    a.update({name: f(q) for name, f in change.items()})
    with pytest.raises(ValueError) as raised:
        _C.attention_backward(a["q"], a["k"], a["v"], a["o"], a["lse"], a["dO"], False, NAN,
                              "omp", None, 0, 0, "f32")
    assert message in str(raised.value), str(raised.value)


def test_module_refuses_bad_values_and_types():
    q, k, v = direct_arrays()
    for scale, shown in ((1e39, "scale = 1e+39"), (-math.inf, "scale = -inf")):
        with pytest.raises(ValueError, match=shown.replace("+", r"\+")):
            _C.attention(q, k, v, False, scale, "omp", None, 0, 0, "f32")
    with pytest.raises(ValueError, match="dtype = f64"):
        _C.attention(q, k, v, False, NAN, "omp", None, 0, 0, "f64")
    with pytest.raises(ValueError, match="backend = nope"):
        _C.attention(q, k, v, False, NAN, "nope", None, 0, 0, "f32")
    with pytest.raises(TypeError):  # pybind11 refuses a float64 array and a block size > int64
        _C.attention(q.astype(np.float64), k, v, False, NAN, "omp", None, 0, 0, "f32")
    with pytest.raises(TypeError):
        _C.attention(q, k, v, False, NAN, "omp", np.ones((1, 1), np.uint8), 2**63, 1, "f32")


CONTIGUOUS = (((0, 0, 0),) * 4, "f32")  # the forward device entry's layouts and O's dtype
CONTIGUOUS_BACKWARD = (((0, 0, 0),) * 8, "f32", "f32")  # the backward's, O's and the gradients'


def test_module_device_entries_check_before_any_device_work():
    """Null addresses and bad problems are refused first, in any build; a CPU backend has no
    device entry."""
    shape = _C.Shape(1, 2, 1, 9, 11, 8)
    good = dict(mask=None, bq=0, bkv=0)
    with pytest.raises(ValueError, match="q = null"):
        _C.attention_device(0, 8, 8, 8, 8, shape, False, NAN, "omp", None, 0, 0, 0, "f32", 0, 0, 0,
                            *CONTIGUOUS)
    with pytest.raises(ValueError, match="dv = null"):
        _C.attention_backward_device(8, 8, 8, 8, 8, 8, 8, 8, 0, shape, False, NAN, "omp",
                                     good["mask"], good["bq"], good["bkv"], 0, "f32", 0, 0, 0,
                                     *CONTIGUOUS_BACKWARD)
    with pytest.raises(ValueError, match="block_mask has shape"):
        _C.attention_device(8, 8, 8, 8, 8, shape, False, NAN, "omp", np.ones((1, 1), np.uint8),
                            2, 3, 0, "f32", 0, 0, 0, *CONTIGUOUS)
    with pytest.raises(ValueError, match="heads_kv = 3"):
        _C.attention_device(8, 8, 8, 8, 8, _C.Shape(1, 2, 3, 9, 11, 8), False, NAN, "omp", None,
                            0, 0, 0, "f32", 0, 0, 0, *CONTIGUOUS)
    with pytest.raises(ValueError, match="takes no device arrays"):
        _C.attention_device(8, 8, 8, 8, 8, shape, False, NAN, "omp", None, 0, 0, 0, "f32", 0, 0, 0,
                            *CONTIGUOUS)
