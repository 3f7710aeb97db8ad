"""Window maximum on channels-last tensors ``(N, spatial..., C)``, any spatial rank.

The innermost loop runs over the C contiguous channels of one tap, so every load is a
contiguous vector and every channel keeps its own running maximum.  Window order, ties, NaN
and empty windows are as in :mod:`poolfold.kernels.window_max`; Indices are reported in the
NCHW layout (``indices[n, c, q]``, NCHW-flat values).  The fused activation is applied as Y
is stored.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .activation import activate
from .odometer import next_in_ranges
from .ordering import is_nan, order_key
from .window_max import reported_index


@njit(parallel=True, cache=True, nogil=True)
def window_max_channels_last(x, y, indices, want_indices, first, lo, hi, in_shape, out_shape,
                             dilations, column_major, empty_value, half_inf_bits,
                             act_code, act_params, act_table):
    """x : (N, S_in, C);  y : (N, S_out, C);  indices : (N, C, S_out) int64.

    The other arguments are those of :func:`poolfold.kernels.window_max.window_max`, plus the
    activation (see :mod:`poolfold.kernels.activation`).
    """
    batch, plane_size, channels = x.shape
    out_size = y.shape[1]
    rank = in_shape.size
    last = rank - 1
    in_strides = np.ones(rank, np.int64)
    for a in range(last - 1, -1, -1):
        in_strides[a] = in_strides[a + 1] * in_shape[a + 1]
    empty_out = activate(empty_value, act_code, act_params, act_table)
    out_last = out_shape[last]
    out_rows = out_size // out_last if out_last else 0
    for task in prange(batch * out_rows):
        n = task // out_rows
        row = task % out_rows
        o = np.empty(rank, np.int64)  # output coordinate
        rest = row
        for a in range(last - 1, -1, -1):
            o[a] = rest % out_shape[a]
            rest //= out_shape[a]
        j = np.empty(rank, np.int64)  # kernel offset of the current tap
        best = np.empty(channels, np.int64)  # winning tap's in-plane offset, per channel
        best_value = np.empty(channels, x.dtype)
        settled = np.empty(channels, np.bool_)  # a NaN won: later taps cannot change it
        for ol in range(out_last):
            o[last] = ol
            q = row * out_last + ol
            empty = False
            for a in range(rank):
                j[a] = lo[a, o[a]]
                if lo[a, o[a]] >= hi[a, o[a]]:
                    empty = True
            if empty:
                for c in range(channels):
                    y[n, q, c] = empty_out
                    if want_indices:
                        indices[n, c, q] = -1
                continue
            first_tap = True
            while True:
                offset = 0
                for a in range(rank):
                    offset += (first[a, o[a]] + j[a] * dilations[a]) * in_strides[a]
                tap = x[n, offset]
                if first_tap:
                    for c in range(channels):
                        best[c] = offset
                        best_value[c] = tap[c]
                        settled[c] = is_nan(tap[c], half_inf_bits)
                    first_tap = False
                else:
                    for c in range(channels):
                        v = tap[c]
                        nan = is_nan(v, half_inf_bits)
                        take = not settled[c] and (nan or order_key(v) > order_key(best_value[c]))
                        best[c] = offset if take else best[c]
                        best_value[c] = v if take else best_value[c]
                        settled[c] = settled[c] or nan
                if not next_in_ranges(j, o, lo, hi, rank):  # next tap in window order
                    break
            for c in range(channels):
                y[n, q, c] = activate(best_value[c], act_code, act_params, act_table)
                if want_indices:
                    indices[n, c, q] = (n * channels + c) * plane_size + reported_index(
                        best[c], column_major, in_shape, in_strides)
