"""Folds written as explicit vector code: the inner loops numba's LLVM leaves slow.

numba hands LLVM scalar loops and lets its loop vectoriser widen them.  For the short,
strided loops of small pools that goes wrong in two ways (measured, float32, 3x3 at stride 2
over (1,64,56,56), one thread):

- the vectoriser takes four registers a turn (32 float32), so a row of 56 elements runs 24
  of them in the scalar remainder, and a row of 28 runs all of them there;
- a stream at stride 2 or more is read by gathers, one load an element, where loading the
  consecutive elements and picking every s-th in registers takes a load and a shuffle a
  register (numba turns LLVM's straight-line vectoriser off, and with it every loop whose
  body LLVM would have to widen by itself).

So these folds are written here in LLVM's vector types (:func:`numba.extending.intrinsic`):
vectors of one register of the host's widest (:func:`_lanes`: 16 float32 with AVX-512, 8
with AVX2), four side by side, every tap of a vector folded in a register, then one store;
the vectors left after the last group of four side by side too, the last of them ending at
the fold's end and overlapping the one before it (recomputing an element gives the same
element); a fold shorter than a vector as two narrower vectors that overlap.  They keep the
first maximum in window order, or the first NaN, as :func:`poolfold.kernels.folds.beats`
does, for every type the kernels pool: float16 and bfloat16 bits are compared as the float32
of the same value and stored as they came.  Measured against the loops they replace (one
thread, the same process, the new time over the old over two or three runs): float32 3x3 at
stride 2 over (8,24,55,55) 0.72-0.92, 5x5 at stride 3 over (4,16,128,128) 0.79-0.88, 7x7 at
stride 1 channels-last over (4,256,256,16) 0.78-0.90; and the row kernels compiled in 5.5 s
where they took 8.9.  Widening the vectors from AVX2's 32 bytes to AVX-512's 64 on a host
that has it, and folding the last vectors side by side where they went one at a time, took
MaxPool to 0.71-0.87 of the time over 2-D and 3-D windows of 3 to 15 (3x3 at stride 2 over
(1,64,56,56) 0.87, 7x7 at stride 1 0.71; 3x3 at stride 1 unchanged), int8 and float64 to
0.76-0.82, channels-last to 0.71-0.94 and AveragePool to 0.92-1.03 (measured in one process
against the build before).

Like every kernel they never check bounds: the caller guarantees each stream lies in its
array, and that ``dst`` overlaps no source (the overlapping last vector reads sources the
vector before it may have written otherwise).  Under ``NUMBA_BOUNDSCHECK=1`` they check
every vector's first and last element as numba checks an index, since raw vector loads
escape numba's own checks.
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic
from numba.np.numpy_support import from_dtype

from . import helper_overload
from .half import HALF_BITS, narrowed


def _host_register_bytes() -> int:
    """64 where numba compiles for a host with AVX-512 registers, else 32 (an AVX2
    register; LLVM splits it for narrower targets)."""
    if config.CPU_NAME or config.CPU_FEATURES:  # a named target (a portable cache, say)
        return 32
    try:
        return 64 if binding.get_host_cpu_features().get("avx512f", False) else 32
    except RuntimeError:  # features unknown on this platform
        return 32


REGISTER_BYTES = _host_register_bytes()


def _lanes(dtype) -> int:
    """Elements of ``dtype`` a fold's vector holds: one register of the host's widest.
    float16 and bfloat16 keep 16 lanes (32 bytes), whose float32 keys fill a 512-bit register
    already: 32 of them were slower (bfloat16 3x3 at stride 2, 1.15x the time)."""
    vector_bytes = 32 if dtype in HALF_BITS else REGISTER_BYTES
    return max(vector_bytes // (dtype.bitwidth // 8), 1)


def vector_lanes(value_type) -> int:
    """:func:`_lanes` for a numpy value type (see :func:`poolfold.dtypes.value_type`), for
    the op layer's choices."""
    return _lanes(from_dtype(np.dtype(value_type)))


def _supported(dtype) -> bool:
    return isinstance(dtype, (types.Float, types.Integer)) or dtype in HALF_BITS


def _key(builder, dtype, vector):
    """The vector as the values it orders by: half bits widened to float32 (exactly)."""
    if dtype == types.uint16:  # float16 bits
        halves = builder.bitcast(vector, ir.VectorType(ir.HalfType(), vector.type.count))
        return builder.fpext(halves, ir.VectorType(ir.FloatType(), vector.type.count))
    if dtype == types.int16:  # bfloat16 bits: float32's top half
        wide = ir.VectorType(ir.IntType(32), vector.type.count)
        shifted = builder.shl(builder.zext(vector, wide),
                              ir.Constant(wide, [16] * vector.type.count))
        return builder.bitcast(shifted, ir.VectorType(ir.FloatType(), vector.type.count))
    return vector


def _beats(builder, dtype, v, held):
    """Lane by lane, whether a later tap ``v`` replaces ``held`` (as ``folds.beats``)."""
    kv, kh = _key(builder, dtype, v), _key(builder, dtype, held)
    if isinstance(kv.type.element, (ir.FloatType, ir.DoubleType)):
        greater = builder.fcmp_unordered(">", kv, kh)  # not (v <= held): greater, or a NaN
        held_no_nan = builder.fcmp_ordered("==", kh, kh)
        return builder.and_(greater, held_no_nan)
    if dtype.signed:
        return builder.icmp_signed(">", kv, kh)
    return builder.icmp_unsigned(">", kv, kh)


def _fold_in(builder, dtype, held, v):
    return builder.select(_beats(builder, dtype, v, held), v, held)


def _fold_in_no_nan(builder, dtype, held, v):
    """:func:`_fold_in` for taps none of which is a NaN: a later tap replaces ``held`` where
    it is greater (one ``vmaxps``, where the NaN-aware comparison takes three instructions)."""
    kv, kh = _key(builder, dtype, v), _key(builder, dtype, held)
    if isinstance(kv.type.element, (ir.FloatType, ir.DoubleType)):
        return builder.select(builder.fcmp_ordered(">", kv, kh), v, held)
    return _fold_in(builder, dtype, held, v)


def _add(builder, dtype, held, v):
    return builder.fadd(held, v)


def _pointer(context, builder, array_type, array):
    return context.make_array(array_type)(context, builder, array).data


def _check(context, builder, first, last, size):
    """Under bounds checking, IndexError unless elements [first, last] lie in the array."""
    if context.enable_boundscheck:
        cgutils.do_boundscheck(context, builder, first, size)
        cgutils.do_boundscheck(context, builder, last, size)


