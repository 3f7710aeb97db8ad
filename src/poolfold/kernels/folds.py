"""Folding streams into their first maximum: the inner loops of every max-pooling pass.

A *stream* is a contiguous run of elements, one per output: tap t of output i is element
``starts[t] + i`` of the source.  Folding taps in window order keeps the first maximum, or the
first NaN (:func:`beats`): this selection is associative as long as earlier taps stay first,
so any grouping of the taps (a pass per axis, prefix and suffix runs) selects exactly the tap a
direct scan in window order would.

Streams are given as offsets into whole arrays, indexed as unsigned integers: numba then
neither wraps negative indices (a per-element select that keeps LLVM from vectorising) nor
makes array views, whose reference counting cost 35-50 ns per call (measured: a call per row of
110 outputs ran 2x slower with views than with offsets).  Each loop is straight and branch-free,
and LLVM vectorises it.  Folding three taps in one sweep reads and writes the destination once
instead of twice.

No loop folds a single tap into the destination in place (``dst[i] = v if beats(v, dst[i])
else dst[i]``): LLVM turns that store into a conditional one and vectorises it as a masked
store, which on AMD processors costs about ten times a plain one (measured: 1.1 against 0.11
ns per element for two taps over 1024 float32).  Taps after the first three go two a sweep,
each sweep storing a selection that mixes both of them, and an odd last tap is folded twice.

Positions (for Indices) are kept unless the position arrays are None: *carried* from arrays
laid out as the sources, or *recorded*, where the source is the input itself and a tap's
position follows from where it sits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import uncounted_helper
from .ordering import order_key
from .simd import fold_pair
from .words import EVEN_IS_HIGH, element_of_word


@uncounted_helper
def beats(v, held):
    """Whether a later tap ``v`` replaces the ``held`` one: it is greater, or it is the first
    NaN (a held NaN stays).  Two comparisons and no branch: "not ``v <= held``" is true when
    v is greater or either is NaN, and ``held == held`` when held is no NaN."""
    held_key = order_key(held)
    return (not (order_key(v) <= held_key)) & (held_key == held_key)


@njit(inline="always")
def fold_values(dst, to, src, starts, taps, count):
    """:func:`fold` without positions, inlined where it is called: a kernel that folds a
    short row per output row pays a call's cost per row otherwise (passing arrays costs
    their reference counts; measured, a 2-D 3x3 pool by rows spent a third of its time in
    the calls of its per-row helpers)."""
    u = np.uint64
    a = starts[0]
    b = starts[min(1, taps - 1)]
    c = starts[min(2, taps - 1)]
    for i in range(count):
        h = src[u(a + i)]
        v = src[u(b + i)]
        h = v if beats(v, h) else h
        v = src[u(c + i)]
        dst[u(to + i)] = v if beats(v, h) else h
    for t in range(3, taps, 2):  # two taps a sweep: see the module's note on stores
        a = starts[t]
        b = starts[min(t + 1, taps - 1)]
        for i in range(count):
            h = dst[u(to + i)]
            v = src[u(a + i)]
            h = v if beats(v, h) else h
            v = src[u(b + i)]
            dst[u(to + i)] = v if beats(v, h) else h


@uncounted_helper
def fold(dst, dst_at, to, to_at, src, src_at, starts, taps, count):
    """``dst[to + i]`` = the first maximum of ``src[starts[t] + i]`` over taps ``t < taps`` in
    order, for i below ``count``; positions carried from ``src_at`` (laid out as ``src``) to
    ``dst_at[to_at + i]``.  The first three taps go in one sweep, a window of one or two taps
    folding its last tap again (folding a tap with itself keeps it): one loop for every short
    window compiles in a fraction of the time of one loop per length."""
    if dst_at is None:
        fold_values(dst, to, src, starts, taps, count)
        return
    u = np.uint64
    a = starts[0]
    b = starts[min(1, taps - 1)]
    c = starts[min(2, taps - 1)]
    for i in range(count):
        h = src[u(a + i)]
        v = src[u(b + i)]
        take = beats(v, h)
        h = v if take else h
        v_at = src_at[u(b + i)]  # loaded before the select, or the loop stays scalar
        h_at = src_at[u(a + i)]
        h_at = v_at if take else h_at
        v = src[u(c + i)]
        take = beats(v, h)
        dst[u(to + i)] = v if take else h
        v_at = src_at[u(c + i)]
        dst_at[u(to_at + i)] = v_at if take else h_at
    for t in range(3, taps, 2):
        a = starts[t]
        b = starts[min(t + 1, taps - 1)]
        for i in range(count):
            h = dst[u(to + i)]
            h_at = dst_at[u(to_at + i)]
            v = src[u(a + i)]
            take = beats(v, h)
            h = v if take else h
            v_at = src_at[u(a + i)]
            h_at = v_at if take else h_at
            v = src[u(b + i)]
            take = beats(v, h)
            dst[u(to + i)] = v if take else h
            v_at = src_at[u(b + i)]
            dst_at[u(to_at + i)] = v_at if take else h_at


@uncounted_helper
def fold_rows(dst, dst_at, targets, x, e, n, rows, k, d, count):
    """Rows of the input at stride 1: for each row r below ``rows``, ``dst[targets[r] + i]``
    = the first maximum of ``x[e + r*n + t*d + i]`` over taps ``t < k``, for i below
    ``count`` (each tap is the row shifted; short windows as in :func:`fold`).  A tap's
    position is its index in ``x``.  One call for many rows: a call per row of a few dozen
    outputs costs as much as its loops."""
    u = np.uint64
    b = min(1, k - 1) * d
    c = min(2, k - 1) * d
    for r in range(rows):
        to = targets[r]
        a = e + r * n
        if dst_at is None:
            for i in range(count):
                h = x[u(a + i)]
                v = x[u(a + b + i)]
                h = v if beats(v, h) else h
                v = x[u(a + c + i)]
                dst[u(to + i)] = v if beats(v, h) else h
            for t in range(3, k, 2):
                at = a + t * d
                bt = a + min(t + 1, k - 1) * d
                for i in range(count):
                    h = dst[u(to + i)]
                    v = x[u(at + i)]
                    h = v if beats(v, h) else h
                    v = x[u(bt + i)]
                    dst[u(to + i)] = v if beats(v, h) else h
            continue
        for i in range(count):
            h = x[u(a + i)]
            v = x[u(a + b + i)]
            take = beats(v, h)
            h = v if take else h
            h_at = (a + b if take else a) + i
            v = x[u(a + c + i)]
            take = beats(v, h)
            dst[u(to + i)] = v if take else h
            dst_at[u(to + i)] = a + c + i if take else h_at
        for t in range(3, k, 2):
            at = a + t * d
            bt = a + min(t + 1, k - 1) * d
            for i in range(count):
                h = dst[u(to + i)]
                h_at = dst_at[u(to + i)]  # loaded before the selects, or it stays scalar
                v = x[u(at + i)]
                take = beats(v, h)
                h = v if take else h
                h_at = at + i if take else h_at
                v = x[u(bt + i)]
                take = beats(v, h)
                dst[u(to + i)] = v if take else h
                dst_at[u(to + i)] = bt + i if take else h_at


@uncounted_helper
def _half_shift(e, bits):
    """The shift that brings element ``e``'s half of its word down."""
    return np.int64(bits if (e % 2 == 1) != EVEN_IS_HIGH else 0)


