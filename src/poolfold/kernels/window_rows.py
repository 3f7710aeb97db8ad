"""Sums over small and medium pooling windows, one row of outputs at a time.

For each row of outputs along the last spatial axis, the kernel first adds, into one row in
cache (of the accumulator's type, below), the input rows that the window's other axes tap
(the vertical sum: whole contiguous rows, in loops that vectorise), then sums each output's
taps along that row (the horizontal sum) and stores ``sum / divisor`` or ``sum ** (1/p)`` in
Y's type. X is read about (taps on the other axes / their strides) times, Y written once; no
plane-sized intermediate, and no pass that re-reads what another wrote.

Both layouts take the same loops: a position is ``channels`` contiguous elements (1 for
channels-first), so a channels-last row is its positions' channel runs end to end and the
horizontal sum adds runs of channels.  A work item is one output row of one outer index
(N*C for channels-first, N for channels-last), so a single large plane still splits across
threads.

Each window's sum adds its own values only, always in the same order (the outer axes' taps
in row-major order into each position, then the positions in order), so an output depends
on its window's values alone: poolfold.dask pools any slab of the tensor to the same bits.
float16 and bfloat16 are widened in registers.  Averages are summed in float32, as the
contract allows (any order of float32 additions of a window's own values stays within its
bound, |V| u max|x|, once divided by the divisor): half the bytes and twice the lanes of
float64.  A float32 sum may overflow where the average does not, so an output whose sum is
not finite is summed again in float64 from its window's taps (the IEEE answer when X holds
inf or NaN, the right one when the sum only overflowed).  LpPool's |x| and x^2 are summed
in float64, whose range holds them.

A float32 sum S becomes its average as ``fma(S, hi, S * lo)`` in float32, where hi + lo is
the float64 factor F (1 / divisor) split in two float32 (:func:`split_factor`): S F rounded
once, to within 2^-47 of S F (the product S * lo, itself ~2^-24 of S F, adds one rounding
of 2^-24 of its own), the float32 nearest S F but for ties that close.  One multiplication
and one fused multiply-add a vector of 16, where converting S to float64, multiplying and
converting back took six instructions a vector of 8 (2x2 at stride 2 over (1,256,56,56),
one thread: 201-213 us -> 148-171; where writing Y to memory holds the store up, as for 3x3
with pads 1 over (1,192,35,35), no change).
"""

from __future__ import annotations

import numpy as np

from numba import njit, types
from numba.extending import intrinsic, register_jitable

from . import helper_overload
from .half import HALF_BITS, narrow_to
from .odometer import next_in_ranges
from .simd import sum_strided, sum_vectors
from .window_sum import (AVERAGE, DILATION, KERNEL, N, OUT, STRIDE, UNCUT_HI, UNCUT_LO,
                         _helper, _kernel, _plane_size, _term, _uncounted_helper,
                         as_float32_value, widen)


def _accumulator(length, mark, x):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_accumulator)
def _accumulator_overload(length, mark, x):
    """Scratch for ``length`` sums of the terms ``mark`` selects: float32 for the values of
    a narrower type (AveragePool), float64 for float64 values and for |x| and x^2 (LpPool,
    whose powers leave float32's range)."""
    if mark.dtype == types.int8 and x.dtype != types.float64:
        return lambda length, mark, x: np.empty(length, np.float32)
    return lambda length, mark, x: np.empty(length, np.float64)