def _load(builder, base, at, vector_type):
    address = builder.bitcast(builder.gep(base, [at]), vector_type.as_pointer())
    return builder.load(address, align=1)


def _store(builder, base, at, value):
    address = builder.bitcast(builder.gep(base, [at]), value.type.as_pointer())
    builder.store(value, address, align=1)


def _vector_name(vector_type) -> str:
    element = vector_type.element
    kind = {ir.FloatType: "f32", ir.DoubleType: "f64"}.get(type(element))
    return f"v{vector_type.count}{kind or f'i{element.width}'}"


def _picked(builder, base, at, stride, lanes, element_type):
    """Elements ``at + j*stride`` for j < lanes: consecutive ones loaded, every stride-th
    kept (a shuffle, where LLVM would gather element by element).  The load is masked to
    the elements up to the last one kept, so that it reads nothing past it."""
    if stride == 1:
        return _load(builder, base, at, ir.VectorType(element_type, lanes))
    wide = ir.VectorType(element_type, lanes * stride)
    reach = (lanes - 1) * stride + 1
    mask = ir.Constant(ir.VectorType(ir.IntType(1), lanes * stride),
                       [j < reach for j in range(lanes * stride)])
    masked_load = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(wide, [wide.as_pointer(), ir.IntType(32), mask.type, wide]),
        f"llvm.masked.load.{_vector_name(wide)}.p0")
    address = builder.bitcast(builder.gep(base, [at]), wide.as_pointer())
    loaded = builder.call(masked_load, [address, ir.Constant(ir.IntType(32), 1), mask,
                                        ir.Constant(wide, ir.Undefined)])
    keep = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [j * stride for j in range(lanes)])
    return builder.shuffle_vector(loaded, ir.Constant(wide, ir.Undefined), keep)


# Vectors folded side by side in the main loop: each tap's comparison waits on the one
# before it, so one vector at a time left the processor idle between them.
UNROLL = 4