@uncounted_helper
def fold_word_rows(dst, dst_at, targets, words, e, n, rows, k, d, count, bits):
    """:func:`fold_rows` at stride 2: tap t of output i is element ``e + r*n + t*d + 2*i``,
    read from ``words``, the input seen as words of two elements of ``bits`` bits
    (:mod:`poolfold.kernels.words`): a stream of words read in one half.  Each tap's words
    and half are worked out once: with ``n`` even they are the same in every row."""
    if n % 2 == 1:  # rows alternate between word halves
        one = np.int64(1)  # not the literal, which numba would compile a second time for
        for r in range(rows):
            _fold_word_rows(dst, dst_at, targets[r:r + 1], words, e + r * n, np.int64(0), one,
                            k, d, count, bits)
        return
    _fold_word_rows(dst, dst_at, targets, words, e, n // 2, rows, k, d, count, bits)


@uncounted_helper
def _fold_word_rows(dst, dst_at, targets, words, e, row_words, rows, k, d, count, bits):
    """:func:`fold_word_rows` with rows ``row_words`` words apart."""
    u = np.uint64
    eb = e + min(1, k - 1) * d
    ec = e + min(2, k - 1) * d
    a = e // 2
    b = eb // 2
    c = ec // 2
    a_shift = _half_shift(e, bits)
    b_shift = _half_shift(eb, bits)
    c_shift = _half_shift(ec, bits)
    for r in range(rows):
        to = targets[r]
        w = r * row_words
        if dst_at is None:
            for i in range(count):
                h = element_of_word(words[u(a + w + i)], a_shift, dst)
                v = element_of_word(words[u(b + w + i)], b_shift, dst)
                h = v if beats(v, h) else h
                v = element_of_word(words[u(c + w + i)], c_shift, dst)
                dst[u(to + i)] = v if beats(v, h) else h
        else:
            for i in range(count):
                h = element_of_word(words[u(a + w + i)], a_shift, dst)
                v = element_of_word(words[u(b + w + i)], b_shift, dst)
                take = beats(v, h)
                h = v if take else h
                h_at = (eb if take else e) + 2 * (w + i)
                v = element_of_word(words[u(c + w + i)], c_shift, dst)
                take = beats(v, h)
                dst[u(to + i)] = v if take else h
                dst_at[u(to + i)] = ec + 2 * (w + i) if take else h_at
        for t in range(3, k, 2):
            et = e + t * d
            ft = e + min(t + 1, k - 1) * d
            at = et // 2 + w
            bt = ft // 2 + w
            at_shift = _half_shift(et, bits)
            bt_shift = _half_shift(ft, bits)
            if dst_at is None:
                for i in range(count):
                    h = dst[u(to + i)]
                    v = element_of_word(words[u(at + i)], at_shift, dst)
                    h = v if beats(v, h) else h
                    v = element_of_word(words[u(bt + i)], bt_shift, dst)
                    dst[u(to + i)] = v if beats(v, h) else h
            else:
                for i in range(count):
                    h = dst[u(to + i)]
                    h_at = dst_at[u(to + i)]
                    v = element_of_word(words[u(at + i)], at_shift, dst)
                    take = beats(v, h)
                    h = v if take else h
                    h_at = et + 2 * (w + i) if take else h_at
                    v = element_of_word(words[u(bt + i)], bt_shift, dst)
                    take = beats(v, h)
                    dst[u(to + i)] = v if take else h
                    dst_at[u(to + i)] = ft + 2 * (w + i) if take else h_at


@uncounted_helper
def fold_strided_rows(dst, dst_at, targets, x, e, n, rows, k, s, d, count):
    """Rows of the input at a stride ``s`` the other row readers do not serve: for each row r
    below ``rows``, ``dst[targets[r] + i]`` = the first maximum of ``x[e + r*n + i*s + t*d]``
    over taps ``t < k``, for i below ``count``.  Each output's taps are folded in a register,
    one output at a time: at such strides a window has few taps per input element (fewer than
    three: longer windows go to van Herk runs), and reading the rows where they lie costs
    less than turning them into lanes first (measured, one thread: 1-D windows of 4 at stride
    4, 7.8 against 18 ms for 8 Mi elements).  Positions recorded."""
    u = np.uint64
    for r in range(rows):
        to = targets[r]
        a = e + r * n
        for i in range(count):
            at = a + i * s
            h = x[u(at)]
            h_at = at
            for t in range(1, k):
                v = x[u(at + t * d)]
                take = beats(v, h)
                h = v if take else h
                h_at = at + t * d if take else h_at
            dst[u(to + i)] = h
            if dst_at is not None:
                dst_at[u(to + i)] = h_at


@uncounted_helper
def fold_column(dst, dst_at, targets, x, e, n, rows, d, taps):
    """For each row r below ``rows``: ``dst[targets[r]]`` = the first maximum of
    ``x[e + r*n + t*d]`` over taps ``t < taps`` (at least one): one output of every row, for
    the few windows the padding cuts.  Tap by tap over the rows, whose loads then overlap
    (one row at a time waits on each comparison).  Positions recorded."""
    u = np.uint64
    for r in range(rows):
        dst[u(targets[r])] = x[u(e + r * n)]
        if dst_at is not None:
            dst_at[u(targets[r])] = e + r * n
    for t in range(1, taps):
        for r in range(rows):
            at = e + r * n + t * d
            v = x[u(at)]
            h = dst[u(targets[r])]
            take = beats(v, h)
            dst[u(targets[r])] = v if take else h
            if dst_at is not None:
                h_at = dst_at[u(targets[r])]
                dst_at[u(targets[r])] = at if take else h_at


@uncounted_helper
def prefix_runs(run, run_at, src, src_at, at, n, inner, k, d):
    """``run[m*inner:][:inner]`` = the first maximum of rows ``m, m - d, ...`` of
    ``src[at:]`` (each ``inner`` long) back to the start of m's block: blocks of k rows of one
    residue modulo d, row m being tap ``(m // d) % k`` of its block.  Positions carried."""
    u = np.uint64
    tap = 0  # (m // d) % k, kept by counting
    residue = 0  # m % d
    for m in range(n):
        here = m * inner
        row = at + here
        if tap == 0:
            for i in range(inner):
                run[u(here + i)] = src[u(row + i)]
            if run_at is not None:
                for i in range(inner):
                    run_at[u(here + i)] = src_at[u(row + i)]
        elif run_at is None:
            fold_pair(run, here, run, here - d * inner, src, row, inner, False)
        else:
            back = here - d * inner
            for i in range(inner):
                h = run[u(back + i)]
                v = src[u(row + i)]
                take = beats(v, h)
                run[u(here + i)] = v if take else h
                v_at = src_at[u(row + i)]
                h_at = run_at[u(back + i)]
                run_at[u(here + i)] = v_at if take else h_at
        residue += 1
        if residue == d:
            residue = 0
            tap = 0 if tap == k - 1 else tap + 1


@uncounted_helper
def suffix_runs(run, run_at, to, src, src_at, at, n, inner, k, d):
    """``run[to + m*inner:][:inner]`` = the first maximum of rows ``m, m + d, ...`` of
    ``src[at:]`` up to the end of m's block (see :func:`prefix_runs`) or of the rows."""
    u = np.uint64
    for m in range(n - 1, -1, -1):
        here = to + m * inner
        row = at + m * inner
        if (m // d) % k == k - 1 or m + d >= n:
            for i in range(inner):
                run[u(here + i)] = src[u(row + i)]
            if run_at is not None:
                for i in range(inner):
                    run_at[u(here + i)] = src_at[u(row + i)]
        elif run_at is None:
            fold_pair(run, here, src, row, run, here + d * inner, inner, False)
        else:
            ahead = here + d * inner
            for i in range(inner):
                h = src[u(row + i)]
                v = run[u(ahead + i)]
                take = beats(v, h)
                run[u(here + i)] = v if take else h
                v_at = run_at[u(ahead + i)]
                h_at = src_at[u(row + i)]
                run_at[u(here + i)] = v_at if take else h_at


@uncounted_helper
def fill_column(dst, dst_at, targets, rows, value):
    """``dst[targets[r]]`` = ``value`` (an empty window's), positions -1, for every row r."""
    for r in range(rows):
        dst[targets[r]] = value
        if dst_at is not None:
            dst_at[targets[r]] = -1


@uncounted_helper
def fill(dst, dst_at, to, to_at, count, value):
    """``dst[to:to + count]`` = ``value`` (an empty window's), positions (from ``to_at``) -1."""
    for i in range(count):
        dst[to + i] = value
    if dst_at is not None:
        for i in range(count):
            dst_at[to_at + i] = -1