def _row_term(raw, mark, p):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_row_term)
def _row_term_overload(raw, mark, p):
    """An element's term in the accumulator's type (see :func:`_accumulator`)."""
    if mark.dtype == types.int8 and raw != types.float64:
        return lambda raw, mark, p: as_float32_value(raw)
    return lambda raw, mark, p: _term(widen(raw), mark, p)


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (LLVM's fma: one instruction where the host has FMA)."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


@register_jitable
def split_factor(factor):
    """A float64 factor as float32 hi and lo, hi + lo within 2^-48 of it (see the module
    doc); WindowTables.split_plane_factors holds the same bits, made by numpy."""
    hi = np.float32(factor)
    return hi, np.float32(factor - np.float64(hi))


def _scaled(total, factor):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_scaled, inline="always")
def _scaled_overload(total, factor):
    """An average: a sum in the accumulator's type times the float64 ``factor``: in float32
    as the module doc says for a float32 sum, else in float64."""
    if total == types.float32:
        def in_float32(total, factor):
            hi, lo = split_factor(factor)
            return _fma(total, hi, total * lo)
        return in_float32
    return lambda total, factor: total * factor


def _scaled_by_table(total, factors, i):  # pragma: no cover - replaced by the overload
    raise NotImplementedError


@helper_overload(_scaled_by_table, inline="always")
def _scaled_by_table_overload(total, factors, i):
    """:func:`_scaled` by the factor at ``i`` of a plan's table of them: (2, n) float32, the
    factors split (a float32 sum), or (1, n) float64."""
    if total == types.float32 and factors.dtype == types.float32:
        return lambda total, factors, i: _fma(total, factors[0, i], total * factors[1, i])
    return lambda total, factors, i: total * factors[0, i]


def _scaled_by_pair(total, hi, lo):  # pragma: no cover - replaced by the overload
    raise NotImplementedError


@helper_overload(_scaled_by_pair, inline="always")
def _scaled_by_pair_overload(total, hi, lo):
    """:func:`_scaled_by_table` by a table's one entry, read into ``hi`` and ``lo`` (row 0
    and the last row of a (2, 1) float32 or (1, 1) float64 table)."""
    if total == types.float32 and hi == types.float32:
        return lambda total, hi, lo: _fma(total, hi, total * lo)
    return lambda total, hi, lo: total * hi


def _add_rows(acc, to, x, row_at, rows, span, mark, p):  # pragma: no cover - see overload
    raise NotImplementedError


# Inlined into the kernel by numba: as a function of its own, LLVM left it a call per row
# (its vector code too large to inline), and the call's arguments cost more than adding two
# short rows (2x2 at stride 2 over (1,256,56,56), one thread: the kernel took 215 us, 150
# inlined).
@helper_overload(_add_rows, inline="always")
def _add_rows_overload(acc, to, x, row_at, rows, span, mark, p):
    """``acc[to + i]`` = the terms of ``x[row_at[r] + i]`` over the rows r < ``rows`` added
    in order, for i < ``span``: in explicit vectors
    (:func:`poolfold.kernels.simd.sum_vectors`) where the terms are the values themselves
    (AveragePool: float32 or float64, or float16 and bfloat16 widened to the float32
    accumulator as they are loaded), else a loop per row (LpPool's powers of each element).
    The vectors hold every row's sum in registers, where the loop loads and stores the
    accumulator once a row: bfloat16 7x7 over (4,16,256,256) took 1.28x float32's time the
    loop's way."""
    if mark.dtype == types.int8 and (x.dtype == acc.dtype or x.dtype in HALF_BITS):
        def in_vectors(acc, to, x, row_at, rows, span, mark, p):
            sum_vectors(acc, to, x, row_at, rows, span)
        return in_vectors

    def by_rows(acc, to, x, row_at, rows, span, mark, p):
        at = np.uint64(row_at[0])
        start = np.uint64(to)
        for i in range(span):
            acc[start + i] = _row_term(x[at + i], mark, p)
        for r in range(1, rows):
            at = np.uint64(row_at[r])
            for i in range(span):
                acc[start + i] += _row_term(x[at + i], mark, p)
    return by_rows