def _vector_folds(context, builder, dst_type, dst, to, src_type, src, offsets, taps, count,
                  stride, combine=_fold_in, screen=None, widen=False, stored=None):
    """The shared body: ``dst[to + i]`` = the taps t < taps of ``src[offsets(t) + i*stride]``
    for i < count, combined in tap order by ``combine(builder, dtype, held, v)``: the first
    maximum, or a sum.  ``screen`` (a :class:`_Screen`): the stored values' zeros and NaNs
    noted as they are stored.  ``widen``: half bits combined and stored as float32 (their
    :func:`_key`), ``dst`` a float32 array.  ``stored(value, i)``: stores the vector of
    outputs from ``i`` on in the caller's way (``dst`` then only bounds its stores)."""
    dtype = src_type.dtype
    lanes = _lanes(dtype)
    i64 = ir.IntType(64)
    element_type = context.get_data_type(dtype)
    held_type = context.get_data_type(dst_type.dtype) if widen else element_type
    src_base = _pointer(context, builder, src_type, src)
    dst_base = _pointer(context, builder, dst_type, dst)
    src_size = context.make_array(src_type)(context, builder, src).nitems
    dst_size = context.make_array(dst_type)(context, builder, dst).nitems
    zero, one = ir.Constant(i64, 0), ir.Constant(i64, 1)

    def picked(at, width):
        """The source's vector at ``at`` (half bits widened with ``widen``)."""
        v = _picked(builder, src_base, at, stride, width, element_type)
        return _key(builder, dtype, v) if widen else v

    def fold_at(starts, width):
        """Fold the vectors of ``width`` lanes whose first elements are ``starts``."""
        vector_type = ir.VectorType(held_type, width)
        held = [cgutils.alloca_once(builder, vector_type) for _ in starts]
        steps = [builder.mul(i, ir.Constant(i64, stride)) for i in starts]
        first = offsets(zero)
        reach = ir.Constant(i64, (width - 1) * stride)
        for h, step in zip(held, steps):
            _check(context, builder, builder.add(first, step),
                   builder.add(builder.add(first, step), reach), src_size)
            builder.store(picked(builder.add(first, step), width), h)
        with cgutils.for_range_slice(builder, one, taps, one, intp=i64) as (t, _):
            at = offsets(t)
            for h, step in zip(held, steps):
                _check(context, builder, builder.add(at, step),
                       builder.add(builder.add(at, step), reach), src_size)
                v = picked(builder.add(at, step), width)
                builder.store(combine(builder, dtype, builder.load(h), v), h)
        for h, i in zip(held, starts):
            _check(context, builder, builder.add(to, i),
                   builder.add(builder.add(to, i), ir.Constant(i64, width - 1)), dst_size)
            value = builder.load(h)
            if screen is not None:
                screen.note(builder, value)
            if stored is not None:
                stored(value, i)
                continue
            _store(builder, dst_base, builder.add(to, i), value)

    block = ir.Constant(i64, lanes * UNROLL)
    blocks = builder.sdiv(count, block)
    with cgutils.for_range(builder, blocks, intp=i64) as loop:
        at = builder.mul(loop.index, block)
        fold_at([builder.add(at, ir.Constant(i64, u * lanes)) for u in range(UNROLL)], lanes)
    done = builder.mul(blocks, block)
    # The rest, fewer than UNROLL vectors, folded side by side too (the last one ending at
    # count, overlapping the one before it: recomputing an element gives the same element):
    # one vector at a time, each waited on its taps' comparisons in turn (rows of 56
    # float32, a 2-D 3x3 pool's, are 3.5 vectors of 16).
    rest = builder.sub(count, done)
    width = ir.Constant(i64, lanes)
    vectors = builder.sdiv(builder.add(rest, ir.Constant(i64, lanes - 1)), width)
    last = builder.sub(count, width)
    with builder.if_then(builder.and_(builder.icmp_signed(">", rest, zero),
                                      builder.icmp_signed(">=", count, width))):
        after = builder.append_basic_block("rest_folded")
        switch = builder.switch(vectors, after)  # the default never taken: 1 to UNROLL
        for n in range(1, UNROLL + 1):
            case = builder.append_basic_block(f"rest_{n}")
            switch.add_case(ir.Constant(i64, n), case)
            builder.position_at_end(case)
            fold_at([builder.add(done, ir.Constant(i64, u * lanes)) for u in range(n - 1)]
                    + [last], lanes)
            builder.branch(after)
        builder.position_at_end(after)

    # A fold shorter than a vector: two narrower vectors that overlap (the width halved
    # until it fits), or one element.
    def ragged(width):
        end = builder.sub(count, ir.Constant(i64, width))
        if width == 1:
            fold_at([zero], 1)
            return
        with builder.if_else(builder.icmp_signed(">=", count, ir.Constant(i64, width))) as (
                fits, narrower):
            with fits:
                fold_at([zero, end], width)
            with narrower:
                ragged(width // 2)

    if lanes > 1:
        with builder.if_then(builder.icmp_signed(">", count, zero)):
            with builder.if_then(builder.icmp_signed("<", count, width)):
                ragged(lanes // 2)


def _over_starts(combine, widen=False):
    """The codegen of a fold over taps that start at ``starts[t]`` (consecutive outputs)."""
    def codegen(context, builder, signature, args):
        dst_v, to_v, src_v, starts_v, taps_v, count_v = args
        starts_base = _pointer(context, builder, signature.args[3], starts_v)

        def offsets(t):
            return builder.load(builder.gep(starts_base, [t]))

        _vector_folds(context, builder, signature.args[0], dst_v, to_v, signature.args[2],
                      src_v, offsets, taps_v, count_v, 1, combine, widen=widen)
        return context.get_dummy_value()

    return codegen


def _over_a_stride(combine, stride: int):
    """The codegen of a fold over taps ``dilation`` apart, outputs ``stride`` apart."""
    def codegen(context, builder, signature, args):
        dst_v, to_v, src_v, at_v, count_v, _, taps_v, dilation_v = args

        def offsets(t):
            return builder.add(at_v, builder.mul(t, dilation_v))

        _vector_folds(context, builder, signature.args[0], dst_v, to_v, signature.args[2],
                      src_v, offsets, taps_v, count_v, stride, combine)
        return context.get_dummy_value()

    return codegen


def _arrays_of(dst, src, accepts) -> bool:
    return (isinstance(src, types.Array) and isinstance(dst, types.Array)
            and accepts(src.dtype) and dst.dtype == src.dtype)


def _floats(dtype) -> bool:
    return isinstance(dtype, types.Float)


@intrinsic
def fold_vectors(typingctx, dst, to, src, starts, taps, count):
    """``dst[to + i]`` = the first maximum of ``src[starts[t] + i]`` over taps t < ``taps``,
    for i < ``count``: :func:`poolfold.kernels.folds.fold_values` in vectors."""
    if not _arrays_of(dst, src, _supported):
        return None
    return (types.void(dst, types.int64, src, starts, types.int64, types.int64),
            _over_starts(_fold_in))


@intrinsic(prefer_literal=True)
def fold_strided(typingctx, dst, to, src, at, count, stride, taps, dilation):
    """``dst[to + i]`` = the first maximum of ``src[at + i*stride + t*dilation]`` over taps
    t < ``taps``, for i < ``count``, ``stride`` a literal: each tap's elements loaded
    consecutively and picked by a shuffle."""
    if not (_arrays_of(dst, src, _supported) and isinstance(stride, types.IntegerLiteral)):
        return None
    return (types.void(dst, types.int64, src, types.int64, types.int64, stride, types.int64,
                       types.int64), _over_a_stride(_fold_in, stride.literal_value))


@intrinsic(prefer_literal=True)
def sum_strided(typingctx, dst, to, src, at, count, stride, taps, dilation):
    """``dst[to + i]`` = ``src[at + i*stride]`` + the taps t < ``taps`` after it, each
    ``dilation`` further on, added left to right (the order a loop per tap adds them in),
    for i < ``count``; float32 or float64, ``stride`` a literal."""
    if not (_arrays_of(dst, src, _floats) and isinstance(stride, types.IntegerLiteral)):
        return None
    return (types.void(dst, types.int64, src, types.int64, types.int64, stride, types.int64,
                       types.int64), _over_a_stride(_add, stride.literal_value))


@intrinsic
def sum_vectors(typingctx, dst, to, src, starts, taps, count):
    """``dst[to + i]`` = ``src[starts[0] + i]`` + ``src[starts[t] + i]`` for the taps t <
    ``taps`` after it, added left to right, for i < ``count``; float32 or float64, or float16
    or bfloat16 bits summed into float32 (each value widened exactly, as
    :func:`poolfold.kernels.half.as_float32` does, and added in float32)."""
    widen = (isinstance(src, types.Array) and src.dtype in HALF_BITS
             and isinstance(dst, types.Array) and dst.dtype == types.float32)
    if not (widen or _arrays_of(dst, src, _floats)):
        return None
    return (types.void(dst, types.int64, src, starts, types.int64, types.int64),
            _over_starts(_add, widen))


@intrinsic
def sum_vectors_screened(typingctx, dst, to, src, starts, taps, count):
    """:func:`sum_vectors` of float32 or float64, and 1 if a sum it stored is an inf or a
    NaN, else 0: noted in registers as they are stored (the block sums' check of float32
    sums that are not finite, which a loop over the stored sums ORed element by element at
    0.07 ns an element, a quarter of its averages' store)."""
    if not _arrays_of(dst, src, _floats):
        return None
    dtype = src.dtype

    def codegen(context, builder, signature, args):
        dst_v, to_v, src_v, starts_v, taps_v, count_v = args
        starts_base = _pointer(context, builder, signature.args[3], starts_v)
        screen = _Screen(builder, dtype, _lanes(dtype), not_finite=True)

        def offsets(t):
            return builder.load(builder.gep(starts_base, [t]))

        _vector_folds(context, builder, signature.args[0], dst_v, to_v, signature.args[2],
                      src_v, offsets, taps_v, count_v, 1, _add, screen)
        return screen.result(builder)

    return (types.int64(dst, types.int64, src, starts, types.int64, types.int64), codegen)


@intrinsic
def store_averages(typingctx, y, y_at, sums, starts, shift, taps, count, scale, factors,
                   factors_at):
    """Averages of windows summed in registers, stored as Y's elements: ``y[y_at + i]`` =
    the sum of ``sums[starts[t] + shift + i]`` over t < ``taps``, added left to right (as
    :func:`sum_vectors_screened` adds them), as float64, times ``scale``, times
    ``factors[factors_at + i]``, a NaN as one quiet NaN, rounded to Y's type
    (:func:`poolfold.kernels.half.narrowed`), for i < ``count``; and 1 if a sum is an inf
    or a NaN, else 0.  The block sums' last axis: storing the window sums and scaling them
    in a second loop, each row's pieces shifted in memory, took 63x63x63 over 16 planes of
    64^3 1.13x as long (one thread, paired over nine rounds).  ``sums`` float32 or float64;
    Y float32, float64, or float16 or bfloat16 bits."""
    if not (isinstance(sums, types.Array) and _floats(sums.dtype)
            and isinstance(y, types.Array) and (_floats(y.dtype) or y.dtype in HALF_BITS)
            and isinstance(factors, types.Array) and factors.dtype == types.float64):
        return None
    target = y.dtype

    def codegen(context, builder, signature, args):
        y_v, y_at_v, sums_v, starts_v, shift_v, taps_v, count_v, scale_v, factors_v, \
            factors_at_v = args
        starts_base = _pointer(context, builder, signature.args[3], starts_v)
        factors_base = _pointer(context, builder, signature.args[8], factors_v)
        factors_size = context.make_array(signature.args[8])(context, builder,
                                                              factors_v).nitems
        y_base = _pointer(context, builder, signature.args[0], y_v)
        screen = _Screen(builder, sums.dtype, _lanes(sums.dtype), not_finite=True)
        i32 = ir.IntType(32)

        def offsets(t):
            return builder.add(builder.load(builder.gep(starts_base, [t])), shift_v)

        def stored(total, i):
            width = total.type.count
            doubles = ir.VectorType(ir.DoubleType(), width)
            wide = total if sums.dtype == types.float64 else builder.fpext(total, doubles)
            scales = builder.shuffle_vector(
                builder.insert_element(ir.Constant(doubles, ir.Undefined), scale_v,
                                       ir.Constant(i32, 0)),
                ir.Constant(doubles, ir.Undefined), ir.Constant(ir.VectorType(i32, width),
                                                                [0] * width))
            first = builder.add(factors_at_v, i)
            _check(context, builder, first, builder.add(first, ir.Constant(first.type,
                                                                           width - 1)),
                   factors_size)
            average = builder.fmul(builder.fmul(wide, scales),
                                   _load(builder, factors_base, first, doubles))
            average = builder.select(builder.fcmp_unordered("uno", average, average),
                                     ir.Constant(doubles, [float("nan")] * width), average)
            _store(builder, y_base, builder.add(y_at_v, i), narrowed(builder, average, target))

        _vector_folds(context, builder, signature.args[0], y_v, y_at_v, signature.args[2],
                      sums_v, offsets, taps_v, count_v, 1, _add, screen, stored=stored)
        return screen.result(builder)

    return (types.int64(y, types.int64, sums, starts, types.int64, types.int64, types.int64,
                        types.float64, factors, types.int64), codegen)


@intrinsic
def fold_lanes(typingctx, dst, to, src, at, outputs, lanes, step, starts, taps):
    """Channels-last outputs: ``dst[to + o*lanes + c]`` = the first maximum of ``src[at +
    o*step + starts[t] + c]`` over taps t < ``taps`` in order, for o < ``outputs`` and c <
    ``lanes``: each output's run of lanes folded in vectors, one output after another."""
    if not _arrays_of(dst, src, _supported):
        return None

    def codegen(context, builder, signature, args):
        dst_v, to_v, src_v, at_v, outputs_v, lanes_v, step_v, starts_v, taps_v = args
        starts_base = _pointer(context, builder, signature.args[7], starts_v)
        with cgutils.for_range(builder, outputs_v, intp=outputs_v.type) as loop:
            o = loop.index
            first = builder.add(at_v, builder.mul(o, step_v))

            def offsets(t, first=first):
                return builder.add(first, builder.load(builder.gep(starts_base, [t])))

            _vector_folds(context, builder, signature.args[0], dst_v,
                          builder.add(to_v, builder.mul(o, lanes_v)), signature.args[2], src_v,
                          offsets, taps_v, lanes_v, 1, _fold_in)
        return context.get_dummy_value()

    return (types.void(dst, types.int64, src, types.int64, types.int64, types.int64,
                       types.int64, starts, types.int64), codegen)


# What :func:`zeros_and_nans` reports, as bits of its result.
HOLDS_ZERO, HOLDS_NAN = 1, 2


class _Screen:
    """Whether vectors of ``dtype`` (a float type's, or half bits) hold a zero of either sign
    or a NaN, lane by lane into masks of ``lanes`` flags; a narrower vector (a fold's short
    tail) is reduced into lane 0.  :meth:`result` gives HOLDS_ZERO | HOLDS_NAN, or with
    ``either`` only whether some value is one or the other (one comparison a vector,
    "unordered or equal to zero", and one mask), with ``not_finite`` whether some value is an
    inf or a NaN (``v - v`` unordered: a subtraction and a comparison a vector)."""

    def __init__(self, builder, dtype, lanes: int, either: bool = False,
                 not_finite: bool = False):
        self.dtype = dtype
        self.lanes = lanes
        self.either = either or not_finite
        self.not_finite = not_finite
        self.flags = ir.VectorType(ir.IntType(1), lanes)
        none = ir.Constant(self.flags, [0] * lanes)
        self.masks = [cgutils.alloca_once_value(builder, none)
                      for _ in range(1 if self.either else 2)]

    def note(self, builder, vector):
        key = _key(builder, self.dtype, vector)
        width = key.type.count
        zero = ir.Constant(key.type, [0.0] * width)
        if self.not_finite:
            difference = builder.fsub(key, key)
            found = [builder.fcmp_unordered("uno", difference, difference)]
        elif self.either:
            found = [builder.fcmp_unordered("==", key, zero)]
        else:
            found = [builder.fcmp_ordered("==", key, zero), builder.fcmp_unordered("uno", key, key)]
        if width != self.lanes:  # any lane, into lane 0
            pick = ir.Constant(ir.IntType(32), 0)
            empty = ir.Constant(self.flags, [0] * self.lanes)
            whole = ir.IntType(width)
            found = [builder.insert_element(empty, builder.icmp_unsigned(
                "!=", builder.bitcast(flags, whole), ir.Constant(whole, 0)), pick)
                for flags in found]
        for mask, flags in zip(self.masks, found):
            builder.store(builder.or_(builder.load(mask), flags), mask)

    def result(self, builder):
        i64 = ir.IntType(64)

        def any_of(pointer, bit):
            bits = builder.bitcast(builder.load(pointer), ir.IntType(self.lanes))
            held = builder.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(self.lanes), 0))
            return builder.select(held, ir.Constant(i64, bit), ir.Constant(i64, 0))

        if self.either:
            return any_of(self.masks[0], 1)
        return builder.or_(any_of(self.masks[0], HOLDS_ZERO), any_of(self.masks[1], HOLDS_NAN))


