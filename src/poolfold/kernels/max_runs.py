"""Window maximum of long windows by streamed running maxima: channels-first planes of any
rank, without Indices, at dilation 1, at a cost that does not grow with the window.

The leading axes go first, each by van Herk / Gil-Werman runs, streamed
(:func:`_stream_axis`).  The rows along the axis (each a contiguous run of everything after
it) are split into blocks of k rows from the first; a window of k rows spans at most two
blocks, so it is the first maximum of its first row's *suffix* (the rows from it to its
block's end) then its last row's *prefix* (the rows from its block's start to it).  The
rows are read in order: a block's suffixes (k rows of scratch) when the first window
starting in it is reached, and one running prefix row that follows the windows' last rows.
That is three folds a row, each a whole row in vectors
(:func:`poolfold.kernels.simd.fold_pair`), and every read but the first from cache.

Each row the last leading axis leaves goes straight on, while in cache, to the last axis: it
is copied between padding of the type's lowest value (which no tap beats, and which an
empty window yields, as it should) and reduced by a ladder of runs (:func:`_last_axis`): the
first maximum over runs of 4, 16, ... taps at every position, each level from four runs of
the level below, then each window from at most four: ``log4(k) + 1`` vectorised passes, with
plain comparisons where the row holds no NaN.  Runs overlap and the earlier is kept on a
tie, so the last axis keeps the first maximum in window order.

Reducing the leading axes first visits a window's taps column by column, not in window
order: where equal values differ in their bits, another tap than the first may be kept (+0.0
where a -0.0 came first, or another NaN).  So an output that is a NaN, or a zero where the
item's input holds a -0.0, is found again in window order (:func:`_in_window_order`).  What
the input holds is found as the first axis first reads each row: until a NaN is met every
fold is a plain comparison, and until a NaN or a -0.0 is, no output is screened.  (The
last axis first, through transposed slabs and running maxima, kept the order with no search
but took 2.2 ms where this takes 1.9, two threads, 63x63 windows over (4,16,256,256)
float32; it was faster over small planes, 9x9 over (1,256,14,14) 0.25 against 0.43 ms,
which the kernel is not chosen for.)

A work item is ``ROWS_PER_ITEM`` outputs along the first axis of one plane: the input rows
their windows reach, and no others; in 1-D, ``PLANES_PER_ITEM`` planes, each one row.  The
kernel never validates: the op layer has checked every shape and sized the scratch
(:func:`poolfold.ops.max_pool.runs_tables`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import helper, kernel, read_only, uncounted_helper
from .max_rows import _holds_negative_zero, _order_matters
from .ordering import order_key
from .simd import HOLDS_NAN, HOLDS_ZERO, fold_pair, fold_taps, zeros_and_nans

# Rows of the per-axis table ``axes``: input and output extents, window, stride, and the
# padding before the first input element.
IN, OUT, KERNEL, STRIDE, PAD = range(5)
AXIS_ROWS = 5
# Entries of ``setup``: the work items, and each scratch buffer's elements.
(ROWS_PER_ITEM, ITEMS_PER_PLANE, PLANES_PER_ITEM, STAGE, SUFFIXES, PREFIX, PADDED_ROW,
 LADDER, STRIP_BYTES, ROW_PITCH, ROWS_LADDERED, ROW_AT) = range(12)
SETUP_SIZE = 12
# Entries of ``seen`` (see :func:`_stream_axis`).
SEEN_KINDS, SEEN_SIGNED_ZEROS, SEEN_SCREENS = range(3)
# Every scratch buffer starts on a cache line, and rows of a multiple of its elements stay on
# them: numba's allocations start 16 or 32 bytes into one, and a vector stored across two
# lines costs about twice one within (float32 folds in L1: 1.04 against 0.59 ns a vector).
LINE_BYTES = 64


@njit(inline="always")
def _scratch(size, like):
    """``size`` elements of ``like``'s type, the first on a cache line."""
    spare = LINE_BYTES // like.itemsize
    buffer = np.empty(size + spare, like.dtype)
    skip = ((-buffer.ctypes.data) % LINE_BYTES) // like.itemsize
    return buffer[skip:skip + size]


@njit(inline="always")
def _fold_runs(dst, to, from_row, row, ladder, starts, taps, count, no_nan):
    """``dst[to + i]`` = the first maximum of the ``taps`` runs at ``starts`` (+ i), for i
    < ``count``: in ``row`` where ``from_row``, else in ``ladder``; by plain comparisons
    where ``no_nan``.  (Each case written out: through one helper that took the sources as
    they came, the ladder took a quarter longer.)"""
    if from_row and no_nan:
        fold_taps(dst, to, row, starts, 0, taps, count, True)
    elif from_row:
        fold_taps(dst, to, row, starts, 0, taps, count, False)
    elif no_nan:
        fold_taps(dst, to, ladder, starts, 0, taps, count, True)
    else:
        fold_taps(dst, to, ladder, starts, 0, taps, count, False)


