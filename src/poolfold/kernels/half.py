"""Reading float16 and bfloat16 values, which numba has no scalar type for.

Kernels get such tensors as views of their bits, told apart by type (see
:func:`poolfold.dtypes.value_view`): ``uint16`` for float16, ``int16`` for bfloat16.
:func:`as_float32` widens the bits to the float32 of the same value, exactly, in registers:
float16 by the CPU's half conversion (vectorised with F16C), bfloat16 by a shift, since it
is float32's top half.
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
        word = builder.shl(word, ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(word, ir.FloatType())

    return types.float32(types.int16), codegen


HALF_BITS = (types.uint16, types.int16)  # the numba types of half-precision bit views


def as_float32(bits):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@overload(as_float32)
def _as_float32(bits):
    if bits == types.uint16:
        return lambda bits: _float16_bits_to_float32(bits)
    if bits == types.int16:
        return lambda bits: _bfloat16_bits_to_float32(bits)
    return None
