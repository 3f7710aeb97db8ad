"""Sums over pooling windows: the kernels of AveragePool, LpPool and the global pools,
but for small and medium windows of plain sums, which :mod:`poolfold.kernels.window_rows`
takes one row of outputs at a time, and larger windows over channels-first planes of 1 to 3
spatial axes and types of at most 4 bytes, which :mod:`poolfold.kernels.window_blocks`
takes.

A window is a box, so its sum is separable: :func:`window_sums` reduces one spatial axis at
a time, from the last to the first, each pass reading the previous one's float64 results
(the first reads X in its own type, float16 and bfloat16 widened in registers), and then
stores ``sum / divisor`` (AveragePool) or ``sum ** (1/p)`` (LpPool) in Y's type.  A work
item is one ``(outer, channel block)`` pair of the view ``(outer, D1..Dr, C)``: ``outer``
is N*C and C is 1 for NCHW, ``outer`` is N for channels-last, whose channels are the
contiguous, vectorised run of every pass.

Per axis, a pass either adds each output's taps (``direct``: short windows, or windows
that skip input) or, where windows overlap a lot, combines van Herk / Gil-Werman partial
sums (``prefix``): blocks of k taps along each dilation phase, each position holding the sum
from its block's start and to its block's end, so that a window is one block or the end of
one plus the start of the next.  About three additions per position whatever the window
(flat cost in the window size), and a window's sum adds its own values only (no running sum
over the row, whose rounding a large value elsewhere would spoil; inf and NaN stay in the
windows that hold them).  The blocks start where the row starts, so these sums round as the
row's start places them: poolfold.dask keeps such axes whole.  float64 inputs are always
added directly, with compensation (Neumaier), so that a window's result depends on its
values alone, whatever part of the tensor a call holds; the passes' results round once per
axis: see docs/semantics.md for the accuracy bound.

LpPool where ``|x| ** p`` could leave float64's range (float64 inputs, or p > 7) carries
``(m, s)`` pairs instead (:func:`scaled_window_sums`): the window's largest |x| and the sum
of ``(|x| / m) ** p``, combined axis by axis, so no power overflows or underflows.

The kernels trust their tables: :mod:`poolfold.ops.averaging` builds and bounds them.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from . import double_double, helper_overload, kernel
from .half import HALF_BITS, as_float32, narrow_to

# Rows of the per-axis table (``axes[row, axis]``).
N, OUT, KERNEL, STRIDE, DILATION, UNCUT_LO, UNCUT_HI, PREFIX = range(8)
AXIS_ROWS = 8

# What the store does with a window's sum: divide it by the output's divisor, take its p-th
# root, or store it as it is (float64 averages, divided axis by axis as they are summed).
AVERAGE, ROOT, AS_IS = 0, 1, 2
# What the first pass takes of each element.
VALUE, ABS, SQUARE, POWER = 0, 1, 2, 3


def as_float32_value(value):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(as_float32_value)
def _as_float32_value(value):
    """A float32, float16 or bfloat16 element (the last two as bits) as a float32; a
    float64 stays one (its sums never take this path, but the kernels compile it)."""
    if value in HALF_BITS:
        return lambda value: as_float32(value)
    if value == types.float64:
        return lambda value: value
    return lambda value: np.float32(value)


def widen(value):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(widen)
def _widen(value):
    if value in HALF_BITS:
        return lambda value: np.float64(as_float32(value))
    return lambda value: np.float64(value)


# Helpers and kernels divide as IEEE does (0/0 is NaN, an empty window's average), with no
# zero check per division: numpy's error model, not Python's.
_helper = njit(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True,
               error_model="numpy")
# ...and those a kernel calls once a row or a block, which allocate no array and keep none
# past their return: compiled without numba's reference counting, as
# poolfold.kernels.uncounted_helper says why.  Counted, window_rows' store of a block
# increfs and decrefs a dozen arrays a call, atomically: 3x3 with pads 1 over
# (1,192,35,35), a block a plane, one thread: 118 us, 98 uncounted.
_uncounted_helper = njit(cache=True, nogil=True, no_cpython_wrapper=True,
                         no_cfunc_wrapper=True, error_model="numpy", _nrt=False)
_kernel = kernel(error_model="numpy")


# What a window adds of each element, told to the kernels by the type of a marker array (a
# compile-time choice: as a runtime value, the branch kept the loops from vectorising).
VALUE_MARK, ABS_MARK, SQUARE_MARK, POWER_MARK = np.int8, np.int16, np.int32, np.int64
_VALUE_MARK = np.empty(0, VALUE_MARK)  # the later passes add values
_MARKS = {VALUE: VALUE_MARK, ABS: ABS_MARK, SQUARE: SQUARE_MARK, POWER: POWER_MARK}


def term_marker(transform: int) -> np.ndarray:
    """The marker array that selects ``transform`` (VALUE, ABS, SQUARE, POWER)."""
    return np.empty(0, _MARKS[transform])


def _term(v, mark, p):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_term)
def _term_overload(v, mark, p):
    """What a window adds of the element ``v`` (a float64), by the marker's type."""
    kind = mark.dtype
    if kind == types.int8:
        return lambda v, mark, p: v
    if kind == types.int16:
        return lambda v, mark, p: abs(v)
    if kind == types.int32:
        return lambda v, mark, p: v * v
    return lambda v, mark, p: abs(v) ** p