@intrinsic(prefer_literal=True)
def fold_strided_screened(typingctx, dst, to, src, at, count, stride, taps, dilation):
    """:func:`fold_strided`, and 1 if a value it stored is a zero or a NaN, else 0: noted as
    they are stored, one comparison a vector.  A scan of them afterwards waited on their
    stores where those missed the cache (a block's outputs freshly written to Y; 3-D 2x2x2
    at stride 2 over (2,32,64,64,64), one thread: 0.4 of the kernel's 5.3 ms); its two
    comparisons a vector in the fold itself slowed blocks that stay in cache (3x3 at stride
    2 over (8,24,55,55), two threads: 83 -> 91 us), where this one does not.  Integer
    types: 0."""
    if not (_arrays_of(dst, src, _supported) and isinstance(stride, types.IntegerLiteral)):
        return None
    dtype = src.dtype
    literal = stride.literal_value

    def codegen(context, builder, signature, args):
        dst_v, to_v, src_v, at_v, count_v, _, taps_v, dilation_v = args
        floats = not (isinstance(dtype, types.Integer) and dtype not in HALF_BITS)
        screen = _Screen(builder, dtype, _lanes(dtype), either=True) if floats else None

        def offsets(t):
            return builder.add(at_v, builder.mul(t, dilation_v))

        _vector_folds(context, builder, signature.args[0], dst_v, to_v, signature.args[2],
                      src_v, offsets, taps_v, count_v, literal, _fold_in, screen)
        return screen.result(builder) if floats else ir.Constant(ir.IntType(64), 0)

    return (types.int64(dst, types.int64, src, types.int64, types.int64, stride, types.int64,
                        types.int64), codegen)


