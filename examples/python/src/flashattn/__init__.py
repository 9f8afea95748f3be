"""flashattn — FlashAttention (arXiv 2205.14135, 2307.08691) from Python.

The same backends as the `flashattn` command line (`flashattn.backends()` lists them), on NumPy
arrays and PyTorch CPU tensors, with the backward pass and autograd:

    import numpy as np, flashattn
    q, k, v = (np.random.randn(2, 8, 1000, 64).astype(np.float32) for _ in range(3))
    o, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    do = np.ones_like(o)
    dq, dk, dv = flashattn.attention_backward(q, k, v, o, lse, do, causal=True)

Conventions (the library's, docs/design.md):
  * shapes (B, H, N, d) or (N, d); K and V may have fewer heads than Q (H % H_kv == 0: MQA/GQA);
  * scale defaults to 1/sqrt(d);
  * causal is bottom-right aligned: query i attends key j iff j <= i + N_kv - N_q;
  * a row with no visible key gives O = 0 and LSE = -inf (and zero gradients), never NaN;
  * LSE = log(sum_j exp(S_ij)), natural log, shape (B, H, N_q) or (N_q,);
  * block_mask (Algorithm 5): a (Tr, Tc) array of 0/1 over blocks of block_size = (Br, Bc) rows and
    keys, Tr = ceil(N_q / Br), Tc = ceil(N_kv / Bc); a 0 block is skipped entirely. bool or uint8:
    a NumPy array, nested lists, or a tensor on any device (it is read on the host).

Errors: TypeError for an argument of the wrong type or dtype, ValueError for a wrong shape, size or
value (each message names the argument), RuntimeError for a failure inside a backend (out of
memory: the message says how many bytes, for what). Arguments are checked before any array is
copied and before any CUDA work, the same way for NumPy arrays, CPU and CUDA tensors; the scale
must be finite and within float32's range, block sizes within int64.

CUDA tensors run where they are, no copy to the host: float32 on cuda-fa2, float16 and bfloat16 on
cuda-tc (tensor cores; fp32 accumulation, softmax and gradients, rounded to the input's dtype at
the end), on PyTorch's current stream (flashattn waits for the work queued on it, then returns when
its results are written). cuda-tc's backward adds dQ with fp32 atomics, so dQ's last bits may
change from run to run; FLASHATTN_DETERMINISTIC=1 fixes their order (slower).
"""
import math
import numbers

import numpy as np

from . import _flashattn as _C

__all__ = ["backends", "backend_info", "attention", "attention_backward", "merge_partials"]

_DEFAULT_BACKEND = "omp"  # the fast CPU form; any name of backends() may be given


def backends():
    """Names of the backends of this build, as `flashattn backends` prints them."""
    return [b["name"] for b in _C.backends()]


def backend_info():
    """One dict per backend: name, device ("cpu" or "cuda"), summary, dtypes, backward (bool),
    device_arrays (bool: takes CUDA tensors in place)."""
    return _C.backends()


# --- argument checks --------------------------------------------------------------------------
#
# Every check runs before any array is copied and before any CUDA call, so a bad call costs
# nothing and raises TypeError (wrong type or dtype) or ValueError (wrong shape, size or value)
# naming the argument, whatever the arrays are: NumPy, CPU tensors or CUDA tensors. The last
# check is the library's own (_C.validate, the rules of common/problem.hpp), on shapes alone.

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_SCORE_LIMIT = _C.score_limit  # common/score_range.hpp's kScoreLimit
_INT64_MAX = 2**63 - 1  # the C++ side's std::int64_t


