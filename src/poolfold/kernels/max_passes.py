"""Window maximum by separable passes, one spatial axis at a time: any rank, window, stride,
dilation and padding, channels-first or channels-last.

A window is a box, so its first maximum in row-major window order is found axis by axis:
reduce the last axis first, then each axis before it, each pass keeping the first maximum
(first NaN) of its taps in order (:mod:`poolfold.kernels.folds`).  The passes work on a
*slab* at a time, small enough to stay in cache: whole planes (several when they are small),
or a range of output rows along the first axis of one large plane.

Tensors are seen as ``planes`` rows of ``S * E`` elements: ``S`` spatial positions of ``E``
elements each, ``E = 1`` channels-first (a plane per image and channel) and ``E = C``
channels-last (a plane per image).  Between passes, an intermediate result has *units*
(everything before the axis the next pass reduces), that axis's extent ``n`` and an *inner*
run of contiguous elements per position along it (what the passes after it reduced, times
``E``).  The pass over an axis of stride ``s`` reads its input in *phases*: rows ``m`` with
the same ``m % s`` are stored together, so that tap t of every output is one contiguous stream
(``o*s + c_t`` for outputs o is slot ``o + c_t // s`` of phase ``c_t % s``) and a pass is a few
long vectorised loops rather than one short loop per output row.  Each pass writes its output
in the phases of the pass after it.

The last axis of a channels-first plane has no inner run: its pass reads each row of the
input where it lies (stride 1: tap t is the row shifted; stride 2: tap t is a stream of words
of two elements, :mod:`poolfold.kernels.words`; other strides: an output's taps at a time),
or, for long windows, turns ``L`` rows at a time into ``L`` lanes
(:mod:`poolfold.kernels.lanes`) and reduces those as an inner run.

Long windows (``axes[VAN_HERK]``) are reduced by van Herk / Gil-Werman runs: along the axis, blocks
of k taps (of one residue modulo the dilation) get their prefix and suffix maxima, and a
window, which spans at most two blocks, is the first maximum of a suffix then a prefix: about
three folds per position whatever the window's length.

Positions (for Indices) travel with the values: recorded where a pass reads the input (the
input's flat index, plane offset included), carried after.  A window with no tap inside the
input yields ``empty_value`` and position -1, which later passes keep (every row they fold for
such an output is empty too).  Arrays are passed whole, with offsets (see
:mod:`poolfold.kernels.folds` for why).  The kernels never validate: the op layer has checked
every shape and table, and sized the slabs and scratch (``setup``).
"""

from __future__ import annotations

import numpy as np
from numba import types

from . import helper, helper_overload, kernel, read_only, uncounted_helper
from .folds import (fill, fill_column, fold, fold_column, fold_rows, fold_strided_rows,
                    fold_word_rows, prefix_runs, suffix_runs)
from .lanes import (evenly_spaced, from_lanes, from_lanes_tiled, lane_count, to_lanes,
                    to_lanes_tiled)
from .simd import vector_width
from .words import element_bits

# Rows of the per-axis table ``axes`` (one value per spatial axis in each).
IN, OUT, KERNEL, STRIDE, DILATION, UNCUT_LO, UNCUT_HI, VAN_HERK = range(8)
AXIS_ROWS = 8
# Entries of ``setup``: how the planes are cut into slabs, and the scratch each slab needs.
(CHANNELS, LAST_MODE, PLANES_PER_ITEM, ROWS_PER_ITEM, ITEMS_PER_PLANE, COLUMN_MAJOR,
 STAGE_CAPACITY, RUN_CAPACITY, LANE_CAPACITY, LANE_OUTPUTS) = range(10)
SETUP_SIZE = 10
# How the pass over a channels-first last axis reads it (setup[LAST_MODE]).
SHIFTED, WORDS, LANES = range(3)
# Rows the channels-first last-axis pass takes at a time, then the windows the padding cuts
# in them, while the rows are in cache (a call per row for those costs more than the rest).
ROWS_IN_CACHE = 64


