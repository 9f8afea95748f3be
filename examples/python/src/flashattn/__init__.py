"""flashattn — FlashAttention (arXiv 2205.14135, 2307.08691) from Python.

The same backends as the `flashattn` command line (`flashattn.backends()` lists them), on NumPy
arrays and PyTorch tensors, with the backward pass and autograd:

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
    a NumPy array, nested lists, or a tensor on any device (see "Block masks" below).

Where it runs:
  * NumPy float32 arrays and PyTorch CPU tensors: the host backends, "omp" unless `backend=` names
    another; CPU tensors of float16/bfloat16 are computed in that precision.
  * PyTorch CUDA tensors: on their GPU, no copy to the host, asynchronously on PyTorch's current
    stream of their device (like any PyTorch operator: the call queues kernels and returns; outputs
    and workspace come from PyTorch's caching allocator). By default, the fastest backend for the
    device and dtype:
      float32                    cuda-fa2 (forward and backward);
      float16 / bfloat16         forward: cuda-fa3 on Hopper (compute capability 9.0, a build with
                                 sm_90a) for d = 64, 128 and 256, else cuda-tc, and cuda-tc for
                                 a decoding forward (at most 64 query rows: it splits the keys
                                 and reads K/V once per GQA group, docs/decoding.md); backward:
                                 cuda-fa3's where it has one, else cuda-tc's (it works from any
                                 forward's O and LSE).
    cuda-tc and cuda-fa3 accumulate, take the softmax and write O and the gradients in float32,
    cast to the input's dtype on the GPU. Their backwards add dQ with fp32 atomics, so dQ's
    last bits may change from run to run; FLASHATTN_DETERMINISTIC=1 fixes their order (slower).
  * `backend=` forces a backend (for CUDA tensors, one with a device entry and the tensors' dtype).
  * Under torch.autocast, q, k and v are cast first as SDPA's are (float32 to autocast's dtype).

With PyTorch >= 2.4 the forward and backward are a PyTorch custom operator
(torch.ops.flashattn.attention_forward / attention_backward, with fake implementations and an
autograd formula), so torch.compile(fullgraph=True) traces through flashattn.attention: the
compiler sees the operator. An eager call goes straight to the same implementation (through an
autograd function when autograd records it: in C++ for CUDA tensors where flashattn._torch_ops is
built), without the dispatch through the operator, which costs host time on every call; tensor
subclasses and dispatch modes (FakeTensor, FakeTensorMode) still get the operator. Eager calls can
be captured in a CUDA graph. Under torch.compile give block_mask as a tensor. With an older PyTorch
every call takes the eager way (no torch.compile support). Where the build found PyTorch with CUDA
and its C++ headers, the operators' CUDA kernels are C++ (flashattn._torch_ops): once a call's
signature has passed the checks here, its launch needs no Python (calls that need a copy or a cast
first still run here). Importing flashattn imports torch where it is installed, so that the
operator is registered before anything is traced.

Block masks with CUDA tensors: a host mask (NumPy, lists, CPU tensor) is checked on the host (0/1)
and copied to the device without waiting (`.to(device, non_blocking=True)`); a CUDA mask is
checked by dtype and shape only, since reading its values would wait for the GPU: the kernels read
any nonzero entry as 1 (visible). Inside a CUDA graph capture, give the mask on the device.

Scores that overflow float32: on the host the library refuses the call (ValueError naming the
scale); CUDA tensors cannot be read without waiting for the GPU, so there the kernels mark a row
whose scores overflowed NaN (O and LSE), never O = 0 and LSE = -inf, which stays reserved for rows
with no visible key.

Errors: TypeError for an argument of the wrong type or dtype, ValueError for a wrong shape, size or
value (each message names the argument), RuntimeError for a failure inside a backend (out of
memory: the message says how many bytes, for what). Arguments are checked before any array is
copied and before any CUDA work, the same way for NumPy arrays, CPU and CUDA tensors, on shapes and
dtypes alone; the scale must be finite and within float32's range, block sizes within int64. A
failure inside a CUDA kernel surfaces at the next synchronization, as with any PyTorch operator.
"""
import importlib.util
import math
import numbers
import os
from typing import NamedTuple

import numpy as np

from . import _flashattn as _C

# PyTorch is optional. Where it is installed it is imported now, not at the first call: the custom
# operator must be registered before torch.compile traces a call to it.
torch = None
if importlib.util.find_spec("torch") is not None:
    import torch

__all__ = ["backends", "backend_info", "attention", "attention_backward", "merge_partials"]

_DEFAULT_BACKEND = "omp"  # the fast CPU form; any name of backends() may be given


def backends():
    """Names of the backends of this build, as `flashattn backends` prints them."""
    return list(_backend_table())


def backend_info():
    """One dict per backend: name, device ("cpu" or "cuda"), summary, dtypes, backward (bool),
    device_arrays (bool: takes CUDA tensors in place), device_layouts (bool: reads strided CUDA
    tensors where they lie and writes O and the gradients in their dtype), device_o_dtype (bool:
    its forward writes O in the inputs' dtype, with no cast afterwards)."""
    return [dict(info) for info in _backend_table().values()]


_BACKEND_TABLE = None


def _backend_table():
    """{name: info} of _C.backends(), asked once: the backends of a build and machine do not change
    while the process runs, and each call checks a name against them."""
    global _BACKEND_TABLE
    if _BACKEND_TABLE is None:
        _BACKEND_TABLE = {info["name"]: info for info in _C.backends()}
    return _BACKEND_TABLE


# --- argument checks --------------------------------------------------------------------------
#
# Every check runs before any array is copied and before any CUDA call, so a bad call costs
# nothing and raises TypeError (wrong type or dtype) or ValueError (wrong shape, size or value)
# naming the argument, whatever the arrays are: NumPy, CPU tensors or CUDA tensors. The last
# check is the library's own (_C.validate, the rules of common/problem.hpp), on shapes alone.

_FLOAT32_MAX = float(np.finfo(np.float32).max)
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
    if backend not in _backend_table():
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
    _check_mask_shape(tuple(mask.shape), Br, Bc, Nq, Nkv)
    return _host_mask_values(mask), Br, Bc


