"""How comparison kernels order values, including the half types numba lacks.

float16 and bfloat16 tensors reach the kernels as ``uint16`` views of their bits (see
:mod:`poolfold.dtypes`).  :func:`order_key` maps such bits to a signed integer that orders
exactly as the floats do: sign-magnitude to two's complement, so that -0.0 and +0.0 get the
same key and tie as floats do.  NaN never reaches it: kernels test :func:`is_nan` first.
Other types are their own key.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload


def order_key(v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


def is_nan(v, half_inf_bits):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@overload(order_key)
def _order_key(v):
    if v == types.uint16:

        def half_key(v):
            magnitude = np.int32(v & 0x7FFF)
            return -magnitude if v & 0x8000 else magnitude

        return half_key
    if isinstance(v, (types.Float, types.Integer)):
        return lambda v: v
    return None


@overload(is_nan)
def _is_nan(v, half_inf_bits):
    if v == types.uint16:
        return lambda v, half_inf_bits: (v & 0x7FFF) > half_inf_bits
    if isinstance(v, types.Float):
        return lambda v, half_inf_bits: v != v
    if isinstance(v, types.Integer):
        return lambda v, half_inf_bits: False
    return None
