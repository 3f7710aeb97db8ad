"""Window maximum over channels-first planes, the last axis first: every input row folded
along it in vectors, then those folded rows along the leading axes.

Folding the last axis first gives the first maximum in window order without a screen:
window order is row-major, so the first maximum of a window is the first, in the order of
the leading taps, of each input row's first maximum along the last axis.  (The row kernels
fold the leading axes first, where a -0.0 and a +0.0 in different rows tie in the wrong
order, and so screen every block for -0.0.)  The first NaN wins the same way.

1. **Along the last axis**, into ``lines`` (one row of ``pitch`` outputs per input row):
   where the row's length is ``pitch`` times the stride, the windows that lie inside a row
   sit one stride apart across the rows, so every row of a work item is folded as one
   strided stream (:func:`poolfold.kernels.simd.fold_strided`, a shuffle picking every s-th
   element of consecutive loads), the windows that straddle two rows computed and then
   written over; else one fold per row.  The windows the padding or a ceil-mode end cuts
   (a few at each end of a row) are folded over their in-bounds taps, tap by tap over the
   rows.
2. **Along the leading axes**: each output row is the first maximum, in window order, of
   the ``lines`` rows its window's in-bounds leading taps read
   (:func:`poolfold.kernels.simd.fold_vectors`, whole rows in vectors), written into Y.

A row of 28 outputs is shorter than most vectorised loops' turn; the stream folds a whole
plane of them at once (3x3 at stride 2 over (1,64,56,56), one thread: 39 us, where the row
blocks, folding the leading axes first, took 55 and onnxruntime 47).

A work item is a plane's run of output rows: the rows under a run of outputs along the
first axis (a whole plane where its folded rows fit the core's cache and the planes are
enough for the threads), whose input rows lie together in the plane.  Which ``lines`` rows
each output row folds, in window order, is a table built once per plan.  The kernel never
validates: the op layer (:func:`poolfold.ops.max_pool.lines_tables`) has checked every
shape and table.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import kernel
from .folds import beats
from .max_rows import fold_at_stride
from .simd import fold_strided, fold_vectors

# Rows of ``dims`` (one column per spatial axis).
IN, OUT, KERNEL, STRIDE, DILATION = range(5)
# Entries of ``setup``.
PITCH, STREAM, INNER_LO, INNER_HI, MOST_ROWS = range(5)
SETUP_SIZE = 5


@njit(inline="always")
def _fold_row_run(dst, to, src, at, count, s, k, d):
    """``dst[to + i]`` = the first maximum of ``src[at + i*s + t*d]`` over t < ``k``, for
    i < ``count``, as :func:`poolfold.kernels.max_rows.fold_at_stride` folds it.  The common
    windows (2 and 3 taps at strides 1 and 2, no dilation) pass every number as a
    literal: LLVM then unrolls the taps and shares their loads (3x3 at stride 2 over
    (1,64,56,56), one thread: the kernel took 58-69 us with the taps and dilation in
    registers, 52 with literals, measured before the cut windows went row by row)."""
    if d == 1 and k == 3 and s == 2:
        fold_strided(dst, to, src, at, count, 2, 3, 1)
    elif d == 1 and k == 3 and s == 1:
        fold_strided(dst, to, src, at, count, 1, 3, 1)
    elif d == 1 and k == 2 and s == 2:
        fold_strided(dst, to, src, at, count, 2, 2, 1)
    elif d == 1 and k == 2 and s == 1:
        fold_strided(dst, to, src, at, count, 1, 2, 1)
    else:
        fold_at_stride(dst, to, src, at, count, s, k, d)


@njit(inline="always")
def _fold_cut(dst, to, pitch, src, at, n, rows, lo, hi, d, empty_value):
    """For each row r below ``rows``: ``dst[to + r*pitch]`` = the first maximum of
    ``src[at + r*n + t*d]`` over taps ``[lo, hi)``, or ``empty_value`` where there is none
    (a window wholly in the padding): one cut window of every row, tap by tap over the rows,
    whose loads then overlap (a row at a time waited on each comparison: 3x3 at stride 2
    over (1,64,56,56), one thread, spent 16 us on its 3584 cut windows, about 3 so).
    :func:`poolfold.kernels.folds.fold_column` folds the same way, through a table of each
    row's target and a helper's call; through it the kernel took 3-6% longer (one thread,
    three rounds each in turn: 41-42 against 39-40 us over (1,64,56,56), 150-160 against
    143-150 over (1,256,54,54)), so the cut windows are folded here, inlined."""
    u = np.uint64
    if hi <= lo:
        for r in range(rows):
            dst[u(to + r * pitch)] = empty_value
        return
    e = at + lo * d
    for r in range(rows):
        dst[u(to + r * pitch)] = src[u(e + r * n)]
    for t in range(1, hi - lo):
        for r in range(rows):
            v = src[u(e + r * n + t * d)]
            held = dst[u(to + r * pitch)]
            dst[u(to + r * pitch)] = v if beats(v, held) else held


@kernel()
def max_lines(x, y, dims, first, lo, hi, setup, runs, lead_first, lead_starts, empty_value,
              start, stop):
    """Fill the work items ``[start, stop)`` of ``y`` (planes, output size) from ``x``
    (planes, input size): item ``i`` is plane ``i // len(runs)``'s run ``i % len(runs)`` of
    output rows (see the module's docstring).

    ``dims``: the plan's input and output shapes, kernel, strides and dilations (rows IN,
    OUT, KERNEL, STRIDE, DILATION); ``first``, ``lo``, ``hi``: its tap table (per axis and
    output, the first tap's coordinate and the in-bounds taps ``[lo, hi)``); ``setup``:
    PITCH (outputs a row of ``lines`` holds), STREAM (1: one strided stream per item),
    INNER_LO and INNER_HI (the last axis's outputs whose windows lie inside the row),
    MOST_ROWS (the most input rows an item reads).  ``runs[r]``: run r's output rows
    ``[runs[r, 0], runs[r, 1])`` and the input rows ``[runs[r, 2], runs[r, 3])`` they read.
    Output row g reads the rows of ``lines`` at ``lead_starts[lead_first[g]:lead_first[g +
    1]]`` (offsets from its run's first input row, times the pitch), in window order."""
    last = dims.shape[1] - 1
    n = dims[IN, last]
    out = dims[OUT, last]
    k = dims[KERNEL, last]
    s = dims[STRIDE, last]
    d = dims[DILATION, last]
    pitch = setup[PITCH]
    stream = setup[STREAM] == 1
    inner_lo, inner_hi = setup[INNER_LO], setup[INNER_HI]
    shift = first[last, 0]  # where output 0's window starts along the row
    in_size, out_size = x.shape[1], y.shape[1]
    x_flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    chunks = runs.shape[0]
    lines = np.empty(setup[MOST_ROWS] * pitch, x.dtype)
    for item in range(start, stop):
        p = item // chunks
        c = item % chunks
        g_lo, g_hi, row_lo, row_hi = runs[c, 0], runs[c, 1], runs[c, 2], runs[c, 3]
        rows = row_hi - row_lo
        x_at = p * in_size + row_lo * n
        # 1. the last axis, into lines
        if rows > 0 and inner_hi > inner_lo:
            if stream:
                _fold_row_run(lines, inner_lo, x_flat, x_at + inner_lo * s + shift,
                              (rows - 1) * pitch + inner_hi - inner_lo, s, k, d)
            else:
                for r in range(rows):
                    _fold_row_run(lines, r * pitch + inner_lo, x_flat,
                                  x_at + r * n + inner_lo * s + shift, inner_hi - inner_lo,
                                  s, k, d)
        for j in range(inner_lo):
            _fold_cut(lines, j, pitch, x_flat, x_at + first[last, j], n, rows, lo[last, j],
                      hi[last, j], d, empty_value)
        for j in range(inner_hi, out):
            _fold_cut(lines, j, pitch, x_flat, x_at + first[last, j], n, rows, lo[last, j],
                      hi[last, j], d, empty_value)
        # 2. the leading axes: each output row from the lines its window reads
        y_at = p * out_size + g_lo * out
        for g in range(g_lo, g_hi):
            at = lead_first[g]
            taps = lead_first[g + 1] - at
            if taps == 0:  # every leading tap is padding: the row's windows are empty
                for j in range(out):
                    y_flat[y_at + j] = empty_value
            else:
                fold_vectors(y_flat, y_at, lines, lead_starts[at:at + taps], taps, out)
            y_at += out