def _check_mask_shape(shape, Br, Bc, Nq, Nkv):
    """A block mask covers the (Tr, Tc) grid of blocks of Br query rows and Bc keys (ValueError)."""
    Tr, Tc = -(-Nq // Br), -(-Nkv // Bc)
    if shape != (Tr, Tc):
        raise ValueError(f"block_mask has shape {shape}: must be (Tr, Tc) = ({Tr}, {Tc}) for "
                         f"block_size = ({Br}, {Bc}), N_q = {Nq}, N_kv = {Nkv}")


def _host_mask_values(mask):
    """A host mask (NumPy bool or uint8) as C-contiguous uint8 of 0/1 (ValueError otherwise)."""
    mask = np.ascontiguousarray(mask.astype(np.uint8))
    if mask.max(initial=0) > 1:
        raise ValueError("block_mask entries must be 0 or 1")
    return mask


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


# --- PyTorch tensors: the checks ---------------------------------------------------------------
#
# A call on tensors is checked in two places. Before the operator, what its schema cannot carry:
# that q, k, v (o, lse, do) are tensors, the types of causal, scale, backend and block_size, and a
# host block mask made a tensor. Inside the implementations (the real ones, which the operator and
# eager calls run, and the fake one torch.compile traces with), everything about the tensors:
# dtypes, devices, shapes, the block mask's dtype and shape, the backend for the device and the
# library's own validate(). Only metadata is read, never a CUDA tensor's values, so nothing waits
# for the GPU. The real implementations run those checks once per signature (_Plan, below).

_TORCH_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
if torch is not None:
    _TORCH_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def _is_torch(*xs):
    """Whether any of xs is a torch tensor (a plain loop: this runs on every call)."""
    if torch is not None:
        for x in xs:
            if isinstance(x, torch.Tensor):
                return True
    return False


def _check_tensor(name, x):
    """A dense tensor on the CPU or a CUDA device (TypeError, ValueError)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor like the other arguments, got "
                        f"{type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError(f"{name} is a {x.layout} tensor: must be dense (torch.strided)")
    if not (x.is_cuda or x.is_cpu):  # two flags: cheaper than x.device, a new object each time
        raise ValueError(f"{name} is on device {x.device}: must be on the CPU or a CUDA device")


def _autocast_dtype(device_type):
    """The dtype torch.autocast casts to on this device type ("cpu" or "cuda"), or None where
    autocast is off there."""
    if hasattr(torch, "get_autocast_dtype"):  # PyTorch >= 2.4: one function for every device
        return (torch.get_autocast_dtype(device_type)
                if torch.is_autocast_enabled(device_type) else None)
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return None


def _autocast(q, k, v):
    """q, k, v as torch.autocast hands them to attention, as to SDPA (whose autocast policy is
    `lower_precision_fp`): where autocast is on for q's device type, floating tensors of that
    type other than float64 are cast to the autocast dtype (float32 inputs under bfloat16
    autocast run in bfloat16, on cuda-fa3 on a Hopper GPU, and O comes back in bfloat16); the
    casts are recorded by autograd, so gradients reach the inputs in their own dtype."""
    on_cuda = q.is_cuda  # (q is on the CPU or a CUDA device, checked; x.device is a new object)
    dtype = _autocast_dtype("cuda" if on_cuda else "cpu")  # every eager call passes here
    if dtype is None:
        return q, k, v
    return tuple(x.to(dtype) if (x.is_floating_point() and x.dtype != dtype
                                 and x.dtype != torch.float64 and x.is_cuda == on_cuda) else x
                 for x in (q, k, v))


def _check_tensors(names, xs):
    """Tensors of rank 2 or 4, on one device, of one dtype (float32, float16 or bfloat16);
    returns the library's name of the dtype."""
    device, dtype = xs[0].device, xs[0].dtype
    if any(x.device != device for x in xs):
        raise ValueError(f"{', '.join(names)} are on different devices: "
                         f"{', '.join(sorted({str(x.device) for x in xs}))}")
    if any(x.dtype != dtype for x in xs):
        raise TypeError(f"{', '.join(names)} have different dtypes: "
                        f"{', '.join(sorted({str(x.dtype) for x in xs}))}")
    if dtype not in _TORCH_DTYPES:
        raise TypeError(f"{names[0]}.dtype is {dtype}: must be float32, float16 or bfloat16")
    for name, x in zip(names, xs):
        _check_shape(name, x.shape)
    return _TORCH_DTYPES[dtype]


def _check_lse_tensor(lse, q):
    """The backward's lse: a floating tensor on q's device with q's shape without d."""
    if lse.device != q.device:
        raise ValueError(f"q, lse are on different devices: {q.device}, {lse.device}")
    if not lse.dtype.is_floating_point:
        raise TypeError(f"lse.dtype is {lse.dtype}: must be a floating dtype (attention returns "
                        f"float32)")
    _check_lse_shape(lse, q)


def _operator_options(causal, scale, backend, block_mask, block_size):
    """The options as the operator's schema takes them (bool, float?, str?, Tensor?, int[]?),
    checked: a host block mask (NumPy array, nested lists) becomes a CPU tensor."""
    causal = _check_bool("causal", causal)
    scale = _check_scale(scale)
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {type(backend).__name__}")
    if block_mask is None:
        if block_size is not None:
            raise ValueError("block_size is the block size of block_mask: give block_mask too")
        return causal, None if math.isnan(scale) else scale, backend, None, None
    if block_size is None:
        raise ValueError("block_mask needs block_size = (Br, Bc), the rows and keys of a block")
    size = list(_check_block_size(block_size))
    if not isinstance(block_mask, torch.Tensor):
        array = _mask_array(block_mask)
        if array.dtype not in (np.bool_, np.uint8):
            raise TypeError(f"block_mask.dtype is {array.dtype}: must be bool or uint8")
        block_mask = torch.from_numpy(np.ascontiguousarray(array))
    elif block_mask.layout != torch.strided:
        raise TypeError(f"block_mask is a {block_mask.layout} tensor: must be dense "
                        f"(torch.strided)")
    return causal, None if math.isnan(scale) else scale, backend, block_mask, size


def _check_mask_tensor(mask, size, Nq, Nkv, read_values):
    """The operator's block mask: bool or uint8 of shape (Tr, Tc). Returns it as a host uint8 array
    of 0/1 where its values may be read (a CPU tensor, or any tensor when read_values is "any"),
    else None: a CUDA mask's values would need a wait for the GPU, and the kernels read a nonzero
    entry as 1."""
    if mask.dtype not in (torch.bool, torch.uint8):
        raise TypeError(f"block_mask.dtype is {mask.dtype}: must be bool or uint8")
    Br, Bc = size
    _check_mask_shape(tuple(mask.shape), Br, Bc, Nq, Nkv)
    if read_values == "any" or (read_values and mask.device.type == "cpu"):
        return _host_mask_values(mask.detach().cpu().numpy())
    return None


def _check_call(names, xs, causal, scale, backend, block_mask, block_size, read_values):
    """The checks inside the operator, for q, k, v first in xs (then o, do). Returns the library's
    dtype, the (B, H, N, d) shapes of q and k, the library's options (causal, scale with NaN for
    the default, host mask or None, Br, Bc) and the backend as given."""
    q, k, v = xs[:3]
    dtype = _check_tensors(names, xs)
    Qs, Ks = _check_shapes(q.shape, k.shape, v.shape)
    scale = _check_scale(scale)  # again: the operator may be called directly
    Br = Bc = 0
    host_mask = None
    if block_mask is not None:
        if block_size is None or len(block_size) != 2:
            raise ValueError("block_mask needs block_size = (Br, Bc), the rows and keys of a block")
        Br, Bc = _check_block_size(block_size)
        host_mask = _check_mask_tensor(block_mask, (Br, Bc), Qs[2], Ks[2], read_values)
    elif block_size is not None:
        raise ValueError("block_size is the block size of block_mask: give block_mask too")
    # The library's own rules on the shapes (d in [1, 256], sizes, ...). Under torch.compile with
    # dynamic shapes the sizes may be symbols, which the library cannot take; the real call checks.
    if all(type(n) is int for n in (*Qs, *Ks)):
        _C.validate(_C.Shape(Qs[0], Qs[1], Ks[1], Qs[2], Ks[2], Qs[3]), causal, scale, host_mask,
                    Br, Bc)
    return dtype, Qs, Ks, (causal, scale, host_mask, Br, Bc), backend


# --- PyTorch tensors: a call's plan, made once per signature -----------------------------------
#
# The checks of a call without a block mask read only its signature: the shapes, dtypes and
# devices of the tensors, causal, scale, the backend asked for, forward or backward, and the two
# environment settings with which the library sizes a device workspace. What they derive (a
# _Plan) is kept per signature, so a call whose signature has passed before skips them and their
# C++ calls, host time that a small CUDA problem would pay on every call. A signature not seen yet
# runs every check, so a bad call raises whatever passed before it, and an error is never kept.
# What each call's arguments are (tensors, dense, on the CPU or a CUDA device) is checked at each
# call, before (_check_tensor). A call with a block mask is planned at each call (a host mask's
# values are checked).


class _Plan(NamedTuple):
    dtype: str             # the library's name of the dtype: "f32", "f16" or "bf16"
    shapes: tuple          # (B, H, N, d) of q and of k, v
    mask: tuple            # (host block mask or None, Br, Bc); (None, 0, 0) without a mask
    backend: str           # the backend that runs (for CUDA tensors, chosen for the device)
    device_shape: object   # the device entries' _C.Shape (None on the host)
    workspace_bytes: int   # the device workspace that backend needs here (0 on the host)
    layouts: bool = False  # the backend reads strided tensors and writes O, gradients in q's dtype
    o_dtype: bool = False  # its forward writes a contiguous O in q's dtype (no cast afterwards)


_PLANS = {}  # signature -> _Plan
_PLANS_LIMIT = 256  # signatures kept; past that the dict starts again (a plan is cheap to redo)


# The two environment settings a signature holds, read at every call. os.environ.get encodes the
# name and decodes the value each time (a microsecond for the two); where os.environ keeps its
# encoded dict (CPython), the encoded values are read from it directly: os.environ's writes
# update that dict (and the process's environment, which the C++ side reads).
_SETTINGS = ("FLASHATTN_VARIANT", "FLASHATTN_DETERMINISTIC")
if isinstance(getattr(os.environ, "_data", None), dict) and hasattr(os.environ, "encodekey"):
    _ENCODED_SETTINGS = tuple(os.environ.encodekey(name) for name in _SETTINGS)

    def _settings():
        data = os.environ._data
        return data.get(_ENCODED_SETTINGS[0]), data.get(_ENCODED_SETTINGS[1])
else:
    def _settings():
        return os.environ.get(_SETTINGS[0]), os.environ.get(_SETTINGS[1])


def _signature(direction, xs, causal, scale, backend):
    """The key of a call without a block mask (direction "forward" or "backward", xs its
    tensors): everything its checks read. The C++ side reads FLASHATTN_VARIANT (a tile, and so
    cuda-tc's split-KV partials) and FLASHATTN_DETERMINISTIC (the backward's dQ turn counters) at
    each call, and both change the workspace's size (cuda/host/variants.hpp)."""
    return (direction, causal, scale, backend, *_settings(),
            *[(x.shape, x.dtype, x.device) for x in xs])


def _planned(key, run_checks, *args):
    """run_checks(*args), run once per key and its _Plan kept (a bad call raises every time)."""
    plan = _PLANS.get(key)
    if plan is None:
        plan = run_checks(*args)
        if len(_PLANS) >= _PLANS_LIMIT:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _forward_plan(q, k, v, causal, scale, backend, block_mask, block_size):
    """Every check of a forward on real tensors, and its _Plan."""
    checked = _check_call(("q", "k", "v"), (q, k, v), causal, scale, backend, block_mask,
                          block_size, read_values="any" if not q.is_cuda else True)
    return _make_plan(q, *checked, backward=False)


def _backward_plan(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size):
    """Every check of a backward on real tensors, and its _Plan."""
    _check_lse_tensor(lse, q)
    checked = _check_call(("q", "k", "v", "o", "do"), (q, k, v, o, do), causal, scale, backend,
                          block_mask, block_size, read_values="any" if not q.is_cuda else True)
    _check_like_q(q, (("o", o), ("do", do)))
    return _make_plan(q, *checked, backward=True)


def _make_plan(q, dtype, Qs, Ks, options, backend, backward):
    """The _Plan of a checked call (_check_call's results): the backend that runs, checked for the
    device, and for CUDA tensors what the device entry takes besides the arrays."""
    causal, scale, host_mask, Br, Bc = options
    if not q.is_cuda:
        return _Plan(dtype, (Qs, Ks), (host_mask, Br, Bc), _check_backend(backend), None, 0)
    backend = _cuda_backend(backend, dtype, q.device, Qs, backward)
    shape = _C.Shape(Qs[0], Qs[1], Ks[1], Qs[2], Ks[2], Qs[3])
    nbytes = _call_on(q.device, _device_workspace_bytes, shape, causal, scale, backend, Br, Bc,
                      dtype, backward)
    info = _backend_table()[backend]
    return _Plan(dtype, (Qs, Ks), (host_mask, Br, Bc), backend, shape, nbytes,
                 info.get("device_layouts", False), info.get("device_o_dtype", False))


def _call_options(plan, causal, scale):
    """The library's options for this call: its own causal and scale (NaN for the default; 0.0 and
    -0.0 share a signature, and each call passes its own) and the plan's block mask."""
    return (causal, math.nan if scale is None else scale) + plan.mask


# --- PyTorch tensors on the host ------------------------------------------------------------


def _host_float32(x):
    """A CPU tensor as a C-contiguous float32 NumPy array (a copy where it must be)."""
    return x.detach().to(torch.float32).contiguous().numpy()


def _cpu_forward(q, k, v, plan, options):
    O, L = _host_attention(*map(_host_float32, (q, k, v)), plan.shapes, options, plan.backend,
                           plan.dtype)
    return torch.from_numpy(O).to(q.dtype).reshape(q.shape), \
        torch.from_numpy(L).reshape(q.shape[:-1])


def _cpu_backward(q, k, v, o, lse, do, plan, options):
    grads = _host_backward(*map(_host_float32, (q, k, v, o, lse, do)), plan.shapes, options,
                           plan.backend, plan.dtype)
    return tuple(torch.from_numpy(g).to(x.dtype).reshape(x.shape)
                 for g, x in zip(grads, (q, k, v)))


# --- PyTorch tensors on a GPU ---------------------------------------------------------------

# cuda-fa3's head dimensions, forward and backward (cuda/fa3/backend.cu and backward.cu, the
# checks): the default sends other d to cuda-tc.
_FA3_HEAD_DIMS = (64, 128, 256)
_CAPABILITY = {}  # device index -> (major, minor), asked once per device


def _capability(device):
    cc = _CAPABILITY.get(device.index)
    if cc is None:
        cc = _CAPABILITY[device.index] = torch.cuda.get_device_capability(device)
    return cc


# At most this many query rows is decoding: fewer than half of cuda-fa3's 128-row work tile, and
# too few rows per head to fill the GPU. cuda-tc splits the keys there and reads K/V once per GQA
# group (docs/decoding.md); cuda-fa3 does neither, so the default sends such a forward to cuda-tc.
_DECODE_ROWS = 64


def _default_cuda_backend(dtype, device, shape, backward):
    """The fastest backend for CUDA tensors of `dtype` (the library's name) on `device`, for q of
    (B, H, N_q, d) `shape`."""
    if dtype == "f32":
        return "cuda-fa2"
    d, rows = shape[3], shape[2]
    fa3 = _backend_table().get("cuda-fa3")  # listed only in sm_90a builds on a Hopper GPU
    # The backends list tells whether cuda-fa3 has a backward, not whether it has a device entry
    # for it: the two are expected to come together. (Under torch.compile the sizes may be
    # symbols: a decoding size is then not known, and the fake implementation needs only a valid
    # backend.)
    decoding = not backward and type(rows) is int and rows <= _DECODE_ROWS
    if (fa3 is not None and fa3["device_arrays"] and (fa3["backward"] or not backward)
            and d in _FA3_HEAD_DIMS and not decoding
            and _capability(device) == (9, 0)):
        return "cuda-fa3"
    return "cuda-tc"


def _cuda_backend(backend, dtype, device, shape, backward):
    """The backend for CUDA tensors: the default, or the one given if it has a device entry for
    this dtype."""
    if backend is None:
        return _default_cuda_backend(dtype, device, shape, backward)
    info = _backend_table()[_check_backend(backend)]
    default = _default_cuda_backend(dtype, device, shape, backward)  # named in the errors
    if not info["device_arrays"]:
        raise ValueError(f"backend = {backend!r} takes no CUDA tensors (use {default!r} for this "
                         f"dtype)")
    if dtype not in info["dtypes"]:
        raise TypeError(f"backend = {backend!r} computes in {', '.join(info['dtypes'])}, not "
                        f"{dtype} (use {default!r} for this dtype)")
    return backend


def _backward_backend(backend):
    """The backend autograd's backward runs on after a forward on `backend`: the same one where it
    has a backward pass, else the default (cuda-tc's backward works from any forward's O and LSE).
    """
    if backend is not None and not _backend_table().get(backend, {}).get("backward", True):
        return None
    return backend


def _signed_q(Q, dtype, scale):
    """The 16-bit kernels (cuda-tc, cuda-fa3) fold a negative scale into Q (negating a 16-bit value
    is exact): they read sign(scale) * Q, and their gradients are still those of Q. Q may be the
    caller's tensor itself (_device_array): the negation is kept out of autograd's graph."""
    return -Q.detach() if dtype != "f32" and scale < 0 else Q


if (torch is not None and hasattr(torch._C, "_cuda_getCurrentRawStream")
        and hasattr(torch._C, "_cuda_getDevice")):
    def _current_stream(device):
        """PyTorch's current stream on `device`, as a cudaStream_t address."""
        return torch._C._cuda_getCurrentRawStream(device.index)

    # torch.cuda.current_device() without its lazy initialization, which a CUDA tensor has done.
    _current_device = torch._C._cuda_getDevice
else:
    def _current_stream(device):
        return torch.cuda.current_stream(device).cuda_stream

    def _current_device():
        return torch.cuda.current_device()


def _call_on(device, entry, *args):
    """entry(*args) with `device` current, for the library's launches: made current only when it
    is not already (the usual case pays one comparison, no context manager)."""
    if device.index == _current_device():
        return entry(*args)
    with torch.cuda.device(device):
        return entry(*args)


def _device_mask(block_mask, device):
    """The block mask on `device`, one byte per entry (bool or uint8), or None. A host mask is
    copied without waiting: from pageable memory the copy is staged before the call returns, from
    pinned memory PyTorch keeps the page until the copy has run."""
    if block_mask is None:
        return None
    if block_mask.device != device:
        block_mask = block_mask.to(device, non_blocking=True)
    return block_mask.contiguous()


def _device_array(x, shape, dtype=None):
    """x as the C-contiguous tensor of `shape` (and `dtype`) that a device entry reads. Most calls
    give one already, 4-D and contiguous, and get x itself: no new tensor for each argument."""
    if x.dim() == len(shape) and x.is_contiguous() and (dtype is None or x.dtype == dtype):
        return x
    x = x.detach().reshape(shape)
    return (x if dtype is None else x.to(dtype)).contiguous()


def _viewed(x, shape):
    """A result (4-D, or 3-D for LSE) in the caller's shape: a view only for an (N, d) call."""
    return x if x.dim() == len(shape) else x.reshape(shape)


# The three functions below are the only calls of the library's device entries (module.cpp). They
# take PyTorch's current stream of the tensors' device, a workspace from PyTorch's caching
# allocator (freed for reuse by later work on that stream, which runs after the kernels) and the
# block mask as a device address, and return without waiting (common/backend.hpp, DeviceForward).


def _device_workspace_bytes(shape, causal, scale, backend, Br, Bc, dtype, backward):
    """Bytes of device workspace the device entry of `backend` needs for this problem (asked once
    per signature, by _make_plan)."""
    return _C.device_workspace_bytes(backend, shape, causal, scale, None, Br, Bc, dtype, backward)


def _workspace(nbytes, device):
    """(address, bytes) of a fresh workspace from PyTorch's allocator ((0, 0) for none), and the
    tensor that owns it. The allocator aligns blocks to 512 bytes, more than the 256 required."""
    if nbytes == 0:
        return 0, 0, None
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buffer.data_ptr(), nbytes, buffer


_CONTIGUOUS = (0, 0, 0)  # the device entries' strides for a contiguous array


def _device_forward(Q, K, V, O, L, plan, options, mask, layouts=(_CONTIGUOUS,) * 4,
                    o_dtype="f32"):
    """Queues the forward of plan.backend on Q, K, V (device tensors) into O and L (float32).
    Every array is contiguous and O float32, unless `layouts` gives the (batch, head, row) strides
    of Q, K, V and O (a backend with plan.layouts) and o_dtype O's dtype (one with plan.layouts
    or plan.o_dtype)."""
    causal, scale, _host_mask, Br, Bc = options
    device = Q.device
    ws, ws_bytes, _owner = _workspace(plan.workspace_bytes, device)
    _call_on(device, _C.attention_device, Q.data_ptr(), K.data_ptr(), V.data_ptr(), O.data_ptr(),
             L.data_ptr(), plan.device_shape, causal, scale, plan.backend, None, Br, Bc,
             _current_stream(device), plan.dtype, ws, ws_bytes,
             0 if mask is None else mask.data_ptr(), layouts, o_dtype)


def _device_backward(Q, K, V, O, L, dO, dQ, dK, dV, plan, options, mask,
                     layouts=(_CONTIGUOUS,) * 8, o_dtype="f32", grad_dtype="f32"):
    """Queues the backward of plan.backend into dQ, dK, dV. Every array is contiguous, O and the
    gradients float32, unless `layouts` gives the strides of Q, K, V, O, dO, dQ, dK, dV and
    o_dtype, grad_dtype the types (a backend with plan.layouts)."""
    causal, scale, _host_mask, Br, Bc = options
    device = Q.device
    ws, ws_bytes, _owner = _workspace(plan.workspace_bytes, device)
    _call_on(device, _C.attention_backward_device, Q.data_ptr(), K.data_ptr(), V.data_ptr(),
             O.data_ptr(), L.data_ptr(), dO.data_ptr(), dQ.data_ptr(), dK.data_ptr(),
             dV.data_ptr(), plan.device_shape, causal, scale, plan.backend, None, Br, Bc,
             _current_stream(device), plan.dtype, ws, ws_bytes,
             0 if mask is None else mask.data_ptr(), layouts, o_dtype, grad_dtype)


def _cuda_forward(q, k, v, block_mask, plan, options):
    Qs, Ks = plan.shapes
    # Every check has passed: from here on, CUDA work, all of it queued on the current stream.
    O = _output_like(q)
    L = torch.empty(Qs[:3], dtype=torch.float32, device=q.device)
    mask = _device_mask(block_mask, q.device)
    if plan.layouts and not options[1] < 0:  # (a negative scale is folded into a copy of Q)
        # cuda-fa3 and cuda-fa2 read q, k, v where they lie (a copy only of one TMA cannot read)
        # and write O in q's dtype: no copy, no cast.
        # (Written out, not looped: this runs on every call of a model.)
        Q, q_at = _readable_in_place(q, Qs)
        K, k_at = _readable_in_place(k, Ks)
        V, v_at = _readable_in_place(v, Ks)
        _device_forward(Q, K, V, O, L, plan, options, mask, (q_at, k_at, v_at, _strides(O)),
                        plan.dtype)
        return O, _viewed(L, q.shape[:-1])
    Q, K, V = _device_array(q, Qs), _device_array(k, Ks), _device_array(v, Ks)
    if options[1] < 0:  # false for the default scale (NaN)
        Q = _signed_q(Q, plan.dtype, options[1])
    if O.is_contiguous() and (plan.dtype == "f32" or plan.o_dtype):
        # O is what the kernels write: float32, or q's 16-bit dtype (cuda-tc).
        _device_forward(Q, K, V, O, L, plan, options, mask, o_dtype=plan.dtype)
        return O, _viewed(L, q.shape[:-1])
    O32 = torch.empty(Qs, dtype=torch.float32, device=q.device)  # contiguous float32
    _device_forward(Q, K, V, O32, L, plan, options, mask)
    O.copy_(O32.view(O.shape))  # the cast to q's dtype, in O's layout
    return O, _viewed(L, q.shape[:-1])


def _strides(x):
    """The (batch, head, row) element strides of a 4-D tensor for a device entry; a 2-D (N, d)
    one is contiguous."""
    return x.stride()[:3] if x.dim() == 4 else _CONTIGUOUS


def _readable_in_place(x, shape):
    """(x, its strides) where TMA (cuda-fa3), and so cuda-fa2's copies, can read x where it lies
    -- d contiguous, a 16-byte aligned address, every other stride a positive multiple of 8
    elements (not a broadcast), the row stride below 2^31 elements (cuda-fa2's copies hold it in
    an int) -- else (a contiguous copy, _CONTIGUOUS)."""
    st = x.stride()  # (every call of a model passes here: no generator, one stride() call)
    if (len(st) == 4 and st[3] == 1 and x.data_ptr() % 16 == 0 and st[0] > 0 and st[1] > 0
            and st[2] > 0 and st[0] % 8 == 0 and st[1] % 8 == 0 and st[2] % 8 == 0
            and st[2] < 2**31):
        return x, st[:3]
    return _device_array(x, shape), _CONTIGUOUS


def _output_like(q):
    """O for q: q's shape and dtype, its rows laid out in the order of q's (as SDPA does). Where
    q's heads lie closer together than its rows (a CUDA q cut from one (B, N, 3 H d) projection
    and viewed as (B, H, N, d)), O is allocated as (B, N, H, d) and returned as a (B, H, N, d)
    view, so that the caller's transpose back to (B, N, H d) needs no copy. The fake
    implementation allocates it the same way (its strides must match the real ones)."""
    if q.is_cuda and q.dim() == 4 and q.stride(1) < q.stride(2):
        B, H, N, d = q.shape
        return torch.empty((B, N, H, d), dtype=q.dtype, device=q.device).transpose(1, 2)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def _cuda_backward(q, k, v, o, lse, do, block_mask, plan, options):
    Qs, Ks = plan.shapes
    # Every check has passed: from here on, CUDA work, all of it queued on the current stream.
    grads = [_output_like(x) for x in (q, k, v)]  # dQ, dK, dV in the order of q, k, v
    L = _device_array(lse, Qs[:3], torch.float32)
    mask = _device_mask(block_mask, q.device)
    if plan.layouts and not options[1] < 0:  # (a negative scale is folded into a copy of Q)
        # cuda-fa3 and cuda-fa2 read q, k, v, do where they lie (a copy only of one TMA cannot
        # read), O in q's dtype, and write the gradients in q's dtype where they lie: no copy, no
        # cast.
        inputs = [_readable_in_place(x, shape)
                  for x, shape in ((q, Qs), (k, Ks), (v, Ks), (do, Qs))]
        (Q, q_at), (K, k_at), (V, v_at), (dO, do_at) = inputs
        # O is read value by value (the D pass): any strides with d contiguous.
        O, o_at = ((o, _strides(o)) if o.dim() == 4 and o.stride(3) == 1
                   else (_device_array(o, Qs), _CONTIGUOUS))
        layouts = (q_at, k_at, v_at, o_at, do_at) + tuple(_strides(g) for g in grads)
        _device_backward(Q, K, V, O, L, dO, *grads, plan, options, mask, layouts, plan.dtype,
                         plan.dtype)
        return tuple(grads)
    Q, K, V = _device_array(q, Qs), _device_array(k, Ks), _device_array(v, Ks)
    dO = _device_array(do, Qs)
    if options[1] < 0:  # false for the default scale (NaN)
        Q = _signed_q(Q, plan.dtype, options[1])
    O = _device_array(o, Qs, torch.float32)  # O is read as float32
    # The kernels write contiguous float32 gradients: into the results themselves where those
    # are, else into new tensors cast into them afterwards.
    sums = [g.view(shape) if g.dtype == torch.float32 and g.is_contiguous()
            else torch.empty(shape, dtype=torch.float32, device=q.device)
            for g, shape in zip(grads, (Qs, Ks, Ks))]
    _device_backward(Q, K, V, O, L, dO, *sums, plan, options, mask)
    for g, s in zip(grads, sums):
        if s.data_ptr() != g.data_ptr():
            g.copy_(s.view(g.shape))
    return tuple(grads)


def _device_plan(backward, xs, causal, scale, backend):
    """The plan of a CUDA call without a block mask for the C++ fast path (_torch_ops), which
    calls this once per signature: every check of the call (raising for a bad one), then
    (backend, dtype, workspace bytes, layouts, o_dtype) where the fast path may run it -- 4-D
    tensors, a scale that is not negative -- else None (the Python implementation runs it). The
    fast path takes a call on a backend without layouts only where _cuda_forward/_cuda_backward
    would neither copy nor cast (contiguous tensors, outputs the kernels write themselves)."""
    if backward:
        q, k, v, o, lse, do = xs
        plan = _planned(_signature("backward", xs, causal, scale, backend), _backward_plan,
                        q, k, v, o, lse, do, causal, scale, backend, None, None)
    else:
        q, k, v = xs
        plan = _planned(_signature("forward", xs, causal, scale, backend), _forward_plan,
                        q, k, v, causal, scale, backend, None, None)
    if (scale is not None and scale < 0) or any(x.dim() != 4 for x in ((q, k, v, o, do)
                                                                      if backward else xs)):
        return None
    return plan.backend, plan.dtype, plan.workspace_bytes, plan.layouts, plan.o_dtype


def _load_torch_ops():
    """flashattn._torch_ops (torch_ops.cpp), built where PyTorch's C++ headers and CUDA were
    found, or None. A module that is there but does not load (built against another PyTorch) is
    said, not hidden: the Python implementation then runs every call."""
    if torch is None or importlib.util.find_spec(__name__ + "._torch_ops") is None:
        return None
    try:
        from . import _torch_ops
    except ImportError as e:
        import warnings
        warnings.warn(f"flashattn: the C++ operators do not load ({e}); the Python "
                      f"implementation runs every CUDA call", RuntimeWarning, stacklevel=2)
        return None
    return _torch_ops


# --- the operator: real and fake implementations, autograd ------------------------------------
#
# flashattn::attention_forward(q, k, v, causal, scale, backend, block_mask, block_size) -> (O, LSE)
# flashattn::attention_backward(q, k, v, o, lse, do, causal, scale, backend, block_mask,
#                               block_size) -> (dQ, dK, dV)
# Functional (no input is written; outputs are new tensors), so torch.compile, CUDA graphs and
# torch.library.opcheck can treat them like PyTorch's own operators.

_FORWARD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, bool causal, float? scale, str? backend, "
                   "Tensor? block_mask, int[]? block_size) -> (Tensor, Tensor)")
