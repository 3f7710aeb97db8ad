"""Reading float16 and bfloat16 values, which numba has no scalar type for.

Kernels get such tensors as views of their bits, told apart by type (see
:func:`poolfold.dtypes.value_view`): ``uint16`` for float16, ``int16`` for bfloat16.
:func:`as_float32` widens the bits to the float32 of the same value, exactly, in registers:
float16 by the CPU's half conversion (vectorised with F16C), bfloat16 by a shift, since it
is float32's top half.

Where the target has no half conversion instructions (no F16C: numba compiling for a named
generic CPU, ``NUMBA_CPU_NAME=generic``, or an old processor), LLVM lowers them to library
calls, ``__extendhfsf2`` and ``__truncsfhf2``, which numba's JIT does not link: the first
float16 pool aborted the process ("LLVM ERROR: Symbol not found").  So this module hands
LLVM the C runtime's own (:func:`_link_half_conversions`) before anything is compiled.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import binding, ir
from numba import types
from numba.extending import intrinsic

from . import helper_overload

# The library calls LLVM makes for half conversions on targets without F16C.
HALF_CONVERSIONS = ("__extendhfsf2", "__truncsfhf2", "__truncdfhf2")


def _link_half_conversions() -> None:
    """Make each of HALF_CONVERSIONS that LLVM's JIT cannot find resolve to the C runtime's:
    libgcc_s holds them from GCC 12 on, with LLVM's calling convention for half (in a vector
    register).  Where the runtime lacks them, nothing is added, and float16 stays usable
    only on targets with F16C, as before."""
    missing = [name for name in HALF_CONVERSIONS if binding.address_of_symbol(name) is None]
    if not missing:
        return
    try:
        # by its soname: ctypes.util.find_library may run a compiler or ldconfig to look
        runtime = ctypes.CDLL("libgcc_s.so.1")
    except OSError:
        return
    for name in missing:
        function = getattr(runtime, name, None)
        if function is not None:
            binding.add_symbol(name, ctypes.cast(function, ctypes.c_void_p).value)


_link_half_conversions()


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


@helper_overload(as_float32)
def _as_float32(bits):
    if bits == types.uint16:
        return lambda bits: _float16_bits_to_float32(bits)
    if bits == types.int16:
        return lambda bits: _bfloat16_bits_to_float32(bits)
    return None


def _splat(value_type, constant):
    """``constant`` as a value of ``value_type``: a scalar, or a vector of it."""
    if isinstance(value_type, ir.VectorType):
        return ir.Constant(value_type, [constant] * value_type.count)
    return ir.Constant(value_type, constant)


def _like(value_type, element):
    """The type of ``element``s shaped as ``value_type``: a scalar, or a vector as long."""
    if isinstance(value_type, ir.VectorType):
        return ir.VectorType(element, value_type.count)
    return element


def narrowed(builder, value, target):
    """LLVM IR: a float64 ``value`` (a scalar or a vector) as the element type a kernel
    stores, ``target`` a numba type: float16 bits (``uint16``), bfloat16 bits (``int16``),
    float32 or float64.  Half types go through float32 (the conversion numba has), so a value
    rounds twice: at most an ulp of T off, within the averaging family's bound
    (docs/semantics.md).  bfloat16 rounds to nearest, ties to even, and keeps a NaN quiet.
    The one rule for :func:`narrow_to` and for the vector kernels that store averages."""
    if target == types.float64:
        return value
    single = builder.fptrunc(value, _like(value.type, ir.FloatType()))
    if target == types.float32:
        return single
    if target == types.uint16:
        half = builder.fptrunc(single, _like(value.type, ir.HalfType()))
        return builder.bitcast(half, _like(value.type, ir.IntType(16)))
    word_type = _like(value.type, ir.IntType(32))
    bits = builder.bitcast(single, word_type)
    high = builder.lshr(bits, _splat(word_type, 16))
    nan = builder.icmp_unsigned(">", builder.and_(bits, _splat(word_type, 0x7FFFFFFF)),
                                _splat(word_type, 0x7F800000))
    quiet = builder.or_(high, _splat(word_type, 0x40))
    odd = builder.and_(high, _splat(word_type, 1))
    rounded = builder.lshr(builder.add(builder.add(bits, _splat(word_type, 0x7FFF)), odd),
                           _splat(word_type, 16))
    return builder.trunc(builder.select(nan, quiet, rounded), _like(value.type, ir.IntType(16)))


@intrinsic
def _narrowed_bits(typingctx, value, bits_type):
    target = getattr(bits_type, "dtype", bits_type)

    def codegen(context, builder, signature, args):
        return narrowed(builder, args[0], target)

    return target(types.float64, bits_type), codegen


def narrow_to(value, bits_type):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(narrow_to)
def _narrow_to(value, bits_type):
    """A float64 ``value`` as the element type the kernel stores (see :func:`narrowed`)."""
    target = getattr(bits_type, "dtype", bits_type)
    if target in HALF_BITS:
        return lambda value, bits_type: _narrowed_bits(np.float64(value), bits_type)
    if target == types.float32:
        return lambda value, bits_type: np.float32(value)
    return lambda value, bits_type: np.float64(value)