@_helper
def _window_sum64(x, row0, position, tap, taps, axes, in_strides, o, c, channels, shrink):
    """The sum of output o's window (channel c; outer axes at ``position``) times
    ``shrink``, in float64 and in the window's tap order: the fallback for a sum that is not
    finite.  ``shrink``, a power of two no larger than 1 / the window's taps, keeps a sum of
    float64 values in range (exact: values that large are far from the subnormals).
    A NaN is returned as one quiet NaN, as the block sums store it: which of two NaNs (an
    input's, or the one inf + -inf makes) an x86 sum keeps depends on its operands' order,
    which LLVM may choose differently wherever it inlines this, and the row and lane
    kernels must agree bit for bit.  ``tap`` is scratch of the rank's length."""
    last = axes.shape[1] - 1
    for a in range(last):
        tap[a] = taps[1, a, position[a]]
        if tap[a] >= taps[2, a, position[a]]:
            return 0.0
    first, lo, hi = taps[0, last, o], taps[1, last, o], taps[2, last, o]
    d = axes[DILATION, last]
    total = 0.0
    while True:
        row = row0 + c
        for a in range(last):
            row += (taps[0, a, position[a]] + tap[a] * axes[DILATION, a]) * in_strides[a]
        for j in range(lo, hi):
            total += widen(x[row + (first + j * d) * channels]) * shrink
        if not next_in_ranges(tap, position, taps[1], taps[2], last):
            return total if total == total else np.nan


@register_jitable(inline="always")
def _one_nan(value):
    """``value``, a NaN as one quiet NaN (see _window_sum64): LpPool's float64 sums of x^2
    keep an input's NaN, and which of two an x86 sum keeps depends on its operands' order."""
    return value if value == value else np.nan


@_helper
def _shrink(axes):
    """A power of two no larger than 1 / the taps of a whole window (see _window_sum64)."""
    taps = 1
    for a in range(axes.shape[1]):
        taps *= axes[KERNEL, a]
    return _shrink_for(taps)


@register_jitable
def _shrink_for(taps):
    """A power of two no larger than 1 / ``taps``."""
    shrink = 1.0
    while shrink * taps > 1.0:
        shrink *= 0.5
    return shrink