def _shown(value):
    """repr(value) for a message, shortened: 2**2000 is shown as its first digits and its length."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _check_shape(name, shape):
    """(B, H, N, d) or (N, d), every dimension at least 1 (ValueError)."""
    shape = tuple(shape)
    if len(shape) not in (2, 4):
        raise ValueError(f"{name} has shape {shape}: must be (B, H, N, d) or (N, d)")
    if min(shape) < 1:
        raise ValueError(f"{name} has shape {shape}: every dimension must be at least 1")
    return shape


def _check_array(name, x):
    """A NumPy float32 array of rank 2 or 4 (any strides and byte order: copied when called)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray or a torch.Tensor, got {type(x).__name__}")
    if x.dtype.kind != "f" or x.dtype.itemsize != 4:
        raise TypeError(f"{name}.dtype is {x.dtype}: pass float32 ({name}.astype(numpy.float32))")
    _check_shape(name, x.shape)
    return x


def _as_4d(shape):
    return (1, 1, *shape) if len(shape) == 2 else tuple(shape)


def _check_shapes(qs, ks, vs):
    """q, k, v shapes (each already (B, H, N, d) or (N, d)) consistent with each other
    (ValueError); returns the (B, H, N, d) shapes of q and of k, v."""
    if not len(qs) == len(ks) == len(vs):
        raise ValueError(f"q, k, v have {len(qs)}, {len(ks)}, {len(vs)} dimensions: must be equal")
    if tuple(ks) != tuple(vs):
        raise ValueError(f"k has shape {tuple(ks)} and v {tuple(vs)}: they must be equal")
    Q, K = _as_4d(qs), _as_4d(ks)
    if Q[0] != K[0]:
        raise ValueError(f"batch of q ({Q[0]}) and of k, v ({K[0]}) differ")
    if Q[3] != K[3]:
        raise ValueError(f"head dimension of q ({Q[3]}) and of k, v ({K[3]}) differ")
    if Q[1] % K[1] != 0:
        raise ValueError(f"heads of q ({Q[1]}) must be a multiple of the heads of k, v "
                         f"({K[1]}) (MQA/GQA)")
    return Q, K


def _check_like_q(q, named):
    """The backward's o and do: q's shape (ValueError)."""
    for name, x in named:
        if tuple(x.shape) != tuple(q.shape):
            raise ValueError(f"{name} has shape {tuple(x.shape)}: must be q's shape "
                             f"{tuple(q.shape)}")


def _check_lse_shape(lse, q):
    if tuple(lse.shape) != tuple(q.shape[:-1]):
        raise ValueError(f"lse has shape {tuple(lse.shape)}: must be q's shape without d, "
                         f"{tuple(q.shape[:-1])}")


def _check_scale(scale):
    if scale is None:
        return math.nan  # the library's "default": 1/sqrt(d)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    try:
        value = float(scale)
    except OverflowError:  # an int or Fraction beyond any double, such as 2**2000
        value = math.inf
    # The library computes in float32: a scale beyond its range would become inf on the way.
    if not abs(value) <= _FLOAT32_MAX:  # also NaN
        raise ValueError(f"scale = {_shown(scale)}: must be finite and at most 3.4028235e+38 in "
                         f"magnitude (float32's largest value)")
    return value


def _check_backend(backend):
    if backend is None:
        return _DEFAULT_BACKEND
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {type(backend).__name__}")
    if backend not in backends():
        raise ValueError(f"backend = {backend!r}: not available in this build "
                         f"(available: {', '.join(backends())})")
    return backend