_BACKWARD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, bool causal, "
                    "float? scale, str? backend, Tensor? block_mask, int[]? block_size) "
                    "-> (Tensor, Tensor, Tensor)")


def _forward_impl(q, k, v, causal, scale, backend, block_mask, block_size):
    """The forward on real tensors, CPU or CUDA: returns O (q's shape and dtype, laid out as
    _output_like(q) says) and LSE (float32, q's shape without d). A CUDA call without a block
    mask takes the C++ fast path where it is built (_torch_ops): the same work, with no Python
    between this call and the launch once its signature is planned."""
    if _TORCH_OPS is not None and q.is_cuda and block_mask is None and block_size is None:
        out = _TORCH_OPS.forward(q, k, v, causal, scale, backend)
        if out is not None:
            return out
    return _forward_python(q, k, v, causal, scale, backend, block_mask, block_size)


def _forward_python(q, k, v, causal, scale, backend, block_mask, block_size):
    """The forward's implementation in Python (every call the C++ fast path does not take)."""
    if block_mask is None and block_size is None:
        plan = _planned(_signature("forward", (q, k, v), causal, scale, backend), _forward_plan,
                        q, k, v, causal, scale, backend, None, None)
    else:
        plan = _forward_plan(q, k, v, causal, scale, backend, block_mask, block_size)
    options = _call_options(plan, causal, scale)
    if q.is_cuda:
        return _cuda_forward(q, k, v, block_mask, plan, options)
    return _cpu_forward(q, k, v, plan, options)


