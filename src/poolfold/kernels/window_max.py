"""Window maximum over planes of any spatial rank.

A plane is one row of ``x`` (shape ``(planes, prod(in_shape))``, row-major spatial layout).
For every output position the kernel visits the in-bounds taps of its window in row-major
order of the kernel offsets, as the :class:`poolfold.geometry.TapTable` lists them, and keeps
the first NaN, else the first maximum.  Nothing is materialised: taps are read in place.

The kernels do not validate; the op layer has checked every shape and table before calling.
"""

from __future__ import annotations

import numpy as np
from numba import types

from . import helper, helper_overload, kernel, read_only

from .odometer import next_in_ranges, next_in_shape
from .ordering import is_nan, order_key
from .words import EVEN_IS_HIGH, element_bits, element_of_word


@helper
def _max_inside(xp, origin, window_taps):
    """Offset of the winning tap of a window lying wholly inside the plane."""
    # Branch-free running maximum: about 5x faster than stopping at a NaN, whose
    # unpredictable branches stall.  NaN is rare, so it is only noted here and its first
    # occurrence looked up afterwards.
    best = origin
    best_key = order_key(xp[origin])
    seen_nan = is_nan(xp[origin])
    for t in range(1, window_taps.size):
        offset = origin + window_taps[t]
        v = xp[offset]
        key = order_key(v)
        greater = key > best_key
        best = offset if greater else best
        best_key = key if greater else best_key
        seen_nan |= is_nan(v)
    if seen_nan:
        for t in range(window_taps.size):
            if is_nan(xp[origin + window_taps[t]]):
                return origin + window_taps[t]
    return best


@helper
def _max_on_border(xp, o, j, first, lo, hi, in_shape, dilations):
    """Offset of the winning in-bounds tap of a window that crosses the border, or -1.

    ``o`` is the output coordinate; ``j`` is scratch space for the kernel offsets."""
    rank = in_shape.size
    last = rank - 1
    for a in range(rank):
        if lo[a, o[a]] >= hi[a, o[a]]:
            return -1  # every tap is padding
    for a in range(last):
        j[a] = lo[a, o[a]]
    row_first = first[last, o[last]]
    d_last = dilations[last]
    j_lo = lo[last, o[last]]
    j_hi = hi[last, o[last]]
    best = -1
    best_key = order_key(xp[0])
    while True:
        row = 0
        for a in range(last):
            row = row * in_shape[a] + first[a, o[a]] + j[a] * dilations[a]
        row = row * in_shape[last] + row_first
        if best < 0:
            best = row + j_lo * d_last
            best_key = order_key(xp[best])
            if is_nan(xp[best]):
                return best
        # Branch-free selects: data-dependent branches here mispredict about half the time.
        seen_nan = False
        for jl in range(j_lo, j_hi):
            offset = row + jl * d_last
            v = xp[offset]
            key = order_key(v)
            greater = key > best_key
            best = offset if greater else best
            best_key = key if greater else best_key
            seen_nan |= is_nan(v)
        if seen_nan:  # rare: the first NaN of this row wins
            for jl in range(j_lo, j_hi):
                if is_nan(xp[row + jl * d_last]):
                    return row + jl * d_last
        if not next_in_ranges(j, o, lo, hi, last):  # next row of taps
            return best