def _positions(indices, size):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_positions)
def _positions_overload(indices, size):
    """Scratch for ``size`` positions, or None when the call wants no Indices: numba then
    compiles none of the position-keeping code (it drops the branches an ``is None`` test on
    an argument rules out)."""
    if isinstance(indices, types.NoneType):
        return lambda indices, size: None
    return lambda indices, size: np.empty(size, np.int64)


@uncounted_helper
def _place_units(targets, units, n, phases, next_units, base, pitch):
    """``targets[u]`` = ``base + r*pitch``, r the row of unit u (of ``units``) in the next
    pass's layout: ``next_units`` units of ``n`` positions in ``phases`` phases, position m
    of a unit being slot ``m // phases`` of phase ``m % phases``, and each phase holding every
    unit's slots in turn.  Counted, without a division per unit."""
    per_phase = (n + phases - 1) // phases
    outer = m = phase = slot = 0
    for u in range(units):
        targets[u] = base + ((phase * next_units + outer) * per_phase + slot) * pitch
        m += 1
        phase += 1
        if phase == phases:
            phase = 0
            slot += 1
        if m == n:
            m = phase = slot = 0
            outer += 1


@uncounted_helper
def _run_pass(src, src_at, units, n, inner, phases, first, lo, hi, k, s, d, uncut_lo, uncut_hi,
              shift, o_b, o_e, run, run_at, van_herk, dst, dst_at, targets, base_at, starts,
              empty_value):
    """The pass over one axis whose positions carry a contiguous run of ``inner`` elements.

    ``src`` (and ``src_at``, laid out the same) holds ``units`` blocks of ``n`` positions of
    ``inner`` elements, in ``phases`` phases (1, or the stride ``s``).  Output o, for o in
    ``[o_b, o_e)``, folds the positions ``first[o] - shift + t*d`` for taps t in
    ``[lo[o], hi[o])``; outputs ``[uncut_lo, uncut_hi)`` have every tap inside.  Each unit's
    outputs go, as a block of ``(o_e - o_b) * inner`` elements, to ``dst[targets[u]:]``, and
    their positions to ``dst_at[targets[u] - base_at:]`` (see :func:`_place_units`).

    With ``van_herk``, the windows are folded from prefixes and suffixes of blocks along the
    axis, kept in ``run`` (``2 * n * inner`` elements), and the input is in one phase.
    ``starts`` is scratch for two rows of tap offsets."""
    flat_lo = max(o_b, uncut_lo)
    flat_hi = min(o_e, uncut_hi)
    flat = flat_lo < flat_hi and (phases == s or s == 1)
    per_phase = (n + phases - 1) // phases
    unit_starts = starts[0]  # where tap t of the uncut outputs starts, in unit 0
    here = starts[1]
    if flat:
        for t in range(k):
            m = first[flat_lo] - shift + t * d
            unit_starts[t] = ((m % phases) * units * per_phase + m // phases) * inner
    for u in range(units):
        to = targets[u]
        to_at = to - base_at
        if van_herk:
            _van_herk(src, src_at, u * n * inner, n, inner, first, lo, hi, k, s, d, flat_lo,
                      flat_hi, shift, o_b, o_e, run, run_at, dst, dst_at, to, to_at, here,
                      empty_value)
            continue
        if flat:  # every uncut output at once: tap t is one stream
            for t in range(k):
                here[t] = unit_starts[t] + u * per_phase * inner
            at = (flat_lo - o_b) * inner
            fold(dst, dst_at, to + at, to_at + at, src, src_at, here, k,
                 (flat_hi - flat_lo) * inner)
            _cut_outputs(src, src_at, u, units, per_phase, inner, phases, first, lo, hi, d,
                         shift, o_b, o_b, flat_lo, dst, dst_at, to, to_at, here, empty_value)
            _cut_outputs(src, src_at, u, units, per_phase, inner, phases, first, lo, hi, d,
                         shift, o_b, flat_hi, o_e, dst, dst_at, to, to_at, here, empty_value)
        else:
            _cut_outputs(src, src_at, u, units, per_phase, inner, phases, first, lo, hi, d,
                         shift, o_b, o_b, o_e, dst, dst_at, to, to_at, here, empty_value)


@uncounted_helper
def _cut_outputs(src, src_at, u, units, per_phase, inner, phases, first, lo, hi, d, shift, o_b,
                 o_lo, o_hi, dst, dst_at, to, to_at, here, empty_value):
    """Outputs ``[o_lo, o_hi)`` of unit u of :func:`_run_pass`, one at a time: windows the
    padding cuts, or every window when the input's phases do not match the stride."""
    for o in range(o_lo, o_hi):
        at = (o - o_b) * inner
        taps = hi[o] - lo[o]
        if taps <= 0:
            fill(dst, dst_at, to + at, to_at + at, inner, empty_value)
            continue
        for t in range(taps):
            m = first[o] - shift + (lo[o] + t) * d
            here[t] = (((m % phases) * units + u) * per_phase + m // phases) * inner
        fold(dst, dst_at, to + at, to_at + at, src, src_at, here, taps, inner)


@uncounted_helper
def _van_herk(src, src_at, unit_at, n, inner, first, lo, hi, k, s, d, flat_lo, flat_hi, shift,
              o_b, o_e, run, run_at, dst, dst_at, to, to_at, here, empty_value):
    """One unit of :func:`_run_pass` (its ``n`` positions at ``src[unit_at:]``, in order) by
    van Herk / Gil-Werman runs (see the module doc).

    ``run[:n*inner]`` gets the prefix maxima and ``run[n*inner:]`` the suffix maxima of the
    blocks of k taps along the axis: position m is tap ``(m // d) % k`` of its block.
    Outputs ``[flat_lo, flat_hi)`` have every tap inside: at stride 1 they are folded as two
    streams, a suffix's and a prefix's (a window that is one whole block is its suffix and its
    prefix both, and folding a tap with itself keeps it)."""
    suffix = n * inner
    # int64 tap counts, not literals: fold then compiles once for every count
    one, two = np.int64(1), np.int64(2)
    prefix_runs(run, run_at, src, src_at, unit_at, n, inner, k, d)
    suffix_runs(run, run_at, suffix, src, src_at, unit_at, n, inner, k, d)
    runs = read_only(run)  # read as the passes read their source: one compile of fold
    flat = s == 1 and flat_lo < flat_hi
    if flat:
        a = first[flat_lo] - shift
        here[0] = suffix + a * inner
        here[1] = (a + (k - 1) * d) * inner
        at = (flat_lo - o_b) * inner
        fold(dst, dst_at, to + at, to_at + at, runs, run_at, here, two,
             (flat_hi - flat_lo) * inner)
    for o in range(o_b, o_e):
        if flat and flat_lo <= o < flat_hi:
            continue
        at = (o - o_b) * inner
        if hi[o] <= lo[o]:
            fill(dst, dst_at, to + at, to_at + at, inner, empty_value)
            continue
        a = first[o] - shift + lo[o] * d  # the window's first and last tap inside
        b = first[o] - shift + (hi[o] - 1) * d
        if (a // d) // k != (b // d) // k:  # across two blocks: a's suffix, then b's prefix
            here[0] = suffix + a * inner
            here[1] = b * inner
            fold(dst, dst_at, to + at, to_at + at, runs, run_at, here, two, inner)
        else:  # one block: from its start (a prefix) or to the axis's end (a suffix)
            here[0] = b * inner if (a // d) % k == 0 else suffix + a * inner
            fold(dst, dst_at, to + at, to_at + at, runs, run_at, here, one, inner)


@uncounted_helper
def _rows_pass(x, words, paired, base, rows, n, first, lo, hi, k, s, d, uncut_lo, uncut_hi,
               shift, o_b, o_e, dst, dst_at, targets, empty_value):
    """The pass over the last axis of channels-first planes, reading the ``rows`` rows of
    ``n`` elements at ``x[base:]`` where they lie: the uncut outputs as
    :func:`_fold_uncut` reads them (``paired``: at stride 2, as ``words``), then the outputs
    whose window the padding cuts, one output of a chunk of rows at a time.  Positions are
    recorded (an element's index in ``x``) and laid out as the values.  Row u's outputs go
    to ``dst[targets[u]:]`` (:func:`_place_units`)."""
    flat_lo = max(o_b, uncut_lo)
    flat_hi = min(o_e, uncut_hi)
    count = flat_hi - flat_lo
    for u in range(rows):
        targets[u] -= o_b
    bits = element_bits(x)
    for r0 in range(0, rows, ROWS_IN_CACHE):  # the cut windows while the rows are in cache
        chunk = min(ROWS_IN_CACHE, rows - r0)
        here = targets[r0:r0 + chunk]
        origin = base + r0 * n - shift  # where the chunk's first row has coordinate 0
        if count > 0:
            for r in range(chunk):
                here[r] += flat_lo
            e = origin + first[flat_lo]
            _fold_uncut(dst, dst_at, here, x, words, paired, e, n, chunk, k, s, d, count,
                        bits)
            for r in range(chunk):
                here[r] -= flat_lo
        for o in range(o_b, o_e):
            if count > 0 and flat_lo <= o < flat_hi:
                continue
            for r in range(chunk):
                here[r] += o
            taps = hi[o] - lo[o]
            if taps <= 0:
                fill_column(dst, dst_at, here, chunk, empty_value)
            else:
                fold_column(dst, dst_at, here, x, origin + first[o] + lo[o] * d, n, chunk, d,
                            taps)
            for r in range(chunk):
                here[r] -= o


@helper
def _lanes_pass(x, base, rows, n, first, lo, hi, k, s, d, uncut_lo, uncut_hi, shift, o_b, o_e,
                run, run_at, van_herk, lanes, lanes_at, lane_capacity, dst, dst_at, targets,
                starts, empty_value):
    """The pass over the last axis of channels-first planes through lanes
    (:mod:`poolfold.kernels.lanes`): ``L`` rows at a time become one unit of ``n`` positions
    with an inner run of ``L``, reduced by :func:`_run_pass` into ``lanes[lane_capacity:]``,
    and turned back into rows.  The lanes are in the stride's phases, but for van Herk runs,
    which read positions in order."""
    width = lane_count(x)
    side = vector_width(x)
    phases = 1 if van_herk else s
    outputs = o_e - o_b
    # values alone in one phase go through tiles transposed in registers (lanes.py)
    tiles_in = lanes_at is None and phases == 1 and n >= side
    for g in range(0, rows, width):
        group = min(width, rows - g)
        if tiles_in:
            to_lanes_tiled(x, base + g * n, group, n, lanes)
        else:
            to_lanes(x, base + g * n, group, n, lanes, lanes_at, phases)
        result = starts[2, :1]  # where _run_pass puts the lanes' outputs
        result[0] = lane_capacity
        # the lanes read as the passes read x: the folds compile once for both.  The lanes'
        # count is a literal, for which _run_pass compiles apart, on purpose: its loops over
        # one position's lanes then unroll into vector instructions (a runtime count made
        # 15x15 windows over float16 planes 2.6x slower)
        _run_pass(read_only(lanes), lanes_at, 1, n, width, phases, first, lo, hi, k, s, d,
                  uncut_lo, uncut_hi, shift, o_b, o_e, run, run_at, van_herk, lanes, lanes_at,
                  result, 0, starts, empty_value)
        even, pitch = evenly_spaced(targets[g:g + group], group)
        if lanes_at is None and even and outputs >= side:
            from_lanes_tiled(lanes[lane_capacity:], outputs, group, dst, targets[g], pitch)
        else:
            from_lanes(lanes[lane_capacity:], _tail(lanes_at, lane_capacity), outputs, group,
                       dst, dst_at, targets[g:g + group], targets[g:g + group])


@uncounted_helper
def _fold_uncut(dst, dst_at, targets, x, words, paired, e, n, rows, k, s, d, count, bits):
    """The uncut outputs of rows read where they lie: as ``words`` (``paired``, stride 2),
    shifted (stride 1) or strided (any other stride).  Chosen at run time, once per chunk of
    rows: chosen by type instead (``words`` None or not), the whole row pass compiled twice
    for each element type, about 2 of the passes kernel's 18 s."""
    if paired:
        fold_word_rows(dst, dst_at, targets, words, e, n, rows, k, d, count, bits)
    elif s == 1:
        fold_rows(dst, dst_at, targets, x, e, n, rows, k, d, count)
    else:
        fold_strided_rows(dst, dst_at, targets, x, e, n, rows, k, s, d, count)


def _last_axis_pass(lanes, x, words, paired, base, rows, n, first, lo, hi, k, s, d, uncut_lo,
                    uncut_hi, shift, o_b, o_e, run, run_at, van_herk, lane_space, lane_space_at,
                    lane_capacity, dst, dst_at, targets, starts,
                    empty_value):  # pragma: no cover
    raise NotImplementedError


@helper_overload(_last_axis_pass)
def _last_axis_pass_overload(lanes, x, words, paired, base, rows, n, first, lo, hi, k, s, d,
                             uncut_lo, uncut_hi, shift, o_b, o_e, run, run_at, van_herk,
                             lane_space, lane_space_at, lane_capacity, dst, dst_at, targets,
                             starts, empty_value):
    """The pass over a channels-first last axis: through lanes (``lanes`` not None) or over
    rows where they lie (``paired``: as words); chosen by type, though :func:`max_passes`
    holds both calls and so compiles both for each of its signatures."""
    if isinstance(lanes, types.NoneType):
        def in_place(lanes, x, words, paired, base, rows, n, first, lo, hi, k, s, d, uncut_lo,
                     uncut_hi, shift, o_b, o_e, run, run_at, van_herk, lane_space, lane_space_at,
                     lane_capacity, dst, dst_at, targets, starts, empty_value):
            _rows_pass(x, words, paired, base, rows, n, first, lo, hi, k, s, d, uncut_lo,
                       uncut_hi, shift, o_b, o_e, dst, dst_at, targets, empty_value)
        return in_place

    def through_lanes(lanes, x, words, paired, base, rows, n, first, lo, hi, k, s, d, uncut_lo,
                      uncut_hi, shift, o_b, o_e, run, run_at, van_herk, lane_space,
                      lane_space_at, lane_capacity, dst, dst_at, targets, starts, empty_value):
        _lanes_pass(x, base, rows, n, first, lo, hi, k, s, d, uncut_lo, uncut_hi, shift, o_b,
                    o_e, run, run_at, van_herk, lane_space, lane_space_at, lane_capacity, dst,
                    dst_at, targets, starts, empty_value)
    return through_lanes


def _tail(a, lo):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_tail)
def _tail_overload(a, lo):
    """``a[lo:]``, or None for a None ``a``."""
    if isinstance(a, types.NoneType):
        return lambda a, lo: None
    return lambda a, lo: a[lo:]


@uncounted_helper
def _nchw_positions(base, count, plane_size, channels, dst_at):
    """``dst_at[j]`` = the position of element ``base + j`` of a channels-last tensor whose
    planes (images) hold ``plane_size`` elements: its index in the channels-first tensor."""
    spatial = plane_size // channels
    for j in range(count):
        f = base + j
        image = f // plane_size
        within = f - image * plane_size
        dst_at[j] = (image * channels + within % channels) * spatial + within // channels


@uncounted_helper
def _channels_first_indices(positions, at, units, block, channels, indices, p0, q0):
    """Unit u's positions (``block`` of them from ``positions[at + u*block]``, outputs by
    channels) into ``indices[p0 + u]``, which holds channel c's outputs from
    ``c * (indices.shape[1] // channels)``, from output ``q0`` on."""
    spatial_out = indices.shape[1] // channels
    outputs = block // channels
    for u in range(units):
        held = at + u * block
        for c in range(channels):
            for q in range(outputs):
                indices[p0 + u, c * spatial_out + q0 + q] = positions[held + q * channels + c]


@uncounted_helper
def _to_column_major(indices, p0, p1, q0, q1, in_shape, spatial_in, channels):
    """Indices ``[q0, q1)`` of every channel of rows ``[p0, p1)`` from row-major positions to
    first-axis-fastest ones (storage_order 1), plane offset kept; -1 stays -1."""
    rank = in_shape.size
    spatial_out = indices.shape[1] // channels
    for p in range(p0, p1):
        for c in range(channels):
            for q in range(c * spatial_out + q0, c * spatial_out + q1):
                index = indices[p, q]
                if index < 0:
                    continue
                plane_at = index - index % spatial_in
                offset = index - plane_at
                column_major = 0
                weight = 1
                stride = spatial_in
                for a in range(rank):
                    stride //= in_shape[a]
                    column_major += (offset // stride) * weight
                    offset %= stride
                    weight *= in_shape[a]
                indices[p, q] = plane_at + column_major


@uncounted_helper
def _fill_empty(y, indices, p, q0, count, channels, empty_value):
    """Outputs ``[q0, q0 + count)`` of plane p (channels included) are empty windows: Y gets
    ``empty_value`` and every channel's Indices -1."""
    for i in range(count):
        y[p, q0 + i] = empty_value
    if indices is not None:
        spatial_out = indices.shape[1] // channels
        for c in range(channels):
            for q in range(q0 // channels, (q0 + count) // channels):
                indices[p, c * spatial_out + q] = -1


@kernel()
def max_passes(x, y, indices, words, axes, taps, setup, empty_value, start, stop):
    """Fill ``y`` (and ``indices`` unless None) for the work items ``[start, stop)``.

    x, y : (planes, S_in * E), (planes, S_out * E), value views
    indices : None, or (planes, E * S_out) int64: channels-first, flat in the tensor
    words : the elements of ``x`` by pairs, flat (:func:`poolfold.kernels.words.words_view`),
        read when ``setup[LAST_MODE]`` is WORDS (else any array of that type, empty)
    axes : (AXIS_ROWS, rank) int64, the per-axis geometry (rows IN, OUT, ... above);
        UNCUT_LO, UNCUT_HI bound the outputs whose window has every tap inside, VAN_HERK
        marks the axes reduced by van Herk runs
    taps : (3, rank, max output size) int64, the first tap and the in-bounds taps
        ``[lo, hi)`` of every output (:class:`poolfold.geometry.TapTable`)
    setup : (SETUP_SIZE,) int64, the slabs and scratch (entries CHANNELS, ... above);
        LAST_MODE says how a channels-first last axis is read (SHIFTED, WORDS or LANES)

    One compile per element type and Indices or not (None compiles none of the position
    code): every way of reading the last axis, and van Herk runs, are in each, chosen at run
    time.  Compiled apart (a signature per way, as None arguments would make them), the
    tests' calls needed six times as many compiles of this kernel, each of about half the
    time.

    A work item is ``setup[PLANES_PER_ITEM]`` whole planes or, with
    ``setup[ITEMS_PER_PLANE]`` > 1 items per plane, ``setup[ROWS_PER_ITEM]`` outputs along the
    first axis of one plane.
    """
    planes, plane_size = x.shape
    rank = axes.shape[1]
    last = rank - 1
    channels = setup[CHANNELS]
    per_item = setup[PLANES_PER_ITEM]
    items_per_plane = setup[ITEMS_PER_PLANE]
    in_row0 = plane_size // axes[IN, 0] if axes[IN, 0] else 0  # elements per row of axis 0
    out_pitch = y.shape[1]
    out_row0 = out_pitch // axes[OUT, 0]  # ...and per output row (channels included)
    flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    capacity = setup[STAGE_CAPACITY]
    stage = np.empty(2 * capacity, x.dtype)
    stage_at = _positions(indices, 2 * capacity)
    run = np.empty(setup[RUN_CAPACITY], x.dtype)
    run_at = _positions(indices, setup[RUN_CAPACITY])
    mode = setup[LAST_MODE]
    lane_capacity = setup[LANE_CAPACITY]
    lane_space = np.empty(lane_capacity + setup[LANE_OUTPUTS] * lane_count(x), x.dtype)
    lane_space_at = _positions(indices, lane_space.size)
    # Tap offsets held at once: a whole window's where every tap is inside (the window then
    # fits in its axis), else an output's in-bounds taps, never more than the axis holds; a
    # kernel far longer than its axis (2**40 taps) needs no more.
    most_taps = 1
    for a in range(rank):
        most_taps = max(most_taps, min(axes[KERNEL, a], axes[IN, a]))
    starts = np.empty((3, max(most_taps, lane_count(x))), np.int64)
    # a destination per unit of any pass: the last axis's pass has the most units
    row_targets = np.empty(max(1, per_item * (plane_size // channels) // max(axes[IN, last], 1)),
                           np.int64)
    extent = np.empty(rank, np.int64)  # the slab's extent along each axis
    for item in range(start, stop):
        if items_per_plane == 1:
            p0 = item * per_item
            p1 = min(p0 + per_item, planes)
            o0 = 0
            o1 = axes[OUT, 0]
        else:
            p0 = item // items_per_plane
            p1 = p0 + 1
            o0 = (item % items_per_plane) * setup[ROWS_PER_ITEM]
            o1 = min(o0 + setup[ROWS_PER_ITEM], axes[OUT, 0])
        r_lo = 0
        r_hi = axes[IN, 0]
        if items_per_plane > 1:  # only the input rows this slab's windows reach
            r_lo = min(max(taps[0, 0, o0], 0), axes[IN, 0])
            reach = taps[0, 0, o1 - 1] + (axes[KERNEL, 0] - 1) * axes[DILATION, 0] + 1
            r_hi = max(min(reach, axes[IN, 0]), r_lo)
        if r_hi == r_lo:  # the slab's windows reach no input row: all of them are empty
            _fill_empty(y, indices, p0, o0 * out_row0, (o1 - o0) * out_row0, channels,
                        empty_value)
            continue
        for a in range(rank):
            extent[a] = axes[IN, a]
        extent[0] = r_hi - r_lo
        base = p0 * plane_size + r_lo * in_row0
        units = p1 - p0
        for a in range(rank):
            units *= extent[a]
        side = 0  # the stage half the next pass writes
        # int64, not the literal 1: numba would compile _run_pass for the literal too
        src_phases = np.int64(1)
        inner = channels
        block = 0
        for a in range(last, -1, -1):
            units //= extent[a]  # this pass's units: everything before axis a
            o_b = o0 if a == 0 else 0
            o_e = o1 if a == 0 else axes[OUT, a]
            shift = r_lo if a == 0 else 0
            block = (o_e - o_b) * inner
            here = side * capacity
            if a == 0:  # the last pass writes y, channels-first positions straight to indices
                dst = y_flat
                _place_units(row_targets, units, 1, 1, units, p0 * out_pitch + o0 * inner,
                             out_pitch)
                at_base = 0
                if channels > 1:  # channels-last positions to the stage, transposed below
                    at_base = row_targets[0] - here
            else:
                dst = stage
                next_n = extent[a - 1]
                next_phases = 1 if axes[VAN_HERK, a - 1] else axes[STRIDE, a - 1]
                _place_units(row_targets, units, next_n, next_phases, units // next_n, here,
                             block)
                at_base = 0
            dst_at = _destination_positions(indices, stage_at, a == 0 and channels == 1)
            first = taps[0, a]
            lo = taps[1, a]
            hi = taps[2, a]
            k = axes[KERNEL, a]
            s = axes[STRIDE, a]
            d = axes[DILATION, a]
            van_herk = axes[VAN_HERK, a] != 0
            if a == last and channels == 1 and mode == LANES:
                _last_axis_pass(True, flat, words, False, base, units, extent[a], first, lo, hi,
                                k, s, d, axes[UNCUT_LO, a], axes[UNCUT_HI, a], shift, o_b, o_e,
                                run, run_at, van_herk, lane_space, lane_space_at,
                                lane_capacity, dst, dst_at, row_targets, starts, empty_value)
            elif a == last and channels == 1:  # SHIFTED or WORDS: one compile for both
                _last_axis_pass(None, flat, words, mode == WORDS, base, units, extent[a], first,
                                lo, hi, k, s, d, axes[UNCUT_LO, a], axes[UNCUT_HI, a], shift,
                                o_b, o_e, run, run_at, van_herk, lane_space, lane_space_at,
                                lane_capacity, dst, dst_at, row_targets, starts, empty_value)
            elif a == last:  # channels-last input, read where it lies
                size = units * extent[a] * inner
                if indices is not None:  # its positions, once
                    _nchw_positions(base, size, plane_size, channels,
                                    stage_at[(1 - side) * capacity:])
                _run_pass(flat[base:base + size], _tail(stage_at, (1 - side) * capacity),
                          units, extent[a], inner, src_phases, first, lo, hi, k, s, d,
                          axes[UNCUT_LO, a], axes[UNCUT_HI, a], shift, o_b, o_e, run, run_at,
                          van_herk, dst, dst_at, row_targets, at_base, starts, empty_value)
            else:
                there = (1 - side) * capacity
                # read-only, as x is above: one compile of _run_pass serves both
                _run_pass(read_only(stage[there:there + capacity]), _tail(stage_at, there),
                          units, extent[a], inner, src_phases, first, lo, hi, k, s, d,
                          axes[UNCUT_LO, a], axes[UNCUT_HI, a], shift, o_b, o_e, run, run_at,
                          van_herk, dst, dst_at, row_targets, at_base, starts, empty_value)
            src_phases = 1 if a == 0 or axes[VAN_HERK, a - 1] else axes[STRIDE, a - 1]
            side = 1 - side
            inner = block
        q0 = o0 * (out_row0 // channels)  # the slab's first spatial output
        if indices is not None:
            if channels > 1:
                _channels_first_indices(stage_at, (1 - side) * capacity, p1 - p0, block,
                                        channels, indices, p0, q0)
            if setup[COLUMN_MAJOR]:
                _to_column_major(indices, p0, p1, q0, q0 + (o1 - o0) * (out_row0 // channels),
                                 axes[IN], plane_size // channels, channels)


def _destination_positions(indices, stage_at, final):  # pragma: no cover - replaced in numba
    raise NotImplementedError


@helper_overload(_destination_positions)
def _destination_positions_overload(indices, stage_at, final):
    """Where a pass puts positions: flat ``indices`` for the last pass over channels-first
    planes, else the stage; None without Indices."""
    if isinstance(indices, types.NoneType):
        return lambda indices, stage_at, final: None

    def impl(indices, stage_at, final):
        if final:
            return indices.reshape(indices.size)
        return stage_at

    return impl
