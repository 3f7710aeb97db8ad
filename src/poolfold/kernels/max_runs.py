"""Window maximum of long windows by streamed running maxima: channels-first planes of any
rank, without Indices, at dilation 1, whatever the window's length.

Each axis is reduced by van Herk / Gil-Werman runs, streamed (:func:`_stream_axis`).  The
rows along the axis (each a contiguous run of everything after it) are split into blocks of
k rows from the first; a window of k rows spans at most two blocks, so it is the first
maximum of its first row's *suffix* (the rows from it to its block's end) then its last
row's *prefix* (the rows from its block's start to it).  The rows are read in order: a
block's suffixes (k rows of scratch) when the first window starting in it is reached, and
one running prefix row that follows the windows' last rows.  That is three folds a row,
each a whole row in vectors (:func:`poolfold.kernels.simd.fold_pair`), and every read but
the first from cache.

The last axis goes first, as window order asks (the first maximum of each row of a window,
then the first of those rows'), and its rows are not contiguous: the slab is transposed, by
square tiles in registers (:func:`poolfold.kernels.simd.transpose_tile`), so that the last
axis becomes the rows' axis, reduced, and transposed back.  Then each leading axis, from
the last to the first, the slab shrinking to the outputs as it goes.

A work item is ``ROWS_PER_ITEM`` outputs along the first axis of one plane: the input rows
their windows reach, and no others; in 1-D, a block of planes (each a row), transposed
together.  A window with no tap inside the input yields
``empty_value``.  The kernel never validates: the op layer has checked every shape and sized
the scratch (:func:`poolfold.ops.max_pool.runs_tables`).
"""

from __future__ import annotations

import numpy as np

from . import helper, kernel, read_only
from .simd import fold_pair, transpose_tile, vector_width

# Rows of the per-axis table ``axes``: input and output extents, window, stride, and the
# padding before the first input element.
IN, OUT, KERNEL, STRIDE, PAD = range(5)
AXIS_ROWS = 5
# Entries of ``setup``: the work items, and each scratch buffer's elements.
ROWS_PER_ITEM, ITEMS_PER_PLANE, PLANES_PER_ITEM, STAGE, SUFFIXES, PREFIX = range(6)
SETUP_SIZE = 6


@helper
def _transpose(dst, dst_at, src, src_at, rows, cols):
    """``src[src_at:]``, ``rows`` rows of ``cols`` elements, into ``dst[dst_at:]`` as
    ``cols`` rows of ``rows``: square tiles of a vector's lanes, the last tile along each
    side overlapping the one before it (an element written twice is the same element);
    element by element where a side is shorter than a tile."""
    side = vector_width(src)
    if rows < side or cols < side:
        for r in range(rows):
            for c in range(cols):
                dst[dst_at + c * rows + r] = src[src_at + r * cols + c]
        return
    for r0 in range(0, rows, side):
        r = min(r0, rows - side)
        for c0 in range(0, cols, side):
            c = min(c0, cols - side)
            transpose_tile(dst, dst_at + c * rows + r, rows, side, src, src_at + r * cols + c,
                           cols, side)


@helper
def _stream_axis(src, src_at, n, width, k, s, pad, out_n, dst, dst_at, dst_pitch, suffixes,
                 prefix, empty_value):
    """Output o, for o < ``out_n``, of an axis of ``n`` rows of ``width`` elements at
    ``src[src_at:]``, into ``dst[dst_at + o*dst_pitch:][:width]``: the first maximum of rows
    ``[o*s - pad, o*s - pad + k)`` that lie inside, or ``empty_value`` where none does (see
    the module's doc).  ``suffixes`` holds ``min(k, n)`` rows, ``prefix`` one.  (Cut into
    strips whose suffixes stay in the first-level cache, the rows took longer: 2-D 63x63
    over (4,16,256,256), 2.8 ms against 2.2.)"""
    held_block = -1  # the first row of the block whose suffixes are held
    last_row = -1  # the last row folded into the running prefix
    block = 0  # ...and the first row of its block
    start = -pad  # the window's first row, inside or not
    for o in range(out_n):
        lo = max(start, 0)
        hi = min(start + k - 1, n - 1)  # the window's first and last rows inside
        start += s
        to = dst_at + o * dst_pitch
        if hi < lo:
            for i in range(width):
                dst[to + i] = empty_value
            continue
        while last_row < hi:  # hi never goes back: the prefix follows it
            last_row += 1
            row = src_at + last_row * width
            if last_row == block + k:
                block = last_row
            if last_row == block:
                fold_pair(prefix, 0, src, row, src, row, width)  # a copy
            else:
                fold_pair(prefix, 0, prefix, 0, src, row, width)
        # lo lies in hi's block or the one before (a window spans at most k rows)
        lo_block = block if lo >= block else block - k
        if lo == block:  # from its block's start: the prefix alone
            fold_pair(dst, to, prefix, 0, prefix, 0, width)
            continue
        if held_block != lo_block:
            held_block = lo_block
            end = min(lo_block + k, n) - 1
            here = (end - lo_block) * width
            fold_pair(suffixes, here, src, src_at + end * width, src, src_at + end * width,
                      width)
            for r in range(end - 1, lo_block - 1, -1):
                here -= width
                fold_pair(suffixes, here, src, src_at + r * width, suffixes, here + width,
                          width)
        held = (lo - lo_block) * width
        if lo_block == block:  # cut by the axis's end, inside one block: the suffix alone
            fold_pair(dst, to, suffixes, held, suffixes, held, width)
        else:  # the suffix of lo, then the prefix of hi
            fold_pair(dst, to, suffixes, held, prefix, 0, width)


