"""The tensor types poolfold handles, and how kernels see the ones numba cannot.

numba has no float16 or bfloat16 scalar type.  Rather than upcasting a whole tensor, the
comparison kernels read those tensors through a ``uint16`` view of their bits and order them
with :func:`poolfold.kernels.ordering.order_key`; the winning bits are copied out unchanged.
``uint16`` is never a MaxPool / MaxUnpool type itself, so in those kernels a ``uint16`` array
always means "half-precision float bits".
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT16 = np.dtype(np.float16)

# A half-precision value is NaN when its exponent bits are all set and its mantissa is not,
# i.e. when the magnitude bits exceed those of +inf.
_HALF_INF_BITS = {FLOAT16: 0x7C00, BFLOAT16: 0x7F80}


STRING = "string"  # numpy str_ ('U'), bytes_ ('S') or object arrays holding str


def name(dtype: np.dtype) -> str:
    """The ONNX-style name of a dtype (``float16``, ``bfloat16``, ``int8``, ``string`` ...)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "USO":
        return STRING
    return dtype.name


def is_half(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in _HALF_INF_BITS


def is_floating(dtype: np.dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BFLOAT16


def bits_view(a: np.ndarray) -> np.ndarray:
    """``a`` itself, or for half types a ``uint16`` view of its bits (no copy)."""
    return a.view(np.uint16) if a.dtype in _HALF_INF_BITS else a


def comparable(a: np.ndarray) -> tuple[np.ndarray, int]:
    """A view of ``a`` that numba can compare, and the NaN threshold for half types.

    Half types come back as a ``uint16`` view (no copy) with the bit pattern of +inf's
    magnitude: any magnitude above it is NaN.  Other types come back as they are, with 0.
    """
    return bits_view(a), _HALF_INF_BITS.get(a.dtype, 0)


def lowest(dtype: np.dtype) -> np.ndarray:
    """The value an empty window yields, as a 0-d array of ``dtype``: -inf for floating types,
    the minimum for integers."""
    dtype = np.dtype(dtype)
    return np.array(-np.inf if is_floating(dtype) else np.iinfo(dtype).min, dtype=dtype)


def float32_table(dtype: np.dtype) -> np.ndarray:
    """The float32 value of every bit pattern of a half type, indexed by its ``uint16`` bits:
    how kernels read float16 / bfloat16 exactly without numba support for them."""
    return _float32_table(np.dtype(dtype))


@functools.lru_cache(maxsize=None)
def _float32_table(dtype: np.dtype) -> np.ndarray:
    table = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dtype).astype(np.float32)
    table.setflags(write=False)
    return table