@intrinsic
def zeros_and_nans(typingctx, src, lo, hi):
    """Whether ``src[lo:hi]`` holds a zero of either sign (bit HOLDS_ZERO) and a NaN (bit
    HOLDS_NAN): a vectorised scan of every element, 0 for integer types.  A loop that ORs
    booleans element by element ran at 0.15 ns an element (float32), twice this."""
    if not (isinstance(src, types.Array) and _supported(src.dtype)):
        return None
    dtype = src.dtype

    def codegen(context, builder, signature, args):
        src_v, lo_v, hi_v = args
        i64 = ir.IntType(64)
        if isinstance(dtype, types.Integer) and dtype not in HALF_BITS:
            return ir.Constant(i64, 0)
        lanes = _lanes(dtype)
        element_type = context.get_data_type(dtype)
        base = _pointer(context, builder, signature.args[0], src_v)
        size = context.make_array(signature.args[0])(context, builder, src_v).nitems
        screen = _Screen(builder, dtype, lanes)

        def scan(at, width):
            _check(context, builder, at, builder.add(at, ir.Constant(i64, width - 1)), size)
            screen.note(builder, _load(builder, base, at, ir.VectorType(element_type, width)))

        count = builder.sub(hi_v, lo_v)
        width = ir.Constant(i64, lanes)
        vectors = builder.sdiv(count, width)
        with cgutils.for_range(builder, vectors, intp=i64) as loop:
            scan(builder.add(lo_v, builder.mul(loop.index, width)), lanes)
        with cgutils.for_range_slice(builder, builder.add(lo_v, builder.mul(vectors, width)),
                                     hi_v, ir.Constant(i64, 1), intp=i64) as (i, _):
            scan(i, 1)
        return screen.result(builder)

    return types.int64(src, types.int64, types.int64), codegen


@intrinsic(prefer_literal=True)
def fold_taps(typingctx, dst, to, src, starts, first, taps, count, no_nan):
    """``dst[to + i]`` = the first maximum of ``src[starts[first + t] + i]`` over taps t <
    ``taps`` (at least one), for i < ``count``: :func:`fold_vectors` over the taps that one
    output of a table of many lists from ``first`` on.  ``no_nan``, a literal: True where the
    caller knows no tap is a NaN, which folds by plain comparisons."""
    if not (_arrays_of(dst, src, _supported) and isinstance(no_nan, types.BooleanLiteral)):
        return None
    combine = _fold_in_no_nan if no_nan.literal_value else _fold_in

    def codegen(context, builder, signature, args):
        dst_v, to_v, src_v, starts_v, first_v, taps_v, count_v, _ = args
        starts_base = _pointer(context, builder, signature.args[3], starts_v)

        def offsets(t):
            return builder.load(builder.gep(starts_base, [builder.add(first_v, t)]))

        _vector_folds(context, builder, signature.args[0], dst_v, to_v, signature.args[2],
                      src_v, offsets, taps_v, count_v, 1, combine)
        return context.get_dummy_value()

    return (types.void(dst, types.int64, src, starts, types.int64, types.int64, types.int64,
                       no_nan), codegen)


def _pair_step(context, builder, signature, args, dtype, combine):
    """The step of :func:`fold_pair` and :func:`add_pair`, whose arguments start ``(dst, to,
    first, first_at, second, second_at)``: ``step(i, width)`` stores ``combine(first's
    vector at first_at + i, second's at second_at + i)`` at ``to + i``, ``width`` lanes."""
    dst_v, to_v, first_v, first_at_v, second_v, second_at_v = args[:6]
    i64 = ir.IntType(64)
    element_type = context.get_data_type(dtype)
    arrays = [(signature.args[k], v) for k, v in ((0, dst_v), (2, first_v), (4, second_v))]
    bases = [_pointer(context, builder, t, v) for t, v in arrays]
    sizes = [context.make_array(t)(context, builder, v).nitems for t, v in arrays]

    def step(i, width):
        reach = ir.Constant(i64, width - 1)
        vector_type = ir.VectorType(element_type, width)
        first_at = builder.add(first_at_v, i)
        second_at = builder.add(second_at_v, i)
        to_at = builder.add(to_v, i)
        _check(context, builder, first_at, builder.add(first_at, reach), sizes[1])
        _check(context, builder, second_at, builder.add(second_at, reach), sizes[2])
        _check(context, builder, to_at, builder.add(to_at, reach), sizes[0])
        held = _load(builder, bases[1], first_at, vector_type)
        v = _load(builder, bases[2], second_at, vector_type)
        _store(builder, bases[0], to_at, combine(builder, dtype, held, v))

    return step


