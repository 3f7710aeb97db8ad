"""Window sums of channels-first planes at a cost that grows little with the window:
AveragePool and LpPool of float32, float16 and bfloat16 over windows too large for the row
sums (:mod:`poolfold.kernels.window_rows`), spatial rank 1 to 3.

**Along one axis**, over a row of terms padded with zeros (positions from the first window's
first tap, ``(out - 1) * s + (k - 1) * d + 1`` of them), either

- every window adds its k taps (``direct``: windows that overlap little), or
- van Herk / Gil-Werman block sums (``running``, windows that overlap much: the axes
  :func:`poolfold.ops.averaging.running_sum_axes` names): along each dilation phase the
  positions fall in blocks of k taps, from the row's first position; each position holds
  the sum from its block's start (a prefix) and to its block's end (a suffix), so a window
  is one whole block (a prefix) or the end of one block and the start of the next (a
  suffix plus a prefix).  Three additions per position whatever the window, and a window's
  sum adds its own values only, so an inf or a NaN stays in the windows that hold it.  The
  blocks start where the padded row starts, so these sums round as the row's start places
  them: poolfold.dask keeps such axes whole, as it does for the passes of
  :mod:`poolfold.kernels.window_sum`.

A leading axis is summed over whole rows of its inputs, :data:`COLUMNS` columns at a time
(each step a loop over the columns that vectorises).  The last axis is summed across rows:
a vector's worth of rows (16 float32 with AVX-512) is transposed in registers into lanes
(:func:`poolfold.kernels.simd.transpose_tile`), so that position j of every row is one
vector, summed there as a leading axis is, and transposed back; a long row goes by segments
that start at a block's start, so their sums are the whole row's.

**Accuracy.**  The sums are of the ``acc`` argument's type: float32 for averages, float64
for LpPool's |x| and x^2 (whose small values float32 would lose).  Along an axis a window's
sum is a tree of additions of depth at most k - 1 (a suffix of j taps plus a prefix of
k - j), and the axes nest, so the whole window's sum has depth at most ``sum(k_a - 1) <=
|V| - 1``: its error is within ``(|V| - 1) * u * sum|x|``, on the average within ``|V| * u
* max|x|``: the contract's bound for the accumulator's u (SEMANTICS.md, "Arithmetic"),
before Y's one rounding.  A float64 sum of float32 terms cannot overflow; a float32 one can,
where the average does not: a plane (1-D: a group of rows) with a float32 sum that is not
finite is summed again in float64, and the averages Y then holds as inf or NaN, only, are
stored from there (a window with an inf or a NaN gives the same either way): the kernels
mark such planes in ``flagged``, and the op layer runs them again with float64 sums and
``patch`` (the float64 kernel is compiled only when a call first needs it).  So each average
depends on its window's values alone, whichever planes are pooled together.  A NaN
is stored as one quiet NaN: LLVM may take a sum's operands in either order, and which of two
NaNs an x86 sum keeps depends on it.

**A plane** (each work item is one plane; 1-D rows a vector's worth of planes at a time):

- rank 1: the rows' terms staged with their padding, a segment of a vector's worth of rows
  at a time, then the last axis;
- rank 2: the first axis from X into rows of its sums laid out at the last axis's padded
  pitch (zeros in the padding), then the last axis over those rows;
- rank 3: the first axis from X into a plane of its sums, then each of its slices as a 2-D
  plane of terms.

The kernels trust their tables: :mod:`poolfold.ops.averaging` builds and bounds them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import kernel, uncounted_helper
from .half import narrow_to
from .simd import add_pair, add_vectors, transpose_tile, vector_width
from .window_sum import AVERAGE, ROOT, _term, widen

# Rows of ``dims`` (one column per spatial axis): input and output sizes, kernel, stride,
# dilation, the padding before the input, the positions a padded row holds, and whether the
# axis is summed by blocks (1) or window by window (0).
N, OUT, KERNEL, STRIDE, DILATION, PAD_BEGIN, PADDED, RUNNING = range(8)
DIM_ROWS = 8

# A leading axis is summed this many columns at a time: its partial sums then stay in the
# core's own cache (a 63-tap axis of 256 rows: 318 positions x 64 x 8 bytes, 160 KiB, in
# float64; half that in float32).
COLUMNS = 64
# The last axis is summed in segments of about this many window starts (a multiple of its
# blocks' span), a vector's worth of rows at a time.
SEGMENT = 256
# Vectors a row of lanes may hold beyond its positions: transposed tiles read and write a
# whole vector of positions; 16 float32 (AVX-512) is the widest.
SLACK = 16


def padded_length(out: int, k: int, s: int, d: int) -> int:
    """The positions a row of ``out`` windows of ``k`` taps at stride ``s`` and dilation
    ``d`` covers, from the first window's first tap."""
    return (out - 1) * s + (k - 1) * d + 1


