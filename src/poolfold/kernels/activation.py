"""Fused activations, applied by kernels as they store each output element, or over Y
afterwards by :func:`activate_in_place` when the kernel that computed Y applies none.

Each activation is a code (the names are in :mod:`poolfold.activations`) with up to two
float64 parameters.  Values are computed in float64 and rounded once when stored in Y's type;
NaN passes through every activation.  float16 data (uint16 bits in kernels) goes through a
65536-entry table of results computed once with the same formulas, so half precision needs
no arithmetic numba lacks.
"""

from __future__ import annotations

import math

import numpy as np
from numba import types

from . import helper_overload, kernel

IDENTITY, RELU, TANH, SIGMOID, LEAKY_RELU, CLIP, HARD_SIGMOID = range(7)


@kernel()
def formula(v, code, params):
    """Activation ``code`` of the float64 ``v`` (comparisons are false for NaN, so NaN stays)."""
    if code == RELU:
        return 0.0 if v < 0 else v
    if code == TANH:
        return math.tanh(v)
    if code == SIGMOID:
        return 1.0 / (1.0 + math.exp(-v))
    if code == LEAKY_RELU:
        return params[0] * v if v < 0 else v
    if code == CLIP:  # min(max(v, lo), hi): hi wins when lo > hi, as the formula says
        raised = params[0] if v < params[0] else v
        return params[1] if raised > params[1] else raised
    if code == HARD_SIGMOID:
        h = params[0] * v + params[1]
        return 0.0 if h < 0 else (1.0 if h > 1 else h)
    return v


def activate(v, code, params, table):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(activate)
def _activate(v, code, params, table):
    if v == types.uint16:  # float16 bits: look the result up

        def half(v, code, params, table):
            return v if code == IDENTITY else table[v]

        return half
    if isinstance(v, types.Float):

        def real(v, code, params, table):
            return v if code == IDENTITY else formula(np.float64(v), code, params)

        return real
    return lambda v, code, params, table: v  # integers take no activation (refused earlier)


@kernel()
def formula_over(values, code, params):
    """:func:`formula` over a float64 array (builds the float16 table)."""
    out = np.empty_like(values)
    for i in range(values.size):
        out[i] = formula(values[i], code, params)
    return out


@kernel()
def activate_in_place(values, code, params, table, start, stop):
    """:func:`activate` over ``values[start:stop]`` of a flat array (uint16 bits for half
    types), where a kernel could not apply it as it stored."""
    for i in range(start, stop):
        values[i] = activate(values[i], code, params, table)