def _check_block_size(block_size):
    """(Br, Bc) as two ints in [1, 2**63 - 1] (the C++ side's int64)."""
    try:
        Br, Bc = block_size
    except (TypeError, ValueError):
        raise TypeError(f"block_size must be a pair of ints (Br, Bc), got {_shown(block_size)}"
                        ) from None
    for name, value in (("block_size[0]", Br), ("block_size[1]", Bc)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= value <= _INT64_MAX:
            raise ValueError(f"{name} = {_shown(value)}: must be in [1, 2**63 - 1]")
    return int(Br), int(Bc)


def _mask_array(block_mask):
    """block_mask as a NumPy array (a torch tensor is brought to the host: it is small)."""
    torch = _torch()
    if torch is not None and isinstance(block_mask, torch.Tensor):
        if block_mask.layout != torch.strided:
            raise TypeError(f"block_mask is a {block_mask.layout} tensor: must be dense "
                            f"(torch.strided)")
        return block_mask.detach().cpu().numpy()
    try:
        return np.asarray(block_mask)
    except (TypeError, ValueError) as error:  # a ragged list, an object NumPy cannot read
        raise TypeError(f"block_mask must be a (Tr, Tc) array of 0/1, got "
                        f"{type(block_mask).__name__}: {error}") from None


def _check_mask(block_mask, block_size, Nq, Nkv):
    """The mask as C-contiguous uint8 and its block size (None, 0, 0 without a mask)."""
    if block_mask is None:
        if block_size is not None:
            raise ValueError("block_size is the block size of block_mask: give block_mask too")
        return None, 0, 0
    if block_size is None:
        raise ValueError("block_mask needs block_size = (Br, Bc), the rows and keys of a block")
    Br, Bc = _check_block_size(block_size)
    mask = _mask_array(block_mask)
    if mask.dtype not in (np.bool_, np.uint8):
        raise TypeError(f"block_mask.dtype is {mask.dtype}: must be bool or uint8")
    Tr, Tc = -(-Nq // Br), -(-Nkv // Bc)
    if mask.shape != (Tr, Tc):
        raise ValueError(f"block_mask has shape {mask.shape}: must be (Tr, Tc) = ({Tr}, {Tc}) for "
                         f"block_size = ({Br}, {Bc}), N_q = {Nq}, N_kv = {Nkv}")
    mask = np.ascontiguousarray(mask.astype(np.uint8))
    if mask.max(initial=0) > 1:
        raise ValueError("block_mask entries must be 0 or 1")
    return mask, Br, Bc


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _check_options(Q, K, causal, scale, block_mask, block_size):
    """causal, scale and the block mask for (B, H, N, d) shapes Q and K, then the whole problem by
    the library's own rules (_C.validate: d in [1, 256], sizes, ...), on shapes alone."""
    causal, scale = _check_bool("causal", causal), _check_scale(scale)
    mask, Br, Bc = _check_mask(block_mask, block_size, Q[2], K[2])
    _C.validate(_C.Shape(Q[0], Q[1], K[1], Q[2], K[2], Q[3]), causal, scale, mask, Br, Bc)
    return causal, scale, mask, Br, Bc


# --- on the host: NumPy arrays and CPU tensors ------------------------------------------------


def _host_attention(Q, K, V, shapes, options, backend, dtype):
    """Runs the forward on float32 C-contiguous host arrays, shapes = (Q's, K's) in 4-D."""
    Qs, Ks = shapes
    return _C.attention(Q.reshape(Qs), K.reshape(Ks), V.reshape(Ks), *options[:2], backend,
                        *options[2:], dtype)


def _host_backward(Q, K, V, O, L, dO, shapes, options, backend, dtype):
    Qs, Ks = shapes
    return _C.attention_backward(Q.reshape(Qs), K.reshape(Ks), V.reshape(Ks), O.reshape(Qs),
                                 L.reshape(Qs[:3]), dO.reshape(Qs), *options[:2], backend,
                                 *options[2:], dtype)


def _float32(x):
    return np.ascontiguousarray(x, dtype=np.float32)  # also native byte order


def _numpy_attention(q, k, v, causal, scale, backend, block_mask, block_size):
    q, k, v = _check_array("q", q), _check_array("k", k), _check_array("v", v)
    shapes = _check_shapes(q.shape, k.shape, v.shape)
    options = _check_options(*shapes, causal, scale, block_mask, block_size)
    backend = _check_backend(backend)
    O, L = _host_attention(_float32(q), _float32(k), _float32(v), shapes, options, backend, "f32")
    return O.reshape(q.shape), L.reshape(q.shape[:-1])


def _numpy_backward(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size):
    q, k, v = _check_array("q", q), _check_array("k", k), _check_array("v", v)
    o, do = _check_array("o", o), _check_array("do", do)
    if not isinstance(lse, np.ndarray):
        raise TypeError(f"lse must be a numpy.ndarray or a torch.Tensor, got {type(lse).__name__}")
    if lse.dtype.kind != "f" or lse.dtype.itemsize != 4:
        raise TypeError(f"lse.dtype is {lse.dtype}: pass float32")
    shapes = _check_shapes(q.shape, k.shape, v.shape)
    _check_like_q(q, (("o", o), ("do", do)))
    _check_lse_shape(lse, q)
    options = _check_options(*shapes, causal, scale, block_mask, block_size)
    backend = _check_backend(backend)
    dQ, dK, dV = _host_backward(*map(_float32, (q, k, v, o, lse, do)), shapes, options, backend,
                                "f32")
    return dQ.reshape(q.shape), dK.reshape(k.shape), dV.reshape(v.shape)


# --- PyTorch (optional) ---------------------------------------------------------------------


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _is_torch(*xs):
    torch = _torch()
    return torch is not None and any(isinstance(x, torch.Tensor) for x in xs)


_TORCH_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
# The backend CUDA tensors run on by default, per dtype: the ones with a device entry.
_DEFAULT_CUDA_BACKEND = {"f32": "cuda-fa2", "f16": "cuda-tc", "bf16": "cuda-tc"}


def _check_tensor(name, x):
    """A dense tensor on the CPU or a CUDA device (TypeError, ValueError)."""
    torch = _torch()
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor like the other arguments, got "
                        f"{type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError(f"{name} is a {x.layout} tensor: must be dense (torch.strided)")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on device {x.device}: must be on the CPU or a CUDA device")


def _check_tensors(names, xs):
    """Dense tensors of rank 2 or 4, on one device, of one dtype (float32, float16 or bfloat16);
    returns the library's name of the dtype."""
    for name, x in zip(names, xs):
        _check_tensor(name, x)
    devices = {str(x.device) for x in xs}
    if len(devices) > 1:
        raise ValueError(f"{', '.join(names)} are on different devices: "
                         f"{', '.join(sorted(devices))}")
    dtypes = {x.dtype for x in xs}
    if len(dtypes) > 1:
        raise TypeError(f"{', '.join(names)} have different dtypes: "
                        f"{', '.join(sorted(map(str, dtypes)))}")
    dtype = str(xs[0].dtype).replace("torch.", "")
    if dtype not in _TORCH_DTYPES:
        raise TypeError(f"{names[0]}.dtype is {xs[0].dtype}: must be float32, float16 or bfloat16")
    for name, x in zip(names, xs):
        _check_shape(name, x.shape)
    return _TORCH_DTYPES[dtype]


def _check_lse_tensor(lse, q):
    """The backward's lse: a floating tensor on q's device with q's shape without d."""
    _check_tensor("lse", lse)
    if lse.device != q.device:
        raise ValueError(f"q, lse are on different devices: {q.device}, {lse.device}")
    if not lse.dtype.is_floating_point:
        raise TypeError(f"lse.dtype is {lse.dtype}: must be a floating dtype (attention returns "
                        f"float32)")
    _check_lse_shape(lse, q)


def _host_float32(x):
    """A CPU tensor as a C-contiguous float32 NumPy array (a copy where it must be)."""
    torch = _torch()
    return x.detach().to(torch.float32).contiguous().numpy()


def _cuda_backend(backend, dtype):
    """The backend for CUDA tensors of `dtype` (the library's name): one with a device entry."""
    backend = _check_backend(_DEFAULT_CUDA_BACKEND[dtype] if backend is None else backend)
    info = {b["name"]: b for b in _C.backends()}[backend]
    if not info["device_arrays"]:
        raise ValueError(f"backend = {backend!r} takes no CUDA tensors (use "
                         f"{_DEFAULT_CUDA_BACKEND[dtype]!r} for this dtype)")
    if dtype not in info["dtypes"]:
        raise TypeError(f"backend = {backend!r} computes in {', '.join(info['dtypes'])}, not "
                        f"{dtype} (use {_DEFAULT_CUDA_BACKEND[dtype]!r} for this dtype)")
    return backend


def _signed_q(Q, dtype, scale):
    """cuda-tc folds a negative scale into Q (negating a 16-bit value is exact): it reads
    sign(scale) * Q, and its gradients are still those of Q."""
    return -Q if dtype != "f32" and scale < 0 else Q


def _max_finite_row_norm(x):
    """The largest Euclidean norm over the rows (last axis) of x whose elements are all finite, in
    float64 (a float32 sum of squares would overflow long before the scores do)."""
    squares = x.detach().to(_torch().float64).square().sum(-1).flatten()
    squares = squares[squares.isfinite()]
    return math.sqrt(squares.max().item()) if squares.numel() else 0.0


def _max_finite_abs(x):
    """The largest |element| of x over its finite elements (0 when there is none)."""
    x = x.detach()
    x = x[x.isfinite()].float()  # float32 holds every f16/bf16 value exactly
    return float(x.abs().max().item()) if x.numel() else 0.0


def _check_score_range(Q, K, scale):
    """The library refuses scores float32 cannot hold (common/score_range.hpp: an overflowed row
    would read as fully masked, O = 0 and LSE = -inf), but it cannot read tensors on a GPU, so the
    same bound is checked here, on the tensors: max(1, |scale|) * max|q_i| * max|k_j| must stay
    within FLT_MAX / 2. Q and K as (B, H, N, d); scale as checked (NaN: the default 1/sqrt(d)).
    A first test on max|x| (|q_i| <= sqrt(d) max|x|) avoids the float64 norms for ordinary inputs.
    Reading the tensors' maxima synchronizes with the device once."""
    d = Q.shape[-1]
    s = abs(float(np.float32(1.0 / math.sqrt(d)))) if math.isnan(scale) else abs(scale)
    factor = max(1.0, s)
    if factor * d * _max_finite_abs(Q) * _max_finite_abs(K) <= _SCORE_LIMIT:
        return
    bound = factor * _max_finite_row_norm(Q) * _max_finite_row_norm(K)
    if bound > _SCORE_LIMIT:
        shown = np.float32(s if scale >= 0 or math.isnan(scale) else -s)  # as the library prints it
        raise ValueError(
            f"scale = {str(shown)}: the scores scale * q.k of these inputs can reach {bound:.3g} "
            f"in magnitude (max(1, |scale|) * max|q_i| * max|k_j|), beyond what float32 holds "
            f"(limit {_SCORE_LIMIT:.3g}): they would overflow, and a row would read as fully "
            f"masked or NaN. Use a smaller |scale| or rescale Q and K")


def _cuda_call(device, call):
    """Runs call(stream) with `device` current, on PyTorch's current stream there."""
    torch = _torch()
    with torch.cuda.device(device):
        call(torch.cuda.current_stream(device).cuda_stream)


def _torch_forward(q, k, v, causal, scale, backend, block_mask, block_size):
    torch = _torch()
    dtype = _check_tensors(("q", "k", "v"), (q, k, v))
    Qs, Ks = shapes = _check_shapes(q.shape, k.shape, v.shape)
    options = _check_options(Qs, Ks, causal, scale, block_mask, block_size)
    if not q.is_cuda:
        backend = _check_backend(backend)
        O, L = _host_attention(*map(_host_float32, (q, k, v)), shapes, options, backend, dtype)
        return torch.from_numpy(O).to(q.dtype).reshape(q.shape), \
            torch.from_numpy(L).reshape(q.shape[:-1])
    backend = _cuda_backend(backend, dtype)
    causal, scale, mask, Br, Bc = options
    _check_score_range(q, k, scale)
    # Every check has passed: from here on, CUDA work.
    Q, K, V = (x.detach().contiguous() for x in (q.reshape(Qs), k.reshape(Ks), v.reshape(Ks)))
    Q = _signed_q(Q, dtype, scale)
    O = torch.empty(Qs, dtype=torch.float32, device=q.device)  # the kernels write float32
    L = torch.empty(Qs[:3], dtype=torch.float32, device=q.device)
    shape = _C.Shape(Qs[0], Qs[1], Ks[1], Qs[2], Ks[2], Qs[3])
    _cuda_call(q.device, lambda stream: _C.attention_device(
        Q.data_ptr(), K.data_ptr(), V.data_ptr(), O.data_ptr(), L.data_ptr(), shape,
        causal, scale, backend, mask, Br, Bc, stream, dtype))
    return O.to(q.dtype).reshape(q.shape), L.reshape(q.shape[:-1])


def _torch_backward(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size):
    torch = _torch()
    dtype = _check_tensors(("q", "k", "v", "o", "do"), (q, k, v, o, do))
    _check_lse_tensor(lse, q)
    Qs, Ks = shapes = _check_shapes(q.shape, k.shape, v.shape)
    _check_like_q(q, (("o", o), ("do", do)))
    options = _check_options(Qs, Ks, causal, scale, block_mask, block_size)
    if not q.is_cuda:
        backend = _check_backend(backend)
        grads = _host_backward(*map(_host_float32, (q, k, v, o, lse, do)), shapes, options,
                               backend, dtype)
        return tuple(torch.from_numpy(g).to(x.dtype).reshape(x.shape)
                     for g, x in zip(grads, (q, k, v)))
    backend = _cuda_backend(backend, dtype)
    causal, scale, mask, Br, Bc = options
    _check_score_range(q, k, scale)
    # Every check has passed: from here on, CUDA work.
    Q, K, V, dO = (x.detach().reshape(s).contiguous()
                   for x, s in ((q, Qs), (k, Ks), (v, Ks), (do, Qs)))
    Q = _signed_q(Q, dtype, scale)
    O = o.detach().reshape(Qs).to(torch.float32).contiguous()  # O and LSE are read as float32
    L = lse.detach().reshape(Qs[:3]).to(torch.float32).contiguous()
    f32 = dict(dtype=torch.float32, device=q.device)  # the kernels write float32 gradients
    dQ, dK, dV = torch.empty(Qs, **f32), torch.empty(Ks, **f32), torch.empty(Ks, **f32)
    shape = _C.Shape(Qs[0], Qs[1], Ks[1], Qs[2], Ks[2], Qs[3])
    _cuda_call(q.device, lambda stream: _C.attention_backward_device(
        Q.data_ptr(), K.data_ptr(), V.data_ptr(), O.data_ptr(), L.data_ptr(), dO.data_ptr(),
        dQ.data_ptr(), dK.data_ptr(), dV.data_ptr(), shape, causal, scale, backend, mask, Br, Bc,
        stream, dtype))
    return tuple(g.to(x.dtype).reshape(x.shape) for g, x in ((dQ, q), (dK, k), (dV, v)))


def _autograd_function():
    """torch.autograd.Function whose backward is our backward pass (made once, on first use)."""
    global _AttentionFunction
    if _AttentionFunction is None:
        torch = _torch()

        class AttentionFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, causal, scale, backend, block_mask, block_size):
                o, lse = _torch_forward(q, k, v, causal, scale, backend, block_mask, block_size)
                ctx.save_for_backward(q, k, v, o, lse)
                ctx.options = (causal, scale, backend, block_mask, block_size)
                ctx.mark_non_differentiable(lse)
                return o, lse

            @staticmethod
            def backward(ctx, do, _dlse):
                q, k, v, o, lse = ctx.saved_tensors
                dq, dk, dv = _torch_backward(q, k, v, o, lse, do.contiguous(), *ctx.options)
                return dq, dk, dv, None, None, None, None, None

        _AttentionFunction = AttentionFunction
    return _AttentionFunction


