"""The fused activations of the com.ms.internal.nhwc domain: names, parameters, checks.

The formulas themselves are in :mod:`poolfold.kernels.activation`, applied as kernels store.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import dtypes
from .errors import PoolfoldError, PoolfoldTypeError
from .kernels import activation as kernel
from .kernels.threads import launch
from .schema import OpVersion

# name -> (kernel code, number of activation_params)
ACTIVATIONS = {
    "Relu": (kernel.RELU, 0),
    "Tanh": (kernel.TANH, 0),
    "Sigmoid": (kernel.SIGMOID, 0),
    "LeakyRelu": (kernel.LEAKY_RELU, 1),  # alpha
    "Clip": (kernel.CLIP, 2),  # min, max
    "HardSigmoid": (kernel.HARD_SIGMOID, 2),  # alpha, beta
}


@dataclass(frozen=True)
class Activation:
    """What a kernel needs to apply an activation while storing."""

    code: int
    params: np.ndarray  # float64, two slots
    table: np.ndarray  # float16 results by input bits (uint16), or a dummy

    def scalar(self, value: np.ndarray) -> np.ndarray:
        """The activation of a 0-d array ``value`` (its type kept), e.g. of an unpooled zero."""
        if self.code == kernel.IDENTITY:
            return value
        if value.dtype == dtypes.FLOAT16:
            return self.table[value.view(np.uint16)].view(np.float16)
        result = launch(kernel.formula_over, np.array([float(value)]), self.code, self.params)[0]
        return np.array(result, value.dtype)


NONE = Activation(kernel.IDENTITY, np.zeros(2), np.zeros(1, np.uint16))


def resolve(spec: OpVersion, name, params, dtype: np.dtype) -> Activation:
    """Check ``activation`` / ``activation_params`` for a tensor of ``dtype``."""
    if name is None:
        if params is not None and len(params):
            raise PoolfoldError(
                f"{spec.label}: attribute 'activation_params' {list(params)} given without an "
                "'activation'"
            )
        return NONE
    if not isinstance(name, str):
        raise PoolfoldTypeError(f"{spec.label}: attribute 'activation' must be a string, got {name!r}")
    if name not in ACTIVATIONS:
        raise PoolfoldError(
            f"{spec.label}: unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}"
        )
    code, count = ACTIVATIONS[name]
    values = [] if params is None else list(params)
    if any(isinstance(v, (bool, np.bool_, str, bytes)) or not isinstance(v, (int, float, np.number))
           for v in values):
        raise PoolfoldTypeError(
            f"{spec.label}: activation {name}: 'activation_params' must be floats, got {values!r}"
        )
    if len(values) != count:
        raise PoolfoldError(
            f"{spec.label}: activation {name} takes {count} 'activation_params', got {len(values)}: "
            f"{values}"
        )
    if not dtypes.is_floating(dtype):
        raise PoolfoldError(
            f"{spec.label}: activation {name} cannot apply to {dtypes.name(dtype)} data "
            "(activations are defined for floating types only)"
        )
    padded = np.zeros(2)
    padded[: len(values)] = values
    table = _half_table(code, tuple(padded)) if np.dtype(dtype) == dtypes.FLOAT16 else NONE.table
    return Activation(code, padded, table)


@functools.lru_cache(maxsize=32)
def _half_table(code: int, params: tuple) -> np.ndarray:
    """float16 bits of the activation of every float16 bit pattern, computed in float64."""
    values = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    results = launch(kernel.formula_over, values.astype(np.float64), code, np.array(params))
    with np.errstate(over="ignore"):  # large results become inf, as a float16 cast should
        table = results.astype(np.float16).view(np.uint16)
    table.setflags(write=False)
    return table