@_kernel
def window_rows(x, y, axes, taps, axis_inverse, plane_factors, channels, mode, mark, p, start,
                stop):
    """Output rows ``[start, stop)`` of ``x`` and ``y`` (flat; per outer index, ``size *
    channels`` and ``outputs * channels`` elements, Y's in its own element type): row ``i``
    is outer ``i // rows`` and output row ``i % rows`` (row-major over every axis but the
    last).  ``axis_inverse[a, o]`` is 1 / the count of the window's taps along axis a at
    output o (AVERAGE: the divisor's inverse is their product, taken per row, so that no
    plane-sized table is read beside X, except ``plane_factors``, those products over a small
    2-D output plane, or empty: see averaging.WindowTables); otherwise the store takes the
    p-th root.
    ``mark`` (:func:`window_sum.term_marker`) selects what is added of each element.

    Every loop indexes whole arrays with unsigned offsets: no slice per row (each costs
    reference counts, which for rows of a few dozen elements cost more than their sums),
    no negative-index checks, and the contiguous loops vectorise."""
    rank = axes.shape[1]
    last = rank - 1
    size = _plane_size(axes, N) * channels
    outputs = _plane_size(axes, OUT)
    out_last = axes[OUT, last]
    rows = outputs // out_last
    width = np.uint64(channels)
    row_length = np.uint64(axes[N, last] * channels)
    out_length = np.uint64(out_last * channels)
    # Channels-first output rows are taken up to block_rows at a time (consecutive along
    # the axis before the last, see _store_block), each row's vertical sum ``pitch`` after
    # the last's (block_pitch: the row's length rounded up to a multiple of the last axis's
    # stride, the slots past the row zeros, read by no output).  For short rows, the loops'
    # own costs then count once per block instead of once per row: the rows that padding
    # cuts along the axis before the last are in the blocks too (7x7 SAME over
    # (1,32,28,28), one thread: 54 us with them one at a time, 41-44 in blocks).  Where the
    # pitch is the row's length, at stride 1 along the axis before the last, the input rows
    # of a run of uncut rows are one run.
    block_rows = 1
    n_last, s_last = axes[N, last], axes[STRIDE, last]
    pitch = block_pitch(n_last, s_last, out_last) if channels == 1 and rank >= 2 else 0
    if pitch > 0:
        block_rows = BLOCK_ELEMENTS // pitch
    else:
        pitch = n_last
    block_length = np.uint64(pitch) * np.uint64(block_rows)
    acc = _accumulator(max(row_length, block_length), mark, x)
    if pitch != n_last:  # the slots past each row, never written
        for i in range(block_length):
            acc[i] = 0.0
    sums = _accumulator(max(out_length, row_length, block_length), mark, x)
    shrink = _shrink(axes)
    # where each input row the outer axes' taps reach starts (at most the taps in bounds)
    most_rows = 1
    for a in range(last):
        most_rows *= min(axes[KERNEL, a], axes[N, a])
    row_at = np.empty(most_rows, np.int64)
    position = np.zeros(rank, np.int64)  # the output row's position along the outer axes
    tap = np.zeros(rank, np.int64)  # the tap being added along the outer axes
    in_strides = np.zeros(rank, np.int64)  # elements between positions along each axis
    in_strides[last] = channels
    for a in range(last - 1, -1, -1):
        in_strides[a] = in_strides[a + 1] * axes[N, a + 1]
    # how far apart consecutive output rows' input rows lie (a block's rows, see above)
    row_step = axes[STRIDE, last - 1] * in_strides[last - 1] if rank >= 2 else 0
    first, lo, hi = taps[0, last], taps[1, last], taps[2, last]
    lo_all, hi_all = taps[1], taps[2]  # views made once: each costs reference counting
    k, d = axes[KERNEL, last], axes[DILATION, last]
    s = np.uint64(axes[STRIDE, last])
    u0, u1 = axes[UNCUT_LO, last], axes[UNCUT_HI, last]
    uncut = np.uint64(max(0, u1 - u0))
    root = 1.0 / p
    item = start
    while item < stop:
        outer = item // rows
        r = item % rows
        rem = r
        for a in range(last - 1, -1, -1):
            position[a] = rem % axes[OUT, a]
            rem //= axes[OUT, a]
        # Output rows of one block: consecutive along the axis before the last (see above).
        count = 1
        if block_rows > 1:
            count = min(block_rows, axes[OUT, last - 1] - position[last - 1], stop - item)
        # The vertical sums, row t of the block at acc[t * pitch]: a run of rows whose
        # windows are whole along the axis before the last shares its taps (each row's
        # input rows row_step after the last's), and a row cut there (padding, the axis's
        # ends) has taps of its own.  A single row (1-D plans' always) is a run of one.
        b = position[last - 1] if count > 1 else 0
        t = 0
        while t < count:
            same = 1
            if count > 1:
                position[last - 1] = b + t
                if axes[UNCUT_LO, last - 1] <= b + t < axes[UNCUT_HI, last - 1]:
                    same = min(count - t, axes[UNCUT_HI, last - 1] - (b + t))
            rows_in = _row_starts(row_at, taps, axes, position, tap, in_strides, outer * size,
                                  lo_all, hi_all)
            at = np.uint64(t) * np.uint64(pitch)
            if rows_in == 0:  # a window with no input row: the sums are zeros
                for i in range(np.uint64(pitch) * np.uint64(same) if count > 1
                               else row_length):
                    acc[at + i] = 0.0
            elif same > 1 and (row_step != n_last or pitch != n_last):  # a sum each row
                for q in range(same):  # unsigned, as the loops index (see above)
                    _add_rows(acc, at + np.uint64(q) * np.uint64(pitch), x, row_at, rows_in,
                              row_length, mark, p)
                    for i in range(rows_in):
                        row_at[i] += row_step
            else:  # one row, or rows at stride 1 that read one run of rows
                _add_rows(acc, at, x, row_at, rows_in, row_length * np.uint64(same), mark, p)
            t += same
        if count > 1:
            position[last - 1] = b
        if count > 1:
            _store_block(x, y, acc, sums, axes, taps, axis_inverse, plane_factors, position,
                         tap, in_strides, outer * size, outer * outputs + r * out_last, count,
                         pitch, mode, p, shrink)
            item += count
            continue
        # The horizontal sum: the uncut outputs tap by tap across the row (the first tap
        # assigned), then the cut ones (padding, the axis's ends) one by one, taps in order.
        if uncut > 0:
            o0 = np.uint64(u0) * width
            t0 = np.int64(first[u0] * channels)
            # Each output's taps added in a register, vectors of outputs at a time
            # (:func:`poolfold.kernels.simd.sum_strided`), for a literal stride: strided
            # single elements loaded consecutively and picked by a shuffle, where LLVM's own
            # loops read them one by one.
            if s == 1:  # consecutive outputs read consecutive runs: one stream
                sum_strided(sums, o0, acc, t0, uncut * width, 1, k, d * channels)
            elif channels == 1:
                _sum_at_stride(sums, o0, acc, t0, uncut, s, k, d)
            else:  # runs of channels, strided
                for j in range(k):
                    tap0 = np.uint64((first[u0] + j * d) * channels)
                    for u in range(uncut):
                        src = tap0 + u * s * width
                        dst = o0 + u * width
                        if j == 0:
                            for c in range(width):
                                sums[dst + c] = acc[src + c]
                        else:
                            for c in range(width):
                                sums[dst + c] += acc[src + c]
        for side in range(2):  # before the uncut run, then after it (not a test per output)
            for o in range(0 if side == 0 else max(u0, u1), u0 if side == 0 else out_last):
                dst = np.uint64(o) * width
                if hi[o] <= lo[o]:
                    for c in range(width):
                        sums[dst + c] = 0.0
                    continue
                for j in range(lo[o], hi[o]):
                    src = np.uint64((first[o] + j * d) * channels)
                    if j == lo[o]:
                        for c in range(width):
                            sums[dst + c] = acc[src + c]
                    else:
                        for c in range(width):
                            sums[dst + c] += acc[src + c]
        # The store, in Y's type.
        base = np.uint64(outer * outputs * channels + r * out_last * channels)
        if mode == AVERAGE:
            row_scale = 1.0
            for a in range(last):
                row_scale *= axis_inverse[a, position[a]]
            scale = axis_inverse[last]
            if channels == 1:
                for o in range(out_length):
                    y[base + o] = narrow_to(_scaled(sums[o], row_scale * scale[o]), y)
            else:
                for o in range(np.uint64(out_last)):
                    q = row_scale * scale[o]
                    for c in range(width):
                        y[base + o * width + c] = narrow_to(_scaled(sums[o * width + c], q),
                                                            y)
            # float32 sums that are not finite: again in float64 (see the module doc)
            finite = True
            for i in range(out_length):
                finite &= (sums[i] - sums[i]) == 0  # inf - inf and NaN - NaN are NaN
            if not finite:
                for i in range(out_length):
                    if (sums[i] - sums[i]) != 0:
                        o = np.int64(i // width)
                        total = _window_sum64(x, outer * size, position, tap, taps, axes,
                                              in_strides, o, np.int64(i % width), channels,
                                              shrink)
                        y[base + i] = narrow_to(total * (row_scale * scale[o]) / shrink, y)
        elif p == 2.0:
            for i in range(out_length):
                y[base + i] = narrow_to(_one_nan(np.sqrt(sums[i])), y)
        elif p == 1.0:  # the sum itself: a power per output costs more than the sums
            for i in range(out_length):
                y[base + i] = narrow_to(_one_nan(sums[i]), y)
        else:
            for i in range(out_length):
                y[base + i] = narrow_to(_one_nan(sums[i] ** root), y)
        item += 1


@njit(inline="always")
def _row_starts(row_at, taps, axes, position, tap, in_strides, base, lo_all, hi_all):
    """Where each input row that the outer axes' taps of the output row at ``position``
    reach starts (``base``: the outer index's first element), in row-major order of the
    taps, into ``row_at``; how many (0 where a window holds no input row).  The odometer's
    next_in_ranges written out, as a call per input row (its seven array arguments) cost as
    much as adding a short row (3x3 s2 over (8,64,112,112): 7.3 against 3.5 ms on one
    thread).  ``tap`` is scratch of the rank's length."""
    last = axes.shape[1] - 1
    for a in range(last):
        tap[a] = lo_all[a, position[a]]
        if tap[a] >= hi_all[a, position[a]]:
            return 0
    rows_in = 0
    while True:
        row = base
        for a in range(last):
            row += (taps[0, a, position[a]] + tap[a] * axes[DILATION, a]) * in_strides[a]
        row_at[rows_in] = row
        rows_in += 1
        a = last - 1
        while a >= 0:  # the next combination, the last outer axis fastest
            tap[a] += 1
            if tap[a] < hi_all[a, position[a]]:
                break
            tap[a] = lo_all[a, position[a]]
            a -= 1
        if a < 0:
            return rows_in


# Elements of input rows taken in one block of output rows (see window_rows): a few rows of
# the core's first-level cache, with the sums beside them.
BLOCK_ELEMENTS = 2048


@register_jitable
def block_pitch(n, s, out):
    """Where channels-first rows of ``n`` inputs and ``out`` outputs at stride ``s`` along
    the last axis lie in a block of rows (see window_rows), one after another: n rounded up
    to a multiple of s, where each row's outputs fit in that over s and a block holds two
    rows at least; else 0, the rows taken one at a time (a stride far beyond the row would
    otherwise make the pitch, and the scratch, as long as the stride)."""
    steps = -(-n // s)
    if out > steps or steps > BLOCK_ELEMENTS // 2 // s:
        return 0
    return steps * s


@njit(inline="always")
def _sum_at_stride(dst, to, src, at, count, s, k, d):
    """``dst[to + i]`` = the sum of ``src[at + i*s + j*d]`` over the taps j < ``k``, added
    left to right, for i < ``count``: :func:`poolfold.kernels.simd.sum_strided` at strides
    1 to 4 (each a literal), else a loop per tap (the same additions in the same order)."""
    if s == 1:
        sum_strided(dst, to, src, at, count, 1, k, d)
    elif s == 2:
        sum_strided(dst, to, src, at, count, 2, k, d)
    elif s == 3:
        sum_strided(dst, to, src, at, count, 3, k, d)
    elif s == 4:
        sum_strided(dst, to, src, at, count, 4, k, d)
    else:
        start, step = np.uint64(to), np.uint64(s)
        for j in range(k):
            tap = np.uint64(at + j * d)
            if j == 0:
                for i in range(np.uint64(count)):
                    dst[start + i] = src[tap + i * step]
            else:
                for i in range(np.uint64(count)):
                    dst[start + i] += src[tap + i * step]


@_uncounted_helper
def _store_block(x, y, acc, sums, axes, taps, axis_inverse, plane_factors, position, tap,
                 in_strides, x_at, y_at, count, n, mode, p, shrink):
    """Outputs of ``count`` consecutive rows along the axis before the last (channels-first;
    stride s along the last, with out_last <= m = n / s) from ``acc``,
    their vertical sums ``n`` apart (row t at ``t * n``; n, the pitch, a multiple of s).  An
    uncut output o of row t adds ``acc[t * n + first[o] + j * d]``, which is ``acc[first[u0] +
    (t * m + o - u0) * s + j * d]``: for every row at once, one loop per tap over the run of
    outputs, written to ``sums[t * m + o]``; the run's positions between rows hold sums
    across the rows' seam, which no output keeps.  The cut outputs (at most a window's width
    at each end) are summed into the seam's places, one output of every row at a time: each
    row's outputs then lie at ``sums[t * m:t * m + out_last]``, stored by one loop per row.
    Each output adds the same values in the same order as in a row of its own."""
    last = axes.shape[1] - 1
    out_last = axes[OUT, last]
    first, lo, hi = taps[0, last], taps[1, last], taps[2, last]
    k, d, s = axes[KERNEL, last], axes[DILATION, last], axes[STRIDE, last]
    m = n // s
    u0, u1 = axes[UNCUT_LO, last], axes[UNCUT_HI, last]
    if u1 > u0:  # the run, each output's taps added in a register (see window_rows)
        _sum_at_stride(sums, u0, acc, first[u0], (count - 1) * m + u1 - u0, s, k, d)
    # The cut outputs, each for every row of the block at once, tap by tap: the rows'
    # additions are independent, where one output's taps within a row each wait on the
    # last (3x3 stride 1 with pads 1 over (1,192,35,35): 0.75-0.8 of the time by rows).
    row_pitch, out_pitch = np.uint64(n), np.uint64(m)
    for side in range(2):  # before the uncut run, then after it
        for o in range(0 if side == 0 else max(u0, u1), u0 if side == 0 else out_last):
            to = np.uint64(o)
            if hi[o] <= lo[o]:
                for t in range(np.uint64(count)):
                    sums[t * out_pitch + to] = 0.0
                continue
            at = np.uint64(first[o] + lo[o] * d)
            for t in range(np.uint64(count)):
                sums[t * out_pitch + to] = acc[t * row_pitch + at]
            for j in range(lo[o] + 1, hi[o]):
                at = np.uint64(first[o] + j * d)
                for t in range(np.uint64(count)):
                    sums[t * out_pitch + to] += acc[t * row_pitch + at]
    b0 = position[last - 1]
    if mode == AVERAGE:
        # each row's factor as a row of its own takes it: the outer axes' in order, the
        # axis before the last's (which differs between the block's rows) last
        outer_scale = 1.0
        for a in range(last - 1):
            outer_scale *= axis_inverse[a, position[a]]
        scale = axis_inverse[last]
        # float32 sums that are not finite are summed again in float64 (see the module
        # doc): ``finite`` says whether the block has none
        finite = True
        if m == out_last and plane_factors.size > 0:
            # the rows' outputs lie end to end in sums and in Y: one loop, the factors the
            # row's loop below multiplies by read from the plan's table, the sums checked
            # as they are stored (a second loop over them took 4% of 3x3 with pads 1 over
            # (1,192,35,35), one thread)
            f0 = np.uint64(b0 * out_last)
            to = np.uint64(y_at)
            if plane_factors.shape[1] == 1:  # one factor for every output, in registers
                hi = plane_factors[0, 0]
                lo = plane_factors[plane_factors.shape[0] - 1, 0]
                for i in range(np.uint64(count * out_last)):
                    total = sums[i]
                    y[to + i] = narrow_to(_scaled_by_pair(total, hi, lo), y)
                    finite &= (total - total) == 0
            else:
                for i in range(np.uint64(count * out_last)):
                    total = sums[i]
                    y[to + i] = narrow_to(_scaled_by_table(total, plane_factors, f0 + i), y)
                    finite &= (total - total) == 0  # inf - inf and NaN - NaN are NaN
        else:
            for t in range(count):
                row_scale = outer_scale * axis_inverse[last - 1, b0 + t]
                at = np.uint64(t * m)
                to = np.uint64(y_at + t * out_last)
                for o in range(np.uint64(out_last)):
                    y[to + o] = narrow_to(_scaled(sums[at + o], row_scale * scale[o]), y)
            for i in range(np.uint64((count - 1) * m + out_last)):
                finite &= (sums[i] - sums[i]) == 0
        if not finite:
            for t in range(count):
                position[last - 1] = b0 + t
                row_scale = outer_scale * axis_inverse[last - 1, b0 + t]
                for o in range(out_last):
                    v = sums[t * m + o]
                    if (v - v) != 0:
                        # int64, not literals: window_rows's own call's compile serves
                        total = _window_sum64(x, x_at, position, tap, taps, axes, in_strides,
                                              o, np.int64(0), np.int64(1), shrink)
                        y[y_at + t * out_last + o] = narrow_to(
                            total * (row_scale * scale[o]) / shrink, y)
            position[last - 1] = b0
        return
    root = 1.0 / p
    for t in range(count):
        at = np.uint64(t * m)
        to = np.uint64(y_at + t * out_last)
        if p == 2.0:
            for o in range(np.uint64(out_last)):
                y[to + o] = narrow_to(_one_nan(np.sqrt(sums[at + o])), y)
        elif p == 1.0:
            for o in range(np.uint64(out_last)):
                y[to + o] = narrow_to(_one_nan(sums[at + o]), y)
        else:
            for o in range(np.uint64(out_last)):
                y[to + o] = narrow_to(_one_nan(sums[at + o] ** root), y)


# Channels a work item of :func:`position_sums` sums at a time: its sums (2 KiB of float32)
# stay in the core's first-level cache beside the runs of X it reads, and a batch-1 tensor
# of many channels still splits across threads.
POSITION_CHANNELS = 512


@_kernel
def position_sums(x, y, positions, channels, factor, mode, mark, p, start, stop):
    """Channels-last global pools (GlobalAveragePool, GlobalLpPool with p 1 or 2): work item
    ``i`` sums, for sample ``i // blocks`` and channels ``[c0, c0 + POSITION_CHANNELS)`` of
    its block, the ``positions`` runs of X (flat, ``positions * channels`` elements a sample)
    in order, then stores ``sum * factor`` (AVERAGE; ``factor``: 1 / positions, the float64
    table's) or the sum's p-th root, in Y (``channels`` a sample).

    The arithmetic of :func:`window_rows` over a whole-axis window, bit for bit (the terms
    added in position order, in the same accumulator, a non-finite float32 average summed
    again in float64 by the same steps), without its first step: the row kernel copies a
    row into its scratch before summing it, here a whole sample's (about 400 KiB for
    (1,7,7,2048)), which doubled what a call reads and left the sums no cache."""
    blocks = -(-channels // POSITION_CHANNELS)
    acc = _accumulator(min(channels, POSITION_CHANNELS), mark, x)
    shrink = _shrink_for(positions)  # as for the row kernel's window of every position
    root = 1.0 / p
    width = np.uint64(channels)
    for item in range(start, stop):
        n = item // blocks
        c0 = (item % blocks) * POSITION_CHANNELS
        span = np.uint64(min(POSITION_CHANNELS, channels - c0))
        base = np.uint64(n) * np.uint64(positions) * width + np.uint64(c0)
        for c in range(span):
            acc[c] = _row_term(x[base + c], mark, p)
        for q in range(1, positions):
            at = base + np.uint64(q) * width
            for c in range(span):
                acc[c] += _row_term(x[at + c], mark, p)
        out = np.uint64(n) * width + np.uint64(c0)
        if mode == AVERAGE:
            finite = True
            for c in range(span):
                total = acc[c]
                y[out + c] = narrow_to(_scaled(total, factor), y)
                finite &= (total - total) == 0  # inf - inf and NaN - NaN are NaN
            if not finite:  # again in float64 (see the module doc), as _window_sum64 adds
                for c in range(span):
                    if (acc[c] - acc[c]) != 0:
                        total = 0.0
                        for q in range(positions):
                            total += widen(x[base + np.uint64(q) * width + c]) * shrink
                        if total != total:  # one quiet NaN, as _window_sum64 returns it
                            total = np.nan
                        y[out + c] = narrow_to(total * factor / shrink, y)
        elif p == 2.0:
            for c in range(span):
                y[out + c] = narrow_to(_one_nan(np.sqrt(acc[c])), y)
        elif p == 1.0:
            for c in range(span):
                y[out + c] = narrow_to(_one_nan(acc[c]), y)
        else:
            for c in range(span):
                y[out + c] = narrow_to(_one_nan(acc[c] ** root), y)