@uncounted_helper
def _last_axis(row, lead, pitch, rows, k, s, out, dst, to, dst_pitch, ladder, starts, no_nan,
               report, fixes, first):
    """Output row r < ``rows``, ``dst[to + r*dst_pitch:][:out]``: the first maximum of
    ``row[lead + r*pitch + i*s + t]`` over taps t < k, for i < ``out`` (each row's elements
    between their padding, ``pitch`` apart): the ladder of runs of the module's doc, over
    every row at once, in the two halves of ``ladder`` (each at least ``rows * pitch``),
    then each row's windows; at a stride, every position's window, then every s-th kept.
    By plain comparisons where ``no_nan`` (the caller knows no row holds a NaN) or the rows
    are found to hold none.  With ``report``, the rows whose outputs hold a zero or a NaN
    are listed as :func:`_stream_axis` lists them, numbered from ``first``.  (Laddered one
    by one, rows of 64 float32, as 3-D windows over 64x64x64 planes have, took half their
    time in each level's set-up, not in its folds.)"""
    span = (out - 1) * s + k  # the elements one row's windows read
    total = (rows - 1) * pitch + span
    if not no_nan:
        no_nan = (zeros_and_nans(row, lead, lead + total) & HOLDS_NAN) == 0
    half = ladder.size // 2
    at = lead  # where the current level starts: in row, then in ladder
    nxt = 0  # ...and the next in ladder
    p = 1
    while 4 * p <= k:
        total -= 3 * p  # the positions whose four runs of p lie in the level below
        for t in range(4):
            starts[t] = at + t * p
        _fold_runs(ladder, nxt, p == 1, row, ladder, starts, 4, total, no_nan)
        at = nxt
        nxt = half - nxt
        p *= 4
    # at most four runs of p taps (k < 4p), in window order: from taps 0, p and 2p where
    # they start before the last, and the one ending the window (31 taps: 0 and 15 only)
    for r in range(rows):
        base = at + r * pitch
        starts[0] = base
        runs = 1
        for t in range(1, 3):
            if t * p < k - p:
                starts[runs] = base + t * p
                runs += 1
        if k > p:
            starts[runs] = base + k - p
            runs += 1
        here = to + r * dst_pitch
        if s == 1:
            _fold_runs(dst, here, p == 1, row, ladder, starts, runs, out, no_nan)
        else:  # every position's window, then every s-th kept
            _fold_runs(ladder, nxt, p == 1, row, ladder, starts, runs, (out - 1) * s + 1,
                       no_nan)
            for i in range(out):
                dst[here + i] = ladder[nxt + i * s]
        if report:
            found = zeros_and_nans(dst, here, here + out)
            if found != 0:
                fixes[0] += 1
                fixes[fixes[0]] = first + r
                fixes[fixes.size - 1] |= found


@njit(inline="always")
def _fold(dst, to, first, first_at, second, second_at, count, no_nan):
    """:func:`poolfold.kernels.simd.fold_pair`, by plain comparisons where ``no_nan``."""
    if no_nan:
        fold_pair(dst, to, first, first_at, second, second_at, count, True)
    else:
        fold_pair(dst, to, first, first_at, second, second_at, count, False)


