"""Window maximum over planes of any spatial rank.

A plane is one row of ``x`` (shape ``(planes, prod(in_shape))``, row-major spatial layout).
For every output position the kernel visits the in-bounds taps of its window in row-major
order of the kernel offsets, as the :class:`poolfold.geometry.TapTable` lists them, and keeps
the first NaN, else the first maximum.  Nothing is materialised: taps are read in place.

The kernels do not validate; the op layer has checked every shape and table before calling.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .ordering import is_nan, order_key


@njit(cache=True, nogil=True)
def _max_inside(xp, origin, window_taps, half_inf_bits):
    """Offset of the winning tap of a window lying wholly inside the plane."""
    # Branch-free running maximum: about 5x faster than stopping at a NaN, whose
    # unpredictable branches stall.  NaN is rare, so it is only noted here and its first
    # occurrence looked up afterwards.
    best = origin
    best_key = order_key(xp[origin])
    seen_nan = is_nan(xp[origin], half_inf_bits)
    for t in range(1, window_taps.size):
        offset = origin + window_taps[t]
        v = xp[offset]
        key = order_key(v)
        greater = key > best_key
        best = offset if greater else best
        best_key = key if greater else best_key
        seen_nan |= is_nan(v, half_inf_bits)
    if seen_nan:
        for t in range(window_taps.size):
            if is_nan(xp[origin + window_taps[t]], half_inf_bits):
                return origin + window_taps[t]
    return best


@njit(cache=True, nogil=True)
def _max_on_border(xp, o, j, first, lo, hi, in_shape, dilations, half_inf_bits):
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
    best = -1
    best_key = order_key(xp[0])
    while True:
        row = 0
        for a in range(last):
            row = row * in_shape[a] + first[a, o[a]] + j[a] * dilations[a]
        row = row * in_shape[last] + row_first
        for jl in range(lo[last, o[last]], hi[last, o[last]]):
            offset = row + jl * d_last
            v = xp[offset]
            if is_nan(v, half_inf_bits):
                return offset
            key = order_key(v)
            if best < 0 or key > best_key:
                best = offset
                best_key = key
        # Next row of taps: advance the outer-axis offsets, last axis fastest.
        a = last - 1
        while a >= 0:
            j[a] += 1
            if j[a] < hi[a, o[a]]:
                break
            j[a] = lo[a, o[a]]
            a -= 1
        if a < 0:
            return best


@njit(cache=True, nogil=True)
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


@njit(parallel=True, cache=True, nogil=True)
def window_max(x, y, indices, want_indices, first, lo, hi, in_shape, out_shape, kernel,
               dilations, column_major, empty_value, half_inf_bits):
    """Fill ``y[p, q]`` (and ``indices[p, q]`` when ``want_indices``) for every plane ``p``
    and flat output position ``q``.

    x, y, indices : (planes, S_in), (planes, S_out), (planes, S_out) int64
    first, lo, hi : the tap table, (rank, max output size)
    in_shape, out_shape, kernel, dilations : (rank,) int64
    column_major : report indices first-axis-fastest (storage_order 1) instead of row-major
    empty_value : what a window with no in-bounds tap yields (its index is -1)
    half_inf_bits : NaN threshold when x holds half-precision bits (uint16), else unused
    """
    planes, plane_size = x.shape
    rank = in_shape.size
    last = rank - 1
    out_last = out_shape[last]
    out_rows = y.shape[1] // out_last if out_last else 0
    in_strides = np.ones(rank, np.int64)
    for a in range(last - 1, -1, -1):
        in_strides[a] = in_strides[a + 1] * in_shape[a + 1]
    # Offsets of a whole window's taps relative to its first tap, in window (row-major)
    # order: windows that lie entirely inside the plane, the vast majority, read these.
    window_taps = np.zeros(1, np.int64)
    for a in range(rank):
        step = dilations[a] * in_strides[a]
        grown = np.empty(window_taps.size * kernel[a], np.int64)
        for t in range(window_taps.size):
            for k in range(kernel[a]):
                grown[t * kernel[a] + k] = window_taps[t] + k * step
        window_taps = grown
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
    for p in prange(planes):
        xp = x[p]
        yp = y[p]
        o = np.zeros(rank, np.int64)  # output coordinate
        j = np.zeros(rank, np.int64)  # scratch for the border walk
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
                    best = _max_inside(xp, origin, window_taps, half_inf_bits)
                    origin += step_last
                    yp[q0 + ol] = xp[best]
                    if want_indices:
                        indices[p, q0 + ol] = p * plane_size + reported_index(best, column_major,
                                                                       in_shape, in_strides)
                border_lo, border_hi = inner_lo, inner_hi
            else:
                border_lo, border_hi = out_last, out_last
            for ol in range(out_last):
                if border_lo <= ol < border_hi:
                    continue
                o[last] = ol
                best = _max_on_border(xp, o, j, first, lo, hi, in_shape, dilations,
                                      half_inf_bits)
                if best < 0:
                    yp[q0 + ol] = empty_value
                    if want_indices:
                        indices[p, q0 + ol] = -1
                else:
                    yp[q0 + ol] = xp[best]
                    if want_indices:
                        indices[p, q0 + ol] = p * plane_size + reported_index(best, column_major,
                                                                       in_shape, in_strides)
            # Next row: advance the outer output coordinates, last of them fastest.
            a = last - 1
            while a >= 0:
                o[a] += 1
                if o[a] < out_shape[a]:
                    break
                o[a] = 0
                a -= 1