# Entries of ``segments``, the last axis's segmentation (:func:`segments`).
STARTS, POSITIONS, BLOCK = range(3)


def segments(k: int, d: int, running: bool, padded: int) -> np.ndarray:
    """The last axis's segments, for the kernels (``segments``) and the op layer's scratch
    bound: STARTS, the window starts a segment holds (a multiple of the blocks' span ``k *
    d`` where the axis is summed by blocks, so that each segment's blocks are the row's);
    POSITIONS, the positions a segment spans, with a vector's worth of slack; BLOCK, the
    blocks' span (1 window by window)."""
    block = k * d if running else 1
    starts = max(block, SEGMENT // block * block)
    table = np.array([starts, min(padded, starts + (k - 1) * d + 1) + SLACK, block], np.int64)
    table.flags.writeable = False
    return table


@njit(inline="always")
def _add(dst, to, first, first_at, second, second_at, width):
    """``dst[to:][:width]`` = ``first[first_at:][:width] + second[second_at:][:width]``: one
    vector of lanes, or a run of columns (:func:`add_pair`)."""
    if width == vector_width(dst):
        add_vectors(dst, to, first, first_at, second, second_at)
    else:
        add_pair(dst, to, first, first_at, second, second_at, width)


@uncounted_helper
def _block_sums(dst, dst_at, dst_step, terms, partial, length, width, start, out, k, s, d,
                running):
    """Window sums along positions ``j < length`` of ``terms`` (``width`` columns each,
    position j at ``terms[j * width:]``): output o (window taps at ``start + o * s + t * d``,
    t < k) into ``dst[dst_at + o * dst_step:][:width]``.  By blocks (``running``, see the
    module's docstring; ``start`` a multiple of ``k * d``): prefixes into ``partial``,
    suffixes in place in ``terms``.  Else each window adds its taps in order."""
    u = np.uint64
    w = u(width)
    if not running:
        for o in range(out):
            at = u(start + o * s) * w
            to = u(dst_at + o * dst_step)
            if k == 1:
                for c in range(width):
                    dst[to + u(c)] = terms[at + u(c)]
                continue
            _add(dst, to, terms, at, terms, at + u(d) * w, width)
            for t in range(2, k):
                _add(dst, to, dst, to, terms, at + u(t * d) * w, width)
        return
    # Along each phase, the blocks' t-th positions one after the other: each block's sum
    # waits on its last step (an addition and a store read back), and the blocks do not
    # wait on each other (one block at a time, a 63-tap row of lanes took 4x as long).
    back = u(d) * w
    for phase in range(min(d, length)):
        chain = (length - 1 - phase) // d + 1  # positions of this phase
        for q in range(0, chain, k):  # prefixes, each from its block's start
            at = u(phase + q * d) * w
            for c in range(width):
                partial[at + u(c)] = terms[at + u(c)]
        for t in range(1, min(k, chain)):
            for q in range(t, chain, k):
                at = u(phase + q * d) * w
                _add(partial, at, partial, at - back, terms, at, width)
        for t in range(min(k, chain) - 2, -1, -1):  # suffixes, each to its block's end
            for q in range(t, chain - 1, k):
                at = u(phase + q * d) * w
                _add(terms, at, terms, at, terms, at + back, width)
    # output o's first tap start + o * s: its place b in its block, counted along
    r = start % d
    b = (start // d) % k
    for o in range(out):
        j0 = start + o * s
        last = u(j0 + (k - 1) * d) * w
        to = u(dst_at + o * dst_step)
        if b == 0:  # a whole block
            for c in range(width):
                dst[to + u(c)] = partial[last + u(c)]
        else:
            _add(dst, to, terms, u(j0) * w, partial, last, width)
        r += s
        while r >= d:
            r -= d
            b += 1
            if b == k:
                b = 0


@uncounted_helper
def _stage(buf, buf_at, src, src_at, n, width, c0, cw, pad, length, mark, p):
    """``buf[buf_at + j * cw + c]`` = the term of ``src[src_at + (j - pad) * width + c0 +
    c]`` for positions ``j < length`` whose input ``j - pad`` lies in ``[0, n)``, 0
    elsewhere."""
    u = np.uint64
    lo = min(max(0, pad), length)  # the positions holding inputs: [lo, hi)
    hi = max(lo, min(length, pad + n))
    for i in range(u(buf_at), u(buf_at + lo * cw)):
        buf[i] = 0.0
    if cw == 1 and width == 1:  # a row: one loop over its positions, which vectorises
        shift = src_at + c0 - pad - buf_at
        for i in range(u(buf_at + lo), u(buf_at + hi)):
            buf[i] = _term(widen(src[u(i + shift)]), mark, p)
    else:
        for j in range(lo, hi):
            row = u(buf_at + j * cw)
            at = u(src_at + (j - pad) * width + c0)
            for c in range(cw):
                buf[row + u(c)] = _term(widen(src[at + u(c)]), mark, p)
    for i in range(u(buf_at + hi * cw), u(buf_at + length * cw)):
        buf[i] = 0.0


@uncounted_helper
def _leading_axis(dst, dst_at, dst_pitch, src, src_at, n, width, cols, out, k, s, d, pad,
                  length, running, buf, partial, mark, p):
    """The sums along the leading axis of ``src[src_at:]`` viewed as ``(n, width)``, of its
    first ``cols`` columns, into ``dst[dst_at + o * dst_pitch + c]`` (o < out, c < cols),
    :data:`COLUMNS` columns at a time."""
    for c0 in range(0, cols, COLUMNS):
        cw = min(COLUMNS, cols - c0)
        _stage(buf, 0, src, src_at, n, width, c0, cw, pad, length, mark, p)
        _block_sums(dst, dst_at + c0, dst_pitch, buf, partial, length, cw, 0, out, k, s, d,
                    running)


@uncounted_helper
def _rows_of_slice(rows, src, src_at, n_a, n_l, out_a, k_a, s_a, d_a, pad_a, len_a, run_a,
                   pad_l, len_l, buf, partial, mark, p):
    """The sums along the axis before the last of ``src[src_at:]`` viewed as ``(n_a, n_l)``,
    output row o at ``rows[o * len_l + pad_l:]`` (the inputs the last axis's windows reach),
    the rest of each row of ``len_l`` positions zeros."""
    u = np.uint64
    cols = max(0, min(n_l, len_l - pad_l))
    for o in range(out_a):
        at = o * len_l
        for j in range(min(pad_l, len_l)):
            rows[u(at + j)] = 0.0
        for j in range(pad_l + cols, len_l):
            rows[u(at + j)] = 0.0
    if cols > 0:
        _leading_axis(rows, pad_l, len_l, src, src_at, n_a, n_l, cols, out_a, k_a, s_a, d_a,
                      pad_a, len_a, run_a, buf, partial, mark, p)


@uncounted_helper
def _store(y, y_at, y_pitch, sums, pitch, rows, count, lead, lead_at, factors, factors_at,
           mode, p, patch):
    """Y's ``rows`` rows (``y_pitch`` apart) of ``count`` outputs from ``sums`` (rows
    ``pitch`` apart): the sum times ``lead[lead_at + r] * factors[factors_at + o]``
    (AVERAGE), its p-th root (ROOT) or itself, a NaN as one quiet NaN, rounded to Y's
    type.  ``patch`` (a float64 redo of float32 averages): only the averages Y holds as inf
    or NaN are stored.  Whether an average's sum was not finite (the flag a redo follows;
    LpPool's float64 sums are never redone)."""
    u = np.uint64
    nan = np.nan
    if patch:
        for r in range(rows):
            at = u(r * pitch)
            to = u(y_at + r * y_pitch)
            scale = lead[lead_at + r]
            for o in range(count):
                held = widen(y[to + u(o)])
                if held - held == 0.0:  # finite: the float32 sum stands
                    continue
                v = np.float64(sums[at + u(o)]) * scale * factors[u(factors_at + o)]
                y[to + u(o)] = narrow_to(v if v == v else nan, y)
        return False
    flagged = 0
    for r in range(rows):
        at = u(r * pitch)
        to = u(y_at + r * y_pitch)
        if mode == AVERAGE:
            scale = lead[lead_at + r]
            for o in range(count):
                total = np.float64(sums[at + u(o)])
                # an integer or-reduction, which vectorises (a bool one did not)
                flagged |= np.int64(total - total != 0.0)
                v = total * scale * factors[u(factors_at + o)]
                y[to + u(o)] = narrow_to(v if v == v else nan, y)
        elif mode == ROOT and p == 2.0:
            for o in range(count):
                v = np.sqrt(sums[at + u(o)])
                y[to + u(o)] = narrow_to(v if v == v else nan, y)
        elif mode == ROOT and p != 1.0:
            root = 1.0 / p
            for o in range(count):
                v = sums[at + u(o)] ** root
                y[to + u(o)] = narrow_to(v if v == v else nan, y)
        else:
            for o in range(count):
                v = sums[at + u(o)]
                y[to + u(o)] = narrow_to(v if v == v else nan, y)
    return flagged != 0


@uncounted_helper
def _last_axis(y, y_at, y_pitch, src, src_at, pitch, rows, shift, out, k, s, d, running,
               starts, block, lanes, partial, lane_sums, sums, lead, lead_at, factors,
               factors_at, mode, p, patch):
    """Sum, scale and store the last axis of ``rows`` rows of padded terms (``src`` from
    ``src_at``, rows ``pitch`` apart, read up to a vector past the last row's end; position
    0 a block's start): output o's window from position ``shift + o * s``.  A vector's worth
    of rows at a time, transposed into lanes a segment at a time (``starts`` window starts
    from a multiple of ``block``: see :func:`segments`); Y's rows from ``y_at``, ``y_pitch``
    apart (``patch``: see :func:`_store`).  Whether a sum was not finite."""
    width = vector_width(lanes)
    flagged = False
    for g0 in range(0, rows, width):
        loads = min(width, rows - g0)
        o_a = 0
        while o_a < out:
            p0, o_b, length = _segment(o_a, shift, out, k, s, d, starts, block)
            for j0 in range(0, length, width):
                transpose_tile(lanes, j0 * width, width, min(width, length - j0), src,
                               src_at + g0 * pitch + p0 + j0, pitch, loads)
            count = o_b - o_a
            _block_sums(lane_sums, 0, width, lanes, partial, length, width,
                        shift + o_a * s - p0, count, k, s, d, running)
            step = (count + width - 1) // width * width  # sums' row pitch: whole tiles
            for o0 in range(0, count, width):
                transpose_tile(sums, o0, step, loads, lane_sums, o0 * width, width,
                               min(width, count - o0))
            flagged |= _store(y, y_at + g0 * y_pitch + o_a, y_pitch, sums, step, loads, count,
                              lead, lead_at + g0, factors, factors_at + o_a, mode, p, patch)
            o_a = o_b
    return flagged


@uncounted_helper
def _segment(o_a, shift, out, k, s, d, starts, block):
    """The segment of the last axis from output ``o_a`` on (output o's window from position
    ``shift + o * s``): its first position (a block's start), the output after its last, and
    the positions it spans."""
    p0 = (shift + o_a * s) // block * block
    o_b = min(out, max(o_a + 1, (p0 + starts - shift + s - 1) // s))
    return p0, o_b, shift + (o_b - 1) * s + (k - 1) * d + 1 - p0


@uncounted_helper
def _axis(dims, a):
    """Axis ``a``'s row of ``dims``: input and output sizes, kernel, stride, dilation, the
    padding before the input, the positions a padded row holds, and whether by blocks."""
    return (dims[N, a], dims[OUT, a], dims[KERNEL, a], dims[STRIDE, a], dims[DILATION, a],
            dims[PAD_BEGIN, a], dims[PADDED, a], dims[RUNNING, a] == 1)


@njit
def _lane_buffers(starts, segment, acc):
    """The last axis's scratch (see :func:`_last_axis`), of ``acc``'s type: a segment's
    positions in lanes and their prefixes, its outputs' sums in lanes and in rows."""
    t = acc.dtype
    return (np.empty(segment * SLACK, t), np.empty(segment * SLACK, t),
            np.empty((starts + SLACK) * SLACK, t), np.empty((starts + SLACK) * SLACK, t))


@uncounted_helper
def _rows_1d(x_flat, y_flat, r0, r1, dims, starts, segment, block, factors, mode, mark, p,
             rows, ones, lanes, partial, lane_sums, sums, patch):
    """Rows ``[r0, r1)`` of :func:`block_sums_1d`, a vector's worth at a time, in the type
    of the buffers; whether a sum was not finite."""
    n, out, k, s, d, pad, _, running = _axis(dims, 0)
    width = vector_width(lanes)
    flagged = False
    for g0 in range(r0, r1, width):
        count = min(width, r1 - g0)
        o_a = 0
        while o_a < out:
            q0, o_b, length = _segment(o_a, 0, out, k, s, d, starts, block)
            for r in range(count):
                _stage(rows, r * segment, x_flat, (g0 + r) * n, n, 1, 0, 1, pad - q0, length,
                       mark, p)
            flagged |= _last_axis(y_flat, g0 * out + o_a, out, rows, 0, segment, count,
                                  o_a * s - q0, o_b - o_a, k, s, d, running, starts, block,
                                  lanes, partial, lane_sums, sums, ones, 0, factors[0], o_a,
                                  mode, p, patch)
            o_a = o_b
    return flagged


@kernel(error_model="numpy")
def block_sums_1d(x, y, flagged, dims, segments, factors, mode, mark, p, acc, patch, start,
                  stop):
    """Pool 1-D rows ``[start, stop)`` of ``x`` (rows, input size) into ``y`` (rows, output
    size, Y's element type), a vector's worth of rows at a time, staged with their padding a
    segment at a time: AVERAGE multiplies each window's sum by ``factors[0, o]`` (the
    divisor's inverse), ROOT takes its p-th root.  ``mark`` selects the term of each element
    (poolfold.kernels.window_sum); ``dims`` see the module's rows; ``segments``, the
    segmentation of the rows (:func:`segments`); the sums are of ``acc``'s type.  A row of a
    group of rows with a sum that is not finite is marked in ``flagged``; with ``patch``,
    only the groups holding a marked row are summed, and only the averages Y holds as inf or
    NaN stored (a float64 redo of float32 sums: see the module's docstring)."""
    starts, segment, block = segments[STARTS], segments[POSITIONS], segments[BLOCK]
    x_flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    lanes, partial, lane_sums, sums = _lane_buffers(starts, segment, acc)
    rows = np.empty(SLACK * segment + SLACK, acc.dtype)
    ones = np.ones(SLACK, np.float64)  # the rows' leading factors
    for r0 in range(start, stop, SLACK):
        r1 = min(stop, r0 + SLACK)
        if patch:
            marked = False
            for r in range(r0, r1):
                marked |= flagged[r] != 0
            if marked:
                _rows_1d(x_flat, y_flat, r0, r1, dims, starts, segment, block, factors, mode,
                         mark, p, rows, ones, lanes, partial, lane_sums, sums, True)
        elif _rows_1d(x_flat, y_flat, r0, r1, dims, starts, segment, block, factors, mode,
                      mark, p, rows, ones, lanes, partial, lane_sums, sums, False):
            for r in range(r0, r1):
                flagged[r] = 1


@uncounted_helper
def _plane_2d(x_flat, x_at, y_flat, y_at, dims, starts, block, factors, mode, mark, p, buf,
              part, row_sums, lanes, partial, lane_sums, sums, patch):
    """One plane of :func:`block_sums_2d` in the type of the buffers; whether a sum was not
    finite."""
    n_a, out_a, k_a, s_a, d_a, pad_a, len_a, run_a = _axis(dims, 0)
    n_l, out_l, k_l, s_l, d_l, pad_l, len_l, run_l = _axis(dims, 1)
    _rows_of_slice(row_sums, x_flat, x_at, n_a, n_l, out_a, k_a, s_a, d_a, pad_a, len_a, run_a,
                   pad_l, len_l, buf, part, mark, p)
    return _last_axis(y_flat, y_at, out_l, row_sums, 0, len_l, out_a, 0, out_l, k_l, s_l, d_l,
                      run_l, starts, block, lanes, partial, lane_sums, sums, factors[0], 0,
                      factors[1], 0, mode, p, patch)


@njit
def _plane_buffers_2d(dims, starts, segment, acc):
    """:func:`_plane_2d`'s scratch of ``acc``'s type."""
    t = acc.dtype
    len_a = dims[PADDED, 0]
    rows = dims[OUT, 0] * dims[PADDED, 1] + SLACK
    return (np.empty(len_a * COLUMNS, t), np.empty(len_a * COLUMNS, t), np.empty(rows, t),
            *_lane_buffers(starts, segment, acc))


@kernel(error_model="numpy")
def block_sums_2d(x, y, flagged, dims, segments, factors, mode, mark, p, acc, patch, start,
                  stop):
    """Pool 2-D planes ``[start, stop)`` of ``x`` (planes, input size) into ``y`` (planes,
    output size): the first axis into rows at the last axis's padded pitch, then the last
    axis; AVERAGE multiplies each window's sum by ``factors[0, o0] * factors[1, o1]``.  See
    :func:`block_sums_1d` for the rest (``flagged`` marks planes)."""
    starts, segment, block = segments[STARTS], segments[POSITIONS], segments[BLOCK]
    x_flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    buf, part, row_sums, lanes, partial, lane_sums, sums = _plane_buffers_2d(
        dims, starts, segment, acc)
    for plane in range(start, stop):
        if patch and flagged[plane] == 0:
            continue
        if _plane_2d(x_flat, plane * x.shape[1], y_flat, plane * y.shape[1], dims, starts,
                     block, factors, mode, mark, p, buf, part, row_sums, lanes, partial,
                     lane_sums, sums, patch):
            flagged[plane] = 1


@uncounted_helper
def _plane_3d(x_flat, x_at, y_flat, y_at, dims, starts, block, factors, mode, mark, p, lead,
              buf, part, row_sums, sums0, lanes, partial, lane_sums, sums, patch):
    """One plane of :func:`block_sums_3d` in the type of the buffers; whether a sum was not
    finite."""
    n_0, out_0, k_0, s_0, d_0, pad_0, len_0, run_0 = _axis(dims, 0)
    n_a, out_a, k_a, s_a, d_a, pad_a, len_a, run_a = _axis(dims, 1)
    n_l, out_l, k_l, s_l, d_l, pad_l, len_l, run_l = _axis(dims, 2)
    slice_in = n_a * n_l
    _leading_axis(sums0, 0, slice_in, x_flat, x_at, n_0, slice_in, slice_in, out_0, k_0, s_0,
                  d_0, pad_0, len_0, run_0, buf, part, mark, p)
    flagged = False
    for o0 in range(out_0):
        for o in range(out_a):
            lead[o] = factors[0, o0] * factors[1, o]
        _rows_of_slice(row_sums, sums0, o0 * slice_in, n_a, n_l, out_a, k_a, s_a, d_a, pad_a,
                       len_a, run_a, pad_l, len_l, buf, part, _SUMS, p)
        flagged |= _last_axis(y_flat, y_at + o0 * out_a * out_l, out_l, row_sums, 0, len_l,
                              out_a, 0, out_l, k_l, s_l, d_l, run_l, starts, block, lanes,
                              partial, lane_sums, sums, lead, 0, factors[2], 0, mode, p, patch)
    return flagged


@njit
def _plane_buffers_3d(dims, starts, segment, acc):
    """:func:`_plane_3d`'s scratch of ``acc``'s type."""
    t = acc.dtype
    longest = max(dims[PADDED, 0], dims[PADDED, 1])
    rows = dims[OUT, 1] * dims[PADDED, 2] + SLACK
    sums0 = dims[OUT, 0] * dims[N, 1] * dims[N, 2]
    return (np.empty(longest * COLUMNS, t), np.empty(longest * COLUMNS, t), np.empty(rows, t),
            np.empty(sums0, t), *_lane_buffers(starts, segment, acc))


@kernel(error_model="numpy")
def block_sums_3d(x, y, flagged, dims, segments, factors, mode, mark, p, acc, patch, start,
                  stop):
    """Pool 3-D planes ``[start, stop)`` of ``x`` into ``y``: the first axis into a plane of
    its sums, then each of its slices as :func:`block_sums_2d` pools a plane of terms;
    AVERAGE multiplies each window's sum by the product of its axes' ``factors[axis, o]``.
    See :func:`block_sums_1d` for the rest (``flagged`` marks planes)."""
    starts, segment, block = segments[STARTS], segments[POSITIONS], segments[BLOCK]
    x_flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    lead = np.empty(dims[OUT, 1], np.float64)
    buf, part, row_sums, sums0, lanes, partial, lane_sums, sums = _plane_buffers_3d(
        dims, starts, segment, acc)
    for plane in range(start, stop):
        if patch and flagged[plane] == 0:
            continue
        if _plane_3d(x_flat, plane * x.shape[1], y_flat, plane * y.shape[1], dims, starts,
                     block, factors, mode, mark, p, lead, buf, part, row_sums, sums0, lanes,
                     partial, lane_sums, sums, patch):
            flagged[plane] = 1


# The term marker of sums already taken (window_sum's VALUE: each element as it is).
_SUMS = np.empty(0, np.int8)