@intrinsic(prefer_literal=True)
def fold_pair(typingctx, dst, to, first, first_at, second, second_at, count, no_nan):
    """``dst[to + i]`` = the first maximum of ``first[first_at + i]`` then
    ``second[second_at + i]``, for i < ``count``: one step of a running maximum (the van Herk
    / Gil-Werman runs of :mod:`poolfold.kernels.folds`), whose two sources may be two arrays
    (a run and the input).  numba's loop over a position's run of lanes (16 float32) was
    unrolled by LLVM before its loop vectoriser saw it, and numba runs no other: one scalar
    comparison an element (windows of 1x63 over (4,16,256,256) float32 by the separable
    passes: 4.5 ms, 3.4 with this).  ``dst`` may be ``first``, the elements apart.
    ``no_nan``, a literal: True where the caller knows neither source holds a NaN, which
    folds by plain comparisons (and copies, a source folded with itself, either way)."""
    if not (_arrays_of(dst, first, _supported) and _arrays_of(dst, second, _supported)
            and isinstance(no_nan, types.BooleanLiteral)):
        return None
    dtype = first.dtype
    combine = _fold_in_no_nan if no_nan.literal_value else _fold_in

    def codegen(context, builder, signature, args):
        count_v = args[6]
        i64 = ir.IntType(64)
        lanes = _lanes(dtype)
        step = _pair_step(context, builder, signature, args, dtype, combine)
        width = ir.Constant(i64, lanes)
        vectors = builder.sdiv(count_v, width)
        with cgutils.for_range(builder, vectors, intp=i64) as loop:
            step(builder.mul(loop.index, width), lanes)
        done = builder.mul(vectors, width)
        # the rest: a last vector ending at count where a whole one fits (recomputing an
        # element gives the same element), else element by element
        with builder.if_then(builder.icmp_signed("<", done, count_v)):
            with builder.if_else(builder.icmp_signed(">=", count_v, width)) as (whole, short):
                with whole:
                    step(builder.sub(count_v, width), lanes)
                with short:
                    with cgutils.for_range_slice(builder, done, count_v, ir.Constant(i64, 1),
                                                 intp=i64) as (i, _):
                        step(i, 1)
        return context.get_dummy_value()

    return (types.void(dst, types.int64, first, types.int64, second, types.int64, types.int64,
                       no_nan), codegen)


def _pair_sums(dtype, whole_vector: bool):
    """The codegen of :func:`add_pair` (``whole_vector``: of :func:`add_vectors`)."""

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        lanes = _lanes(dtype)
        step = _pair_step(context, builder, signature, args, dtype, _add)
        if whole_vector:
            step(ir.Constant(i64, 0), lanes)
            return context.get_dummy_value()
        count_v = args[6]
        width = ir.Constant(i64, lanes)
        vectors = builder.sdiv(count_v, width)
        with cgutils.for_range(builder, vectors, intp=i64) as loop:
            step(builder.mul(loop.index, width), lanes)
        with cgutils.for_range_slice(builder, builder.mul(vectors, width), count_v,
                                     ir.Constant(i64, 1), intp=i64) as (i, _):
            step(i, 1)
        return context.get_dummy_value()

    return codegen


@intrinsic
def add_pair(typingctx, dst, to, first, first_at, second, second_at, count):
    """``dst[to + i]`` = ``first[first_at + i] + second[second_at + i]``, for i < ``count``:
    one step of a prefix or suffix of block sums (:mod:`poolfold.kernels.window_blocks`),
    whose sources and destination are often one array.  numba's loop over a position's
    lanes (8 float64) was unrolled by LLVM before its loop vectoriser saw it (one scalar
    addition an element), as for :func:`fold_pair`.  ``dst`` may be ``first``, the same
    elements or elements at least ``count`` apart: the elements past the last whole vector
    are added one by one, none twice.  float32 or float64."""
    if not (_arrays_of(dst, first, _floats) and _arrays_of(dst, second, _floats)):
        return None
    return (types.void(dst, types.int64, first, types.int64, second, types.int64,
                       types.int64), _pair_sums(first.dtype, False))


@intrinsic
def add_vectors(typingctx, dst, to, first, first_at, second, second_at):
    """:func:`add_pair` of one vector's elements (:func:`vector_width`), without a loop: a
    position of lanes, a vector of rows side by side."""
    if not (_arrays_of(dst, first, _floats) and _arrays_of(dst, second, _floats)):
        return None
    return (types.void(dst, types.int64, first, types.int64, second, types.int64),
            _pair_sums(first.dtype, True))


@intrinsic(prefer_literal=True)
def fold_row_groups(typingctx, dst, to, src, at, rows, width, src_step, tap_step, taps):
    """``dst[to + j*width + i]`` = the first maximum of ``src[at + j*src_step + t*tap_step +
    i]`` over taps t < ``taps``, in order, for i < ``width`` and rows j < ``rows``: each row
    one vector, ``width`` at most a vector's lanes, stored whole.  A row's store runs past
    its ``width`` elements into the rows after it, which are stored later, so the caller
    keeps the last rows' spill inside ``dst`` (and ``src`` readable a vector past each
    row).  Rows of 7 float32 (2x2 windows at stride 2 over 14x14 planes, the rows already
    folded in pairs) then take one vector fold each, where a fold per row ran its short
    tail element by element."""
    if not (_arrays_of(dst, src, _supported)):
        return None
    dtype = src.dtype

    def codegen(context, builder, signature, args):
        dst_v, to_v, src_v, at_v, rows_v, width_v, src_step_v, tap_step_v, taps_v = args
        i64 = ir.IntType(64)
        lanes = _lanes(dtype)
        element_type = context.get_data_type(dtype)
        vector_type = ir.VectorType(element_type, lanes)
        reach = ir.Constant(i64, lanes - 1)
        dst_base = _pointer(context, builder, signature.args[0], dst_v)
        src_base = _pointer(context, builder, signature.args[2], src_v)
        dst_size = context.make_array(signature.args[0])(context, builder, dst_v).nitems
        src_size = context.make_array(signature.args[2])(context, builder, src_v).nitems
        held = cgutils.alloca_once(builder, vector_type)
        one = ir.Constant(i64, 1)
        with cgutils.for_range(builder, rows_v, intp=i64) as loop:
            j = loop.index
            row_at = builder.add(at_v, builder.mul(j, src_step_v))
            _check(context, builder, row_at, builder.add(row_at, reach), src_size)
            builder.store(_load(builder, src_base, row_at, vector_type), held)
            with cgutils.for_range_slice(builder, one, taps_v, one, intp=i64) as (t, _):
                tap_at = builder.add(row_at, builder.mul(t, tap_step_v))
                _check(context, builder, tap_at, builder.add(tap_at, reach), src_size)
                v = _load(builder, src_base, tap_at, vector_type)
                builder.store(_fold_in(builder, dtype, builder.load(held), v), held)
            out_at = builder.add(to_v, builder.mul(j, width_v))
            _check(context, builder, out_at, builder.add(out_at, reach), dst_size)
            _store(builder, dst_base, out_at, builder.load(held))
        return context.get_dummy_value()

    return (types.void(dst, types.int64, src, types.int64, types.int64, types.int64,
                       types.int64, types.int64, types.int64), codegen)