@kernel()
def max_runs(x, y, axes, setup, empty_value, start, stop):
    """Fill ``y`` for the work items ``[start, stop)``.

    x, y : (planes, S_in), (planes, S_out), value views of channels-first planes
    axes : (AXIS_ROWS, rank) int64, per axis IN, OUT, KERNEL, STRIDE and PAD (above)
    setup : (SETUP_SIZE,) int64: a work item is PLANES_PER_ITEM whole planes of rank 1, or
        ROWS_PER_ITEM outputs along the first axis of one plane, ITEMS_PER_PLANE items a
        plane; then the elements of each of the two stages, of the suffixes and of the
        prefix row (sized by the op layer for the largest item)
    """
    rank = axes.shape[1]
    last = rank - 1
    planes, plane_size = x.shape
    out_plane = y.shape[1]
    flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    stage_a = np.empty(setup[STAGE], x.dtype)
    stage_b = np.empty(setup[STAGE], x.dtype)
    suffixes = np.empty(setup[SUFFIXES], x.dtype)
    prefix = np.empty(setup[PREFIX], x.dtype)
    in0, out0 = axes[IN, 0], axes[OUT, 0]
    k0, s0, pad0 = axes[KERNEL, 0], axes[STRIDE, 0], axes[PAD, 0]
    inner0 = plane_size // in0  # elements of one input row along the first axis
    out_inner0 = out_plane // out0
    width = axes[IN, last]
    out_last = axes[OUT, last]
    k_last, s_last, pad_last = axes[KERNEL, last], axes[STRIDE, last], axes[PAD, last]
    # a last axis the windows leave as it is: the leading axes read the input in place
    same_last = k_last == 1 and s_last == 1 and pad_last == 0 and out_last == width
    per_item = setup[ROWS_PER_ITEM]
    items_per_plane = setup[ITEMS_PER_PLANE]
    for item in range(start, stop):
        if rank == 1:  # a block of planes, each one row: their rows transposed together
            p0 = item * setup[PLANES_PER_ITEM]
            lines = min(setup[PLANES_PER_ITEM], planes - p0)
            _transpose(stage_a, 0, flat, p0 * plane_size, lines, width)
            _stream_axis(read_only(stage_a), 0, width, lines, k_last, s_last, pad_last,
                         out_last, stage_b, 0, lines, suffixes, prefix, empty_value)
            _transpose(y_flat, p0 * out_plane, read_only(stage_b), 0, out_last, lines)
            continue
        p = item // items_per_plane
        o0 = (item % items_per_plane) * per_item
        o1 = min(o0 + per_item, out0)
        r_lo = min(max(o0 * s0 - pad0, 0), in0)
        r_hi = max(min((o1 - 1) * s0 - pad0 + k0, in0), r_lo)
        y_at = p * out_plane + o0 * out_inner0
        if r_hi == r_lo:  # every window of the item lies in the padding
            for i in range((o1 - o0) * out_inner0):
                y_flat[y_at + i] = empty_value
            continue
        rows = r_hi - r_lo
        lines = rows * inner0 // width  # the slab's rows along the last axis
        x_at = p * plane_size + r_lo * inner0
        src, src_at = flat, x_at
        if not same_last:  # the last axis: transposed, reduced as rows, transposed back
            _transpose(stage_a, 0, flat, x_at, lines, width)
            _stream_axis(read_only(stage_a), 0, width, lines, k_last, s_last, pad_last,
                         out_last, stage_b, 0, lines, suffixes, prefix, empty_value)
            _transpose(stage_a, 0, read_only(stage_b), 0, out_last, lines)
            src, src_at = read_only(stage_a), 0
        # then each leading axis, the last first: units of n rows of `inner` elements
        inner = out_last
        units = lines
        to_b = True  # the stage the next leading axis writes: b, then a, then b...
        for a in range(last - 1, -1, -1):
            n = rows if a == 0 else axes[IN, a]
            units //= n
            if a == 0:
                _stream_axis(src, src_at, n, inner, k0, s0, pad0 + r_lo - o0 * s0, o1 - o0,
                             y_flat, y_at, inner, suffixes, prefix, empty_value)
                continue
            out_n = axes[OUT, a]
            dst = stage_b if to_b else stage_a
            for u in range(units):
                _stream_axis(src, src_at + u * n * inner, n, inner, axes[KERNEL, a],
                             axes[STRIDE, a], axes[PAD, a], out_n, dst, u * out_n * inner,
                             inner, suffixes, prefix, empty_value)
            inner *= out_n
            # the next axis reads what this one wrote, and writes the other stage
            src, src_at = read_only(dst), 0
            to_b = not to_b