def _forward_fake(q, k, v, causal, scale, backend, block_mask, block_size):
    """The same checks on metadata alone, and outputs of the right shapes, dtypes and devices."""
    dtype, Qs, _, _, backend = _check_call(("q", "k", "v"), (q, k, v), causal, scale, backend,
                                           block_mask, block_size, read_values=False)
    if q.is_cuda:
        _cuda_backend(backend, dtype, q.device, Qs, backward=False)
    elif backend is not None:
        _check_backend(backend)
    return (_output_like(q), torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device))


def _backward_impl(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size):
    """The backward on real tensors: dQ, dK, dV with the shapes and dtypes of q, k, v (the C++
    fast path first, as _forward_impl)."""
    if _TORCH_OPS is not None and q.is_cuda and block_mask is None and block_size is None:
        grads = _TORCH_OPS.backward(q, k, v, o, lse, do, causal, scale, backend)
        if grads is not None:
            return grads
    return _backward_python(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size)


def _backward_python(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size):
    """The backward's implementation in Python (every call the C++ fast path does not take)."""
    if block_mask is None and block_size is None:
        plan = _planned(_signature("backward", (q, k, v, o, lse, do), causal, scale, backend),
                        _backward_plan, q, k, v, o, lse, do, causal, scale, backend, None, None)
    else:
        plan = _backward_plan(q, k, v, o, lse, do, causal, scale, backend, block_mask,
                              block_size)
    options = _call_options(plan, causal, scale)
    if q.is_cuda:
        return _cuda_backward(q, k, v, o, lse, do, block_mask, plan, options)
    return _cpu_backward(q, k, v, o, lse, do, plan, options)