def _accumulate(dst, lo_buf, i, t):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_accumulate)
def _accumulate_overload(dst, lo_buf, i, t):
    """dst[i] += t; compensated (its rounding error added to lo_buf[i]) unless lo_buf is
    None (a compile-time choice, as for the terms)."""
    if isinstance(lo_buf, types.NoneType):
        def plain(dst, lo_buf, i, t):
            dst[i] += t
        return plain

    def compensated(dst, lo_buf, i, t):
        _two_sum_into(dst, lo_buf, i, t)
    return compensated


@_helper
def _two_sum_into(hi, lo, i, b):
    """hi[i] += b, its rounding error added to lo[i] (Knuth's TwoSum: exact, any order)."""
    a = hi[i]
    s = a + b
    bb = s - a
    lo[i] += (a - (s - bb)) + (b - bb)
    hi[i] = s


@_helper
def _add(dst, lo_buf, dst_at, src, src_at, count, step, mark, p, assign=False, scale=1.0):
    """``dst[dst_at + i] += term(src[src_at + i * step])`` for ``i < count`` (``=`` with
    ``assign``: a window's first tap).  Indexed by unsigned integers, with the contiguous
    case apart: numba then checks no index for a negative value and LLVM vectorises the
    loop (measured: 4x faster than signed indices; slices cost as much in reference counts
    when taken per call).  Compensated sums add ``term * scale``."""
    d0 = np.uint64(dst_at)
    s0 = np.uint64(src_at)
    if step == 1:
        if assign:
            for i in range(count):
                dst[d0 + np.uint64(i)] = _term(widen(src[s0 + np.uint64(i)]), mark, p)
        elif lo_buf is None:
            for i in range(count):
                _accumulate(dst, lo_buf, d0 + np.uint64(i),
                            _term(widen(src[s0 + np.uint64(i)]), mark, p))
        else:
            for i in range(count):
                _accumulate(dst, lo_buf, d0 + np.uint64(i),
                            _term(widen(src[s0 + np.uint64(i)]), mark, p) * scale)
        return
    stride = np.uint64(step)
    if assign:
        for i in range(count):
            dst[d0 + np.uint64(i)] = _term(widen(src[s0 + np.uint64(i) * stride]), mark, p)
    elif lo_buf is None:
        for i in range(count):
            _accumulate(dst, lo_buf, d0 + np.uint64(i),
                        _term(widen(src[s0 + np.uint64(i) * stride]), mark, p))
    else:
        for i in range(count):
            _accumulate(dst, lo_buf, d0 + np.uint64(i),
                        _term(widen(src[s0 + np.uint64(i) * stride]), mark, p) * scale)


@_helper
def _cut_output(dst, lo_buf, dst_at, src, base, src_inner, width, first, lo, hi, d, mark, p,
                scale):
    """Add the in-bounds taps of one output whose window the padding or an axis's end cuts;
    one element each (channels-first last axis) in a scalar loop, not a call per tap."""
    if width == 1 and lo_buf is None:
        total = 0.0
        for j in range(lo, hi):
            total += _term(widen(src[base + (first + j * d) * src_inner]), mark, p)
        dst[dst_at] = total
        return
    for j in range(lo, hi):
        _add(dst, lo_buf, dst_at, src, base + (first + j * d) * src_inner, width, 1, mark, p,
             False, scale)


@_helper
def _axis_pass(src, src_at, src_inner, dst, lo_buf, run_hi, run_lo, rows, n, width, out, first,
               lo, hi, k, s, d, uncut_lo, uncut_hi, prefix, cases, p, counts):
    """Reduce the middle axis of float64 ``src`` viewed as ``(rows, n, src_inner)`` (from flat
    ``src_at``; only the first ``width`` of each inner run are read) into ``dst`` as
    ``(rows, out, width)``, float64.  ``lo_buf`` holds the compensation terms (None: no
    compensation); ``run_hi`` / ``run_lo`` the running sums of one row (n * width).
    ``counts`` (or None): each output's sum is divided by ``counts[o]``: a float64 average
    taken axis by axis, whose partial results never exceed the largest |x| (a float64 sum
    may overflow where the average does not)."""
    # A float64 average's terms are scaled by a power of two (exact) that keeps the sum of
    # the axis's taps in range; the quotient is scaled back.
    scale = 1.0
    if counts is not None:
        while scale * k > 1.0:  # by the kernel, not by the windows a call holds: the same
            scale *= 0.5        # scale (and bits) for a slab of the tensor (poolfold.dask)
    if not (prefix and lo_buf is None):
        _direct_rows(src, src_at, src_inner, dst, lo_buf, 0, rows, n, width, out, first, lo,
                     hi, s, d, uncut_lo, uncut_hi, _VALUE_MARK, p, scale)
    else:
        for r in range(rows):
            _running_row(src, src_at, src_inner, dst, run_hi, run_lo, r, n, width, out, first,
                         lo, hi, k, d, cases)
    if counts is not None:
        for r in range(rows):
            at = r * out * width
            for o in range(out):
                for c in range(width):
                    dst[at + o * width + c] = dst[at + o * width + c] / counts[o] / scale


