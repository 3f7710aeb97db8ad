"""Window maximum by whole rows: the leading axes first, the last axis last.

For channels-first planes of any rank, without Indices.  An output row (every output along
the last axis, for one position of the leading axes) is found in two steps:

1. the input rows its window reaches along the leading axes (for a 2-D 3x3 window, three
   rows of the plane) are folded, tap by tap, into one row of the input's width: contiguous
   streams, vectorised (:func:`poolfold.kernels.folds.fold`), read from the input where they
   lie.  A window of one leading row is read in place.
2. that row is reduced along the last axis, tap by tap over every output of the row: tap t
   of output i is element ``i*s + t*d``, a stream at the stride.  LLVM vectorises such loops
   (deinterleaving loads) when it knows the stride, so strides 1 to 4 each get a loop of
   their own; other strides share one.

Reducing the last axis last means the strided pass, the dear one, runs over the output rows
only, not over every input row: at stride s along the leading axes it has s times fewer
rows to reduce than when the last axis goes first (:mod:`poolfold.kernels.max_passes`).
Tap by tap over a row beats folding each output's taps in a register by 1.5-4x (measured,
float32, 5 taps at stride 3: 0.93 against 2.7 ns per output): a register's running maximum
waits on each comparison.

Folding the leading taps first visits a window's taps column by column, not in window order.
Where equal values differ in their bits this picks another tap than the first: +0.0 where a
-0.0 came first, or another NaN than the first.  So an output that is a zero or a NaN (never
an integer one) is found again in window order (:func:`_in_window_order`): the first tap
that equals it, which for the common all-zero window is the window's first.

Windows the padding cuts along the last axis (a few at each end of a row) are folded one at
a time over their in-bounds taps; a window with no tap inside the input gives
``empty_value``.  The kernel never validates: the op layer has checked every shape and
table (:func:`poolfold.ops.max_pool.rows_tables`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from . import helper
from .folds import beats, fold
from .half import HALF_BITS
from .odometer import next_in_ranges, next_in_shape
from .ordering import order_key

# Rows of the per-axis table ``axes``.
IN, OUT, KERNEL, STRIDE, DILATION, UNCUT_LO, UNCUT_HI = range(7)
AXIS_ROWS = 7
# Entries of ``setup``.
ROWS_PER_ITEM, ITEMS_PER_PLANE, MOST_ROWS = range(3)
SETUP_SIZE = 3


@njit(inline="always")
def _stride_loop(dst, to, src, e, count, s, k, d):
    """``dst[to + i]`` = the first maximum of ``src[e + i*s + t*d]`` over taps t < k, for i
    below ``count``: the first three taps in one sweep, then two a sweep (the store always
    mixes a tap in: see :mod:`poolfold.kernels.folds` on conditional stores).  Inlined, so
    that a literal ``s`` reaches LLVM as a constant."""
    u = np.uint64
    b = min(1, k - 1) * d
    c = min(2, k - 1) * d
    for i in range(count):
        at = e + i * s
        h = src[u(at)]
        v = src[u(at + b)]
        h = v if beats(v, h) else h
        v = src[u(at + c)]
        dst[u(to + i)] = v if beats(v, h) else h
    for t in range(3, k, 2):
        a_t = e + t * d
        b_t = e + min(t + 1, k - 1) * d
        for i in range(count):
            h = dst[u(to + i)]
            v = src[u(a_t + i * s)]
            h = v if beats(v, h) else h
            v = src[u(b_t + i * s)]
            dst[u(to + i)] = v if beats(v, h) else h


# A function per stride LLVM is told as a constant (see the module doc).
@helper
def _stride_1(dst, to, src, e, count, k, d):
    _stride_loop(dst, to, src, e, count, 1, k, d)


@helper
def _stride_2(dst, to, src, e, count, k, d):
    _stride_loop(dst, to, src, e, count, 2, k, d)


@helper
def _stride_3(dst, to, src, e, count, k, d):
    _stride_loop(dst, to, src, e, count, 3, k, d)


@helper
def _stride_4(dst, to, src, e, count, k, d):
    _stride_loop(dst, to, src, e, count, 4, k, d)


@helper
def _stride_any(dst, to, src, e, count, s, k, d):
    _stride_loop(dst, to, src, e, count, s, k, d)


@helper
def _cut_window(dst, to, src, at, taps, d, empty_value):
    """``dst[to]`` = the first maximum of ``src[at + t*d]`` over taps t < ``taps`` (a window
    the padding cuts), or ``empty_value`` for a window of no tap."""
    u = np.uint64
    if taps <= 0:
        dst[u(to)] = empty_value
        return
    h = src[u(at)]
    for t in range(1, taps):
        v = src[u(at + t * d)]
        h = v if beats(v, h) else h
    dst[u(to)] = h


@helper
def reduce_row(dst, to, src, e, first, lo, hi, k, s, d, out, uncut_lo, uncut_hi, empty_value):
    """Output row ``dst[to:to + out]`` from one row whose coordinate 0 is ``src[e]``: output o
    folds coordinates ``first[o] + t*d`` for taps t in ``[lo[o], hi[o])``; the outputs in
    ``[uncut_lo, uncut_hi)`` (a range, possibly empty) have all k taps inside, the others
    lie before and after it."""
    count = uncut_hi - uncut_lo
    if count > 0:
        at = e + first[uncut_lo]
        where = to + uncut_lo
        if s == 1:
            _stride_1(dst, where, src, at, count, k, d)
        elif s == 2:
            _stride_2(dst, where, src, at, count, k, d)
        elif s == 3:
            _stride_3(dst, where, src, at, count, k, d)
        elif s == 4:
            _stride_4(dst, where, src, at, count, k, d)
        else:
            _stride_any(dst, where, src, at, count, s, k, d)
    else:
        uncut_lo = uncut_hi = out
    for o in range(uncut_lo):
        _cut_window(dst, to + o, src, e + first[o] + lo[o] * d, hi[o] - lo[o], d, empty_value)
    for o in range(uncut_hi, out):
        _cut_window(dst, to + o, src, e + first[o] + lo[o] * d, hi[o] - lo[o], d, empty_value)


def _order_matters(v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@overload(_order_matters)
def _order_matters_overload(v):
    """Whether a maximum ``v`` may be held by taps of other bits than the first's: a zero
    (either sign) or a NaN.  Never for integers (but the bits of the half types): their
    loop then compiles away."""
    if isinstance(v, types.Integer) and v not in HALF_BITS:
        return lambda v: False

    def floating(v):
        key = order_key(v)
        return (key == 0) | (key != key)
    return floating


@helper
def _in_window_order(dst, to, src, row_at, rows, first, lo, hi, d, out):
    """For each output of row ``dst[to:to + out]`` that is a zero or a NaN: the first tap in
    window order (the leading rows ``row_at[:rows]`` in order, then the last axis's taps)
    that equals it, zero for zero, NaN for NaN."""
    u = np.uint64
    for o in range(out):
        v = dst[u(to + o)]
        if not _order_matters(v):
            continue
        zero = order_key(v) == 0
        found = False
        for r in range(rows):
            at = row_at[r] + first[o]
            for t in range(lo[o], hi[o]):
                w = src[u(at + t * d)]
                key = order_key(w)
                if (key == 0) if zero else (key != key):
                    dst[u(to + o)] = w
                    found = True
                    break
            if found:
                break


@njit(cache=True, nogil=True)
def max_rows(x, y, axes, taps, setup, empty_value, start, stop):
    """Fill ``y`` for the work items ``[start, stop)``.

    x, y : (planes, S_in), (planes, S_out), value views of channels-first planes
    axes : (AXIS_ROWS, rank) int64, per axis: IN, OUT, KERNEL, STRIDE, DILATION and the
        outputs ``[UNCUT_LO, UNCUT_HI)`` whose window has every tap inside
    taps : (3, rank, max output size) int64, the first tap and the in-bounds taps
        ``[lo, hi)`` of every output (:class:`poolfold.geometry.TapTable`)
    setup : (SETUP_SIZE,) int64: a work item is ROWS_PER_ITEM output rows (positions of the
        leading axes, row-major) of one plane, ITEMS_PER_PLANE items a plane; MOST_ROWS is
        the most input rows one output row's window reaches
    """
    u = np.uint64
    rank = axes.shape[1]
    last = rank - 1
    width = axes[IN, last]
    out = axes[OUT, last]
    lead_out = 1
    for a in range(last):
        lead_out *= axes[OUT, a]
    rows_per_item = setup[ROWS_PER_ITEM]
    items_per_plane = setup[ITEMS_PER_PLANE]
    in_size = x.shape[1]
    out_size = y.shape[1]
    flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    row = np.empty(width, x.dtype)  # the leading taps' rows folded
    row_at = np.empty(max(setup[MOST_ROWS], 1), np.int64)  # where each of those rows starts
    o = np.zeros(max(last, 1), np.int64)  # the leading output position
    j = np.zeros(max(last, 1), np.int64)  # a leading tap
    pitch = np.full(max(last, 1), width, np.int64)  # elements between rows of a leading axis
    for a in range(last - 2, -1, -1):
        pitch[a] = pitch[a + 1] * axes[IN, a + 1]
    first_last = taps[0, last]
    lo_last = taps[1, last]
    hi_last = taps[2, last]
    k = axes[KERNEL, last]
    s = axes[STRIDE, last]
    d = axes[DILATION, last]
    uncut_lo = axes[UNCUT_LO, last]
    uncut_hi = axes[UNCUT_HI, last]
    for item in range(start, stop):
        p = item // items_per_plane
        q0 = (item % items_per_plane) * rows_per_item
        q1 = min(q0 + rows_per_item, lead_out)
        x_at = p * in_size
        rest = q0
        for a in range(last - 1, -1, -1):  # q0's leading position
            o[a] = rest % axes[OUT, a]
            rest //= axes[OUT, a]
        for q in range(q0, q1):
            to = p * out_size + q * out
            rows = 1
            for a in range(last):
                rows *= max(taps[2, a, o[a]] - taps[1, a, o[a]], 0)
            if rows == 0:  # every leading tap is padding: the whole row is empty windows
                for i in range(out):
                    y_flat[u(to + i)] = empty_value
            else:
                for a in range(last):
                    j[a] = taps[1, a, o[a]]
                for r in range(rows):  # the rows in window order
                    at = x_at
                    for a in range(last):
                        at += (taps[0, a, o[a]] + j[a] * axes[DILATION, a]) * pitch[a]
                    row_at[r] = at
                    next_in_ranges(j, o, taps[1], taps[2], last)
                if rows == 1:
                    reduce_row(y_flat, to, flat, row_at[0], first_last, lo_last, hi_last, k, s,
                               d, out, uncut_lo, uncut_hi, empty_value)
                else:
                    fold(row, None, 0, 0, flat, None, row_at, rows, width)
                    reduce_row(y_flat, to, row, 0, first_last, lo_last, hi_last, k, s, d, out,
                               uncut_lo, uncut_hi, empty_value)
                    _in_window_order(y_flat, to, flat, row_at, rows, first_last, lo_last,
                                     hi_last, d, out)
            next_in_shape(o, axes[OUT], last)  # the next leading output position
