"""How comparison kernels order values, including the half types numba lacks.

float16 and bfloat16 values reach the comparison kernels as bits (see
:mod:`poolfold.kernels.half`); :func:`order_key` reads them as the float32 of the same value,
so they order, tie (-0.0 and +0.0) and test NaN as the floats do.  Other types are their own
key.
"""

from __future__ import annotations

from numba import types

from . import helper_overload
from .half import HALF_BITS, as_float32


def order_key(v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


def is_nan(v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(order_key)
def _order_key(v):
    if v in HALF_BITS:
        return lambda v: as_float32(v)
    if isinstance(v, (types.Float, types.Integer)):
        return lambda v: v
    return None


@helper_overload(is_nan)
def _is_nan(v):
    if isinstance(v, types.Float) or v in HALF_BITS:

        def nan(v):
            key = order_key(v)
            return key != key

        return nan
    if isinstance(v, types.Integer):
        return lambda v: False
    return None