@_helper
def _stage_terms(stage, x, at, positions, width, channels, mark, p):
    """``stage[q * width + c] = term(x[at + q * channels + c])``, as float64."""
    if width == 1 and channels == 1:
        xs = x[at:at + positions]
        st = stage[:positions]
        for q in range(positions):
            st[q] = _term(widen(xs[q]), mark, p)
        return
    for q in range(positions):
        xs = x[at + q * channels:at + q * channels + width]
        st = stage[q * width:(q + 1) * width]
        for c in range(width):
            st[c] = _term(widen(xs[c]), mark, p)


# How a running-sums pass gets an output's sum (``cases``, per output, from
# poolfold.ops.averaging.window_tables): no tap; the end of one block plus the start of the
# next; from a block's start; to a block's end; its taps added (a cut window inside a block).
RUN_EMPTY, RUN_ACROSS, RUN_PREFIX, RUN_SUFFIX, RUN_ADD = range(5)


@_helper
def _running_row(src, src_at, src_inner, dst, run_hi, run_lo, r, n, width, out, first, lo, hi,
                 k, d, cases):
    """Row r's outputs from van Herk / Gil-Werman partial sums: along each dilation phase,
    the positions are cut into blocks of k taps; ``run_hi`` holds each position's sum from
    its block's start (prefix), ``run_lo`` to its block's end (suffix).  A window of k taps
    is one whole block (a prefix) or the end of one block and the start of the next (a
    suffix plus a prefix): a sum of the window's own values only, whatever the rest of the
    row holds, at about three additions per position whatever k.  Cut windows (fewer taps)
    inside one block add their taps.  inf and NaN stay in the windows that hold them."""
    base = src_at + r * n * src_inner
    at = r * out * width
    for phase in range(min(d, n)):
        m = (n - phase + d - 1) // d  # positions of this phase
        for b0 in range(0, m, k):
            b1 = min(b0 + k, m)
            if width == 1:  # one element per position: the sums carried in registers,
                # on slices of the block (indices from 0: no negative-index checks)
                q0 = phase + b0 * d
                q1 = phase + (b1 - 1) * d + 1
                xs = src[base + q0 * src_inner:base + q1 * src_inner:d * src_inner]
                ph = run_hi[q0:q1:d]
                sf = run_lo[q0:q1:d]
                total = 0.0
                for i in range(b1 - b0):
                    total += xs[i]
                    ph[i] = total
                total = 0.0
                for i in range(b1 - b0 - 1, -1, -1):
                    total += xs[i]
                    sf[i] = total
                continue
            for t in range(b0, b1):
                q = phase + t * d
                q_at = q * width
                row = base + q * src_inner
                if t == b0:
                    for c in range(width):
                        run_hi[q_at + c] = src[row + c]
                else:
                    b_at = q_at - d * width
                    for c in range(width):
                        run_hi[q_at + c] = run_hi[b_at + c] + src[row + c]
            for t in range(b1 - 1, b0 - 1, -1):
                q = phase + t * d
                q_at = q * width
                row = base + q * src_inner
                if t == b1 - 1:
                    for c in range(width):
                        run_lo[q_at + c] = src[row + c]
                else:
                    a_at = q_at + d * width
                    for c in range(width):
                        run_lo[q_at + c] = run_lo[a_at + c] + src[row + c]
    if width == 1:  # on slices, indices from 0
        row_out = dst[at:at + out]
        cs, fs, ls, hs = cases[:out], first[:out], lo[:out], hi[:out]
        for o in range(out):
            case = cs[o]
            q0 = fs[o] + ls[o] * d
            q1 = fs[o] + (hs[o] - 1) * d
            if case == RUN_ACROSS:
                row_out[o] = run_lo[q0] + run_hi[q1]
            elif case == RUN_PREFIX:
                row_out[o] = run_hi[q1]
            elif case == RUN_SUFFIX:
                row_out[o] = run_lo[q0]
            elif case == RUN_EMPTY:
                row_out[o] = 0.0
            else:
                total = 0.0
                for j in range(ls[o], hs[o]):
                    total += src[base + (fs[o] + j * d) * src_inner]
                row_out[o] = total
        return
    for o in range(out):
        o_at = at + o * width
        case = cases[o]
        q0 = first[o] + lo[o] * d
        q1 = first[o] + (hi[o] - 1) * d
        if case == RUN_ACROSS:
            for c in range(width):
                dst[o_at + c] = run_lo[q0 * width + c] + run_hi[q1 * width + c]
        elif case == RUN_PREFIX:
            for c in range(width):
                dst[o_at + c] = run_hi[q1 * width + c]
        elif case == RUN_SUFFIX:
            for c in range(width):
                dst[o_at + c] = run_lo[q0 * width + c]
        elif case == RUN_EMPTY:
            for c in range(width):
                dst[o_at + c] = 0.0
        else:
            for c in range(width):
                total = 0.0
                for j in range(lo[o], hi[o]):
                    total += src[base + (first[o] + j * d) * src_inner + c]
                dst[o_at + c] = total


