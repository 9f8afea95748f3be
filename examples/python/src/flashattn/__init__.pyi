# Type stubs of the flashattn package (examples/python/src/flashattn/__init__.py).
from typing import Any, Optional, Sequence, Tuple, TypedDict, Union, overload

import numpy as np
import numpy.typing as npt

Array = Union[npt.NDArray[np.float32], Any]  # a NumPy float32 array or a torch.Tensor

class BackendInfo(TypedDict):
    name: str
    device: str
    summary: str
    dtypes: list[str]
    backward: bool
    device_arrays: bool
    device_layouts: bool
    device_o_dtype: bool

def backends() -> list[str]: ...
def backend_info() -> list[BackendInfo]: ...
def attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    causal: bool = ...,
    scale: Optional[float] = ...,
    backend: Optional[str] = ...,
    return_lse: bool = ...,
    block_mask: Optional[Union[npt.ArrayLike, Any]] = ...,  # or a torch.Tensor
    block_size: Optional[Tuple[int, int]] = ...,
) -> Union[Array, Tuple[Array, Array]]: ...
def attention_backward(
    q: Array,
    k: Array,
    v: Array,
    o: Array,
    lse: Array,
    do: Array,
    *,
    causal: bool = ...,
    scale: Optional[float] = ...,
    backend: Optional[str] = ...,
    block_mask: Optional[Union[npt.ArrayLike, Any]] = ...,  # or a torch.Tensor
    block_size: Optional[Tuple[int, int]] = ...,
) -> Tuple[Array, Array, Array]: ...
def merge_partials(
    outputs: Sequence[Array],
    lses: Sequence[Array],
) -> Tuple[Array, Array]: ...
