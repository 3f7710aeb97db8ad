"""How comparison kernels order values, including the half types numba lacks.

float16 and bfloat16 tensors reach the comparison kernels as views of their bits, told apart
by type: ``uint16`` for float16 and ``int16`` for bfloat16 (see
:func:`poolfold.dtypes.comparable`).  :func:`order_key` widens such bits to the float32 of
the same value, exactly (float16 by the CPU's half conversion, vectorised with F16C;
bfloat16 by a shift), so they order, tie (-0.0 and +0.0) and test NaN as the floats do.
Other types are their own key.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload


@intrinsic
def _float16_bits_to_float32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def _bfloat16_bits_to_float32(typingctx, bits):
    def codegen(context, builder, signature, args):
        word = builder.zext(args[0], ir.IntType(32))
        word = builder.shl(word, ir.Constant(ir.IntType(32), 16))  # bfloat16 is float32's top half
        return builder.bitcast(word, ir.FloatType())

    return types.float32(types.int16), codegen


def order_key(v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


def is_nan(v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@overload(order_key)
def _order_key(v):
    if v == types.uint16:
        return lambda v: _float16_bits_to_float32(v)
    if v == types.int16:
        return lambda v: _bfloat16_bits_to_float32(v)
    if isinstance(v, (types.Float, types.Integer)):
        return lambda v: v
    return None


@overload(is_nan)
def _is_nan(v):
    if isinstance(v, types.Float) or v in (types.uint16, types.int16):

        def nan(v):
            key = order_key(v)
            return key != key

        return nan
    if isinstance(v, types.Integer):
        return lambda v: False
    return None