@_helper
def _direct_rows(src, src_at, src_inner, dst, lo_buf, r0, r1, n, width, out, first, lo, hi, s,
                 d, uncut_lo, uncut_hi, mark, p, scale):
    """Rows [r0, r1) of a pass, each output adding its taps: the uncut outputs tap by tap
    across outputs (a strided row when one element each), the first tap assigned; then the
    cut outputs one by one."""
    span = out * width
    plain_rows = width == 1 and lo_buf is None  # every output assigned, nothing to clear
    if not plain_rows:
        for i in range(np.uint64(r0 * span), np.uint64(r1 * span)):
            dst[i] = 0.0
        if lo_buf is not None:
            for i in range(np.uint64(r0 * span), np.uint64(r1 * span)):
                lo_buf[i] = 0.0
    if uncut_hi > uncut_lo:
        k = hi[uncut_lo]
        if plain_rows and s == 1 and out == n and src_inner == 1:
            # Rows as long as their outputs, read at stride 1: output i of the whole run
            # of rows reads input i + offset, so each tap is one long loop over every row.
            # The cut outputs between two rows' uncut ones get taps across the rows' seam
            # here, and are assigned afresh below.
            start = r0 * out + uncut_lo
            count = (r1 - 1) * out + uncut_hi - start
            offset = first[uncut_lo] - uncut_lo
            for j in range(k):
                _add(dst, lo_buf, start, src, src_at + start + offset + j * d, count, 1, mark,
                     p, j == 0 and plain_rows)
        else:
            for r in range(r0, r1):
                base = src_at + r * n * src_inner
                at = r * span
                for j in range(k):
                    tap = base + (first[uncut_lo] + j * d) * src_inner
                    if width == 1:
                        _add(dst, lo_buf, at + uncut_lo, src, tap, uncut_hi - uncut_lo,
                             s * src_inner, mark, p, j == 0 and plain_rows, scale)
                    elif s == 1 and src_inner == width:
                        # consecutive outputs read consecutive runs: one loop for them all
                        _add(dst, lo_buf, at + uncut_lo * width, src, tap,
                             (uncut_hi - uncut_lo) * width, 1, mark, p, False, scale)
                    else:
                        for u in range(uncut_hi - uncut_lo):
                            _add(dst, lo_buf, at + (uncut_lo + u) * width, src,
                                 tap + u * s * src_inner, width, 1, mark, p, False, scale)
    for r in range(r0, r1):
        base = src_at + r * n * src_inner
        at = r * span
        for o in range(0, uncut_lo):
            _cut_output(dst, lo_buf, at + o * width, src, base, src_inner, width, first[o],
                        lo[o], hi[o], d, mark, p, scale)
        for o in range(max(uncut_hi, uncut_lo), out):
            _cut_output(dst, lo_buf, at + o * width, src, base, src_inner, width, first[o],
                        lo[o], hi[o], d, mark, p, scale)
    if lo_buf is not None:
        for i in range(r0 * span, r1 * span):
            if np.isfinite(dst[i]):  # an inf's rounding error is NaN: not added
                dst[i] += lo_buf[i]


@_helper
def _store(target, sums, divisor, planes, outputs, width, channels, c0, mode, p):
    """Y's elements of one work item: ``sums`` as ``(planes, outputs, width)`` divided by
    the output position's divisor (AVERAGE), to the power 1/p (ROOT) or as they are (AS_IS),
    rounded to Y's type.  ``divisor`` holds the divisors' inverses (a multiplication costs
    far less than a division; the result is within an ulp of float64 of the quotient, well
    inside the bound; an empty window's inverse is inf: 0 * inf is its NaN)."""
    if channels == 1:  # channels-first: planes of outputs in a row, in loops that vectorise
        root = 1.0 / p
        for plane in range(planes):
            t = target[plane * outputs:(plane + 1) * outputs]
            v = sums[plane * outputs:(plane + 1) * outputs]
            if mode == AVERAGE:
                q = divisor[:outputs]
                for o in range(outputs):
                    t[o] = narrow_to(v[o] * q[o], t)
            elif mode == AS_IS:
                for o in range(outputs):
                    t[o] = narrow_to(v[o], t)
            elif p == 2.0:
                for o in range(outputs):
                    t[o] = narrow_to(np.sqrt(v[o]), t)
            elif p == 1.0:  # the sum itself: a power per output costs more than the sums
                for o in range(outputs):
                    t[o] = narrow_to(v[o], t)
            else:
                for o in range(outputs):
                    t[o] = narrow_to(v[o] ** root, t)
        return
    root = 1.0 / p
    for o in range(outputs):
        t = target[o * channels + c0:o * channels + c0 + width]
        v = sums[o * width:(o + 1) * width]
        if mode == AVERAGE:
            q = divisor[o]
            for c in range(width):
                t[c] = narrow_to(v[c] * q, t)
        elif mode == AS_IS:
            for c in range(width):
                t[c] = narrow_to(v[c], t)
        elif p == 2.0:
            for c in range(width):
                t[c] = narrow_to(np.sqrt(v[c]), t)
        elif p == 1.0:
            for c in range(width):
                t[c] = narrow_to(v[c], t)
        else:
            for c in range(width):
                t[c] = narrow_to(v[c] ** root, t)


