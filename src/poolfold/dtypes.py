"""The tensor types poolfold handles, and how kernels see the ones numba cannot.

numba has no float16 or bfloat16 scalar type.  Rather than upcasting a whole tensor, kernels
read those tensors through a view of their bits (:func:`bits_view`, :func:`value_view`) and
widen them to float32 in registers where they need the value (:mod:`poolfold.kernels.half`);
bits that are only moved are copied out unchanged.  Neither ``uint16`` nor ``int16`` is a
MaxPool / MaxUnpool type itself, so in those kernels such an array always means half bits;
Col2Im, which does take them, tells half bits by its float32 accumulator.
"""

from __future__ import annotations

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


def value_type(dtype: np.dtype) -> np.dtype:
    """The type :func:`value_view` gives an array of ``dtype``: what a launch views X and Y
    as on every call."""
    return value_view(np.empty(0, dtype)).dtype


def value_view(a: np.ndarray) -> np.ndarray:
    """A view of ``a`` (no copy) whose elements kernels read as its values: float16 as
    ``uint16`` bits and bfloat16 as ``int16`` bits, told apart by type and widened by
    :func:`poolfold.kernels.half.as_float32`; any other type as it is."""
    if a.dtype == BFLOAT16:
        return a.view(np.int16)
    return bits_view(a)


def lowest(dtype: np.dtype) -> np.ndarray:
    """The value an empty window yields, as a 0-d array of ``dtype``: -inf for floating types,
    the minimum for integers."""
    dtype = np.dtype(dtype)
    return np.array(-np.inf if is_floating(dtype) else np.iinfo(dtype).min, dtype=dtype)


def additive_identity(dtype: np.dtype) -> np.ndarray:
    """The value whose addition leaves any sum of ``dtype`` exactly as it is, as a 0-d array:
    -0.0 in every part for floating and complex types (IEEE addition's identity: x + -0.0 is x
    for every x, -0.0 included; +0.0 is not), else 0 (False for bool)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return np.array(complex(-0.0, -0.0), dtype)
    return np.array(-0.0 if is_floating(dtype) else 0).astype(dtype)