def _backward_fake(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size):
    _check_lse_tensor(lse, q)
    dtype, Qs, _, _, backend = _check_call(("q", "k", "v", "o", "do"), (q, k, v, o, do), causal,
                                           scale, backend, block_mask, block_size,
                                           read_values=False)
    _check_like_q(q, (("o", o), ("do", do)))
    if q.is_cuda:
        _cuda_backend(backend, dtype, q.device, Qs, backward=True)
    elif backend is not None:
        _check_backend(backend)
    return tuple(_output_like(x) for x in (q, k, v))


def _forward_autocast(q, k, v, causal, scale, backend, block_mask, block_size):
    """The forward operator's kernel for the Autocast dispatch keys (see _autocast)."""
    q, k, v = _autocast(q, k, v)
    with torch.autocast(q.device.type, enabled=False):
        return _FORWARD_OP(q, k, v, causal, scale, backend, block_mask, block_size)


def _setup_context(ctx, inputs, output):
    """Autograd: what the backward needs (LSE is an output without a gradient: the backward
    kernels take the gradient of O alone)."""
    q, k, v, causal, scale, backend, block_mask, block_size = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.mark_non_differentiable(lse)
    ctx.options = (causal, scale, _backward_backend(backend), block_mask, block_size)


def _gradients(ctx, do, backward):
    """The gradients of a recorded forward: backward(q, k, v, o, lse, do, options) for q, k, v,
    none for the options."""
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = backward(q, k, v, o, lse, do, *ctx.options)
    return dq, dk, dv, None, None, None, None, None


