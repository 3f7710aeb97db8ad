"""The tensor types poolfold handles, and how kernels see the ones numba cannot.

numba has no float16 or bfloat16 scalar type.  Rather than upcasting a whole tensor, kernels
read those tensors through a view of their bits (:func:`bits_view`, :func:`comparable`) and
the comparison kernels order them with :func:`poolfold.kernels.ordering.order_key`; the
winning bits are copied out unchanged.  Neither ``uint16`` nor ``int16`` is a MaxPool /
MaxUnpool type itself, so in those kernels such an array always means half-precision bits.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT16 = np.dtype(np.float16)

_HALF = (FLOAT16, BFLOAT16)


STRING = "string"  # numpy str_ ('U'), bytes_ ('S') or object arrays holding str


def name(dtype: np.dtype) -> str:
    """The ONNX-style name of a dtype (``float16``, ``bfloat16``, ``int8``, ``string`` ...)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "USO":
        return STRING
    return dtype.name


def is_half(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in _HALF


def is_floating(dtype: np.dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BFLOAT16


def bits_view(a: np.ndarray) -> np.ndarray:
    """``a`` itself, or for half types a ``uint16`` view of its bits (no copy)."""
    return a.view(np.uint16) if a.dtype in _HALF else a


def comparable(a: np.ndarray) -> np.ndarray:
    """A view of ``a`` (no copy) that the comparison kernels order as its values: float16
    as ``uint16`` bits and bfloat16 as ``int16`` bits, so that kernels tell them apart by
    type (see :mod:`poolfold.kernels.ordering`), any other type as it is."""
    if a.dtype == BFLOAT16:
        return a.view(np.int16)
    return bits_view(a)


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