@helper
def reported_index(offset, column_major, in_shape, in_strides):
    """The reported index of an in-plane offset: itself (row-major), or first-axis-fastest."""
    if not column_major:
        return offset
    index = 0
    weight = 1
    for a in range(in_shape.size):
        index += (offset // in_strides[a]) * weight
        offset %= in_strides[a]
        weight *= in_shape[a]
    return index


@kernel()
def window_max(x, y, indices, first, lo, hi, in_shape, out_shape, kernel, dilations,
               column_major, empty_value, in_strides, window_taps, scratch, start, stop):
    """Fill ``y[p, q]`` (and ``indices[p, q]`` unless ``indices`` is None) for every plane
    ``p`` in ``[start, stop)`` and flat output position ``q``.

    x, y, indices : (planes, S_in), (planes, S_out), (planes, S_out) int64 or None
    first, lo, hi : the tap table, (rank, max output size)
    in_shape, out_shape, kernel, dilations, in_strides : (rank,) int64
    column_major : report indices first-axis-fastest (storage_order 1) instead of row-major
    empty_value : what a window with no in-bounds tap yields (its index is -1)
    window_taps : offsets of a whole window's taps from its first, in window order
        (``poolfold.geometry.WindowPlan.window_offsets``)
    scratch : (planes, 2, rank) int64, each plane's output coordinate and border walk

    Its arrays all come from numpy: an array made in here would compile numba's allocation
    code on the first call (a quarter of this kernel's compile time).
    """
    rank = in_shape.size
    last = rank - 1
    plane_size = x.shape[1]
    out_last = out_shape[last]
    out_rows = y.shape[1] // out_last if out_last else 0
    # Output positions along the last axis whose windows lie wholly inside it: a contiguous
    # run [inner_lo, inner_hi), walked with a constant step (no table reads in the hot loop).
    inner_lo = out_last
    inner_hi = out_last
    for ol in range(out_last):
        if lo[last, ol] == 0 and hi[last, ol] == kernel[last]:
            if inner_lo == out_last:
                inner_lo = ol
            inner_hi = ol + 1
    step_last = first[last, 1] - first[last, 0] if out_last > 1 else 0
    for p in range(start, stop):
        xp = x[p]
        yp = y[p]
        o = scratch[p, 0]  # output coordinate
        j = scratch[p, 1]  # the border walk's kernel offsets
        for a in range(rank):
            o[a] = 0
        for row in range(out_rows):
            # The outer axes are fixed along a row of outputs.
            row_inside = True
            row_origin = 0
            for a in range(last):
                if lo[a, o[a]] != 0 or hi[a, o[a]] != kernel[a]:
                    row_inside = False
                row_origin += first[a, o[a]] * in_strides[a]
            q0 = row * out_last
            if row_inside and inner_lo < inner_hi:
                origin = row_origin + first[last, inner_lo]
                for ol in range(inner_lo, inner_hi):
                    best = _max_inside(xp, origin, window_taps)
                    origin += step_last
                    yp[q0 + ol] = xp[best]
                    if indices is not None:
                        indices[p, q0 + ol] = p * plane_size + reported_index(best, column_major,
                                                                       in_shape, in_strides)
                border_lo, border_hi = inner_lo, inner_hi
            else:
                border_lo, border_hi = out_last, out_last
            for ol in range(out_last):
                if border_lo <= ol < border_hi:
                    continue
                o[last] = ol
                best = _max_on_border(xp, o, j, first, lo, hi, in_shape, dilations)
                if best < 0:
                    yp[q0 + ol] = empty_value
                    if indices is not None:
                        indices[p, q0 + ol] = -1
                else:
                    yp[q0 + ol] = xp[best]
                    if indices is not None:
                        indices[p, q0 + ol] = p * plane_size + reported_index(best, column_major,
                                                                       in_shape, in_strides)
            next_in_shape(o, out_shape, last)  # next row of outputs


# Index arrays are None when the call wants no Indices: numba compiles a kernel for each type
# of its arguments and drops the branches an ``is None`` test on an argument rules out, so a
# call without Indices compiles none of the index-keeping code.  Scratch for positions goes
# through the functions below, which keep None as None.

def _rows_of(a, i):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


def _part_of(a, lo, hi):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


def _positions_like(indices, rows, capacity):  # pragma: no cover - replaced inside numba
    raise NotImplementedError


@helper_overload(_rows_of)
def _rows_of_overload(a, i):
    """``a[i]``, or None for a None ``a``."""
    if isinstance(a, types.NoneType):
        return lambda a, i: None
    return lambda a, i: a[i]


@helper_overload(_part_of)
def _part_of_overload(a, lo, hi):
    """``a[lo:hi]``, or None for a None ``a``."""
    if isinstance(a, types.NoneType):
        return lambda a, lo, hi: None
    return lambda a, lo, hi: a[lo:hi]


@helper_overload(_positions_like)
def _positions_like_overload(indices, rows, capacity):
    """Scratch for ``rows`` x ``capacity`` positions, or None when ``indices`` is None."""
    if isinstance(indices, types.NoneType):
        return lambda indices, rows, capacity: None
    return lambda indices, rows, capacity: np.empty((rows, capacity), np.int64)


# Constant arguments are passed as ``np.int64(c)``: numba compiles a helper once more for each
# literal value it is called with, and each copy cost seconds of first-call compile time.

# The loops below are the whole cost of a separable pass.  Each is a straight loop over a
# plane with no branches, indexing views that were sliced to line up beforehand, which LLVM
# vectorises (about 0.1 ns per element).  Indexing ``src[i + shift]`` with a run-time shift
# instead, or folding the variants into one loop with mode flags, keeps it scalar: 8x slower.

@helper
def _copy(src, dst):
    """``dst[i] = src[i]``: a loop, not ``dst[:] = src``, whose shape check compiles numba's
    error formatting into the kernel (seconds of first-call compile time)."""
    for i in range(dst.size):
        dst[i] = src[i]


@helper
def _beats(v, held):
    """Whether a later tap ``v`` replaces the ``held`` one: it is greater, or it is the first
    NaN (a held NaN stays).  As two comparisons and no branch: "not ``v <= held``" is true
    when v is greater or either is NaN, and ``held == held`` when held is no NaN."""
    held_key = order_key(held)
    return (not (order_key(v) <= held_key)) & (held_key == held_key)


@helper
def _keep_first_max(later, held):
    """``held[i] = later[i]`` where that beats it: greater, or the first NaN."""
    for i in range(held.size):
        v = later[i]
        h = held[i]
        take = _beats(v, h)
        held[i] = v if take else h


@helper
def _first_max_of_two(earlier, later, held):
    """``held[i]`` = ``later[i]`` where it beats ``earlier[i]`` (greater, or the first NaN),
    else ``earlier[i]``."""
    for i in range(held.size):
        v = later[i]
        h = earlier[i]
        take = _beats(v, h)
        held[i] = v if take else h


@helper
def _first_max_of_three(earlier, middle, later, held):
    """:func:`_first_max_of_two` over three taps in one sweep (the common 3-wide kernel)."""
    for i in range(held.size):
        h = earlier[i]
        v = middle[i]
        h = v if _beats(v, h) else h
        v = later[i]
        held[i] = v if _beats(v, h) else h


@helper
def _keep_first_max_at(later, held, held_index, shift):
    """:func:`_keep_first_max`, recording the winner's position (``i + shift``)."""
    for i in range(held.size):
        v = later[i]
        h = held[i]
        take = _beats(v, h)
        held[i] = v if take else h
        h_index = held_index[i]  # loaded before the select, or it stays scalar (8x slower)
        held_index[i] = i + shift if take else h_index


@helper
def _keep_first_max_from(later, later_index, held, held_index):
    """:func:`_keep_first_max`, carrying the winner's recorded position along."""
    for i in range(held.size):
        v = later[i]
        h = held[i]
        take = _beats(v, h)
        held[i] = v if take else h
        v_index = later_index[i]  # both loaded before the select, or it stays scalar
        h_index = held_index[i]
        held_index[i] = v_index if take else h_index


@helper
def _first_max_of_two_at(earlier, later, held, held_index, shift, step):
    """:func:`_first_max_of_two`, recording the winner's position: ``i + shift`` for the
    earlier tap, ``i + shift + step`` for the later one."""
    for i in range(held.size):
        v = later[i]
        h = earlier[i]
        take = _beats(v, h)
        held[i] = v if take else h
        held_index[i] = i + shift + step if take else i + shift


@helper
def _first_max_of_two_from(earlier, earlier_index, later, later_index, held, held_index):
    """:func:`_first_max_of_two`, carrying the winner's recorded position along.

    Not :func:`_keep_first_max_from` called with ``earlier`` as ``held``: the overlap check
    LLVM puts before a vectorised loop fails for an in-place call, which then runs scalar."""
    for i in range(held.size):
        v = later[i]
        h = earlier[i]
        take = _beats(v, h)
        held[i] = v if take else h
        v_index = later_index[i]  # both loaded before the select, or it stays scalar
        h_index = earlier_index[i]
        held_index[i] = v_index if take else h_index


@helper
def _first_max_of_three_at(earlier, middle, later, held, held_index, shift, step):
    """:func:`_first_max_of_two_at` over three taps in one sweep (the third at
    ``i + shift + 2*step``)."""
    for i in range(held.size):
        h = earlier[i]
        v = middle[i]
        take = _beats(v, h)
        h = v if take else h
        h_index = i + shift + step if take else i + shift
        v = later[i]
        take = _beats(v, h)
        held[i] = v if take else h
        held_index[i] = i + shift + 2 * step if take else h_index


@helper
def _first_max_of_three_from(earlier, earlier_index, middle, middle_index, later, later_index,
                             held, held_index):
    """:func:`_first_max_of_two_from` over three taps in one sweep."""
    for i in range(held.size):
        h = earlier[i]
        v = middle[i]
        take = _beats(v, h)
        h = v if take else h
        v_index = middle_index[i]  # loaded before the select, or it stays scalar
        h_index = earlier_index[i]
        h_index = v_index if take else h_index
        v = later[i]
        take = _beats(v, h)
        held[i] = v if take else h
        v_index = later_index[i]
        held_index[i] = v_index if take else h_index


# Stride 2 along the last axis: each tap of output j is a stream of words, read in a fixed
# half (see :mod:`poolfold.kernels.words`); ``a_shift`` and the like select the half.  The
# position of output j's tap t is ``base + 2*j + t``.

@helper
def _copy_halves(a, a_shift, held):
    """``held[j]`` = the element in ``a[j] >> a_shift``: a kernel of one tap."""
    for j in range(held.size):
        held[j] = element_of_word(a[j], a_shift, held)


@helper
def _copy_halves_at(a, a_shift, held, held_index, base):
    """:func:`_copy_halves`, recording each position (``base + 2*j``)."""
    for j in range(held.size):
        held[j] = element_of_word(a[j], a_shift, held)
        held_index[j] = base + 2 * j


@helper
def _first_max_of_two_halves(a, a_shift, b, b_shift, held):
    """:func:`_first_max_of_two` over two taps read from words."""
    for j in range(held.size):
        h = element_of_word(a[j], a_shift, held)
        v = element_of_word(b[j], b_shift, held)
        held[j] = v if _beats(v, h) else h


@helper
def _first_max_of_two_halves_at(a, a_shift, b, b_shift, held, held_index, base):
    """:func:`_first_max_of_two_halves`, recording the winner's position."""
    for j in range(held.size):
        h = element_of_word(a[j], a_shift, held)
        v = element_of_word(b[j], b_shift, held)
        take = _beats(v, h)
        held[j] = v if take else h
        held_index[j] = base + 2 * j + 1 if take else base + 2 * j


@helper
def _first_max_of_three_halves(a, a_shift, b, b_shift, c, c_shift, held):
    """:func:`_first_max_of_three` over three taps read from words."""
    for j in range(held.size):
        h = element_of_word(a[j], a_shift, held)
        v = element_of_word(b[j], b_shift, held)
        h = v if _beats(v, h) else h
        v = element_of_word(c[j], c_shift, held)
        held[j] = v if _beats(v, h) else h


@helper
def _first_max_of_three_halves_at(a, a_shift, b, b_shift, c, c_shift, held, held_index, base):
    """:func:`_first_max_of_three_halves`, recording the winner's position."""
    for j in range(held.size):
        h = element_of_word(a[j], a_shift, held)
        v = element_of_word(b[j], b_shift, held)
        take = _beats(v, h)
        h = v if take else h
        h_index = base + 2 * j + 1 if take else base + 2 * j
        v = element_of_word(c[j], c_shift, held)
        take = _beats(v, h)
        held[j] = v if take else h
        held_index[j] = base + 2 * j + 2 if take else h_index


@helper
def _keep_first_max_halves(a, a_shift, held):
    """:func:`_keep_first_max` with the later tap read from words."""
    for j in range(held.size):
        v = element_of_word(a[j], a_shift, held)
        h = held[j]
        held[j] = v if _beats(v, h) else h


@helper
def _keep_first_max_halves_at(a, a_shift, held, held_index, position):
    """:func:`_keep_first_max_halves`, recording the winner's position
    (``position + 2*j``)."""
    for j in range(held.size):
        v = element_of_word(a[j], a_shift, held)
        h = held[j]
        take = _beats(v, h)
        held[j] = v if take else h
        h_index = held_index[j]  # loaded before the select, or it stays scalar (8x slower)
        held_index[j] = position + 2 * j if take else h_index


@helper
def _first_max_rows(src, src_index, dst, dst_index, start, step, taps, count, record):
    """``dst[:count]`` = the first maximum (first NaN) of ``src[start + t*step:][:count]``
    over taps t in order; unless ``dst_index`` is None their positions too, recorded as
    ``record`` plus the offset in ``src`` (``record`` >= 0) or carried along from
    ``src_index``.

    A slab may hold no input row (its outputs' windows are only padding), which makes
    ``count`` negative: nothing to do, and ``dst[:count]`` would slice from the end."""
    if count <= 0:
        return
    held = dst[:count]
    first_tap = src[start:start + count]
    if dst_index is None:
        if taps == 1:
            _copy(first_tap, held)
        elif taps == 3:
            _first_max_of_three(first_tap, src[start + step:start + step + count],
                                src[start + 2 * step:start + 2 * step + count], held)
        else:
            _first_max_of_two(first_tap, src[start + step:start + step + count], held)
            for t in range(2, taps):
                shift = start + t * step
                _keep_first_max(src[shift:shift + count], held)
        return
    held_index = dst_index[:count]
    if taps == 1:
        _copy(first_tap, held)
        if record >= 0:
            for i in range(count):
                held_index[i] = record + start + i
        else:
            _copy(src_index[start:start + count], held_index)
        return
    second = start + step
    third = second + step
    if taps == 3 and record >= 0:  # the common 3-wide kernel in one sweep
        _first_max_of_three_at(first_tap, src[second:second + count], src[third:third + count],
                               held, held_index, record + start, step)
        return
    if taps == 3:
        _first_max_of_three_from(first_tap, src_index[start:start + count],
                                 src[second:second + count], src_index[second:second + count],
                                 src[third:third + count], src_index[third:third + count],
                                 held, held_index)
        return
    # The first two taps in one sweep, then one sweep per further tap.
    if record >= 0:
        _first_max_of_two_at(first_tap, src[second:second + count], held, held_index,
                             record + start, step)
    else:
        _first_max_of_two_from(first_tap, src_index[start:start + count],
                               src[second:second + count], src_index[second:second + count],
                               held, held_index)
    for t in range(2, taps):
        shift = start + t * step
        if record >= 0:
            _keep_first_max_at(src[shift:shift + count], held, held_index, record + shift)
        else:
            _keep_first_max_from(src[shift:shift + count], src_index[shift:shift + count],
                                 held, held_index)


@helper
def _cut_windows_by_rows(src, src_index, dst, dst_index, rows, src_pitch, dst_pitch, at, to,
                         step, taps, record):
    """Along the last axis, one padding-cut window per row: ``dst[r*dst_pitch + to]`` gets the
    first maximum (first NaN) of ``src[r*src_pitch + at + t*step]`` over taps t, for every
    row r; positions recorded as ``record`` plus the offset (``record`` >= 0) or carried from
    ``src_index``.

    Tap by tap over the rows: the rows are independent, so a tap's loads overlap (one scan
    per row instead waits on each comparison: 2-3x slower)."""
    for r in range(rows):
        i = r * src_pitch + at
        dst[r * dst_pitch + to] = src[i]
        if dst_index is not None:
            dst_index[r * dst_pitch + to] = record + i if record >= 0 else src_index[i]
    for t in range(1, taps):
        for r in range(rows):
            i = r * src_pitch + at + t * step
            v = src[i]
            h = dst[r * dst_pitch + to]
            take = _beats(v, h)
            dst[r * dst_pitch + to] = v if take else h
            if dst_index is not None:
                h_index = dst_index[r * dst_pitch + to]
                v_index = record + i if record >= 0 else src_index[i]
                dst_index[r * dst_pitch + to] = v_index if take else h_index


@helper
def _axis_pass(src, src_index, dst, dst_index, size, a, inner, first, lo, hi, extent, kernel,
               dilations, starts, slot, cut, cut_count, record):
    """One separable pass along axis ``a`` of a staged slab of ``size`` elements, laid out as
    blocks of ``extent`` rows of ``inner`` elements, the same layout in ``src`` and ``dst``.

    Row i of a block gets the first maximum of the window that starts at row i, for every
    i < ``starts[a]`` in one flat loop (rows near a block's end get garbage, the windows
    crossing into the next block).  The ``cut_count[a]`` outputs ``cut[a, :]`` whose window
    the padding cuts (each with an in-bounds tap) get their in-bounds taps' maximum in row
    ``slot[a, o]``, one of those garbage rows."""
    step = dilations[a] * inner
    if starts[a] > 0:
        _first_max_rows(src, src_index, dst, dst_index, np.int64(0), step, kernel[a],
                        size - (kernel[a] - 1) * step, record)
    if inner == 1:  # the last axis
        for c in range(cut_count[a]):
            o = cut[a, c]
            _cut_windows_by_rows(src, src_index, dst, dst_index, size // extent, extent, extent,
                                 first[a, o] + lo[a, o] * dilations[a], slot[a, o], step,
                                 hi[a, o] - lo[a, o], record)
        return
    for u in range(size // (extent * inner)):
        for c in range(cut_count[a]):
            o = cut[a, c]
            at = (u * extent + first[a, o] + lo[a, o] * dilations[a]) * inner
            to = (u * extent + slot[a, o]) * inner
            _first_max_rows(src, src_index, dst[to:to + inner], _part_of(dst_index, to, to + inner),
                            at, step, hi[a, o] - lo[a, o], inner, record)


@helper
def _tap_words(words, i_lo, count, e, bits):
    """The words holding tap ``e`` (element ``2*i + e``) of outputs ``i_lo + j`` for j below
    ``count``, and the shift that brings its half down."""
    at = i_lo + e // 2
    high = (e % 2 == 1) != EVEN_IS_HIGH
    return words[at:at + count], np.int64(bits if high else 0)


@helper
def _pairs_pass(src, words, dst, dst_index, size, extent, first, lo, hi, kernel, cut,
                cut_count, record):
    """The last axis at stride 2 and dilation 1, of even ``extent``: output o of row r goes to
    ``dst[r*extent/2 + o]``, so the pass halves the slab (``size`` elements of ``src``, seen
    as ``size/2`` pairs in ``words``).

    Output o's window starts at ``2*o + first[last, 0]``, so over the whole slab output i
    (rows joined) has its tap t at ``2*i + first[last, 0] + t``: one stream of words per tap.
    The first three taps are folded in one flat loop, each further tap in one more.  Outputs
    whose window the padding cuts get garbage there (taps of the neighbouring row), then
    their in-bounds taps' maximum (:func:`_cut_windows_by_rows`)."""
    last = first.shape[0] - 1
    k = kernel[last]
    offset = first[last, 0]
    bits = 8 * src.itemsize
    half = size // 2
    i_lo = max(0, -(offset // 2))  # the first output reading no position < 0
    i_hi = min(half, half - (offset + k - 1) // 2)  # ...and past the last reading < size
    count = i_hi - i_lo
    if count > 0:
        held = dst[i_lo:i_hi]
        held_index = _part_of(dst_index, i_lo, i_hi)
        base = record + 2 * i_lo + offset  # the position of held[0]'s first tap
        a, a_shift = _tap_words(words, i_lo, count, offset, bits)
        if k == 1:
            if dst_index is not None:
                _copy_halves_at(a, a_shift, held, held_index, base)
            else:
                _copy_halves(a, a_shift, held)
        else:
            b, b_shift = _tap_words(words, i_lo, count, offset + 1, bits)
            if k == 2 and dst_index is not None:
                _first_max_of_two_halves_at(a, a_shift, b, b_shift, held, held_index, base)
            elif k == 2:
                _first_max_of_two_halves(a, a_shift, b, b_shift, held)
            else:
                c, c_shift = _tap_words(words, i_lo, count, offset + 2, bits)
                if dst_index is not None:
                    _first_max_of_three_halves_at(a, a_shift, b, b_shift, c, c_shift, held,
                                                  held_index, base)
                else:
                    _first_max_of_three_halves(a, a_shift, b, b_shift, c, c_shift, held)
            for t in range(3, k):
                a, a_shift = _tap_words(words, i_lo, count, offset + t, bits)
                if dst_index is not None:
                    _keep_first_max_halves_at(a, a_shift, held, held_index, base + t)
                else:
                    _keep_first_max_halves(a, a_shift, held)
    # Positions here are recorded (record >= 0), never carried: dst_index only fills the
    # place of a source index array.
    for c in range(cut_count[last]):
        o = cut[last, c]
        _cut_windows_by_rows(src, dst_index, dst, dst_index, size // extent, extent,
                             extent // 2, first[last, o] + lo[last, o], o, np.int64(1),
                             hi[last, o] - lo[last, o], record)


@helper
def _restart(o, o0):
    """Set the output coordinate ``o`` to the start of the slab whose first row is ``o0``."""
    for a in range(o.size):
        o[a] = 0
    o[0] = o0


@helper
def _read_staged_row(dst, staged, row, slot_last, in_order):
    """``dst[ol]``, for a row of outputs, = the staged result of output ol: ``staged[row + ol]``
    when the last axis was staged in output order, else ``staged[row + slot_last[ol]]``.

    ``dst`` is a 1-D view of the row: indexing ``y[p, q + ol]`` instead keeps these loops
    scalar, 2-3x slower."""
    if in_order:
        src = staged[row:row + dst.size]
        for ol in range(dst.size):
            dst[ol] = src[ol]
    else:
        for ol in range(dst.size):
            dst[ol] = staged[row + slot_last[ol]]


@kernel()
def window_max_separable(x, y, indices, first, lo, hi, in_shape, out_shape, kernel, dilations,
                         column_major, empty_value, slab_rows, starts, slot, cut, cut_count,
                         pairs, in_strides, strides, words, start, stop):
    """The same contract as :func:`window_max`, computed by separable passes.

    ``slab_rows`` is how many outputs along the first axis are computed per slab of the plane
    (it bounds the scratch, and keeps it in cache); the scratch is allocated once per call.

    Reducing the last axis first, then the others towards the first, keeps row-major window
    order: each pass keeps the first maximum (first NaN) of its taps, so the result is the
    first in window order, exactly as a direct scan.  Each pass is one long branch-free loop
    per tap with a constant shift, which LLVM vectorises (runs of a few dozen would not be):

    - the last axis, then each other axis but the first, at every window start of the slab
      (:func:`_axis_pass`), the staged slab keeping the input's layout; or with ``pairs``
      the last axis at its outputs only (:func:`_pairs_pass`, reading ``x`` as ``words``
      of two elements), which halves the slab;
    - the first axis only at the rows its outputs need, over their in-bounds taps;
    - then each output reads its result: ``slot`` maps an output to its staged row on each
      axis, its window start, or the garbage row where its padding-cut window was put.

    ``starts``, ``slot``, ``cut`` and ``cut_count`` say where each axis stages its results
    (see :func:`_axis_pass` and ``poolfold.ops.max_pool.separable_staging``, which also
    refuses plans whose cut windows do not fit, and chooses ``pairs``); ``in_strides`` and
    ``strides`` are the row-major strides of a plane and of the staged slab.  A window with no
    in-bounds tap yields ``empty_value`` (index -1), patched in at the end.
    """
    planes, plane_size = x.shape
    rank = in_shape.size
    last = rank - 1
    out_last = out_shape[last]
    has_empty = False  # some window holds only padding
    for a in range(rank):
        for o in range(out_shape[a]):
            has_empty |= lo[a, o] >= hi[a, o]
    if rank == 1:
        slab_rows = 1
    step_first = first[0, 1] - first[0, 0] if out_shape[0] > 1 else 1
    slab_in_rows = min(in_shape[0], (slab_rows - 1) * step_first
                       + (kernel[0] - 1) * dilations[0] + 1)
    inner0 = strides[0]  # elements per staged row along the first axis
    # Short rows along the first axis vectorise badly one output at a time (2-3x slower):
    # then reduce at every window start of the slab in one loop, as the other axes are, and
    # stage the cut windows in rows after the slab's.
    flat_first = inner0 < 512
    cut_rows = min(cut_count[0], slab_rows) if flat_first else 0
    capacity = (max(slab_in_rows, slab_rows) + cut_rows) * in_strides[0] if rank > 1 \
        else plane_size
    out_inner = 1  # outputs per output row along the first axis
    for a in range(1, rank):
        out_inner *= out_shape[a]
    values = np.empty((2, capacity), x.dtype)
    positions = _positions_like(indices, 2, capacity)
    out_row = np.empty(slab_rows, np.int64)  # staged row of each output along axis 0
    o = np.empty(rank, np.int64)  # set by _restart before each use
    for p in range(start, stop):
        xp = x[p]
        plane_offset = p * plane_size
        for o0 in range(0, out_shape[0] if rank > 1 else 1, slab_rows):
            o1 = min(o0 + slab_rows, out_shape[0])
            # The slab: input rows [r_lo, r_hi) along the first axis hold all its taps.
            r_lo = 0
            size = plane_size
            if rank > 1:
                r_lo = min(max(first[0, o0], 0), in_shape[0])
                r_hi = max(min(first[0, o1 - 1] + (kernel[0] - 1) * dilations[0] + 1,
                               in_shape[0]), r_lo)
                size = (r_hi - r_lo) * in_strides[0]
            slab_at = r_lo * in_strides[0]
            slab = xp[slab_at:slab_at + size]
            if pairs:
                _pairs_pass(slab, words[p, slab_at // 2:(slab_at + size) // 2], values[0],
                            _rows_of(positions, 0), size, in_shape[last], first, lo, hi, kernel,
                            cut, cut_count, plane_offset + slab_at)
                size //= 2
            else:
                _axis_pass(slab, _rows_of(positions, 1), values[0], _rows_of(positions, 0), size,
                           last, np.int64(1), first, lo, hi, in_shape[last], kernel, dilations,
                           starts, slot, cut, cut_count, plane_offset + slab_at)
            side = 0
            for a in range(last - 1, 0, -1):
                _axis_pass(read_only(values[side]), _rows_of(positions, side), values[1 - side],
                           _rows_of(positions, 1 - side), size, a, strides[a], first, lo, hi,
                           in_shape[a], kernel, dilations, starts, slot, cut, cut_count,
                           np.int64(-1))
                side = 1 - side
            if rank > 1:  # the first axis
                src = read_only(values[side])  # the helpers then compile as for x
                src_index = _rows_of(positions, side)
                rows_in = r_hi - r_lo
                spare = rows_in  # staged rows of the cut windows, in flat mode
                joined = rows_in - (kernel[0] - 1) * dilations[0]
                if flat_first and joined > 0:  # every window start of the slab at once
                    _first_max_rows(src, src_index, values[1 - side],
                                    _rows_of(positions, 1 - side), np.int64(0),
                                    dilations[0] * inner0, kernel[0], joined * inner0,
                                    np.int64(-1))
                for oa in range(o0, o1):
                    taps = hi[0, oa] - lo[0, oa]
                    at = (first[0, oa] + lo[0, oa] * dilations[0] - r_lo) * inner0
                    if taps <= 0:
                        out_row[oa - o0] = 0
                        continue  # only padding: patched below
                    if not flat_first:
                        out_row[oa - o0] = oa - o0
                    elif taps == kernel[0]:
                        out_row[oa - o0] = at // inner0
                        continue  # done above
                    else:
                        out_row[oa - o0] = spare
                        spare += 1
                    to = out_row[oa - o0] * inner0
                    _first_max_rows(src, src_index, values[1 - side, to:to + inner0],
                                    _part_of(_rows_of(positions, 1 - side), to, to + inner0),
                                    at, dilations[0] * inner0, taps, inner0, np.int64(-1))
                side = 1 - side
            # Every output of the slab reads its result.
            staged = values[side]
            staged_positions = _rows_of(positions, side)
            slot_last = slot[last]
            _restart(o, o0)
            q0 = o0 * out_inner
            out_rows = (o1 - o0) * out_inner // out_last if rank > 1 else 1
            for r in range(out_rows):
                row = 0
                if rank > 1:
                    row = out_row[o[0] - o0] * inner0
                    for a in range(1, last):
                        row += slot[a, o[a]] * strides[a]
                q = q0 + r * out_last
                _read_staged_row(y[p, q:q + out_last], staged, row, slot_last, pairs)
                if indices is not None:
                    _read_staged_row(indices[p, q:q + out_last], staged_positions, row,
                                     slot_last, pairs)
                next_in_shape(o, out_shape, last)
            # Rare cases: windows made only of padding, and column-major indices.
            if has_empty or (indices is not None and column_major):
                _restart(o, o0)
                for q in range(q0, q0 + out_rows * out_last):
                    empty = False
                    for a in range(rank):
                        empty |= lo[a, o[a]] >= hi[a, o[a]]
                    if empty:
                        y[p, q] = empty_value
                        if indices is not None:
                            indices[p, q] = -1
                    elif indices is not None and column_major:
                        # column_major (True here), not the literal: window_max's compile
                        # of reported_index serves
                        indices[p, q] = plane_offset + reported_index(
                            indices[p, q] - plane_offset, column_major, in_shape, in_strides)
                    next_in_shape(o, out_shape, rank)


# Windows that tile the input: kernel 2, stride 2, dilation 1 on every axis, none cut by
# padding or by the end of an axis, over two or three axes.  The commonest pools (2x2 and
# 2x2x2 at stride 2), which one fused pass serves better than the separable passes: output
# row r of a plane reads the 2 (or 4) input rows of its windows, each a stream of words
# holding its outputs' pairs of taps, and folds them in window order straight into Y.
#
# The sweeps are written out in the kernel, not called as helpers: over rows of a few dozen
# outputs, a helper's loop ran 1.5x slower (each call passes its row views as new array
# references, which numba counts in and out, and LLVM vectorised the helper's loop on its
# own behind checks that the views do not overlap, paid on every call).

@helper
def _pair_max(word, shift_even, shift_odd, like):
    """The first maximum (first NaN) of the even then the odd element of ``word``."""
    h = element_of_word(word, shift_even, like)
    v = element_of_word(word, shift_odd, like)
    return v if _beats(v, h) else h


@helper
def _pair_max_at(word, shift_even, shift_odd, like, at):
    """:func:`_pair_max`, with its position: the pair's elements are at ``at``, ``at + 1``."""
    h = element_of_word(word, shift_even, like)
    v = element_of_word(word, shift_odd, like)
    take = _beats(v, h)
    return (v if take else h), (at + 1 if take else at)


@helper
def _then_pair(word, shift_even, shift_odd, like, h):
    """The first maximum (first NaN) of ``h``, then the even and odd element of ``word``."""
    v = element_of_word(word, shift_even, like)
    h = v if _beats(v, h) else h
    v = element_of_word(word, shift_odd, like)
    return v if _beats(v, h) else h


@helper
def _then_pair_at(word, shift_even, shift_odd, like, h, h_index, at):
    """:func:`_then_pair`, with positions: the pair's elements are at ``at`` and ``at + 1``."""
    v = element_of_word(word, shift_even, like)
    take = _beats(v, h)
    h = v if take else h
    h_index = at if take else h_index
    v = element_of_word(word, shift_odd, like)
    take = _beats(v, h)
    return (v if take else h), (at + 1 if take else h_index)


@kernel()
def window_max_tiles(x, y, indices, in_shape, out_shape, words, start, stop):
    """The contract of :func:`window_max` (row-major indices) for windows that tile the
    input (see above), rank 2 or 3, the last dim even, ``words`` the planes of ``x`` as words
    of two elements (:func:`poolfold.kernels.words.words_view`).

    Output j of a row folds, in window order: row 0's pair j (its even element first), then
    row 1's, and with three axes rows 2 and 3 (the window's rows in row-major order of their
    offsets).  Each step keeps the first maximum (first NaN), exactly as a direct scan."""
    planes, plane_size = x.shape
    rank = in_shape.size
    half_row = in_shape[rank - 1] // 2  # words per input row
    out_last = out_shape[rank - 1]
    out_middle = out_shape[rank - 2]
    out_rows = y.shape[1] // out_last if out_last else 0
    bits = element_bits(x)  # a constant: shifts by a known amount vectorise better
    shift_even = np.int64(bits if EVEN_IS_HIGH else 0)
    shift_odd = np.int64(0 if EVEN_IS_HIGH else bits)
    next_row = half_row  # words from a window's row to the next along the last-but-one axis
    next_slice = in_shape[rank - 2] * half_row  # ...and along the first of three axes
    for p in range(start, stop):
        wp = words[p]
        yp = y[p]
        plane_at = p * plane_size
        for r in range(out_rows):
            # The window's first row: (2*r0, 2*r1) along the axes but the last.
            first = 2 * (r % out_middle) * next_row
            if rank == 3:
                first += 2 * (r // out_middle) * next_slice
            q = r * out_last
            held = yp[q:q + out_last]
            r0 = wp[first:first + out_last]
            r1 = wp[first + next_row:first + next_row + out_last]
            at0 = plane_at + 2 * first
            at1 = at0 + 2 * next_row
            if rank == 2:
                if indices is None:
                    for j in range(out_last):
                        h = _pair_max(r0[j], shift_even, shift_odd, held)
                        held[j] = _then_pair(r1[j], shift_even, shift_odd, held, h)
                else:
                    held_index = indices[p, q:q + out_last]
                    for j in range(out_last):
                        h, h_index = _pair_max_at(r0[j], shift_even, shift_odd, held,
                                                  at0 + 2 * j)
                        h, h_index = _then_pair_at(r1[j], shift_even, shift_odd, held, h,
                                                   h_index, at1 + 2 * j)
                        held[j] = h
                        held_index[j] = h_index
                continue
            # Three axes: the window's rows 2 and 3 are in the next slice.  Their views exist
            # only here: made for both ranks (as aliases of rows 0 and 1 when unused), the 2-D
            # sweeps ran 1.3-4x slower, most on planes of short rows.
            second = first + next_slice
            r2 = wp[second:second + out_last]
            r3 = wp[second + next_row:second + next_row + out_last]
            if indices is None:
                for j in range(out_last):
                    h = _pair_max(r0[j], shift_even, shift_odd, held)
                    h = _then_pair(r1[j], shift_even, shift_odd, held, h)
                    h = _then_pair(r2[j], shift_even, shift_odd, held, h)
                    held[j] = _then_pair(r3[j], shift_even, shift_odd, held, h)
                continue
            held_index = indices[p, q:q + out_last]
            at2 = plane_at + 2 * second
            at3 = at2 + 2 * next_row
            for j in range(out_last):
                h, h_index = _pair_max_at(r0[j], shift_even, shift_odd, held, at0 + 2 * j)
                h, h_index = _then_pair_at(r1[j], shift_even, shift_odd, held, h, h_index,
                                           at1 + 2 * j)
                h, h_index = _then_pair_at(r2[j], shift_even, shift_odd, held, h, h_index,
                                           at2 + 2 * j)
                h, h_index = _then_pair_at(r3[j], shift_even, shift_odd, held, h, h_index,
                                           at3 + 2 * j)
                held[j] = h
                held_index[j] = h_index
