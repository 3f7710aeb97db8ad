"""Window maximum by whole rows: the leading axes first, the last axis last.

For channels-first planes, or channels-last samples, of any rank, without Indices.  An
output row (every output along the last axis, for one position of the leading axes) is found
in two steps:

1. the input rows its window reaches along the leading axes (for a 2-D 3x3 window, three
   rows of the plane) are folded, tap by tap, into one row of the input's width (W elements,
   or W*C for channels-last samples): contiguous streams, vectorised
   (:func:`poolfold.kernels.simd.fold_vectors`), read from the input where they lie.  A
   window of one leading row is read in place.
2. that row is reduced along the last axis over every output of the row: tap t of output i
   is element ``i*s + t*d``, a stream at the stride, folded in explicit vectors
   (:func:`poolfold.kernels.simd.fold_strided`: each tap's elements loaded consecutively and
   picked by a shuffle), strides 1 to 4 each compiled for their own literal; other strides
   share one scalar loop (:func:`_stride_loop`), which LLVM vectorises by gathers.  Windows
   of 8 taps and more go by a ladder of runs (:func:`_ladder`), whose passes do not grow
   with the window.  A channels-last row at stride 1 is one such stream too (lane c of
   output i is element ``i*C + c``, its tap t ``t*d*C`` further on); at other strides, and
   for windows the padding cuts, each output folds its taps' runs of C channels
   (:func:`_reduce_lanes`).

Every per-row step runs inside the kernel, never as a call: a helper called once per row of
a few dozen outputs costs a third of a 2-D 3x3 pool's time (its array arguments, seven values
each, and their reference counts), and so does one in the row loop that is never taken.  The
steps are small functions numba inlines (:func:`_stride_loop`, :func:`_cut_window`) or
intrinsics (:mod:`poolfold.kernels.simd`), called from the kernel's own body: numba copies
a function's whole variable scope once per block of it when it inlines it, so inlining a
function that holds other inlined loops (the row's reduction as one function) took 19-26 s
to compile per type, where these take 7-11 (5-6 since the intrinsics).  Long windows'
helpers (:func:`_ladder`, :func:`_edge_scans`) are only in the kernel compiled for a
``long_windows`` of True: numba drops a branch on an argument that is None before it
compiles anything else.

Reducing the last axis last means the strided pass, the dear one, runs over the output rows
only, not over every input row: at stride s along the leading axes it has s times fewer
rows to reduce than when the last axis goes first (:mod:`poolfold.kernels.max_passes`).
A single output's taps folded in a scalar register lose to either: its running maximum
waits on each comparison (measured, float32, 5 taps at stride 3: 2.7 ns an output, 0.93
tap by tap over the row, 0.65 in vectors, four of them in flight).

Folding the leading taps first visits a window's taps column by column, not in window order.
Where equal values differ in their bits this picks another tap than the first: +0.0 where a
-0.0 came first, or another NaN than the first.  So an output that is a zero or a NaN (never
an integer one) is found again in window order (:func:`_in_window_order`): the first tap
that equals it, which for the common all-zero window is the window's first.

Windows the padding cuts along the last axis (a few at each end of a row) are folded one at
a time over their in-bounds taps, or, for long windows, found as running maxima from each
end of the row (:func:`_edge_scans`); a window with no tap inside the input gives
``empty_value``.  The kernel never validates: the op layer has checked every shape and
table (:func:`poolfold.ops.max_pool.rows_tables`).

Short channels-first rows go a block of rows at a time (:func:`max_row_blocks`): the same
folds and the same strided loops, but each loop runs over a whole block, cut windows and
all, where a row of a few dozen outputs alone never reaches a vectorised turn of its loop.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types

from . import helper, helper_overload, kernel, read_only, uncounted_helper
from .folds import beats
from .simd import (HOLDS_NAN, HOLDS_ZERO, fold_lanes, fold_strided, fold_strided_screened,
                   fold_taps, fold_vectors, zeros_and_nans)
from .half import HALF_BITS
from .odometer import next_in_ranges, next_in_shape
from .ordering import is_nan, order_key

# Rows of the per-axis table ``axes``.
IN, OUT, KERNEL, STRIDE, DILATION, UNCUT_LO, UNCUT_HI, STEP = range(8)
AXIS_ROWS = 8
# Rows of the leading-axes table ``lead``.
AT, TAPS = range(2)
# Entries of ``setup``.
(ROWS_PER_ITEM, ITEMS_PER_PLANE, MOST_ROWS, LADDER_SIZE, EDGE_SCANS, LANES, OUT_PITCH,
 PADDED_ROW, DATA_COLUMNS) = range(9)
SETUP_SIZE = 9


@njit(inline="always")
def _stride_loop(dst, to, src, e, count, s, k, d):
    """``dst[to + i]`` = the first maximum of ``src[e + i*s + t*d]`` over taps t < k, for i
    below ``count``: the first three taps in one sweep, then two a sweep (the store always
    mixes a tap in: see :mod:`poolfold.kernels.folds` on conditional stores).  Inlined, so
    that literals reach LLVM as constants: the kernels call it for strides above 4 (which
    :func:`fold_strided` has no literal for)."""
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


@njit(inline="always")
def fold_at_stride(dst, to, src, at, count, s, k, d):
    """``dst[to + i]`` = the first maximum of ``src[at + i*s + t*d]`` over taps t < ``k``,
    for i < ``count``: :func:`poolfold.kernels.simd.fold_strided` at strides 1 to 4 (a
    loop per stride, LLVM told it as a constant), else :func:`_stride_loop`."""
    if s == 1:
        fold_strided(dst, to, src, at, count, 1, k, d)
    elif s == 2:
        fold_strided(dst, to, src, at, count, 2, k, d)
    elif s == 3:
        fold_strided(dst, to, src, at, count, 3, k, d)
    elif s == 4:
        fold_strided(dst, to, src, at, count, 4, k, d)
    else:
        _stride_loop(dst, to, src, at, count, s, k, d)


@njit(inline="always")
def fold_at_stride_screened(dst, to, src, at, count, s, k, d):
    """:func:`fold_at_stride`, and 1 if a value it stored, ``dst[to:to + count]``, may be a
    zero or a NaN, else 0: noted as it is stored at strides 1 to 4
    (:func:`poolfold.kernels.simd.fold_strided_screened`), scanned afterwards at others."""
    if s == 1:
        return fold_strided_screened(dst, to, src, at, count, 1, k, d)
    if s == 2:
        return fold_strided_screened(dst, to, src, at, count, 2, k, d)
    if s == 3:
        return fold_strided_screened(dst, to, src, at, count, 3, k, d)
    if s == 4:
        return fold_strided_screened(dst, to, src, at, count, 4, k, d)
    _stride_loop(dst, to, src, at, count, s, k, d)
    return 1 if zeros_and_nans(dst, to, to + count) != 0 else 0


@njit(inline="always")
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


# The most taps of a channels-last window at a stride read straight from the input rows:
# 4 loads an output for 2x2 where folding the rows first takes 6, and 3 stores (measured,
# one thread, the new time over the old: 2x2 at stride 2 over (8,112,112,24) 0.58-0.62,
# 3x3 at stride 2 over (8,55,55,64) 0.80-0.82).
LANE_TAPS = 9


# The fewest outputs a ladder chunk covers (see _ladder; the op layer sizes the scratch).
LADDER_CHUNK = 2048


@njit(inline="always")
def _fold_four(dst, to, src, ladder, from_src, starts, count, no_nan):
    """``dst[to + i]`` = the first maximum of the four taps ``starts[t] + i`` of ``src``
    (``from_src``) or of ``ladder``, for i < ``count``; by plain comparisons where
    ``no_nan``, each case a call of its own."""
    if from_src and no_nan:
        fold_taps(dst, to, src, starts, 0, 4, count, True)
    elif from_src:
        fold_taps(dst, to, src, starts, 0, 4, count, False)
    elif no_nan:
        fold_taps(dst, to, read_only(ladder), starts, 0, 4, count, True)
    else:
        fold_taps(dst, to, read_only(ladder), starts, 0, 4, count, False)


@uncounted_helper
def _ladder(dst, to, src, e, count, s, k, d, ladder, starts):
    """``dst[to + i]`` = the first maximum of ``src[e + i*s + t*d]`` over taps t < k, for i
    below ``count``, by a ladder of runs: the first maximum over runs of 4, 16, ..., p taps
    (p the largest power of four not above k) is found at every position, each level from
    four runs of the level below, then each window is at most four runs of p taps, the last
    one ending where the window ends.  That is ``log4(k) + 1`` vectorised passes, where
    folding tap by tap takes k / 2 (runs of 2, 4, 8, ... took twice as many passes, each as
    dear: 1-D windows of 256 over (4,16,65536), 5.3 ms against about 3).  Runs overlap, and
    the earlier one is kept on a tie: the selection stays the first maximum in window order.
    The outputs go in chunks, as many as the two scratch rows of ``ladder`` hold; each
    level is four taps of explicit vectors (:func:`poolfold.kernels.simd.fold_taps`), by
    plain comparisons where the chunk holds no NaN (found by one vectorised scan), where
    numba's loop compared NaN-aware, element by element as LLVM widened it (1-D windows of
    63 over (4,16,65536), two threads: 1.15 ms against 1.58; 256 taps, 1.56 against 2.18).
    ``starts`` holds four taps."""
    u = np.uint64
    half = ladder.size // 2
    extent = (k - 1) * d + 1
    chunk = (half - extent) // s + 1
    for c0 in range(0, count, chunk):
        n = min(chunk, count - c0)
        span = (n - 1) * s + extent
        base = e + c0 * s
        no_nan = (zeros_and_nans(src, base, base + span) & HOLDS_NAN) == 0
        at = base  # where the current level starts: in src, then in ladder
        nxt = 0
        p = 1
        while 4 * p <= k:
            valid = span - (4 * p - 1) * d
            for t in range(4):
                starts[t] = at + t * p * d
            _fold_four(ladder, nxt, src, ladder, p == 1, starts, valid, no_nan)
            at = nxt
            nxt = half - nxt
            p *= 4
        # at most four runs of p taps: from taps 0, p and 2p, and the one ending the window
        starts[0] = at
        starts[1] = at + min(p, k - p) * d
        starts[2] = at + min(2 * p, k - p) * d
        starts[3] = at + (k - p) * d
        if s == 1:
            _fold_four(dst, to + c0, src, ladder, p == 1, starts, n, no_nan)
            continue
        cur = src if p == 1 else read_only(ladder)
        for i in range(n):
            h = cur[u(starts[0] + i * s)]
            v = cur[u(starts[1] + i * s)]
            h = v if beats(v, h) else h
            v = cur[u(starts[2] + i * s)]
            h = v if beats(v, h) else h
            v = cur[u(starts[3] + i * s)]
            dst[u(to + c0 + i)] = v if beats(v, h) else h


@uncounted_helper
def _edge_scans(dst, to, src, e, first, lo, hi, out, uncut_lo, uncut_hi, width):
    """The cut windows of a row at dilation 1 whose windows before the uncut ones all start
    at the row's start and those after it all end at its end (the op layer checks this):
    running maxima from each end, one fold per position, where folding each window costs
    its taps (a 1-D window of 1024 with SAME pads: 2x the whole pool's time)."""
    u = np.uint64
    h = src[u(e)]
    at = 1
    for o in range(uncut_lo):
        end = first[o] + hi[o]
        while at < end:
            v = src[u(e + at)]
            h = v if beats(v, h) else h
            at += 1
        dst[u(to + o)] = h
    at = width - 1
    h = src[u(e + at)]
    for o in range(out - 1, uncut_hi - 1, -1):
        begin = first[o] + lo[o]
        while at > begin:  # an earlier tap goes first: it is kept on a tie
            at -= 1
            v = src[u(e + at)]
            h = h if beats(h, v) else v
        dst[u(to + o)] = h


def _is_zero(v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_is_zero)
def _is_zero_overload(v):
    """Whether a floating ``v`` is a zero of either sign; never for integers (but the bits
    of the half types), whose loops then compile away."""
    if isinstance(v, types.Integer) and v not in HALF_BITS:
        return lambda v: False
    return lambda v: order_key(v) == 0


@njit(inline="always")
def _order_matters(v, signed_zeros):
    """Whether a maximum ``v`` may be held by taps of other bits than the first's: a NaN,
    or, where ``signed_zeros`` (the taps may hold a -0.0), a zero of either sign."""
    return (_is_zero(v) & signed_zeros) | is_nan(v)


def _negative_zero(v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_negative_zero)
def _negative_zero_overload(v):
    """Whether ``v`` is a -0.0 (for the half types, their bits 0x8000)."""
    if v == types.uint16:
        return lambda v: v == np.uint16(0x8000)
    if v == types.int16:
        return lambda v: v == np.int16(-0x8000)
    if isinstance(v, types.Float):
        return lambda v: (v == 0) & (math.copysign(1.0, v) < 0)
    if isinstance(v, types.Integer):
        return lambda v: False
    return None


@njit(inline="always")
def _screen(src, scan_lo, scan_hi, lo, hi):
    """Whether ``src[lo:hi]`` holds a -0.0, where ``src[scan_lo:scan_hi]`` (possibly empty)
    was screened and holds none; and the span screened now.  The span stays one interval,
    each element screened once (a gap between the two is screened too): a window's rows
    need not start further on than the last window's (the first in-bounds row of a window
    the padding cuts comes after the next window's)."""
    if scan_hi <= scan_lo:
        return _holds_negative_zero(src, lo, hi), lo, hi
    found = False
    if lo < scan_lo:
        found |= _holds_negative_zero(src, lo, scan_lo)
        scan_lo = lo
    if hi > scan_hi:
        found |= _holds_negative_zero(src, scan_hi, hi)
        scan_hi = hi
    return found, scan_lo, scan_hi


def _holds_negative_zero(src, lo, hi):  # pragma: no cover - replaced by the overload
    raise NotImplementedError


@helper_overload(_holds_negative_zero)
def _holds_negative_zero_overload(src, lo, hi):
    """Whether ``src[lo:hi]`` holds a -0.0: one branch-free pass, which LLVM vectorises, over
    the elements' bits (the sign bit alone).  Comparing the values instead (zero, and a
    negative sign) took 0.038-0.043 ns a float32 element against 0.027-0.030 over 8192 of
    them in cache, as a block's span is, and 0.054-0.057 against 0.043-0.046 over 3 MiB."""
    if src.dtype in (types.float32, types.float64):
        bits = np.uint32 if src.dtype == types.float32 else np.uint64
        sign = bits(1) << bits(src.dtype.bitwidth - 1)

        def by_bits(src, lo, hi):
            words = src.view(bits)
            found = False
            for i in range(np.uint64(lo), np.uint64(hi)):
                found |= words[i] == sign
            return found
        return by_bits

    def by_value(src, lo, hi):
        found = False
        for i in range(np.uint64(lo), np.uint64(hi)):
            found |= _negative_zero(src[i])
        return found
    return by_value


@uncounted_helper
def _in_window_order(dst, to, src, row_at, rows, first, lo, hi, d, out, lanes, signed_zeros):
    """For each output of row ``dst[to:to + out*lanes]`` that is a NaN, or a zero where
    ``signed_zeros`` (the taps may hold a -0.0): the first
    tap in window order (the leading rows ``row_at[:rows]`` in order, then the last axis's
    taps) that equals it, zero for zero, NaN for NaN.  Output ``o*lanes + c`` is output o of
    lane c, whose taps are ``lanes`` elements a position."""
    u = np.uint64
    for m in range(out * lanes):
        v = dst[u(to + m)]
        if not _order_matters(v, signed_zeros):
            continue
        o, c = m // lanes, m % lanes
        zero = order_key(v) == 0
        found = False
        for r in range(rows):
            at = row_at[r] + first[o] * lanes + c
            for t in range(lo[o], hi[o]):
                w = src[u(at + t * d * lanes)]
                key = order_key(w)
                if (key == 0) if zero else (key != key):
                    dst[u(to + m)] = w
                    found = True
                    break
            if found:
                break


@njit(inline="always")
def _reduce_lanes(dst, to, src, e, first, lo, hi, d, o_lo, o_hi, lanes, empty_value,
                  lane_taps):
    """Outputs ``[o_lo, o_hi)`` of an output row of a channels-last sample: ``lanes``
    contiguous elements a position (the channels), output o's lanes
    ``dst[to + o*lanes:][:lanes]`` folding its in-bounds taps' runs of lanes, a vectorised
    loop over the lanes per output."""
    u = np.uint64
    for o in range(o_lo, o_hi):
        taps = hi[o] - lo[o]
        where = to + o * lanes
        if taps <= 0:
            for c in range(lanes):
                dst[u(where + c)] = empty_value
            continue
        for t in range(taps):
            lane_taps[t] = e + (first[o] + (lo[o] + t) * d) * lanes
        fold_vectors(dst, where, src, lane_taps, taps, lanes)


@uncounted_helper
def _leading_rows(row_at, x_at, lead_at, no_taps, lead_taps, steps, o, j, last):
    """Where the input rows of leading output position ``o`` start (``row_at``, in window
    order), and how many there are: per leading axis, ``lead_taps[a, o[a]]`` taps from
    ``lead_at[a, o[a]]``, ``steps[a]`` elements apart (``no_taps``: zeros, where each
    axis's tap counter starts)."""
    rows = 1
    for a in range(last):
        rows *= lead_taps[a, o[a]]
        j[a] = 0
    for r in range(rows):
        at = x_at
        for a in range(last):
            at += lead_at[a, o[a]] + j[a] * steps[a]
        row_at[r] = at
        next_in_ranges(j, o, no_taps, lead_taps, last)
    return rows


@uncounted_helper
def _rows_in_window_order(dst, src, fixes, count, p, x_at, out_size, out, lanes, row_at,
                          lead_at, no_taps, lead_taps, steps, o, j, out_shape, last, first,
                          lo, hi, d, signed_zeros):
    """:func:`_in_window_order` for the output rows ``fixes[:count]`` (positions of the
    leading axes, row-major) of plane ``p``, whose input rows start at ``x_at``: the rows
    that hold a zero or a NaN, set aside by the kernel's loop over rows, which must call no
    helper (see the module's doc).  ``o`` and ``j`` are overwritten."""
    for f in range(count):
        q = fixes[f]
        rest = q
        for a in range(last - 1, -1, -1):
            o[a] = rest % out_shape[a]
            rest //= out_shape[a]
        rows = _leading_rows(row_at, x_at, lead_at, no_taps, lead_taps, steps, o, j, last)
        _in_window_order(dst, p * out_size + q * out * lanes, src, row_at, rows, first, lo,
                         hi, d, out, lanes, signed_zeros)


@njit(inline="always")
def _row_starts(row_at, x_at, q, lead, steps, out_shape, o, j, lead_at, lead_taps, no_taps,
                last):
    """Where the input rows of output row ``q`` (a position of the leading axes, row-major)
    start, in window order, into ``row_at``; how many there are.  Two and three dimensions
    are written out: through :func:`_leading_rows` and its counters they cost a fifth of a
    2-D 3x3 pool (about 20 ns a row).  Above three, ``o`` holds q's leading position (``j``
    a tap counter) and is advanced to the next row's."""
    rows = 1
    row_at[0] = x_at
    if last == 1:
        rows = lead[TAPS, 0, q]
        at = x_at + lead[AT, 0, q]
        for r in range(rows):
            row_at[r] = at + r * steps[0]
    elif last == 2:
        q_0, q_1 = q // out_shape[1], q % out_shape[1]
        taps_1 = lead[TAPS, 1, q_1]
        rows = lead[TAPS, 0, q_0] * taps_1
        at = x_at + lead[AT, 0, q_0] + lead[AT, 1, q_1]
        for r in range(rows):
            row_at[r] = at + (r // taps_1) * steps[0] + (r % taps_1) * steps[1]
    elif last > 2:
        rows = _leading_rows(row_at, x_at, lead_at, no_taps, lead_taps, steps, o, j, last)
        next_in_shape(o, out_shape, last)
    return rows


@kernel()
def max_rows(x, y, axes, taps, lead, setup, empty_value, long_windows, start, stop):
    """Fill ``y`` for the work items ``[start, stop)``.

    x, y : (planes, S_in), (planes, S_out), value views of channels-first planes, or of
        channels-last samples (a position's LANES channels contiguous)
    axes : (AXIS_ROWS, rank) int64, per axis: IN, OUT, KERNEL, STRIDE, DILATION, the
        outputs ``[UNCUT_LO, UNCUT_HI)`` whose window has every tap inside, and STEP, the
        elements between two taps (for a leading axis, rows of the plane apart)
    taps : (3, rank, max output size) int64, the first tap and the in-bounds taps
        ``[lo, hi)`` of every output (:class:`poolfold.geometry.TapTable`)
    lead : (2, max(rank - 1, 1), max output size) int64, per leading axis and output: AT,
        the plane offset of its first in-bounds tap's rows, and TAPS, how many it has
    setup : (SETUP_SIZE,) int64: a work item is ROWS_PER_ITEM output rows (positions of the
        leading axes, row-major) of one plane, ITEMS_PER_PLANE items a plane; MOST_ROWS is
        the most input rows one output row's window reaches; LADDER_SIZE the scratch of
        :func:`_ladder`, 0 where the last axis folds tap by tap; EDGE_SCANS 1 where the cut
        windows go by :func:`_edge_scans`; LANES the elements a position holds: 1 for
        channels-first planes, C for channels-last ones (then neither ladder nor edge scans)
    long_windows : None where the tables ask for neither ladder nor edge scans, else True:
        the kernel compiled for None has no code for them (see the module's doc)
    """
    u = np.uint64
    rank = axes.shape[1]
    last = rank - 1
    lanes = setup[LANES]
    width = axes[IN, last] * lanes
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
    ladder = np.empty(setup[LADDER_SIZE], x.dtype)  # long last-axis windows' scratch, or none
    ladder_starts = np.empty(4, np.int64)
    edge_scans = setup[EDGE_SCANS] == 1
    # where each tap of a channels-last output starts: a row's in-bounds taps (no more than
    # the row holds), or a direct output's taps (at most LANE_TAPS, see below)
    lanes_direct = lanes > 1 and axes[STRIDE, last] > 1
    lane_taps = np.empty(max(LANE_TAPS, min(axes[KERNEL, last], axes[IN, last])) if lanes > 1
                         else 1, np.int64)
    # the output rows of a work item that hold a zero or a NaN, found again in window order
    # once the item's rows are done
    fixes = np.empty(rows_per_item, np.int64)
    o = np.zeros(max(last, 1), np.int64)  # the leading output position
    j = np.zeros(max(last, 1), np.int64)  # a leading tap
    # views made once: each costs reference counting
    out_shape, lead_at, lead_taps, steps = axes[OUT], lead[AT], lead[TAPS], axes[STEP]
    no_taps = np.zeros_like(lead_taps)
    first_last = taps[0, last]
    lo_last = taps[1, last]
    hi_last = taps[2, last]
    k = axes[KERNEL, last]
    s = axes[STRIDE, last]
    d = axes[DILATION, last]
    uncut_lo = axes[UNCUT_LO, last]
    uncut_hi = axes[UNCUT_HI, last]
    step0 = axes[STEP, 0]
    step1 = axes[STEP, min(1, rank - 1)]
    out1 = axes[OUT, min(1, rank - 1)]
    for item in range(start, stop):
        p = item // items_per_plane
        q0 = (item % items_per_plane) * rows_per_item
        q1 = min(q0 + rows_per_item, lead_out)
        x_at = p * in_size
        # np.int64 and np.bool_, not literals: typed first as the literals, the call that
        # takes them below compiled _rows_in_window_order once more, for those
        fixing = np.int64(0)
        # Whether the input span [scan_lo, scan_hi) screened so far holds a -0.0: without
        # one every zero tap has the bits of the first, and the zeros of a ReLU's output
        # (about half of a CNN's MaxPool input) need no search in window order (which made
        # the row kernel 3-4x slower on them).
        signed_zeros = np.bool_(False)
        scan_lo = scan_hi = 0
        rest = q0
        for a in range(last - 1, -1, -1):  # q0's leading position
            o[a] = rest % axes[OUT, a]
            rest //= axes[OUT, a]
        for q in range(q0, q1):
            to = p * out_size + q * out * lanes
            # The input rows the window reaches along the leading axes, in window order.  Two
            # and three dimensions are written out: through a helper and its counters they
            # cost a fifth of a 2-D 3x3 pool (about 20 ns a row).
            rows = 1
            row_at[0] = x_at
            if last == 1:
                rows = lead[TAPS, 0, q]
                at = x_at + lead[AT, 0, q]
                for r in range(rows):
                    row_at[r] = at + r * step0
            elif last == 2:
                q_0, q_1 = q // out1, q % out1
                taps_1 = lead[TAPS, 1, q_1]
                rows = lead[TAPS, 0, q_0] * taps_1
                at = x_at + lead[AT, 0, q_0] + lead[AT, 1, q_1]
                for r in range(rows):
                    row_at[r] = at + (r // taps_1) * step0 + (r % taps_1) * step1
            elif last > 2:
                rows = _leading_rows(row_at, x_at, lead_at, no_taps, lead_taps, steps, o, j,
                                     last)
                next_in_shape(o, out_shape, last)  # the next leading output position
            if rows == 0:  # every leading tap is padding: the whole row is empty windows
                for i in range(out * lanes):
                    y_flat[u(to + i)] = empty_value
                continue
            src = flat  # one leading row is read where it lies
            e = row_at[0]
            # channels-last windows of few taps at a stride: every tap read from the input
            # rows, in window order, with no folded row between
            direct = lanes_direct and rows * k <= LANE_TAPS
            if rows > 1 and not direct:
                fold_vectors(row, 0, flat, row_at, rows, width)
                src = row
                e = 0
            if lanes == 1 or s == 1:
                # The row along the last axis (see the module's note on what is written out
                # here): the uncut outputs tap by tap, then the cut ones.  At stride 1 a
                # channels-last row's uncut outputs are one stream as well: lane c of output
                # i is element i*C + c of it, and its tap t element t*d*C further on.
                cut_lo, cut_hi = uncut_lo, uncut_hi
                count = uncut_hi - uncut_lo
                if count <= 0:
                    cut_lo = cut_hi = out
                laddered = False
                if long_windows is not None:
                    if count > 0 and ladder.size > 0:
                        _ladder(y_flat, to + uncut_lo, src, e + first_last[uncut_lo], count,
                                s, k, d, ladder, ladder_starts)
                        laddered = True
                if count > 0 and not laddered:
                    at = e + first_last[uncut_lo] * lanes
                    where = to + uncut_lo * lanes
                    # A loop per stride LLVM is told as a constant (fold_at_stride's, but
                    # for stride 1, where a channels-last sample's lanes ride along each
                    # tap: calling it for the other strides added a dead stride-1 fold,
                    # 1.2 s more to each compile).
                    if s == 1:
                        fold_strided(y_flat, where, src, at, count * lanes, 1, k, d * lanes)
                    elif s == 2:
                        fold_strided(y_flat, where, src, at, count, 2, k, d)
                    elif s == 3:
                        fold_strided(y_flat, where, src, at, count, 3, k, d)
                    elif s == 4:
                        fold_strided(y_flat, where, src, at, count, 4, k, d)
                    else:
                        _stride_loop(y_flat, where, src, at, count, s, k, d)
                scanned = False
                if long_windows is not None:
                    if edge_scans:
                        _edge_scans(y_flat, to, src, e, first_last, lo_last, hi_last, out,
                                    cut_lo, cut_hi, width)
                        scanned = True
                if not scanned and lanes == 1:
                    for cut in range(cut_lo):
                        _cut_window(y_flat, to + cut, src, e + first_last[cut] + lo_last[cut] * d,
                                    hi_last[cut] - lo_last[cut], d, empty_value)
                    for cut in range(cut_hi, out):
                        _cut_window(y_flat, to + cut, src, e + first_last[cut] + lo_last[cut] * d,
                                    hi_last[cut] - lo_last[cut], d, empty_value)
                elif not scanned:
                    _reduce_lanes(y_flat, to, src, e, first_last, lo_last, hi_last, d, 0,
                                  cut_lo, lanes, empty_value, lane_taps)
                    _reduce_lanes(y_flat, to, src, e, first_last, lo_last, hi_last, d, cut_hi,
                                  out, lanes, empty_value, lane_taps)
            elif direct:  # channels-last: each output's taps in window order
                for cut in range(out):  # the cut outputs one by one, their in-bounds taps
                    if uncut_lo <= cut < uncut_hi:
                        continue
                    n = 0
                    for r in range(rows):
                        for t in range(lo_last[cut], hi_last[cut]):
                            lane_taps[n] = row_at[r] + (first_last[cut] + t * d) * lanes
                            n += 1
                    if n == 0:
                        for c in range(lanes):
                            y_flat[u(to + cut * lanes + c)] = empty_value
                    else:
                        fold_lanes(y_flat, to + cut * lanes, flat, 0, 1, lanes, 0, lane_taps,
                                   n)
                if uncut_hi > uncut_lo:  # the uncut ones in one call
                    n = 0
                    for r in range(rows):
                        for t in range(k):
                            lane_taps[n] = row_at[r] + t * d * lanes
                            n += 1
                    fold_lanes(y_flat, to + uncut_lo * lanes, flat, first_last[uncut_lo] * lanes,
                               uncut_hi - uncut_lo, lanes, s * lanes, lane_taps, n)
            else:  # channels-last at a stride: the uncut outputs' runs of lanes in vectors
                cut_lo, cut_hi = uncut_lo, max(uncut_lo, uncut_hi)
                if cut_hi > cut_lo:
                    for t in range(k):
                        lane_taps[t] = e + t * d * lanes
                    fold_lanes(y_flat, to + cut_lo * lanes, src, first_last[cut_lo] * lanes,
                               cut_hi - cut_lo, lanes, s * lanes, lane_taps, k)
                else:
                    cut_lo = cut_hi = out
                _reduce_lanes(y_flat, to, src, e, first_last, lo_last, hi_last, d, 0, cut_lo,
                              lanes, empty_value, lane_taps)
                _reduce_lanes(y_flat, to, src, e, first_last, lo_last, hi_last, d, cut_hi,
                              out, lanes, empty_value, lane_taps)
            if rows > 1 and not direct:  # (a direct row folded its taps in window order)
                found = zeros_and_nans(y_flat, to, to + out * lanes)  # most rows hold neither
                zeros = (found & HOLDS_ZERO) != 0
                nans = (found & HOLDS_NAN) != 0
                if zeros and not signed_zeros:
                    signed_zeros, scan_lo, scan_hi = _screen(
                        flat, scan_lo, scan_hi, row_at[0], row_at[rows - 1] + width)
                if nans or (zeros and signed_zeros):
                    fixes[fixing] = q
                    fixing += 1
        if fixing > 0:
            _rows_in_window_order(y_flat, flat, fixes, fixing, p, x_at, out_size, out, lanes,
                                  row_at, lead_at, no_taps, lead_taps, steps, o, j, out_shape,
                                  last, first_last, lo_last, hi_last, d, signed_zeros)


@kernel()
def max_row_blocks(x, y, axes, taps, lead, setup, empty_value, start, stop):
    """:func:`max_rows` for short channels-first rows, a block of consecutive output rows
    (of one plane or several) at a time.  Fill ``y`` for the blocks ``[start, stop)``.

    Each output row's leading taps are folded into a row of ``folded``: the input row as
    the windows see it, padded with ``empty_value`` (PADDED_ROW elements, the input's first
    DATA_COLUMNS columns after the padding before the axis), the rows ``OUT_PITCH * stride``
    elements apart.  Output i of the block's flat run of rows (``OUT_PITCH`` a row) then taps
    ``folded[i*s + t*d]``, and one loop over the whole block reduces the last axis, cut
    windows and all: a padding tap holds the lowest value, which an in-bounds tap equals only
    in the same bits (the empty window's value), and never a zero or a NaN.  A row of a few
    dozen outputs is shorter than one turn of a vectorised loop, which ran it in its scalar
    remainder (3x3 at stride 2 over (1,64,56,56): 1.1 ns an element by rows, 0.28 over rows
    of 864).

    Where ``OUT_PITCH`` is the output row's length the loop writes Y where it lies (one
    row's padding after it shares elements with the next row's padding before it); else it
    writes ``staged``, copied row by row.  The padding is written once a call: the folds
    write the columns between.

    Arguments as :func:`max_rows`'s (``lanes`` 1, no ladder nor edge scans), but that a work
    item is ROWS_PER_ITEM output rows counted across planes (row g of the call is row
    ``g % rows_per_plane`` of plane ``g // rows_per_plane``)."""
    u = np.uint64
    rank = axes.shape[1]
    last = rank - 1
    out = axes[OUT, last]
    lead_out = 1
    for a in range(last):
        lead_out *= axes[OUT, a]
    block_rows = setup[ROWS_PER_ITEM]
    out_pitch = setup[OUT_PITCH]
    padded = setup[PADDED_ROW]
    data = setup[DATA_COLUMNS]
    in_size = x.shape[1]
    flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    first_last = taps[0, last]
    k = axes[KERNEL, last]
    s = axes[STRIDE, last]
    d = axes[DILATION, last]
    pitch = out_pitch * s
    shift = -first_last[0]  # the padding before the axis: where column 0 lies in a row
    folded = np.empty(block_rows * pitch + padded, x.dtype)
    for b in range(block_rows):
        for i in range(b * pitch, b * pitch + shift):
            folded[u(i)] = empty_value
        for i in range(b * pitch + shift + data, b * pitch + padded):
            folded[u(i)] = empty_value
    in_place = out_pitch == out
    staged = np.empty(0 if in_place else block_rows * out_pitch, x.dtype)
    row_at = np.empty(max(setup[MOST_ROWS], 1), np.int64)
    rows_of = np.empty(block_rows, np.int64)  # each row's count of leading rows
    one = np.empty(1, np.int64)  # a staged row's start; an output row found in window order
    o = np.zeros(max(last, 1), np.int64)
    j = np.zeros(max(last, 1), np.int64)
    out_shape, lead_at, lead_taps, steps = axes[OUT], lead[AT], lead[TAPS], axes[STEP]
    no_taps = np.zeros_like(lead_taps)
    step0 = axes[STEP, 0]
    step1 = axes[STEP, min(1, rank - 1)]
    out1 = axes[OUT, min(1, rank - 1)]
    for item in range(start, stop):
        g0 = item * block_rows
        g1 = min(g0 + block_rows, y.shape[0] * lead_out)
        # g0's plane and leading position, then counted along (a division per row cost a
        # tenth of a 2-D 3x3 pool)
        p, q = g0 // lead_out, g0 % lead_out
        rest = q
        for a in range(last - 1, -1, -1):
            o[a] = rest % axes[OUT, a]
            rest //= axes[OUT, a]
        q_0, q_1 = o[0], o[min(1, last - 1)]
        folding = False
        span_lo = span_hi = -1  # the input the block's rows read: offsets grow along it
        for g in range(g0, g1):
            b = g - g0
            x_at = p * in_size
            # the input rows the window reaches along the leading axes, in window order, as
            # in max_rows, and written out for the same reason: through an inlined helper
            # shared by both kernels, both ran 2.5-5x slower (measured, 2-D to 4-D)
            rows = 1
            row_at[0] = x_at
            if last == 1:
                rows = lead[TAPS, 0, q]
                at = x_at + lead[AT, 0, q]
                for r in range(rows):
                    row_at[r] = at + r * step0
            elif last == 2:
                taps_0, taps_1 = lead[TAPS, 0, q_0], lead[TAPS, 1, q_1]
                rows = taps_0 * taps_1
                at = x_at + lead[AT, 0, q_0] + lead[AT, 1, q_1]
                r = 0
                for r0 in range(taps_0):
                    for r1 in range(taps_1):
                        row_at[r] = at + r0 * step0 + r1 * step1
                        r += 1
                q_1 += 1
                if q_1 == out1:
                    q_1 = 0
                    q_0 += 1
            elif last > 2:
                rows = _leading_rows(row_at, x_at, lead_at, no_taps, lead_taps, steps, o, j,
                                     last)
                next_in_shape(o, out_shape, last)  # the next leading output position
            q += 1
            if q == lead_out:  # the next plane
                p += 1
                q = q_0 = q_1 = 0
            rows_of[b] = rows
            folding |= rows > 1
            if rows > 0:
                # (not always the first row's first: see _screen)
                span_lo = row_at[0] if span_lo < 0 else min(span_lo, row_at[0])
                span_hi = max(span_hi, row_at[rows - 1] + data)
                fold_vectors(folded, b * pitch + shift, flat, row_at, rows, data)
            else:  # every leading tap is padding: the row's windows are empty
                for i in range(b * pitch + shift, b * pitch + shift + data):
                    folded[u(i)] = empty_value
        dst = y_flat if in_place else staged
        where = g0 * out if in_place else 0
        count = (g1 - g0 - 1) * out_pitch + out
        # whether an output may be a zero or a NaN, noted as they are stored (a staged
        # block's outputs between its rows too, which no row keeps: a false alarm costs
        # the scan below only)
        suspect = fold_at_stride_screened(dst, where, folded, 0, count, s, k, d)
        if not in_place:  # each staged row copied as a fold of one tap: in vectors
            for b in range(g1 - g0):
                one[0] = b * out_pitch
                fold_vectors(y_flat, (g0 + b) * out, staged, one, 1, out)
        if folding and suspect:  # NaNs and zeros of folded rows found again in window order
            found = zeros_and_nans(y_flat, g0 * out, g1 * out)
            zeros = (found & HOLDS_ZERO) != 0
            nans = (found & HOLDS_NAN) != 0
            # zeros only where the block's input holds a -0.0 (see max_rows)
            signed_zeros = zeros and _holds_negative_zero(flat, span_lo, span_hi)
            if nans or signed_zeros:
                for g in range(g0, g1):
                    if rows_of[g - g0] < 2:
                        continue
                    matters = False
                    for i in range(g * out, (g + 1) * out):
                        matters |= _order_matters(y_flat[u(i)], signed_zeros)
                    if matters:
                        p = g // lead_out
                        one[0] = g % lead_out
                        # int64 counts, not literals: max_rows's compile serves
                        _rows_in_window_order(y_flat, flat, one, np.int64(1), p, p * in_size,
                                              y.shape[1], out, np.int64(1), row_at, lead_at,
                                              no_taps, lead_taps, steps, o, j, out_shape,
                                              last, first_last, taps[1, last],
                                              taps[2, last], d, signed_zeros)