@_kernel
def window_sums(x, y, axes, taps, divisor, axis_counts, channels, block, group, mode, mark, p,
                compensated, start, stop):
    """Pool work items ``[start, stop)`` of ``x`` and ``y`` (flat; per outer, ``size *
    channels`` and ``outputs * channels`` elements, Y's in its own element type).

    Channels-last (``channels`` > 1), item i is outer ``i // blocks`` and channels
    ``[c0, c0 + block)``, ``c0 = (i % blocks) * block``; channels-first, item i is the
    ``group`` outers from ``i * group``, pooled as one (their planes are rows of the first
    pass: small planes cost one item's overhead for many).  ``divisor[o]`` (an inverse)
    scales the sum of output position o (AVERAGE); ROOT stores ``sum ** (1 / p)``; AS_IS the sum, each
    pass having divided by ``axis_counts[axis, o]``.  ``mark`` (:func:`term_marker`) selects
    what is added of each element; ``compensated`` is an array to compensate the sums
    (float64), None not to."""
    rank = axes.shape[1]
    blocks = (channels + block - 1) // block
    outers = x.size // max(1, _plane_size(axes, N) * channels)
    size = _plane_size(axes, N) * channels
    outputs = _plane_size(axes, OUT)
    # scratch: the largest intermediate result of one item, twice (ping-pong), its
    # compensation terms, and one row's running sums
    largest = 1
    run = 1
    shape_rows = _plane_size(axes, N) * group
    inner = block
    for a in range(rank - 1, -1, -1):
        rows = shape_rows // axes[N, a]
        largest = max(largest, rows * axes[OUT, a] * inner)
        if axes[PREFIX, a]:
            run = max(run, axes[N, a] * inner)
        shape_rows = rows
        inner *= axes[OUT, a]
    ping = np.empty(largest, np.float64)
    pong = np.empty(largest, np.float64)
    # The first pass reads X's terms from a float64 copy of the item (in cache): every pass
    # then reads float64, and the passes compile once per kernel, not once per source type
    # (each costs seconds of a first call).
    stage = np.empty(_plane_size(axes, N) * group * block, np.float64)
    lo_buf = None if compensated is None else np.empty(largest, np.float64)
    run_hi = np.empty(run, np.float64)
    run_lo = np.empty(run, np.float64)
    for item in range(start, stop):
        if channels == 1:
            outer = item * group
            g = min(group, outers - outer)
            c0 = 0
            width = 1
        else:
            outer = item // blocks
            g = 1
            c0 = (item % blocks) * block
            width = min(block, channels - c0)
        # the last axis first: rows = the axes before it, inner = the outputs after it
        rows = g
        for a in range(rank - 1):
            rows *= axes[N, a]
        inner_out = 1
        in_ping = True
        for a in range(rank - 1, -1, -1):
            n_a = axes[N, a]
            out_a = axes[OUT, a]
            w = inner_out * width
            dst = ping if in_ping else pong
            if a == rank - 1:
                # x's positions are C apart: width of each C-long run, from c0
                _stage_terms(stage, x, outer * size + c0, rows * n_a, width, channels, mark, p)
                source = stage
            else:
                source = pong if in_ping else ping
            _axis_pass(source, 0, w, dst, lo_buf, run_hi, run_lo, rows, n_a, w, out_a,
                       taps[0, a], taps[1, a], taps[2, a], axes[KERNEL, a], axes[STRIDE, a],
                       axes[DILATION, a], axes[UNCUT_LO, a], axes[UNCUT_HI, a], axes[PREFIX, a],
                       taps[3, a], p,
                       None if axis_counts is None else axis_counts[a])
            inner_out *= out_a
            if a > 0:
                rows //= axes[N, a - 1]
                in_ping = not in_ping
        _store(y[outer * outputs * channels:], ping if in_ping else pong, divisor, g, outputs,
               width, channels, c0, mode, p)


@_helper
def _plane_size(axes, row):
    size = 1
    for a in range(axes.shape[1]):
        size *= axes[row, a]
    return size


@_helper
def _scaled_axis_pass(src_m, src_s, src_s_lo, src_at, src_inner, first_pass, dst_m, dst_s,
                      dst_s_lo, rows, n, width, out, first, lo, hi, d, p, whole):
    """One axis of :func:`scaled_window_sums`, always tap by tap: per output, m = the
    largest m over the taps, s = the sum of s * (m_tap / m) ** p.  ``first_pass``: the
    sources are X's elements (m = |x|, s = 1 or 0 for a zero).  With ``dst_s_lo`` (not
    None), s is a double-double, its low parts in ``src_s_lo`` and ``dst_s_lo``, and so is
    each term (:mod:`.double_double`)."""
    for r in range(rows):
        base = src_at + r * n * src_inner
        at = r * out * width
        for o in range(out):
            o_at = at + o * width
            for c in range(width):
                largest = 0.0
                nan = False
                for j in range(lo[o], hi[o]):
                    i = base + (first[o] + j * d) * src_inner + c
                    m = abs(widen(src_m[i]))
                    if m != m:
                        nan = True
                    elif m > largest:
                        largest = m
                if nan:
                    dst_m[o_at + c] = np.nan
                    dst_s[o_at + c] = np.nan
                    continue
                if dst_s_lo is not None:
                    dst_m[o_at + c] = largest
                    dst_s[o_at + c], dst_s_lo[o_at + c] = _precise_scaled_sum(
                        src_m, src_s, src_s_lo, base, src_inner, first_pass, c, first[o],
                        lo[o], hi[o], d, p, largest)
                    continue
                total = 0.0
                if largest > 0.0:
                    for j in range(lo[o], hi[o]):
                        i = base + (first[o] + j * d) * src_inner + c
                        m = abs(widen(src_m[i]))
                        if m == 0.0:
                            continue
                        weight = 1.0 if first_pass else src_s[i]
                        if largest == np.inf:
                            total += weight if m == np.inf else 0.0
                        elif whole:
                            ratio = m / largest
                            term = 1.0
                            for _ in range(int(p)):
                                term *= ratio
                            total += weight * term
                        else:
                            total += weight * (m / largest) ** p
                dst_m[o_at + c] = largest
                dst_s[o_at + c] = total


