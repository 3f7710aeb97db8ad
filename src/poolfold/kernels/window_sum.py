"""Sums over pooling windows: the kernels of AveragePool, LpPool and the global pools.

A window is a box, so its sum is separable: :func:`window_sums` reduces one spatial axis at
a time, from the last to the first, each pass reading the previous one's float64 results
(the first reads X in its own type, float16 and bfloat16 widened in registers), and then
stores ``sum / divisor`` (AveragePool) or ``sum ** (1/p)`` (LpPool) in Y's type.  A work
item is one ``(outer, channel block)`` pair of the view ``(outer, D1..Dr, C)``: ``outer``
is N*C and C is 1 for NCHW, ``outer`` is N for channels-last, whose channels are the
contiguous, vectorised run of every pass.

Per axis, a pass either adds each output's taps (``direct``: short windows, or windows
that skip input) or, where windows overlap a lot, subtracts two running sums (``prefix``):
two reads per output whatever the window (flat cost in the window size).  Running sums are
kept as double-double pairs (the rounding error of each addition carried in a second
array), so a window's sum is as accurate as if added directly: the difference of two
pairs is within about one float64 rounding of the window's sum, not of the running sum's
size, and a float32 (float16, bfloat16) result rounds as the direct sum's would but for
values within about 2^-50 of a rounding boundary.  A run that meets a non-finite value
(inf - inf would spoil every later window) is added directly instead.  float64 inputs are
always added directly, with compensation (Neumaier), so that a window's result depends on
its values alone, whatever part of the tensor a call holds (poolfold.dask relies on it);
the passes' results round once per axis: see docs/semantics.md for the accuracy bound.

LpPool where ``|x| ** p`` could leave float64's range (float64 inputs, or p > 7) carries
``(m, s)`` pairs instead (:func:`scaled_window_sums`): the window's largest |x| and the sum
of ``(|x| / m) ** p``, combined axis by axis, so no power overflows or underflows.

The kernels trust their tables: :mod:`poolfold.ops.averaging` builds and bounds them.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from . import helper
from .half import HALF_BITS, as_float32, narrow_to

# Rows of the per-axis table (``axes[row, axis]``).
N, OUT, KERNEL, STRIDE, DILATION, UNCUT_LO, UNCUT_HI, PREFIX = range(8)
AXIS_ROWS = 8

# What the store does with a window's sum.
AVERAGE, ROOT = 0, 1
# What the first pass takes of each element.
VALUE, ABS, SQUARE, POWER = 0, 1, 2, 3


def widen(value):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@overload(widen)
def _widen(value):
    if value in HALF_BITS:
        return lambda value: np.float64(as_float32(value))
    return lambda value: np.float64(value)


@helper
def _term(v, transform, p):
    """What a window adds of the element ``v`` (a float64)."""
    if transform == VALUE:
        return v
    if transform == ABS:
        return abs(v)
    if transform == SQUARE:
        return v * v
    return abs(v) ** p


@helper
def _two_sum_into(hi, lo, i, b):
    """hi[i] += b, its rounding error added to lo[i] (Knuth's TwoSum: exact, any order)."""
    a = hi[i]
    s = a + b
    bb = s - a
    lo[i] += (a - (s - bb)) + (b - bb)
    hi[i] = s


@helper
def _axis_pass(src, src_at, src_inner, dst, lo_buf, run_hi, run_lo, rows, n, width, out, first,
               lo, hi, s, d, uncut_lo, uncut_hi, prefix, compensated, transform, p):
    """Reduce the middle axis of ``src`` viewed as ``(rows, n, src_inner)`` (from flat
    ``src_at``; only the first ``width`` of each inner run are read) into ``dst`` as
    ``(rows, out, width)``, float64.  ``lo_buf`` holds the compensation terms when
    ``compensated``; ``run_hi`` / ``run_lo`` the running sums of one row (n * width)."""
    for r in range(rows):
        base = src_at + r * n * src_inner
        at = r * out * width
        if prefix and not compensated:
            # running sums along the axis, one per dilation phase: run[q] = term(q) + run[q - d]
            finite = True
            for q in range(n):
                row = base + q * src_inner
                for c in range(width):
                    t = _term(widen(src[row + c]), transform, p)
                    if q >= d:
                        prev_hi = run_hi[(q - d) * width + c]
                        total = prev_hi + t
                        bb = total - prev_hi
                        run_lo[q * width + c] = run_lo[(q - d) * width + c] + (
                            (prev_hi - (total - bb)) + (t - bb))
                        run_hi[q * width + c] = total
                    else:
                        run_hi[q * width + c] = t
                        run_lo[q * width + c] = 0.0
                    if not np.isfinite(run_hi[q * width + c]):
                        finite = False
            if finite:
                for o in range(out):
                    o_at = at + o * width
                    if lo[o] >= hi[o]:
                        for c in range(width):
                            dst[o_at + c] = 0.0
                        continue
                    last = (first[o] + (hi[o] - 1) * d) * width
                    before = first[o] + (lo[o] - 1) * d
                    if before < 0:
                        for c in range(width):
                            dst[o_at + c] = run_hi[last + c] + run_lo[last + c]
                    else:
                        b_at = before * width
                        for c in range(width):
                            dst[o_at + c] = (run_hi[last + c] - run_hi[b_at + c]) + (
                                run_lo[last + c] - run_lo[b_at + c])
                continue
        # direct: each output adds its taps; the uncut outputs tap by tap across outputs
        for i in range(out * width):
            dst[at + i] = 0.0
            if compensated:
                lo_buf[at + i] = 0.0
        for o in range(out):
            if o >= uncut_lo and o < uncut_hi:
                continue
            o_at = at + o * width
            for j in range(lo[o], hi[o]):
                row = base + (first[o] + j * d) * src_inner
                for c in range(width):
                    t = _term(widen(src[row + c]), transform, p)
                    if compensated:
                        _two_sum_into(dst, lo_buf, o_at + c, t)
                    else:
                        dst[o_at + c] += t
        if uncut_hi > uncut_lo:
            k = hi[uncut_lo]
            for j in range(k):
                for o in range(uncut_lo, uncut_hi):
                    row = base + (first[o] + j * d) * src_inner
                    o_at = at + o * width
                    for c in range(width):
                        t = _term(widen(src[row + c]), transform, p)
                        if compensated:
                            _two_sum_into(dst, lo_buf, o_at + c, t)
                        else:
                            dst[o_at + c] += t
        if compensated:
            for i in range(out * width):
                dst[at + i] += lo_buf[at + i]


@njit(cache=True, nogil=True)
def window_sums(x, y, axes, taps, divisor, channels, block, mode, transform, p, compensated,
                start, stop):
    """Pool work items ``[start, stop)``: item i is outer ``i // blocks`` and channels
    ``[c0, c0 + block)``, ``c0 = (i % blocks) * block``.  ``x`` is ``(outer, size * channels)``
    and ``y`` ``(outer, outputs * channels)``, both flat per outer, in Y's element type for
    ``y``.  ``divisor[o]`` divides the sum of output position o (AVERAGE); with ROOT the
    store is ``sum ** (1 / p)``."""
    rank = axes.shape[1]
    blocks = (channels + block - 1) // block
    # scratch: the largest intermediate result of one item, twice (ping-pong), its
    # compensation terms, and one row's running sums
    largest = 1
    run = 1
    shape_rows = 1
    for a in range(rank):
        shape_rows *= axes[N, a]
    inner = block
    for a in range(rank - 1, -1, -1):
        rows = shape_rows // axes[N, a]
        largest = max(largest, rows * axes[OUT, a] * inner)
        if axes[PREFIX, a]:
            run = max(run, axes[N, a] * inner)
        shape_rows = rows
        inner *= axes[OUT, a]
    ping = np.empty(largest, np.float64)
    pong = np.empty(largest, np.float64)
    lo_buf = np.empty(largest if compensated else 1, np.float64)
    run_hi = np.empty(run, np.float64)
    run_lo = np.empty(run, np.float64)
    outputs = 1
    for a in range(rank):
        outputs *= axes[OUT, a]
    for item in range(start, stop):
        outer = item // blocks
        c0 = (item % blocks) * block
        width = min(block, channels - c0)
        # the last axis first: rows = the axes before it, inner = the outputs after it
        rows = 1
        for a in range(rank - 1):
            rows *= axes[N, a]
        inner_out = 1
        in_ping = True
        for a in range(rank - 1, -1, -1):
            n_a = axes[N, a]
            out_a = axes[OUT, a]
            w = inner_out * width
            dst = ping if in_ping else pong
            if a == rank - 1:
                # x's positions are C apart: read width of each C-long run, from c0
                _axis_pass(x[outer], c0, channels, dst, lo_buf, run_hi, run_lo, rows, n_a,
                           width, out_a, taps[0, a], taps[1, a], taps[2, a], axes[STRIDE, a],
                           axes[DILATION, a], axes[UNCUT_LO, a], axes[UNCUT_HI, a],
                           axes[PREFIX, a], compensated, transform, p)
            else:
                _axis_pass(pong if in_ping else ping, 0, w, dst, lo_buf, run_hi, run_lo, rows,
                           n_a, w, out_a, taps[0, a], taps[1, a], taps[2, a], axes[STRIDE, a],
                           axes[DILATION, a], axes[UNCUT_LO, a], axes[UNCUT_HI, a],
                           axes[PREFIX, a], compensated, VALUE, p)
            inner_out *= out_a
            if a > 0:
                rows //= axes[N, a - 1]
                in_ping = not in_ping
        dst = ping if in_ping else pong
        # dst holds (outputs, width) sums of this item
        target = y[outer]
        for o in range(outputs):
            for c in range(width):
                total = dst[o * width + c]
                if mode == AVERAGE:
                    value = total / divisor[o] if divisor[o] != 0 else np.nan
                else:
                    value = total ** (1.0 / p) if total > 0 else total
                target[o * channels + c0 + c] = narrow_to(value, target)


@helper
def _scaled_axis_pass(src_m, src_s, src_at, src_inner, first_pass, dst_m, dst_s, rows, n, width,
                      out, first, lo, hi, d, p, whole):
    """One axis of :func:`scaled_window_sums`, always tap by tap: per output, m = the
    largest m over the taps, s = the sum of s * (m_tap / m) ** p.  ``first_pass``: the
    sources are X's elements (m = |x|, s = 1 or 0 for a zero)."""
    for r in range(rows):
        base = src_at + r * n * src_inner
        at = r * out * width
        for o in range(out):
            o_at = at + o * width
            for c in range(width):
                largest = 0.0
                nan = False
                for j in range(lo[o], hi[o]):
                    i = base + (first[o] + j * d) * src_inner + c
                    m = abs(widen(src_m[i]))
                    if m != m:
                        nan = True
                    elif m > largest:
                        largest = m
                if nan:
                    dst_m[o_at + c] = np.nan
                    dst_s[o_at + c] = np.nan
                    continue
                total = 0.0
                if largest > 0.0:
                    for j in range(lo[o], hi[o]):
                        i = base + (first[o] + j * d) * src_inner + c
                        m = abs(widen(src_m[i]))
                        if m == 0.0:
                            continue
                        weight = 1.0 if first_pass else src_s[i]
                        if largest == np.inf:
                            total += weight if m == np.inf else 0.0
                        elif whole:
                            ratio = m / largest
                            term = 1.0
                            for _ in range(int(p)):
                                term *= ratio
                            total += weight * term
                        else:
                            total += weight * (m / largest) ** p
                dst_m[o_at + c] = largest
                dst_s[o_at + c] = total


@njit(cache=True, nogil=True)
def scaled_window_sums(x, y, axes, taps, channels, block, p, start, stop):
    """LpPool without overflow or underflow at any p and type: per window, the largest |x|,
    m, and the sum s of (|x| / m) ** p, then Y = m * s ** (1 / p).  Work items as
    :func:`window_sums`."""
    rank = axes.shape[1]
    blocks = (channels + block - 1) // block
    whole = p == np.floor(p) and p <= 64
    largest = 1
    shape_rows = 1
    for a in range(rank):
        shape_rows *= axes[N, a]
    inner = block
    for a in range(rank - 1, -1, -1):
        rows = shape_rows // axes[N, a]
        largest = max(largest, rows * axes[OUT, a] * inner)
        shape_rows = rows
        inner *= axes[OUT, a]
    m_ping = np.empty(largest, np.float64)
    s_ping = np.empty(largest, np.float64)
    m_pong = np.empty(largest, np.float64)
    s_pong = np.empty(largest, np.float64)
    outputs = 1
    for a in range(rank):
        outputs *= axes[OUT, a]
    for item in range(start, stop):
        outer = item // blocks
        c0 = (item % blocks) * block
        width = min(block, channels - c0)
        rows = 1
        for a in range(rank - 1):
            rows *= axes[N, a]
        inner_out = 1
        in_ping = True
        for a in range(rank - 1, -1, -1):
            w = inner_out * width
            dst_m, dst_s = (m_ping, s_ping) if in_ping else (m_pong, s_pong)
            if a == rank - 1:
                row = x[outer]
                _scaled_axis_pass(row, row, c0, channels, True, dst_m, dst_s, rows, axes[N, a],
                                  width, axes[OUT, a], taps[0, a], taps[1, a], taps[2, a],
                                  axes[DILATION, a], p, whole)
            else:
                src_m, src_s = (m_pong, s_pong) if in_ping else (m_ping, s_ping)
                _scaled_axis_pass(src_m, src_s, 0, w, False, dst_m, dst_s, rows, axes[N, a], w,
                                  axes[OUT, a], taps[0, a], taps[1, a], taps[2, a],
                                  axes[DILATION, a], p, whole)
            inner_out *= axes[OUT, a]
            if a > 0:
                rows //= axes[N, a - 1]
                in_ping = not in_ping
        m_final, s_final = (m_ping, s_ping) if in_ping else (m_pong, s_pong)
        target = y[outer]
        for o in range(outputs):
            for c in range(width):
                m = m_final[o * width + c]
                s = s_final[o * width + c]
                if m != m:
                    value = np.nan
                elif m == 0.0 or m == np.inf:
                    value = m
                else:
                    value = m * s ** (1.0 / p)
                target[o * channels + c0 + c] = narrow_to(value, target)


@njit(cache=True, nogil=True)
def plane_sums(x, y, size, mode, transform, p, compensated, start, stop):
    """The global pools' sums over whole planes (channels-first): ``y[i]`` from the ``size``
    elements ``x[i]``, added in eight interleaved running sums (independent additions the
    CPU overlaps), compensated for float64.  mode AVERAGE divides by ``size`` (NaN for an
    empty plane), ROOT takes the p-th root."""
    for i in range(start, stop):
        row = x[i]
        hi = np.zeros(8, np.float64)
        lo = np.zeros(8, np.float64)
        body = size - size % 8
        for q in range(0, body, 8):
            for lane in range(8):
                t = _term(widen(row[q + lane]), transform, p)
                if compensated:
                    _two_sum_into(hi, lo, lane, t)
                else:
                    hi[lane] += t
        for q in range(body, size):
            t = _term(widen(row[q]), transform, p)
            if compensated:
                _two_sum_into(hi, lo, 0, t)
            else:
                hi[0] += t
        total = 0.0
        correction = 0.0
        for lane in range(8):
            if compensated:
                a = total
                total = a + hi[lane]
                bb = total - a
                correction += (a - (total - bb)) + (hi[lane] - bb) + lo[lane]
            else:
                total += hi[lane]
        total += correction
        if mode == AVERAGE:
            value = total / size if size > 0 else np.nan
        else:
            value = total ** (1.0 / p) if total > 0 else total
        y[i] = narrow_to(value, y)


@njit(cache=True, nogil=True)
def scaled_plane_sums(x, y, size, p, start, stop):
    """GlobalLpPool without overflow or underflow: per plane, m = the largest |x|, then
    Y = m * (sum of (|x| / m) ** p) ** (1 / p); NaN propagates, a zero-size plane gives 0."""
    whole = p == np.floor(p) and p <= 64
    for i in range(start, stop):
        row = x[i]
        largest = 0.0
        nan = False
        for q in range(size):
            m = abs(widen(row[q]))
            if m != m:
                nan = True
            elif m > largest:
                largest = m
        if nan:
            y[i] = narrow_to(np.nan, y)
            continue
        if largest == 0.0 or largest == np.inf:
            y[i] = narrow_to(largest, y)
            continue
        total = 0.0
        for q in range(size):
            ratio = abs(widen(row[q])) / largest
            if whole:
                term = 1.0
                for _ in range(int(p)):
                    term *= ratio
            else:
                term = ratio ** p
            total += term
        y[i] = narrow_to(largest * total ** (1.0 / p), y)


@njit(cache=True, nogil=True)
def global_max(x, y, size, channels, start, stop):
    """GlobalMaxPool over ``x`` as ``(outer, size, channels)``: ``y[outer, c]`` is the
    element of the largest value (its bits kept), the first NaN if any; -inf for an empty
    plane (the caller fills those).  Work items are outers."""
    best = np.empty(channels, np.float64)
    winner = np.empty(channels, np.int64)
    for i in range(start, stop):
        row = x[i]
        for c in range(channels):
            best[c] = -np.inf
            winner[c] = c
        for q in range(size):
            at = q * channels
            for c in range(channels):
                v = widen(row[at + c])
                if v > best[c] or (v != v and best[c] == best[c]):
                    best[c] = v
                    winner[c] = at + c
        for c in range(channels):
            y[i, c] = row[winner[c]]