@uncounted_helper
def _stream_axis(src, src_at, n, width, pitch, k, s, pad, out_n, dst, dst_at, dst_pitch,
                 suffixes, prefix, empty_value, last, target, ladder, starts, fixes, seen):
    """Output o, for o < ``out_n``, of an axis of ``n`` rows of ``width`` elements at
    ``src[src_at:]``, ``pitch`` apart: the first maximum of rows
    ``[o*s - pad, o*s - pad + k)`` that lie inside, or ``empty_value`` where none does (see
    the module's doc).  ``suffixes`` holds ``min(k, n)`` rows, ``prefix`` one.

    Into ``dst[dst_at + o*dst_pitch:][:width]`` (``target`` is ``dst``); or, with ``last``
    (for the last axis: its kernel, stride, padding and outputs, then the padded rows'
    pitch and how many ``target`` holds), into ``target``, the padded rows, each after its
    padding, and each time they are full (or the axis ends), their last axis into
    ``dst[dst_at + o*dst_pitch:][:last[3]]`` (:func:`_last_axis`).  Then, once the rows
    read hold a NaN or a -0.0 (``seen``, below), the outputs o that are a zero or a NaN are
    listed in ``fixes[1:]``, their count in ``fixes[0]``, and their kinds ORed into
    ``fixes[-1]``.

    ``seen`` (:data:`SEEN_KINDS`, :data:`SEEN_SIGNED_ZEROS`, :data:`SEEN_SCREENS`): what the
    rows read so far hold.  Until they hold a NaN the folds are plain comparisons, and until
    they hold a NaN or a -0.0 no output is screened (the windows of an output read no row
    after its last).  With ``seen[SEEN_SCREENS]``, each row is screened where it is first
    read, into the prefix, while in cache (a scan of the item's input first, from memory,
    took a fifth of 2-D windows' time); else ``seen`` holds the whole input's."""
    laddered = last[0] > 0
    row_at = last[2]  # where a padded row's elements start
    row_pitch = last[4]
    batch = max(last[5], 1)
    row_lead = last[6]  # ...and its padding
    fixes[0] = 0
    fixes[fixes.size - 1] = 0
    held_block = -1  # the first row of the block whose suffixes are held
    last_row = -1  # the last row folded into the running prefix
    block = 0  # ...and the first row of its block
    start = -pad  # the window's first row, inside or not
    for o in range(out_n):
        lo = max(start, 0)
        hi = min(start + k - 1, n - 1)  # the window's first and last rows inside
        start += s
        to = dst_at + o * dst_pitch
        no_nan = (seen[SEEN_KINDS] & HOLDS_NAN) == 0
        slot = o % batch  # the padded row it goes into
        held_in = slot * row_pitch + row_at if laddered else to  # where in target
        if hi < lo:
            for i in range(width):
                target[held_in + i] = empty_value
        else:
            while last_row < hi:  # hi never goes back: the prefix follows it
                last_row += 1
                at = src_at + last_row * pitch
                if last_row == block + k:
                    block = last_row
                if seen[SEEN_SCREENS] != 0:
                    kinds = zeros_and_nans(src, at, at + width)
                    seen[SEEN_KINDS] |= kinds
                    if (kinds & HOLDS_ZERO) != 0 and seen[SEEN_SIGNED_ZEROS] == 0:
                        if _holds_negative_zero(src, at, at + width):
                            seen[SEEN_SIGNED_ZEROS] = 1
                    no_nan = (seen[SEEN_KINDS] & HOLDS_NAN) == 0
                if last_row == block:
                    fold_pair(prefix, 0, src, at, src, at, width, True)  # a copy
                else:
                    _fold(prefix, 0, prefix, 0, src, at, width, no_nan)
            # lo lies in hi's block or the one before (a window spans at most k rows)
            lo_block = block if lo >= block else block - k
            if lo == block:  # from its block's start: the prefix alone
                fold_pair(target, held_in, prefix, 0, prefix, 0, width, True)
            else:
                if held_block != lo_block:
                    held_block = lo_block
                    end = min(lo_block + k, n) - 1
                    at = (end - lo_block) * width
                    fold_pair(suffixes, at, src, src_at + end * pitch, src,
                              src_at + end * pitch, width, True)
                    for r in range(end - 1, lo_block - 1, -1):
                        at -= width
                        _fold(suffixes, at, src, src_at + r * pitch, suffixes,
                              at + width, width, no_nan)
                held = (lo - lo_block) * width
                if lo_block == block:  # cut by the axis's end inside one block: the suffix
                    fold_pair(target, held_in, suffixes, held, suffixes, held, width, True)
                else:  # the suffix of lo, then the prefix of hi
                    _fold(target, held_in, suffixes, held, prefix, 0, width, no_nan)
        if laddered and (slot == batch - 1 or o == out_n - 1):
            report = not no_nan or seen[SEEN_SIGNED_ZEROS] != 0
            _last_axis(target, row_lead, row_pitch, slot + 1, last[0], last[1], last[3], dst,
                       to - slot * dst_pitch, dst_pitch, ladder, starts, no_nan, report,
                       fixes, o - slot)