@_helper
def _precise_scaled_sum(src_m, src_s, src_s_lo, base, src_inner, first_pass, c, first, lo, hi,
                        d, p, largest):
    """:func:`_scaled_axis_pass`'s s of one output in double-doubles: the sum of s_tap *
    (m_tap / m) ** p over its taps (an inf m: of the infinite taps' s), for ``largest`` m."""
    total_hi, total_lo = 0.0, 0.0
    if largest == 0.0:
        return total_hi, total_lo
    m_log_hi, m_log_lo = (0.0, 0.0) if largest == np.inf else double_double.log(largest, 0.0)
    for j in range(lo, hi):
        i = base + (first + j * d) * src_inner + c
        m = abs(widen(src_m[i]))
        if m == 0.0 or (largest == np.inf and m != np.inf):
            continue
        w_hi, w_lo = (1.0, 0.0) if first_pass else (src_s[i], src_s_lo[i])
        if largest != np.inf:
            t_hi, t_lo = double_double.ratio_power(m, m_log_hi, m_log_lo, p)
            w_hi, w_lo = double_double.multiply(w_hi, w_lo, t_hi, t_lo)
        total_hi, total_lo = double_double.add(total_hi, total_lo, w_hi, w_lo)
    return total_hi, total_lo


@_helper
def _low_parts(precise, size):
    """Room for ``size`` sums' low parts where they are double-doubles (``precise``), else
    None (a compile-time choice)."""
    if precise is None:
        return None
    return np.empty(size, np.float64)


@_helper
def _root_of_scaled(m, s, s_lo, at, p):
    """Y = m * s ** (1 / p) of a window's (m, s), s a double-double with its low part at
    ``s_lo[at]`` (``s_lo`` not None); NaN, 0 and inf for m NaN, 0 and inf."""
    if m != m:
        return np.nan
    if m == 0.0 or m == np.inf:
        return m
    if s_lo is not None:
        return double_double.root_times(m, s, s_lo[at], p)
    return m * s ** (1.0 / p)


@_kernel
def scaled_window_sums(x, y, axes, taps, channels, block, p, precise, start, stop):
    """LpPool without overflow or underflow at any p and type: per window, the largest |x|,
    m, and the sum s of (|x| / m) ** p, then Y = m * s ** (1 / p).  ``precise`` (an array,
    not None): s and the root in double-doubles (float64 at p < 1, whose root magnifies the
    sum's rounding 1/p times: :mod:`.double_double`).  Work items as :func:`window_sums`."""
    rank = axes.shape[1]
    blocks = (channels + block - 1) // block
    whole = p == np.floor(p) and p <= 64
    largest = 1
    shape_rows = 1
    for a in range(rank):
        shape_rows *= axes[N, a]
    inner = block
    for a in range(rank - 1, -1, -1):
        rows = shape_rows // axes[N, a]
        largest = max(largest, rows * axes[OUT, a] * inner)
        shape_rows = rows
        inner *= axes[OUT, a]
    m_ping = np.empty(largest, np.float64)
    s_ping = np.empty(largest, np.float64)
    m_pong = np.empty(largest, np.float64)
    s_pong = np.empty(largest, np.float64)
    lo_ping = _low_parts(precise, largest)  # the sums' low parts (double-doubles), or None
    lo_pong = _low_parts(precise, largest)
    outputs = 1
    for a in range(rank):
        outputs *= axes[OUT, a]
    for item in range(start, stop):
        outer = item // blocks
        c0 = (item % blocks) * block
        width = min(block, channels - c0)
        rows = 1
        for a in range(rank - 1):
            rows *= axes[N, a]
        inner_out = 1
        in_ping = True
        for a in range(rank - 1, -1, -1):
            w = inner_out * width
            dst_m, dst_s = (m_ping, s_ping) if in_ping else (m_pong, s_pong)
            dst_lo = lo_ping if in_ping else lo_pong
            src_lo = lo_pong if in_ping else lo_ping  # (not read by the first pass)
            if a == rank - 1:
                row = x[outer]
                _scaled_axis_pass(row, row, src_lo, c0, channels, True, dst_m, dst_s, dst_lo,
                                  rows, axes[N, a], width, axes[OUT, a], taps[0, a],
                                  taps[1, a], taps[2, a], axes[DILATION, a], p, whole)
            else:
                src_m, src_s = (m_pong, s_pong) if in_ping else (m_ping, s_ping)
                _scaled_axis_pass(src_m, src_s, src_lo, 0, w, False, dst_m, dst_s, dst_lo,
                                  rows, axes[N, a], w, axes[OUT, a], taps[0, a], taps[1, a],
                                  taps[2, a], axes[DILATION, a], p, whole)
            inner_out *= axes[OUT, a]
            if a > 0:
                rows //= axes[N, a - 1]
                in_ping = not in_ping
        m_final, s_final = (m_ping, s_ping) if in_ping else (m_pong, s_pong)
        lo_final = lo_ping if in_ping else lo_pong
        target = y[outer]
        for o in range(outputs):
            for c in range(width):
                at = o * width + c
                value = _root_of_scaled(m_final[at], s_final[at], lo_final, at, p)
                target[o * channels + c0 + c] = narrow_to(value, target)