def _backward_formula(ctx, do, _dlse):
    """The operator's autograd formula: the backward operator, which torch.compile traces."""
    return _gradients(ctx, do, _BACKWARD_OP)


_FORWARD_OP = _BACKWARD_OP = None
_TORCH_OPS = None  # flashattn._torch_ops where it is built and registered (torch_ops.cpp)
_LIBRARY = None  # the torch.library.Library that holds the operators (kept alive with the module)
_is_compiling = lambda: False  # noqa: E731
_dispatch_mode_count = lambda: 0  # noqa: E731
if torch is not None and hasattr(torch.library, "register_fake") and hasattr(torch.library,
                                                                           "register_autograd"):
    # PyTorch >= 2.4: the operators, defined with torch.library's low-level API. The
    # implementations are registered for the CPU and CUDA dispatch keys as they are: the
    # dispatcher calls them directly, without torch.library.custom_op's wrapper around each call
    # (its aliasing checks and its guard against Dynamo tracing the implementation), host time
    # that every call of a compiled model paid (docs/python.md measures it). The schemas say the
    # operators are functional; opcheck verifies that the implementations keep it.
    _LIBRARY = torch.library.Library("flashattn", "DEF")
    _LIBRARY.define("attention_forward" + _FORWARD_SCHEMA)
    _LIBRARY.define("attention_backward" + _BACKWARD_SCHEMA)
    _TORCH_OPS = _load_torch_ops()
    # CUDA tensors: the C++ kernels where they are built (they call the Python implementation for
    # what their fast path does not run), else the Python implementation.
    for _key in ("CPU",) if _TORCH_OPS is not None else ("CPU", "CUDA"):
        _LIBRARY.impl("attention_forward", _forward_impl, _key)
        _LIBRARY.impl("attention_backward", _backward_impl, _key)
    if _TORCH_OPS is not None:
        _TORCH_OPS.register_operators(_device_plan, _forward_python, _backward_python)
    torch.library.register_fake("flashattn::attention_forward", _forward_fake, lib=_LIBRARY)
    torch.library.register_fake("flashattn::attention_backward", _backward_fake, lib=_LIBRARY)
    torch.library.register_autograd("flashattn::attention_forward", _backward_formula,
                                    setup_context=_setup_context, lib=_LIBRARY)
    # Under torch.autocast the forward operator casts q, k, v as SDPA's does (_autocast), then
    # runs with autocast off; torch.compile traces these casts into its graph. (The backward
    # operator has none: autograd calls it with the tensors the forward saved, already cast.)
    for _key in ("AutocastCPU", "AutocastCUDA"):
        _LIBRARY.impl("attention_forward", _forward_autocast, _key)
    _FORWARD_OP = torch.ops.flashattn.attention_forward.default
    _BACKWARD_OP = torch.ops.flashattn.attention_backward.default
    _is_compiling = torch.compiler.is_compiling
    _dispatch_mode_count = getattr(torch._C, "_len_torch_dispatch_stack", _dispatch_mode_count)