@helper
def _in_window_order(y_flat, y_at, flat, x_at, axes, position, rank, signed_zeros):
    """For each output of the output row at ``y_flat[y_at:]`` (leading position
    ``position``, of a plane at ``flat[x_at:]``) that is a NaN, or a zero where
    ``signed_zeros``: the first tap in window order (row-major, the padding skipped) that
    equals it, zero for zero, NaN for NaN."""
    last = rank - 1
    width = axes[IN, last]
    lo = np.empty(rank, np.int64)
    hi = np.empty(rank, np.int64)
    tap = np.empty(rank, np.int64)
    for a in range(last):
        start = position[a] * axes[STRIDE, a] - axes[PAD, a]
        lo[a] = max(start, 0)
        hi[a] = min(start + axes[KERNEL, a], axes[IN, a])
    for o in range(axes[OUT, last]):
        v = y_flat[y_at + o]
        if not _order_matters(v, signed_zeros):
            continue
        start = o * axes[STRIDE, last] - axes[PAD, last]
        c_lo = max(start, 0)
        c_hi = min(start + axes[KERNEL, last], width)
        zero = order_key(v) == 0
        for a in range(last):
            tap[a] = lo[a]
        found = False
        while not found:
            row = 0  # the leading taps' row of the plane
            for a in range(last):
                row = row * axes[IN, a] + tap[a]
            at = x_at + row * width
            for c in range(c_lo, c_hi):
                w = flat[at + c]
                key = order_key(w)
                if (key == 0) if zero else (key != key):
                    y_flat[y_at + o] = w
                    found = True
                    break
            a = last - 1  # the next leading tap, row-major
            while a >= 0 and not found:
                tap[a] += 1
                if tap[a] < hi[a]:
                    break
                tap[a] = lo[a]
                a -= 1
            if a < 0:
                break  # (never: the output came from one of the window's taps)


