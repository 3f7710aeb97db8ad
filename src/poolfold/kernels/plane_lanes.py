"""Window maximum over small channels-first planes, many planes at once as the lanes.

A 7x7 or 14x14 plane is too small for any loop over it to vectorise well: the row kernels
spend 150-230 ns a plane on its few short rows (3x3 over (1,832,7,7): 0.09 ms on one
thread, where onnxruntime's channel-blocked kernel takes 0.045).  So a block of ``P``
consecutive planes (:data:`poolfold.kernels.simd.UNROLL` vectors of lanes: 64 float32) is
turned into lanes, position m of plane l to ``lanes_in[m*P + l]``, by square tiles
transposed in registers (:func:`poolfold.kernels.simd.transpose_tile`); every output then
folds its window's in-bounds taps, whole runs of ``P`` lanes each
(:func:`poolfold.kernels.simd.fold_taps`: four vectors in flight, in window order, so the
first maximum or the first NaN is kept as the other kernels keep it); and the outputs'
lanes are turned back into Y's planes the same way.  The block's lanes sit in cache between
the three steps.  Windows that tile each row along the last axis (2x2 at stride 2) are
folded along it first, where the planes lie, so that half as much is turned into lanes.

Sums over small planes (AveragePool, LpPool: :func:`sum_plane_lanes`) take the same lanes
and hand them to the row sums' kernel (:func:`poolfold.kernels.window_rows.window_rows`) as
one channels-last sample of ``P`` channels: its loops then run over whole vectors of lanes
rather than rows of a few elements, and since that kernel adds each window's values in the
same order in either layout, the sums are bit for bit those of the planes pooled one by one.

For the maximum, the taps of every output are a table (``starts``, ``tap_first``) built
once per plan (:func:`poolfold.ops.max_pool.plane_lanes_tables`): the in-bounds input
positions of output o's window, in window order, are ``starts[tap_first[o]:tap_first[o +
1]]``, each already multiplied by ``P``.  Any rank, stride, dilation, padding and ceil mode
is such a table; its size (outputs times taps) is why only small planes come here.  The
kernels never validate: the op layer has checked every shape and table.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import kernel, read_only
from .ordering import is_nan
from .max_rows import fold_at_stride
from .simd import UNROLL, fold_row_groups, fold_taps, transpose_tile, vector_width
from .window_rows import window_rows
from .window_sum import OUT


@njit(inline="always")
def _to_lanes(lanes, x_flat, p0, planes, n, block):
    """Planes ``[p0, p0 + planes)`` of ``n`` elements each (planes <= ``block``) into
    ``lanes``: element m of plane l to ``lanes[m*block + l]``.  Lanes from ``planes`` on are
    left as they were: no output of them is written back.  Returns whether the planes hold
    a NaN."""
    width = vector_width(lanes)
    nan = False
    if n >= width:
        for g in range(0, planes, width):
            loads = min(width, planes - g)
            for m0 in range(0, n, width):
                m = min(m0, n - width)  # the last tile overlaps the one before it
                nan |= transpose_tile(lanes, m * block + g, block, width, x_flat,
                                      (p0 + g) * n + m, n, loads)
    else:  # planes shorter than a tile
        for m in range(n):
            for lane in range(planes):
                v = x_flat[(p0 + lane) * n + m]
                nan |= is_nan(v)
                lanes[m * block + lane] = v
    return nan


@njit(inline="always")
def _from_lanes(y_flat, p0, planes, n_out, lanes, block):
    """The inverse of :func:`_to_lanes` for the first ``planes`` lanes of ``n_out``
    positions."""
    width = vector_width(lanes)
    if n_out >= width:
        for g in range(0, planes, width):
            stores = min(width, planes - g)
            for o0 in range(0, n_out, width):
                o = min(o0, n_out - width)
                transpose_tile(y_flat, (p0 + g) * n_out + o, n_out, stores, lanes,
                               o * block + g, block, width)
    else:
        for lane in range(planes):
            for o in range(n_out):
                y_flat[(p0 + lane) * n_out + o] = lanes[o * block + lane]


@njit(inline="always")
def _fold_groups(y_flat, to, folded, rows, width, k, s, starts):
    """Output rows j < ``rows`` of ``width``, ``y_flat[to + j*width:]``: the first maximum
    of the folded rows ``j*s + t``, t < k (see :func:`max_plane_lanes`), a vector a row
    while its store stays inside these rows, the last ones by narrower folds."""
    spill = (vector_width(folded) + width - 1) // width - 1  # the rows a store runs into
    whole = max(rows - spill, 0)
    fold_row_groups(y_flat, to, folded, 0, whole, width, s * width, width, k)
    for j in range(whole, rows):
        for t in range(k):
            starts[t] = (j * s + t) * width
        fold_taps(y_flat, to + j * width, folded, starts, 0, k, width, False)


@kernel()
def max_plane_lanes(x, y, starts, tap_first, block, row_fold, empty_value, start, stop):
    """Fill planes ``[start*block, stop*block)`` of ``y`` (planes, output size) from ``x``
    (planes, input size), ``block`` planes (a multiple of a vector's lanes) a work item (see
    the module's docstring).

    ``row_fold`` (taps, stride, dilation along the last axis; taps 0 for none): windows
    that tile each row along the last axis, none reaching past it (a 2x2 window at stride 2
    over rows of even length), are folded along it first, where the planes lie, as one
    strided stream over the block's rows: the lanes then hold ``row_fold``'s outputs, half
    the input for 2x2 at stride 2, and ``starts`` tap them.  Folding each window's row of
    taps first, then those rows in order, keeps the first maximum in window order.

    Then ``row_fold[3:6]`` (taps and stride along the first of two axes, and the folded
    rows' width; taps 0 for none): where the windows also tile the planes' columns, each
    within one stride, and the folded rows fit a vector, the folded rows are folded in
    groups straight into Y, a vector a row, and nothing goes into lanes (2x2 at stride 2
    over (1,832,14,14), two threads: 24-36 us by lanes, where onnxruntime takes 32)."""
    planes, n = x.shape
    n_out = y.shape[1]
    x_flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    fold_k, fold_s, fold_d = row_fold[0], row_fold[1], row_fold[2]
    n_lanes = n // fold_s if fold_k > 0 else n  # positions a plane has in the lanes
    group_k, group_s, width = row_fold[3], row_fold[4], row_fold[5]
    # (a vector's spare past the last row: the row groups read whole vectors)
    folded = np.empty(block * n_lanes + vector_width(x) if fold_k > 0 else 0, x.dtype)
    group_starts = np.empty(max(group_k, 1), np.int64)
    lanes_in = np.empty(max(n_lanes, 1) * block, x.dtype)
    lanes_out = np.empty(n_out * block, x.dtype)
    for item in range(start, stop):
        p0 = item * block
        count = min(block, planes - p0)
        if fold_k > 0:
            fold_at_stride(folded, 0, x_flat, p0 * n, count * n_lanes, fold_s, fold_k,
                           fold_d)
            if group_k > 0:
                _fold_groups(y_flat, p0 * n_out, folded, count * (n_out // width), width,
                             group_k, group_s, group_starts)
                continue
            nan = _to_lanes(lanes_in, folded, 0, count, n_lanes, block)
        else:
            nan = _to_lanes(lanes_in, x_flat, p0, count, n, block)
        for o in range(n_out):
            first = tap_first[o]
            taps = tap_first[o + 1] - first
            if taps == 0:  # every tap is padding: the window is empty
                for lane in range(block):
                    lanes_out[o * block + lane] = empty_value
            elif nan:
                fold_taps(lanes_out, o * block, lanes_in, starts, first, taps, block, False)
            else:
                fold_taps(lanes_out, o * block, lanes_in, starts, first, taps, block, True)
        _from_lanes(y_flat, p0, count, n_out, lanes_out, block)


@kernel(error_model="numpy")
def sum_plane_lanes(x, y, axes, taps, axis_inverse, plane_factors, mode, mark, p, block,
                    start, stop):
    """Fill planes ``[start*block, stop*block)`` of ``y`` (planes, output size, in Y's own
    element type) with the window sums of ``x`` (planes, input size), ``block`` planes a work
    item: turned into lanes, summed by :func:`window_rows` as one channels-last sample of
    ``block`` channels (its arguments after X and Y as :func:`window_rows` takes them), and
    turned back (see the module's docstring)."""
    planes, n = x.shape
    n_out = y.shape[1]
    x_flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    rows = n_out // axes[OUT, axes.shape[1] - 1]  # output rows of one plane
    # zeroed once: the lanes past a partial last block hold zeros or an earlier block's
    # values, summed but never written back
    lanes_in = np.zeros(n * block, x.dtype)
    lanes_out = np.empty(n_out * block, y.dtype)
    for item in range(start, stop):
        p0 = item * block
        count = min(block, planes - p0)
        _to_lanes(lanes_in, x_flat, p0, count, n, block)
        # the types of a direct call (X read-only, no literal start): numba compiles the row
        # kernel once for both, not again inside this kernel (10 of its 15 s of compile)
        window_rows(read_only(lanes_in), lanes_out, axes, taps, axis_inverse, plane_factors,
                    block, mode, mark, p, np.int64(0), rows)
        _from_lanes(y_flat, p0, count, n_out, lanes_out, block)


def block_planes(value_type: np.dtype, planes: int, threads: int) -> int:
    """``P``, the planes of one work item, for the kernel's view of a type
    (:func:`poolfold.dtypes.value_type`): :data:`UNROLL` vectors of lanes, or fewer where
    that leaves a thread without a block (64 float32 planes on 2 threads: 2 blocks of 32,
    0.053 ms against 0.066 in one block of 64, 3x3 over 32x32)."""
    from numba import from_dtype

    from .simd import _lanes
    width = _lanes(from_dtype(np.dtype(value_type)))
    vectors = -(-planes // (threads * width))  # each thread's share, in vectors
    return width * max(1, min(UNROLL, vectors))