# The sums of whole planes may be added in any order (the contract allows it): with only
# reassociation allowed, LLVM vectorises them, NaN and inf still as IEEE says.
_reassociating = njit(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True,
                      error_model="numpy", fastmath={"reassoc"})


@_reassociating
def _plane_total(x, i, size, transform, p):
    """The sum of plane i's terms (x indexed in place: a view of the row would cost its
    reference counts, as much as summing a small plane)."""
    total = 0.0
    if transform == VALUE:
        # in float32, twice the lanes of float64 (the contract's accumulator): a sum that
        # is not finite is added again in float64 (it overflowed, or X holds inf or NaN)
        narrow = np.float32(0.0)
        for q in range(size):
            narrow += as_float32_value(x[i, q])
        if np.isfinite(narrow):
            return np.float64(narrow)
        for q in range(size):
            total += widen(x[i, q])
    elif transform == SQUARE:
        for q in range(size):
            v = widen(x[i, q])
            total += v * v
    elif transform == ABS:
        for q in range(size):
            total += abs(widen(x[i, q]))
    else:
        for q in range(size):
            total += abs(widen(x[i, q])) ** p
    return total


@_helper
def _compensated_plane_total(x, i, size, scale, mark, p):
    """Neumaier's sum of a float64 plane's terms times ``scale``, in order (an average's terms
    divided first: its sum never exceeds the largest |x|, where the plain sum may overflow)."""
    total = 0.0
    correction = 0.0
    for q in range(size):
        t = _term(widen(x[i, q]), mark, p) * scale
        s = total + t
        if abs(total) >= abs(t):
            correction += (total - s) + t
        else:
            correction += (t - s) + total
        total = s
    return total + correction if np.isfinite(total) else total


@_kernel
def plane_sums(x, y, size, mode, transform, mark, p, compensated, start, stop):
    """The global pools' sums over whole planes (channels-first): ``y[i]`` from the ``size``
    elements ``x[i]`` (float64 sums; compensated for float64).  mode AVERAGE divides by
    ``size``, ROOT takes the p-th root."""
    for i in range(start, stop):
        if compensated:
            scale = 1.0 / size if mode == AVERAGE else 1.0
            value = _compensated_plane_total(x, i, size, scale, mark, p)
            if mode == ROOT:
                value = np.sqrt(value) if p == 2.0 else value ** (1.0 / p)
            y[i] = narrow_to(value, y)
            continue
        total = _plane_total(x, i, size, transform, p)
        if mode == AVERAGE:
            value = total / size
        elif p == 2.0:
            value = np.sqrt(total)
        elif p == 1.0:
            value = total
        else:
            value = total ** (1.0 / p)
        y[i] = narrow_to(value, y)


@kernel(error_model="numpy", fastmath={"reassoc"})
def plane_means(x, y, size, start, stop):
    """GlobalAveragePool over channels-first planes of a type of at most 4 bytes: ``y[i]``
    the mean of the ``size`` elements ``x[i]``, summed in float32 (twice float64's lanes; the
    contract's accumulator), in any order (``reassoc``: the loop vectorises).  A plane whose
    float32 sum is not finite (it overflowed, or the plane holds inf or NaN) is added again
    in float64 once every plane is done: a branch to that sum inside the plane loop, or a
    call per plane, made 49-element planes 2.2x slower."""
    redo = np.empty(stop - start, np.int64)
    redoing = 0
    for i in range(start, stop):
        narrow = np.float32(0.0)
        for q in range(size):
            narrow += as_float32_value(x[i, q])
        y[i] = narrow_to(np.float64(narrow) / size, y)
        redo[redoing] = i
        redoing += not np.isfinite(narrow)
    for r in range(redoing):
        i = redo[r]
        total = 0.0
        for q in range(size):
            total += widen(x[i, q])
        y[i] = narrow_to(total / size, y)


