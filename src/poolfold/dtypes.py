"""The tensor types poolfold handles, and how kernels see the ones numba cannot.

numba has no float16 or bfloat16 scalar type.  Rather than upcasting a whole tensor, the
comparison kernels read those tensors through a ``uint16`` view of their bits and order them
with :func:`poolfold.kernels.ordering.order_key`; the winning bits are copied out unchanged.
``uint16`` is never a MaxPool / MaxUnpool type itself, so in those kernels a ``uint16`` array
always means "half-precision float bits".
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)
INT8 = np.dtype(np.int8)
UINT8 = np.dtype(np.uint8)
INT64 = np.dtype(np.int64)

# A half-precision value is NaN when its exponent bits are all set and its mantissa is not,
# i.e. when the magnitude bits exceed those of +inf.
_HALF_INF_BITS = {FLOAT16: 0x7C00, BFLOAT16: 0x7F80}


def name(dtype: np.dtype) -> str:
    """The ONNX-style name of a dtype (``float16``, ``bfloat16``, ``int8`` ...)."""
    return np.dtype(dtype).name


def is_half(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in _HALF_INF_BITS


def is_floating(dtype: np.dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BFLOAT16


def comparable(a: np.ndarray) -> tuple[np.ndarray, int]:
    """A view of ``a`` that numba can compare, and the NaN threshold for half types.

    Half types come back as a ``uint16`` view (no copy) with the bit pattern of +inf's
    magnitude: any magnitude above it is NaN.  Other types come back as they are, with 0.
    """
    inf_bits = _HALF_INF_BITS.get(a.dtype)
    if inf_bits is None:
        return a, 0
    return a.view(np.uint16), inf_bits


def lowest(dtype: np.dtype) -> np.ndarray:
    """The value an empty window yields, as a 0-d array of ``dtype``: -inf for floating types,
    the minimum for integers."""
    dtype = np.dtype(dtype)
    return np.array(-np.inf if is_floating(dtype) else np.iinfo(dtype).min, dtype=dtype)