# --- eager calls: the implementations without the operator's dispatch ---------------------------
#
# Through the operator, an eager call pays PyTorch's dispatcher, its call back into Python and the
# operator's autograd wrapper, host time that a small CUDA problem feels (docs/python.md, "Where a
# call's host time goes"). An eager call on plain tensors runs the same implementations directly;
# where autograd records it, through _AttentionFunction, whose backward is the backward's
# implementation, or for CUDA tensors without a block mask where flashattn._torch_ops is built,
# through its C++ node of the same forward and backward. torch.compile (and torch.export) trace
# the operator, and so do tensor subclasses and dispatch modes (FakeTensor, FakeTensorMode,
# make_fx), which act on operators: the implementations read data pointers, which such tensors do
# not have. With an older PyTorch there is no operator, and every call takes this way.

if torch is not None:
    class _AttentionFunction(torch.autograd.Function):
        """An eager forward that autograd records, and its backward."""

        @staticmethod
        def forward(ctx, q, k, v, causal, scale, backend, block_mask, block_size):
            output = _forward_impl(q, k, v, causal, scale, backend, block_mask, block_size)
            _setup_context(ctx, (q, k, v, causal, scale, backend, block_mask, block_size), output)
            return output

        @staticmethod
        def backward(ctx, do, _dlse):
            # The backward's implementation, or its operator where a tracer runs this backward.
            return _gradients(ctx, do, _eager_backward)


def _needs_operator(*xs):
    """Whether a call on the tensors xs goes through the operator (see above): while compiling,
    under a dispatch mode, or for anything but a plain torch.Tensor. Never without an operator."""
    if _FORWARD_OP is None:
        return False
    if _is_compiling() or _dispatch_mode_count() > 0:
        return True
    for x in xs:
        if type(x) is not torch.Tensor:
            return True
    return False