@_kernel
def scaled_plane_sums(x, y, size, p, precise, start, stop):
    """GlobalLpPool without overflow or underflow: per plane, m = the largest |x|, then
    Y = m * (sum of (|x| / m) ** p) ** (1 / p); NaN propagates, a zero-size plane gives 0.
    ``precise``: as :func:`scaled_window_sums` takes it."""
    whole = p == np.floor(p) and p <= 64
    for i in range(start, stop):
        row = x[i]
        largest = 0.0
        nan = False
        for q in range(size):
            m = abs(widen(row[q]))
            if m != m:
                nan = True
            elif m > largest:
                largest = m
        if nan:
            y[i] = narrow_to(np.nan, y)
            continue
        if largest == 0.0 or largest == np.inf:
            y[i] = narrow_to(largest, y)
            continue
        if precise is not None:
            total_hi, total_lo = 0.0, 0.0
            m_log_hi, m_log_lo = double_double.log(largest, 0.0)
            for q in range(size):
                v = abs(widen(row[q]))
                if v > 0.0:  # a zero's term is 0
                    t_hi, t_lo = double_double.ratio_power(v, m_log_hi, m_log_lo, p)
                    total_hi, total_lo = double_double.add(total_hi, total_lo, t_hi, t_lo)
            y[i] = narrow_to(double_double.root_times(largest, total_hi, total_lo, p), y)
            continue
        total = 0.0
        for q in range(size):
            ratio = abs(widen(row[q])) / largest
            if whole:
                term = 1.0
                for _ in range(int(p)):
                    term *= ratio
            else:
                term = ratio ** p
            total += term
        y[i] = narrow_to(largest * total ** (1.0 / p), y)


@_kernel
def global_max(x, keys, y_keys, size, channels, order, start, stop):
    """GlobalMaxPool over ``x`` as ``(outer, size, channels)``: ``y[outer, c]`` is the
    element of the largest value (its bits kept; the first of equal ones), or the first NaN
    if any, written through ``y_keys``, Y's bits as signed integers as ``keys`` is X's.  Work
    items are outers.

    IEEE floats sort as their bits read as sign-magnitude integers: flipping every bit but
    the sign of the negative ones (``order``: that mask, then the keys of +inf and -inf)
    turns a signed view of the bits into keys that sort as the values, NaNs beyond the
    infinities, and turns a key back into the bits.  A plane's largest and smallest key come
    from one integer loop that vectorises (a float maximum with NaN in play does not), and
    the largest key is the answer's bits: equal values have equal bits but for the zeros and
    the NaNs.  Planes whose answer is a NaN, or +0 (which ties with -0), are found again in
    order once every plane is done (:func:`_first_winner`): a branch to that search inside
    the plane loop made 49-element planes 2.5x slower.

    The keys stay in the bits' own width, and the flip is a select on the sign rather than
    an arithmetic shift by a width numba only knows at run time: numba widens integer
    arithmetic to 64 bits, and a variable shift kept it there.  Float32 planes took
    0.43-0.53 of the time of 64-bit keys."""
    own = keys.dtype.type
    mask, top, bottom = own(order[0]), own(order[1]), own(order[2])
    if channels == 1:
        fixes = np.empty(stop - start, np.int64)  # planes searched again
        fixing = 0
        for i in range(start, stop):
            high = own(bottom - 1)
            low = own(top + 1)
            for q in range(size):
                k = keys[i, q]
                key = own(_flip(k, mask))
                high = max(high, key)
                low = min(low, key)
            y_keys[i, 0] = own(_flip(high, mask))
            fixes[fixing] = i
            fixing += (high > top) | (low < bottom) | (high == 0)
        for f in range(fixing):
            # int64, not literals: the channels-last call's compile serves
            y_keys[fixes[f], 0] = _first_winner(x, keys, fixes[f], np.int64(0), size,
                                                np.int64(1), mask)
        return
    # channels-last: the same keys per channel, each position's run of channels one
    # vectorised loop
    high = np.empty(channels, keys.dtype)
    low = np.empty(channels, keys.dtype)
    for i in range(start, stop):
        for c in range(channels):
            high[c] = bottom - 1
            low[c] = top + 1
        for q in range(size):
            at = q * channels
            for c in range(channels):
                k = keys[i, at + c]
                key = own(_flip(k, mask))
                high[c] = max(high[c], key)
                low[c] = min(low[c], key)
        for c in range(channels):
            h = high[c]
            if h > top or low[c] < bottom or h == 0:
                y_keys[i, c] = _first_winner(x, keys, i, c, size, channels, mask)
            else:
                y_keys[i, c] = own(_flip(h, mask))


@njit(inline="always")
def _flip(k, mask):
    """A float's bits read as a signed integer to its sort key, or a key back to the bits
    (the same flip both ways): every bit but the sign flipped where the sign is set, by a
    select (see global_max); in 64 bits, cast back to k's type by the caller."""
    return k ^ mask if k < 0 else k


@_helper
def _first_winner(x, keys, i, c, size, channels, mask):
    """The bits (as a signed integer) of the first NaN of channel c (of ``channels``, 1
    for a channels-first plane) of outer i, or where it has none (its largest value is then
    +0), of its first zero, +0 (key 0) or -0 (key -1)."""
    for q in range(size):
        v = widen(x[i, q * channels + c])
        if v != v:
            return keys[i, q * channels + c]
    first = size  # a minimum reduction over the whole plane: it vectorises, a loop that
    for q in range(size):  # stops at the first hit does not
        k = keys[i, q * channels + c]
        key = _flip(k, mask)
        first = min(first, q if key == 0 or key == -1 else size)
    return keys[i, first * channels + c]