_AttentionFunction = None


# --- the API --------------------------------------------------------------------------------


def attention(q, k, v, *, causal=False, scale=None, backend=None, return_lse=False,
              block_mask=None, block_size=None):
    """softmax(scale * q k^T) v, computed by one of the library's backends.

    q: (B, H, N_q, d) or (N_q, d); k, v: (B, H_kv, N_kv, d) or (N_kv, d) with H % H_kv == 0.
    NumPy float32 arrays, or PyTorch CPU tensors of float32, float16 or bfloat16 (computed in
    that precision, as `flashattn run --dtype` does; outputs have the input's dtype), or PyTorch
    CUDA tensors (computed on their GPU, results on the same device): float32 by cuda-fa2,
    float16 and bfloat16 by cuda-tc (tensor cores; d in 32, 64, 96, 128, and 256 forward only).

    causal: bottom-right aligned mask (query i sees key j iff j <= i + N_kv - N_q).
    scale: softmax scale, default 1 / sqrt(d).
    backend: a name from flashattn.backends(); default "omp" (for CUDA tensors "cuda-fa2" in
        float32, "cuda-tc" in float16 / bfloat16).
    return_lse: also return LSE = log sum_j exp(scale q_i . k_j) over visible keys, float32,
        shape (B, H, N_q) or (N_q,); -inf for a row with no visible key (whose O row is 0).
    block_mask, block_size: block-sparse attention (Algorithm 5), see the module's docstring.

    Returns O (the shape of q), or (O, LSE). With PyTorch tensors that require grad, gradients
    flow through flashattn's own backward pass (attention_backward).
    """
    return_lse = _check_bool("return_lse", return_lse)
    if _is_torch(q, k, v):
        torch = _torch()
        if torch.is_grad_enabled() and any(
                isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v)):
            o, lse = _autograd_function().apply(q, k, v, causal, scale, backend, block_mask,
                                                block_size)
        else:
            o, lse = _torch_forward(q, k, v, causal, scale, backend, block_mask, block_size)
    else:
        o, lse = _numpy_attention(q, k, v, causal, scale, backend, block_mask, block_size)
    return (o, lse) if return_lse else o


def attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, backend=None,
                       block_mask=None, block_size=None):
    """The backward pass (paper Algorithm 4): (dQ, dK, dV) for the upstream gradient do = dL/dO.

    o and lse are what attention(..., return_lse=True) returned for the same q, k, v and options;
    do has o's shape. dK and dV are summed over the query heads that share a K/V head (GQA).
    The backend must have a backward pass (backend_info()[i]["backward"]); default "omp".
    """
    if _is_torch(q, k, v, o, lse, do):
        return _torch_backward(q, k, v, o, lse, do, causal, scale, backend, block_mask,
                               block_size)
    return _numpy_backward(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size)


# --- merging partial results ----------------------------------------------------------------


def _check_parts(outputs, lses):
    """outputs and lses: equally long, non-empty lists of float32 arrays, all NumPy or all torch
    (one device); every output of one shape, (B, H, N, d) or (N, d), every LSE that shape
    without d. Returns the torch module when they are tensors, else None."""
    for name, parts in (("outputs", outputs), ("lses", lses)):
        if not isinstance(parts, (list, tuple)):
            raise TypeError(f"{name} must be a list or tuple of arrays (one per part), got "
                            f"{type(parts).__name__}")
    if len(outputs) != len(lses):
        raise ValueError(f"outputs has {len(outputs)} parts and lses {len(lses)}: must be equal")
    if not outputs:
        raise ValueError("outputs and lses are empty: merge_partials needs at least one part")
    named = [(f"outputs[{s}]", x) for s, x in enumerate(outputs)] + \
            [(f"lses[{s}]", x) for s, x in enumerate(lses)]
    torch = _torch() if _is_torch(*outputs, *lses) else None
    for name, x in named:
        if torch is not None:
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} is a {type(x).__name__}: outputs and lses must be all "
                                f"torch tensors or all NumPy arrays")
            _check_tensor(name, x)
            if x.dtype != torch.float32:
                raise TypeError(f"{name}.dtype is {x.dtype}: must be torch.float32")
        else:
            if not isinstance(x, np.ndarray):
                raise TypeError(f"{name} must be a numpy.ndarray or a torch.Tensor, got "
                                f"{type(x).__name__}")
            if x.dtype.kind != "f" or x.dtype.itemsize != 4:
                raise TypeError(f"{name}.dtype is {x.dtype}: must be float32")
    if torch is not None:
        devices = {str(x.device) for _, x in named}
        if len(devices) > 1:
            raise ValueError(f"outputs and lses are on different devices: "
                             f"{', '.join(sorted(devices))}")
    shape = _check_shape("outputs[0]", outputs[0].shape)
    for name, x in named:
        expected = shape if name.startswith("outputs") else shape[:-1]
        if tuple(x.shape) != expected:
            raise ValueError(f"{name} has shape {tuple(x.shape)}: must be {expected} (every "
                             f"output has outputs[0]'s shape, every LSE that shape without d)")
    return torch