def _eager_forward(q, k, v, causal, scale, backend, block_mask, block_size):
    """The forward of an eager call, options as the operator takes them."""
    if _needs_operator(q, k, v):
        return _FORWARD_OP(q, k, v, causal, scale, backend, block_mask, block_size)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if _TORCH_OPS is not None and q.is_cuda and block_mask is None:
            # The same forward and backward recorded by a C++ node (torch_ops.cpp, AttentionNode):
            # no Python between autograd's engine and the backward's launch.
            return _TORCH_OPS.attention(q, k, v, causal, scale, backend,
                                        _backward_backend(backend))
        return _AttentionFunction.apply(q, k, v, causal, scale, backend, block_mask, block_size)
    return _forward_impl(q, k, v, causal, scale, backend, block_mask, block_size)


def _eager_backward(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size):
    """The backward of an eager call (attention_backward's, and _AttentionFunction's)."""
    if _needs_operator(q, k, v, o, lse, do):
        return _BACKWARD_OP(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size)
    return _backward_impl(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size)


# --- the API --------------------------------------------------------------------------------


def attention(q, k, v, *, causal=False, scale=None, backend=None, return_lse=False,
              block_mask=None, block_size=None):
    """softmax(scale * q k^T) v, computed by one of the library's backends.

    q: (B, H, N_q, d) or (N_q, d); k, v: (B, H_kv, N_kv, d) or (N_kv, d) with H % H_kv == 0.
    NumPy float32 arrays, or PyTorch CPU tensors of float32, float16 or bfloat16 (computed in
    that precision, as `flashattn run --dtype` does; outputs have the input's dtype), or PyTorch
    CUDA tensors (computed on their GPU, asynchronously on PyTorch's current stream, results on
    the same device): float32 on cuda-fa2; float16 and bfloat16 on cuda-fa3 on a Hopper GPU for
    d = 64, 128 and 256 and more than 64 query rows (its backward too, after any forward), else on
    cuda-tc (d in 32, 64, 96, 128, and 256 forward only; decoding: split
    keys, GQA groups packed). cuda-fa3 and cuda-fa2 read strided tensors (such as q, k, v viewed
    out of one projection) where they lie; outputs of CUDA tensors follow their inputs' order as SDPA's do,
    so O of a q viewed as (B, H, N, d) out of (B, N, H, d) memory is such a view too.

    causal: bottom-right aligned mask (query i sees key j iff j <= i + N_kv - N_q).
    scale: softmax scale, default 1 / sqrt(d).
    backend: a name from flashattn.backends(); default "omp" for NumPy arrays and CPU tensors, the
        fastest one for the device and dtype for CUDA tensors (above).
    return_lse: also return LSE = log sum_j exp(scale q_i . k_j) over visible keys, float32,
        shape (B, H, N_q) or (N_q,); -inf for a row with no visible key (whose O row is 0). LSE
        carries no gradient.
    block_mask, block_size: block-sparse attention (Algorithm 5), see the module's docstring.

    Under torch.autocast for the tensors' device type, q, k and v are first cast as SDPA's are:
    floating tensors other than float64 to the autocast dtype (float32 inputs under bfloat16
    autocast run in bfloat16, so on cuda-fa3 on a Hopper GPU), and O has that dtype.

    Returns O (the shape and dtype of q), or (O, LSE). With PyTorch tensors that require grad,
    gradients flow through flashattn's own backward pass (attention_backward). With PyTorch >= 2.4
    torch.compile traces it as the custom operator torch.ops.flashattn.attention_forward; an eager
    call runs the operator's implementation directly.
    """
    if _is_compiling():
        # torch.compile traces this call: the operator goes into the graph as it is, and its fake
        # implementation checks the call while tracing.
        o, lse = _FORWARD_OP(q, k, v, causal, scale, backend, block_mask, block_size)
        return (o, lse) if return_lse else o
    return_lse = _check_bool("return_lse", return_lse)
    if _is_torch(q, k, v):
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check_tensor(name, x)
        q, k, v = _autocast(q, k, v)  # (torch.compile: the operator's autocast kernel, below)
        o, lse = _eager_forward(q, k, v, *_operator_options(causal, scale, backend, block_mask,
                                                            block_size))
    else:
        o, lse = _numpy_attention(q, k, v, causal, scale, backend, block_mask, block_size)
    return (o, lse) if return_lse else o


def attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, backend=None,
                       block_mask=None, block_size=None):
    """The backward pass (paper Algorithm 4): (dQ, dK, dV) for the upstream gradient do = dL/dO.

    o and lse are what attention(..., return_lse=True) returned for the same q, k, v and options;
    do has o's shape. dK and dV are summed over the query heads that share a K/V head (GQA).
    The backend must have a backward pass (backend_info()[i]["backward"]); default "omp" for NumPy
    arrays and CPU tensors; for CUDA tensors cuda-fa2 in float32, and in float16 and bfloat16
    cuda-fa3 on a Hopper GPU for d = 64, 128 and 256 at any number of query rows, else cuda-tc.
    With PyTorch >= 2.4 torch.compile traces it as the custom operator
    torch.ops.flashattn.attention_backward; an eager call runs its implementation directly.
    """
    if _is_compiling():
        return _BACKWARD_OP(q, k, v, o, lse, do, causal, scale, backend, block_mask, block_size)
    if _is_torch(q, k, v, o, lse, do):
        for name, x in (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do)):
            _check_tensor(name, x)
        return _eager_backward(q, k, v, o, lse, do, *_operator_options(causal, scale, backend,
                                                                       block_mask, block_size))
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
    torch = globals()["torch"] if _is_torch(*outputs, *lses) else None  # None: NumPy arrays
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
    O_parts = torch.stack([x.detach().reshape(R, d) for x in outputs])  # (S, R, d), contiguous
    L_parts = torch.stack([x.detach().reshape(R) for x in lses])        # (S, R)
    if device.type == "cpu":
        O, L = _C.merge_partials(O_parts.numpy(), L_parts.numpy())
        return torch.from_numpy(O).reshape(shape), torch.from_numpy(L).reshape(shape[:-1])
    O = torch.empty((R, d), dtype=torch.float32, device=device)
    L = torch.empty((R,), dtype=torch.float32, device=device)
    # A build without CUDA raises RuntimeError here, saying so.
    _call_on(device, _C.merge_partials_device, O_parts.data_ptr(), L_parts.data_ptr(), S, R, d,
             O.data_ptr(), L.data_ptr(), _current_stream(device))
    return O.reshape(shape), L.reshape(shape[:-1])