def _transposed(builder, rows):
    """The columns of ``rows``, W vectors of W lanes (W a power of two): log2(W) rounds of
    interleaving row i with row i + W/2 into rows 2i and 2i+1, each a two-source shuffle
    (one instruction on AVX-512, ``vpermt2ps`` and the like)."""
    width = len(rows)
    half = width // 2
    low = ir.Constant(ir.VectorType(ir.IntType(32), width),
                      [j for k in range(half) for j in (k, width + k)])
    high = ir.Constant(ir.VectorType(ir.IntType(32), width),
                       [j for k in range(half, width) for j in (k, width + k)])
    for _ in range(width.bit_length() - 1):
        interleaved = []
        for i in range(half):
            interleaved.append(builder.shuffle_vector(rows[i], rows[i + half], low))
            interleaved.append(builder.shuffle_vector(rows[i], rows[i + half], high))
        rows = interleaved
    return rows


def vector_width(a):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(vector_width)
def _vector_width(a):
    """The lanes of a fold's vector of ``a``'s elements (the side of
    :func:`transpose_tile`'s tile), as a compile-time constant."""
    width = _lanes(a.dtype)
    return lambda a: width


@intrinsic
def transpose_tile(typingctx, dst, dst_at, dst_pitch, stores, src, src_at, src_pitch, loads):
    """A square tile of W x W elements (W = :func:`vector_width`), transposed: row r of the tile
    is ``src[src_at + r*src_pitch:][:W]`` (rows from ``loads`` on repeat the last row below
    it, so that nothing past the source is read), column j goes to
    ``dst[dst_at + j*dst_pitch:][:W]`` for j below ``stores`` only.  A tile is W loads, W
    log2(W) shuffles and W stores, where element by element it is W*W of each.  Returns
    whether a row loaded holds a NaN (False for integer types)."""
    if not (_arrays_of(dst, src, _supported)):
        return None

    def codegen(context, builder, signature, args):
        dst_v, dst_at_v, dst_pitch_v, stores_v, src_v, src_at_v, src_pitch_v, loads_v = args
        dtype = signature.args[4].dtype
        width = _lanes(dtype)
        i64 = ir.IntType(64)
        element_type = context.get_data_type(dtype)
        vector_type = ir.VectorType(element_type, width)
        src_base = _pointer(context, builder, signature.args[4], src_v)
        dst_base = _pointer(context, builder, signature.args[0], dst_v)
        src_size = context.make_array(signature.args[4])(context, builder, src_v).nitems
        dst_size = context.make_array(signature.args[0])(context, builder, dst_v).nitems
        reach = ir.Constant(i64, width - 1)
        last_row = builder.sub(loads_v, ir.Constant(i64, 1))
        rows = []
        nan = ir.Constant(ir.VectorType(ir.IntType(1), width), [0] * width)
        for r in range(width):
            row = ir.Constant(i64, r)
            row = builder.select(builder.icmp_signed("<", row, loads_v), row, last_row)
            at = builder.add(src_at_v, builder.mul(row, src_pitch_v))
            _check(context, builder, at, builder.add(at, reach), src_size)
            rows.append(_load(builder, src_base, at, vector_type))
            if isinstance(dtype, types.Float) or dtype in HALF_BITS:
                key = _key(builder, dtype, rows[-1])
                nan = builder.or_(nan, builder.fcmp_unordered("uno", key, key))
        for j, column in enumerate(_transposed(builder, rows)):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, j), stores_v)):
                at = builder.add(dst_at_v, builder.mul(ir.Constant(i64, j), dst_pitch_v))
                _check(context, builder, at, builder.add(at, reach), dst_size)
                _store(builder, dst_base, at, column)
        bits = builder.bitcast(nan, ir.IntType(width))
        return builder.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(width), 0))

    return (types.boolean(dst, types.int64, types.int64, types.int64, src, types.int64,
                          types.int64, types.int64), codegen)


# The fields of one entry of a block program (:func:`run_block_program`), an int64 row;
# a field of -1 does nothing.  RESET: 1 sets the running sum to -0.0 (so that its first
# term is copied, bit for bit), 2 to +0.0 (a padding position's zero); TERM: a term added
# from ``src``; SUFFIX: a sum of ``partial`` added to what ``TO`` stores; TO: where ``dst``
# takes the running sum (plus the suffix); KEEP: where ``partial`` takes the running sum.
RESET, TERM, SUFFIX, TO, KEEP = range(5)
PROGRAM_FIELDS = 5
# Vectors side by side in a block program's columns (each entry's loads wait on nothing but
# the running sum of their own columns).
PROGRAM_UNROLL = 8