@kernel()
def max_runs(x, y, axes, setup, empty_value, start, stop):
    """Fill ``y`` for the work items ``[start, stop)``.

    x, y : (planes, S_in), (planes, S_out), value views of channels-first planes
    axes : (AXIS_ROWS, rank) int64, per axis IN, OUT, KERNEL, STRIDE and PAD (above)
    setup : (SETUP_SIZE,) int64: a work item is PLANES_PER_ITEM whole planes of rank 1, or
        ROWS_PER_ITEM outputs along the first axis of one plane, ITEMS_PER_PLANE items a
        plane; then the elements of each of the two stages, of the suffixes, of the prefix
        row, of the padded rows and of the ladder's scratch (sized by the op layer for the
        largest item; the stages hold nothing in 2-D); STRIP_BYTES, the most the suffixes of
        a leading axis's pass before the last take, by strips of its rows; ROW_PITCH, the
        padded rows' pitch, ROWS_LADDERED, how many are laddered at once, and ROW_AT, where
        the first one's elements start (its padding before them)
    """
    rank = axes.shape[1]
    last = rank - 1
    planes, plane_size = x.shape
    out_plane = y.shape[1]
    flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    stage_a = _scratch(setup[STAGE], x)
    # (a second stage only from 4-D on: the 3-D passes write one, 1 MiB over 64x64x64
    # float32 planes, whose pages a call would touch for nothing)
    stage_b = _scratch(setup[STAGE] if rank > 3 else 0, x)
    suffixes = _scratch(setup[SUFFIXES], x)
    prefix = _scratch(setup[PREFIX], x)
    ladder = _scratch(setup[LADDER], x)
    starts = np.empty(4, np.int64)
    width = axes[IN, last]
    # the rows each output row of the leading axes goes into, from ROW_AT, ROW_PITCH apart,
    # each between the last axis's padding (never written: the lowest value, which no tap
    # beats), and laddered ROWS_LADDERED at a time
    row = _scratch(setup[PADDED_ROW], x)
    row[:] = empty_value
    row_at = setup[ROW_AT]
    row_lead = row_at - axes[PAD, last]
    row_pitch = setup[ROW_PITCH]
    batch = setup[ROWS_LADDERED]
    last_axis = np.array([axes[KERNEL, last], axes[STRIDE, last], row_at, axes[OUT, last],
                          row_pitch, batch, row_lead])
    no_ladder = np.zeros(7, np.int64)
    out_last = axes[OUT, last]
    in0, out0 = axes[IN, 0], axes[OUT, 0]
    k0, s0, pad0 = axes[KERNEL, 0], axes[STRIDE, 0], axes[PAD, 0]
    inner0 = plane_size // in0  # elements of one input row along the first axis
    out_inner0 = out_plane // out0
    per_item = setup[ROWS_PER_ITEM]
    items_per_plane = setup[ITEMS_PER_PLANE]
    most_rows = max(per_item, 1)
    for a in range(1, last):
        most_rows = max(most_rows, axes[OUT, a])
    fixes = np.empty(most_rows + 2, np.int64)
    seen = np.zeros(3, np.int64)
    position = np.zeros(max(last, 1), np.int64)
    for item in range(start, stop):
        if rank == 1:  # whole planes, each one row: its last axis alone
            p0 = item * setup[PLANES_PER_ITEM]
            p1 = min(p0 + setup[PLANES_PER_ITEM], planes)
            for b0 in range(p0, p1, batch):
                b1 = min(b0 + batch, p1)
                for p in range(b0, b1):
                    at = p * plane_size  # (a slice assignment took 3x as long)
                    fold_pair(row, (p - b0) * row_pitch + row_at, flat, at, flat, at, width,
                              True)
                # (a 1-D window is in window order: no output is looked for again)
                _last_axis(row, row_lead, row_pitch, b1 - b0, last_axis[0], last_axis[1],
                           out_last, y_flat, b0 * out_plane, out_plane, ladder, starts, False,
                           False, fixes, 0)
            continue
        p = item // items_per_plane
        o0 = (item % items_per_plane) * per_item
        o1 = min(o0 + per_item, out0)
        r_lo = min(max(o0 * s0 - pad0, 0), in0)
        r_hi = max(min((o1 - 1) * s0 - pad0 + k0, in0), r_lo)
        y_at = p * out_plane + o0 * out_inner0
        x_at = p * plane_size + r_lo * inner0
        rows = r_hi - r_lo
        if rows == 0:  # every window of the item lies in the padding
            for i in range((o1 - o0) * out_inner0):
                y_flat[y_at + i] = empty_value
            continue
        # What the item's input holds, found by the first axis's pass as it reads the rows:
        # without a NaN every fold is a plain comparison, and without a NaN or a -0.0 no
        # output can depend on the order of its taps, so none is screened or looked for
        # again (a screen of each row before its ladder and of its outputs after took a
        # fifth of 3-D windows' time over rows of 64)
        seen[SEEN_KINDS] = 0
        seen[SEEN_SIGNED_ZEROS] = 0
        seen[SEEN_SCREENS] = 1
        # the leading axes, the first first: units of n rows of `inner` elements, the last
        # of them laddered along the last axis into Y
        src, src_at = flat, x_at
        units = 1
        inner = plane_size
        to_b = False  # the stage the next axis writes: a, then b, then a...
        for a in range(last):
            n = rows if a == 0 else axes[IN, a]
            out_n = o1 - o0 if a == 0 else axes[OUT, a]
            pad = pad0 + r_lo - o0 * s0 if a == 0 else axes[PAD, a]
            inner //= axes[IN, a]
            if a < last - 1:
                dst = stage_b if to_b else stage_a
                # strips of the rows whose suffixes fit STRIP_BYTES, and stay in cache (3-D
                # rows of 64x64 float32, 16 KiB each, took 1 MiB of suffixes for 63 taps)
                line = LINE_BYTES // x.itemsize  # (whole lines: each strip's rows start on one)
                strip = setup[STRIP_BYTES] // (min(axes[KERNEL, a], n) * x.itemsize)
                strip = max(strip // line * line, line)
                for u in range(units):
                    for c0 in range(0, inner, strip):
                        _stream_axis(src, src_at + u * n * inner + c0, n,
                                     min(strip, inner - c0), inner, axes[KERNEL, a],
                                     axes[STRIDE, a], pad, out_n, dst,
                                     u * out_n * inner + c0, inner, suffixes, prefix,
                                     empty_value, no_ladder, dst, ladder, starts, fixes,
                                     seen)
                src, src_at = read_only(dst), 0
                seen[SEEN_SCREENS] = 0  # the first axis has read the whole input
                to_b = not to_b
                units *= out_n
                continue
            for u in range(units):
                to = y_at + u * out_n * out_last
                _stream_axis(src, src_at + u * n * inner, n, inner, inner, axes[KERNEL, a],
                             axes[STRIDE, a], pad, out_n, y_flat, to, out_last, suffixes,
                             prefix, empty_value, last_axis, row, ladder, starts, fixes, seen)
                signed_zeros = seen[SEEN_SIGNED_ZEROS] != 0
                if fixes[0] == 0:
                    continue
                if (fixes[fixes.size - 1] & HOLDS_NAN) == 0 and not signed_zeros:
                    continue
                for f in range(1, fixes[0] + 1):
                    # the leading position of output row (u, o): u over the axes before
                    # the last leading one, row-major
                    rest = u
                    for b in range(last - 2, -1, -1):
                        extent = o1 - o0 if b == 0 else axes[OUT, b]
                        position[b] = rest % extent
                        rest //= extent
                    position[last - 1] = fixes[f]
                    position[0] += o0
                    _in_window_order(y_flat, to + fixes[f] * out_last, flat,
                                     p * plane_size, axes, position, rank, signed_zeros)