def merge_partials(outputs, lses):
    """The LSE merge: S partial attention results over disjoint sets of keys, merged into one.

    outputs[s] and lses[s] are what attention(q, k_s, v_s, return_lse=True) returns for the same
    queries and the s-th set of keys (the sets disjoint): O_s, shape (B, H, N, d) or (N, d), and
    LSE_s, shape (B, H, N) or (N,). The result is the attention over all the keys together,
        LSE = log sum_s e^(LSE_s),    O = sum_s e^(LSE_s - LSE) O_s,
    computed by the library's rule (merge_partial_row in common/online_softmax.hpp), which folds
    the parts in the order given. A part whose row saw no key (LSE = -inf) adds nothing; a row
    that saw no key in any part gives O = 0, LSE = -inf; a NaN in an O_s or LSE_s stays NaN.
    Split-KV decoding and ring attention (flashattn.distributed) merge their parts this way.

    float32 NumPy arrays, or float32 torch tensors all on one device (CPU or CUDA; on CUDA on
    PyTorch's current stream); returns (O, LSE) of the same kind, on the same device. Not
    differentiable: tensors that require grad are refused while grad mode is on.
    """
    torch = _check_parts(outputs, lses)
    shape = tuple(outputs[0].shape)
    S, d = len(outputs), shape[-1]
    R = math.prod(shape[:-1])  # rows: every (batch, head, query) of the output
    if torch is None:
        O, L = _C.merge_partials(np.stack([_float32(x).reshape(R, d) for x in outputs]),
                                 np.stack([_float32(x).reshape(R) for x in lses]))
        return O.reshape(shape), L.reshape(shape[:-1])
    if torch.is_grad_enabled() and any(x.requires_grad for x in (*outputs, *lses)):
        raise TypeError("merge_partials is not differentiable, and outputs or lses require "
                        "grad: call it under torch.no_grad() or on detached tensors")
    device = outputs[0].device
    if device.type == "cuda" and not hasattr(_C, "merge_partials_device"):
        raise RuntimeError("this build of flashattn has no CUDA (no merge_partials_device): "
                           "CUDA tensors cannot be merged; pass CPU tensors or build with CUDA")
    O_parts = torch.stack([x.detach().reshape(R, d) for x in outputs])  # (S, R, d), contiguous
    L_parts = torch.stack([x.detach().reshape(R) for x in lses])        # (S, R)
    if device.type == "cpu":
        O, L = _C.merge_partials(O_parts.numpy(), L_parts.numpy())
        return torch.from_numpy(O).reshape(shape), torch.from_numpy(L).reshape(shape[:-1])
    O = torch.empty((R, d), dtype=torch.float32, device=device)
    L = torch.empty((R,), dtype=torch.float32, device=device)
    _cuda_call(device, lambda stream: _C.merge_partials_device(
        O_parts.data_ptr(), L_parts.data_ptr(), S, R, d, O.data_ptr(), L.data_ptr(), stream))
    return O.reshape(shape), L.reshape(shape[:-1])