def _program_columns(context, builder, signature, args, c, width, vectors):
    """Run the program over the ``vectors`` vectors of ``width`` lanes from column ``c``."""
    dst_v, dst_at_v, partial_v, src_v, src_at_v, program_v, first_v, entries_v = args[:8]
    i64 = ir.IntType(64)
    dtype = signature.args[0].dtype
    src_dtype = signature.args[3].dtype
    term_kind = signature.args[9].dtype
    element_type = context.get_data_type(dtype)
    vector_type = ir.VectorType(element_type, width)
    src_vector_type = ir.VectorType(context.get_data_type(src_dtype), width)
    arrays = [(signature.args[k], v) for k, v in ((0, dst_v), (2, partial_v), (3, src_v))]
    dst_base, partial_base, src_base = [_pointer(context, builder, t, v) for t, v in arrays]
    dst_size, partial_size, src_size = [context.make_array(t)(context, builder, v).nitems
                                        for t, v in arrays]
    program_base = _pointer(context, builder, signature.args[5], program_v)
    reach = ir.Constant(i64, width - 1)
    zero, minus = ir.Constant(i64, 0), ir.Constant(i64, -1)
    negative_zero = ir.Constant(vector_type, [-0.0] * width)
    positive_zero = ir.Constant(vector_type, [0.0] * width)
    steps = [builder.add(c, ir.Constant(i64, u * width)) for u in range(vectors)]
    held = [cgutils.alloca_once(builder, vector_type) for _ in steps]
    for h in held:
        builder.store(positive_zero, h)

    def vectors_at(base, size, at, loaded_type=vector_type):
        out = []
        for step in steps:
            i = builder.add(at, step)
            _check(context, builder, i, builder.add(i, reach), size)
            out.append(_load(builder, base, i, loaded_type))
        return out

    def term(v):
        """A source vector's terms in the sums' type: half bits widened, float32 to float64,
        then |x| or x^2 by the marker's type (window_sum's ABS and SQUARE)."""
        v = _key(builder, src_dtype, v)
        if v.type != vector_type:
            v = builder.fpext(v, vector_type)
        if term_kind == types.int16:
            fabs = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vector_type, [vector_type]),
                f"llvm.fabs.{_vector_name(vector_type)}")
            v = builder.call(fabs, [v])
        elif term_kind == types.int32:
            v = builder.fmul(v, v)
        return v

    def store_at(base, size, at, values):
        for step, value in zip(steps, values):
            i = builder.add(at, step)
            _check(context, builder, i, builder.add(i, reach), size)
            _store(builder, base, i, value)

    with cgutils.for_range(builder, entries_v, intp=i64) as loop:
        row = builder.add(first_v, builder.mul(loop.index, ir.Constant(i64, PROGRAM_FIELDS)))

        def field(f):
            return builder.load(builder.gep(program_base, [builder.add(row, ir.Constant(i64,
                                                                                      f))]))

        reset = field(RESET)
        with builder.if_then(builder.icmp_signed(">", reset, zero)):
            start = builder.select(builder.icmp_signed("==", reset, ir.Constant(i64, 1)),
                                   negative_zero, positive_zero)
            for h in held:
                builder.store(start, h)
        term_at = field(TERM)
        with builder.if_then(builder.icmp_signed(">", term_at, minus)):
            terms = vectors_at(src_base, src_size, builder.add(src_at_v, term_at),
                               src_vector_type)
            for h, v in zip(held, terms):
                builder.store(builder.fadd(builder.load(h), term(v)), h)
        to = field(TO)
        with builder.if_then(builder.icmp_signed(">", to, minus)):
            suffix = field(SUFFIX)
            at = builder.add(dst_at_v, to)
            with builder.if_else(builder.icmp_signed(">", suffix, minus)) as (added, alone):
                with added:
                    sums = vectors_at(partial_base, partial_size, suffix)
                    store_at(dst_base, dst_size, at,
                             [builder.fadd(builder.load(h), v) for h, v in zip(held, sums)])
                with alone:
                    store_at(dst_base, dst_size, at, [builder.load(h) for h in held])
        keep = field(KEEP)
        with builder.if_then(builder.icmp_signed(">", keep, minus)):
            store_at(partial_base, partial_size, keep, [builder.load(h) for h in held])


def _halvings(n: int) -> list[int]:
    """n, n / 2, n / 4 ... 1 (n a power of two)."""
    return [n >> i for i in range(n.bit_length())]


@intrinsic
def run_block_program(typingctx, dst, dst_at, partial, src, src_at, program, first, entries,
                      cols, mark):
    """Run ``entries`` entries of a block program (``program[first:]``, rows of
    :data:`PROGRAM_FIELDS`: see :data:`RESET`) over ``cols`` columns, column by column:
    a running sum (one per column) takes each entry in turn, its terms at ``src[src_at +
    TERM + c]``, its suffixes at ``partial[SUFFIX + c]``, its stores at ``dst[dst_at + TO +
    c]`` and ``partial[KEEP + c]``.  The sums of a leading axis by blocks
    (:mod:`poolfold.kernels.window_blocks`): the running sum of a run of positions stays in
    registers, where numba's loops, one row of columns at a time, stored it and loaded it
    back for each position.  A term is the source's value in the sums' type (half bits
    widened to float32, float32 to float64), or its |x| or x^2 where ``mark`` is int16 or
    int32 (poolfold.kernels.window_sum's markers; int8: the value).  ``dst``, ``partial`` and
    ``src`` distinct arrays, the program's offsets inside them."""
    if not (_arrays_of(dst, partial, _floats) and takes_block_terms(src, dst, mark)
            and isinstance(program, types.Array) and program.dtype == types.int64):
        return None
    dtype = dst.dtype

    def codegen(context, builder, signature, args):
        cols_v = args[8]
        i64 = ir.IntType(64)
        lanes = _lanes(dtype)
        block = ir.Constant(i64, lanes * PROGRAM_UNROLL)
        blocks = builder.sdiv(cols_v, block)
        with cgutils.for_range(builder, blocks, intp=i64) as loop:
            _program_columns(context, builder, signature, args,
                             builder.mul(loop.index, block), lanes, PROGRAM_UNROLL)
        done = cgutils.alloca_once_value(builder, builder.mul(blocks, block))
        # the vectors left, fewer than PROGRAM_UNROLL: a run of half as many, of a quarter
        # ..., each once at most (where one vector at a time ran the program over 64 columns
        # four times); then the columns left, fewer than a vector: one narrower vector of
        # half a vector's lanes, of a quarter ..., each once at most
        runs = [(lanes, v) for v in _halvings(PROGRAM_UNROLL // 2)]
        runs += [(w, 1) for w in _halvings(lanes // 2)]
        for width, vectors in runs:
            span = ir.Constant(i64, width * vectors)
            at = builder.load(done)
            with builder.if_then(builder.icmp_signed("<=", builder.add(at, span), cols_v)):
                _program_columns(context, builder, signature, args, at, width, vectors)
                builder.store(builder.add(at, span), done)
        return context.get_dummy_value()

    return (types.void(dst, types.int64, partial, src, types.int64, program, types.int64,
                       types.int64, types.int64, mark), codegen)


def takes_block_terms(src, dst, mark) -> bool:
    """Whether :func:`run_block_program` takes terms of ``src`` (numba array types) into sums
    of ``dst``'s type by ``mark``'s rule: float32 or float64 sums; terms of the same type,
    float32 into float64, or half bits into float32 or float64; the value, |x| or x^2."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)
            and isinstance(mark, types.Array) and dst.dtype in (types.float32, types.float64)):
        return False
    widens = (src.dtype == dst.dtype or src.dtype in HALF_BITS
              or (src.dtype == types.float32 and dst.dtype == types.float64))
    return widens and mark.dtype in (types.int8, types.int16, types.int32)
