"""Window sums of channels-first planes at a cost that grows little with the window:
AveragePool and LpPool of float32, float16 and bfloat16 over windows too large for the row
sums (:mod:`poolfold.kernels.window_rows`), spatial rank 1 to 3.

**Along one axis**, over a row of terms padded with zeros (positions from the first window's
first tap, ``(out - 1) * s + (k - 1) * d + 1`` of them), either

- every window adds its k taps (``direct``: windows that overlap little), or, where
  windows overlap (``running``: the axes :func:`poolfold.ops.averaging.running_sum_axes`
  names),
- a leading axis by van Herk / Gil-Werman block sums: along each dilation phase the
  positions fall in blocks of k taps, from the row's first position; a window is one
  whole block (its prefix sum) or the end of one block and the start of the next (a suffix
  plus a prefix).  Three additions per position whatever the window.  These sums round as
  the blocks fall, so the blocks are placed from the whole row's first position: a
  poolfold.dask slab's row starts OFFSET positions into their pattern
  (:func:`block_offset`), and its windows have the whole tensor's bits;
- the last axis by doubling (:func:`_doubled_levels`): the sums of 2, 4, 8 ... taps from
  every position, each level a pass of vectors over the row, and a window adds the levels
  that make up its k taps (:func:`_window_sums`), each output vector its pieces in
  registers, where an average is also scaled and stored
  (:func:`poolfold.kernels.simd.store_averages`): about log2(k) passes and one more.  A
  window's sum is then a tree grouped by its taps' places in the window alone, wherever the
  row starts.

Either way a window's sum adds its own values only, so an inf or a NaN stays in the windows
that hold it.

A leading axis is summed over whole rows of its inputs, up to :data:`COLUMNS` columns at a
time, its terms read from X as they are needed; a block's suffixes stay in the core's
first-level cache.  By blocks, its additions are a block program (:func:`_block_program`)
that :func:`poolfold.kernels.simd.run_block_program` runs over each step's columns, the
running prefix of each run of columns in registers.
The last axis by doubling takes a row a segment at a time, or the levels of rows shorter
than half a segment several rows at a time, as one row; window by window it is summed across
rows: a vector's worth of rows (16 float32 with AVX-512) is transposed in registers into
lanes (:func:`poolfold.kernels.simd.transpose_tile`), so that position j of every row is one
vector, summed there as a leading axis is, and transposed back.  Measured (float32, two
threads, stride 1, SAME): doubling took 1-D windows of 63 taps over (4,16,65536) from 4.2 ms
(the row sums) to 2.1, and with the leading axis streamed from X, 63x63 over (4,16,256,256)
from 3.9 ms to 3.1-3.2 and 63x63x63 over (2,8,64,64,64) from 6.4-7.1 to 5.6-5.9; each window
adding its pieces in registers, not a pass over the sums per piece, took the 63x63 on to 2.9
(more in docs/architecture.md).

**Accuracy.** The sums are of the ``acc`` argument's type: float32 for averages, float64 for
LpPool's |x| and x^2 (whose small values float32 would lose).  Along an axis a window's sum
is a tree of additions of depth at most k - 1 (a suffix of j taps plus a prefix of k - j; by
doubling at most log2(k) + popcount(k) - 1), and the axes nest, so the whole window's sum
has depth at most ``sum(k_a - 1) <= |V| - 1``: its error is within ``(|V| - 1) * u *
sum|x|``, on the average within ``|V| * u * max|x|``: the contract's bound for the
accumulator's u (SEMANTICS.md, "Arithmetic"), before Y's one rounding.  A float64 sum of
float32 terms cannot overflow; a float32 one can, where the average does not: a plane (1-D:
a group of rows) with a float32 sum that is not finite is summed again in float64, and the
averages Y then holds as inf or NaN, only, are stored from there (a window with an inf or a
NaN gives the same either way): the kernels mark such planes in ``flagged``, and the op
layer runs them again with float64 sums and ``patch`` (the float64 kernel is compiled only
when a call first needs it).  So each average depends on its window's values alone,
whichever planes are pooled together.  A NaN is stored as one quiet NaN: LLVM may take a
sum's operands in either order, and which of two NaNs an x86 sum keeps depends on it.

**A plane** (each work item is one plane, or a band of its first axis's outputs where
planes are fewer than threads: :func:`_band`; 1-D rows a group of planes at a time):

- rank 1: the rows' terms staged with their padding, a segment at a time (window by
  window, a segment of a vector's worth of rows), then the last axis;
- rank 2: the first axis from X into rows of its sums, zeros in their padding, a row's
  padding after its inputs the next row's before them (:func:`row_pitch`), then the last
  axis over those rows;
- rank 3: the first axis from X into a stack of slices of its sums, then each slice as a
  2-D plane of terms.

The first axis's outputs of a work item are taken a pass at a time (as many as the op layer's
``at_once``: :func:`poolfold.ops.averaging.block_pass_outputs`), each pass's windows summed
as the whole plane sums them (:func:`_first_axis_from`), so that the first axis's sums of a
large plane stay a few hundred KiB: a whole plane's, allocated by every kernel call, took
fresh pages from the system each time.

The kernels trust their tables: :mod:`poolfold.ops.averaging` builds and bounds them.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from . import helper_overload, kernel, uncounted_helper
from .half import narrow_to
from .simd import (KEEP, PROGRAM_FIELDS, RESET, SUFFIX, TERM, TO, add_pair, add_vectors,
                   run_block_program, store_averages, sum_vectors_screened, takes_block_terms,
                   transpose_tile, vector_width)
from .window_sum import AVERAGE, ROOT, _term, widen

# Rows of ``dims`` (one column per spatial axis): input and output sizes, kernel, stride,
# dilation, the padding before the input, the positions a padded row holds, whether the axis
# is summed by blocks (1) or window by window (0), and where its blocks start: OFFSET
# positions of the first block lie before the row's first position (0 in memory; a
# poolfold.dask slab's blocks are the whole tensor's: see :func:`block_offset`).
N, OUT, KERNEL, STRIDE, DILATION, PAD_BEGIN, PADDED, RUNNING, OFFSET = range(9)
DIM_ROWS = 9

# A leading axis is summed at most this many columns at a time, and by blocks as many as
# keep a block's suffixes and the next block's prefix within SUFFIX_BYTES (a first-level
# data cache of 48 KiB), a multiple of 16, at least 16 (:func:`leading_columns`): 2 + the
# most inputs a block holds, k where the axis holds a whole block of them (63 taps SAME
# over 64 inputs hold 32 a block: 256 columns, not 176, took 63x63x63 over 16 planes of
# 64^3 to 0.97 of the time, one thread, paired over 11 rounds, load 0.12 at the start,
# 0.68 at the end).  A row's columns are split into steps of about equal width.
# Measured, one thread, float32, 63 taps along the first axis of (2,8,64,64,64) (rows 64 KiB
# apart): 64 columns 9.9 ms, 128 6.3-6.6, 256 6.1; 7 taps 9.3, 6.5, 5.3; 63x63 over
# (4,16,256,256) 6.9, 6.0, 6.3.  Two threads, 63x63 over (4,16,256,256): steps of 112, 112
# and 32 columns (32 KiB) 2.44-2.70 ms, of 96, 96 and 64 2.63-2.70, of 128 and 128 (48 KiB,
# even steps) 2.34-2.59.
COLUMNS = 256
SUFFIX_BYTES = 49152
# The last axis is summed in segments of about this many window starts (a multiple of its
# blocks' span), a vector's worth of rows at a time.
SEGMENT = 256
# Where the last axis is summed by doubling, a row goes this many window starts at a time:
# its partial sums then stay in the core's first-level cache (4 KiB of float32).
DOUBLING_STARTS = 1024
# Vectors a row of lanes may hold beyond its positions: transposed tiles read and write a
# whole vector of positions; 16 float32 (AVX-512) is the widest.
SLACK = 16


def padded_length(out: int, k: int, s: int, d: int) -> int:
    """The positions a row of ``out`` windows of ``k`` taps at stride ``s`` and dilation
    ``d`` covers, from the first window's first tap."""
    return (out - 1) * s + (k - 1) * d + 1


_padded_length = njit(padded_length)


def block_offset(first_output: int, k: int, s: int, d: int) -> int:
    """Where a leading axis's blocks start in a row whose first window is the whole row's
    window ``first_output``: the positions of its first block before its first position.
    Along each dilation phase the whole row's blocks start every k taps from its first
    position, so their pattern repeats every ``k * d`` positions; a slab's row that starts
    this far into it has the whole row's blocks, and each window the whole row's bits."""
    return first_output * s % (k * d)


# Entries of ``segments``, the last axis's segmentation (:func:`segments`).
STARTS, POSITIONS, LEVELS = range(3)


def segments(k: int, d: int, running: bool, padded: int) -> np.ndarray:
    """The last axis's segments, for the kernels (``segments``) and the op layer's scratch
    bound: STARTS, the window starts a segment holds (:data:`DOUBLING_STARTS` where the
    axis is summed by doubling, :data:`SEGMENT` window by window); POSITIONS, the positions
    a segment spans, with a vector's worth of slack; LEVELS, the doubling's levels kept
    apart from the terms (the sums of 2, 4, 8 ... taps, up to the largest power of two in
    k: see :func:`_doubled_levels`; their room :func:`level_room`).  A segment may start
    anywhere: a window's sum depends on its own values alone, either way."""
    levels = 0
    if running:  # a segment may hold several short rows (see _last_axis)
        starts, positions = DOUBLING_STARTS, DOUBLING_STARTS + (k - 1) * d + 1
        levels = int(k).bit_length() - 1
    else:
        starts, positions = SEGMENT, min(padded, SEGMENT + (k - 1) * d + 1)
    table = np.array([starts, positions + SLACK, levels], np.int64)
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


@njit(inline="always")
def _copy(dst, to, src, at, width):
    """``dst[to:][:width]`` = ``src[at:][:width]``."""
    u = np.uint64
    for c in range(width):
        dst[to + u(c)] = src[at + u(c)]


@uncounted_helper
def _lane_sums(dst, dst_at, dst_step, terms, width, start, out, k, s, d):
    """Window by window: output o (taps at positions ``start + o * s + t * d``, t < k, of
    ``terms``, position j at ``terms[j * width:]``) into ``dst[dst_at + o * dst_step:]
    [:width]``, its taps added in order."""
    u = np.uint64
    w = u(width)
    for o in range(out):
        at = u(start + o * s) * w
        to = u(dst_at + o * dst_step)
        if k == 1:
            _copy(dst, to, terms, at, width)
            continue
        _add(dst, to, terms, at, terms, at + u(d) * w, width)
        for t in range(2, k):
            _add(dst, to, dst, to, terms, at + u(t * d) * w, width)


def level_room(levels: int, segment: int) -> int:
    """The positions past its terms that the last axis's doubling keeps ``levels`` levels of
    a segment's ``segment`` positions in (:func:`_doubled_levels`): each slot rounded up to
    whole vectors, the first on a whole vector."""
    return levels * (segment + SLACK) + SLACK if levels else 0


_level_room = njit(level_room)


@uncounted_helper
def _doubled_levels(terms, src_at, length, k, d, levels_at, level_pitch, pieces):
    """The levels of a doubling over ``terms[src_at:][:length]``: level m holds, from
    each position, the sum of m taps ``d`` apart, level 2m the sum of level m's position
    and of the one m taps on (one pass of vectors over the positions).  Level 1 is the
    terms themselves; the others go to slots of ``level_pitch`` positions (rounded up to
    whole vectors) in ``terms`` from the first whole vector at or after ``levels_at`` (room
    for :func:`level_room`), a level no window takes overwritten in place by the next: a
    pass then loads one level and stores the next without splitting cache lines (a pass of
    unaligned vectors took 2.5 cycles a vector, aligned but for the level m taps on 1.9).  A
    window adds, from its first tap on, the levels of the powers of two that make up k,
    smallest first: ``pieces[t]`` is where the first window's t-th piece lies.  Returns
    the pieces' count.  A window's sum is then a tree over its own values, grouped by
    their places in the window alone, wherever the row or the segment starts."""
    lanes = vector_width(terms)
    behind = (terms.ctypes.data // terms.itemsize + levels_at) % lanes
    slot = levels_at + (lanes - behind) % lanes
    level_pitch = (level_pitch + lanes - 1) // lanes * lanes
    cur_at = src_at  # level m, from each position
    m, rest, reach, taken = 1, k, 0, 0  # reach: the taps taken so far
    while True:
        kept = rest & 1
        if kept:  # the windows take the m taps from their tap ``reach`` on
            pieces[taken] = cur_at + reach * d
            taken += 1
            reach += m
        rest >>= 1
        if rest == 0:
            return taken
        length -= m * d
        to = cur_at
        if kept or cur_at == src_at:
            to = slot
            slot += level_pitch
        add_pair(terms, to, terms, cur_at, terms, cur_at + m * d, length)
        cur_at = to
        m *= 2


@uncounted_helper
def _window_sums(sums, to, terms, pieces, taken, shift, count, s):
    """``sums[to + o]`` = the window from position ``shift + o * s`` of a doubling's levels
    (:func:`_doubled_levels`: its ``pieces`` and their count), for o < ``count``.  At
    stride 1 each output vector adds its pieces in registers
    (:func:`sum_vectors_screened`), with no pass over ``sums`` per piece.  Whether a sum is
    not finite (the flag :func:`_store` otherwise takes)."""
    u = np.uint64
    if s == 1:
        for t in range(taken):
            pieces[t] += shift
        flagged = sum_vectors_screened(sums, to, terms, pieces, taken, count)
        for t in range(taken):
            pieces[t] -= shift
        return flagged != 0
    at = pieces[0] + shift
    for o in range(count):
        sums[u(to + o)] = terms[u(at + o * s)]
    for t in range(1, taken):
        at = pieces[t] + shift
        for o in range(count):
            sums[u(to + o)] += terms[u(at + o * s)]
    flagged = 0
    for o in range(count):
        total = sums[u(to + o)]
        flagged |= np.int64(total - total != 0.0)
    return flagged != 0


@uncounted_helper
def _stage_row(buf, buf_at, src, src_at, n, pad, length, mark, p):
    """``buf[buf_at + j]`` = the term of ``src[src_at + j - pad]`` for positions ``j <
    length`` whose input ``j - pad`` lies in ``[0, n)``, 0 elsewhere."""
    u = np.uint64
    lo = min(max(0, pad), length)  # the positions holding inputs: [lo, hi)
    hi = max(lo, min(length, pad + n))
    for i in range(u(buf_at), u(buf_at + lo)):
        buf[i] = 0.0
    shift = src_at - pad - buf_at
    for i in range(u(buf_at + lo), u(buf_at + hi)):
        buf[i] = _term(widen(src[u(i + shift)]), mark, p)
    for i in range(u(buf_at + hi), u(buf_at + length)):
        buf[i] = 0.0


@njit
def leading_columns(k: int, running: bool, itemsize: int) -> int:
    """The most columns a leading axis of ``k`` taps is summed at a time (see
    :data:`COLUMNS`)."""
    if not running:
        return COLUMNS
    return min(COLUMNS, max(16, SUFFIX_BYTES // ((k + 2) * itemsize) // 16 * 16))


@njit
def suffix_positions(dims, leading: int) -> int:
    """The scratch, in elements, of the block sums' ``leading`` leading axes (see
    :func:`_leading_axis`): k + 3 positions of up to :data:`COLUMNS` columns."""
    most = 0
    for a in range(leading):
        most = max(most, (dims[KERNEL, a] + 3) * COLUMNS)
    return most


@njit(inline="always")
def _phase_inputs(phase, d, pad, n, length):
    """Dilation phase ``phase`` of a row padded by ``pad`` (positions j < ``length``, input
    j - pad of ``n``): its positions, and the first and last of them that hold an input
    (none where last < first)."""
    chain = (length - 1 - phase) // d + 1
    first = max(0, -((phase - pad) // d))
    return chain, first, min(chain - 1, (pad + n - 1 - phase) // d)


@njit
def _inputs_a_block_holds(n, k, d, pad, length, offset):
    """The most inputs one block of a leading axis by blocks holds, over its phases, its
    blocks placed as :func:`_running_columns` places them: a bound on the suffixes it takes
    of a block (k where the axis holds a whole block of inputs; fewer where the windows are
    nearly as long as the axis, 32 for 63 taps SAME over 64 inputs)."""
    pad += offset
    length += offset
    most = 0
    for phase in range(min(d, length)):
        _, first, last = _phase_inputs(phase, d, pad, n, length)
        if last - first + 1 >= 2 * k - 1:
            return k
        for q in range(first // k, last // k + 1):
            most = max(most, min(last, q * k + k - 1) - max(first, q * k) + 1)
    return most


@njit(inline="always")
def _term_row(src, src_at, j, pad, n, width):
    """Where position ``j`` of a leading axis padded by ``pad`` reads its terms in ``src``,
    and whether it holds inputs (else zeros)."""
    i = j - pad
    return np.uint64(src_at + max(i, 0) * width), 0 <= i < n


@njit(inline="always")
def _term_into(dst, to, src, at, present, cols, mark, p):
    """``dst[to:][:cols]`` = the terms of ``src[at:][:cols]`` in ``dst``'s type (zeros where
    not ``present``)."""
    u = np.uint64
    if present:
        for c in range(u(cols)):
            dst[to + c] = narrow_to(_term(widen(src[at + c]), mark, p), dst)
    else:
        for c in range(u(cols)):
            dst[to + c] = 0.0


@njit(inline="always")
def _add_term(dst, to, first, first_at, src, at, present, cols, mark, p):
    """``dst[to:][:cols]`` = ``first[first_at:][:cols]`` + the terms of ``src[at:][:cols]``
    (zeros where not ``present``), added in ``dst``'s type."""
    u = np.uint64
    if present:
        for c in range(u(cols)):
            dst[to + c] = first[first_at + c] + narrow_to(_term(widen(src[at + c]), mark, p),
                                                          dst)
    else:
        zero = narrow_to(0.0, dst)
        for c in range(u(cols)):
            dst[to + c] = first[first_at + c] + zero


@njit(inline="always")
def _column_step(cols, held, running, itemsize):
    """The columns of each of a leading axis's steps over ``cols`` columns: about equal
    steps of at most :func:`leading_columns`, whole vectors of 16 but the last."""
    most = leading_columns(max(1, held), running, itemsize)
    steps = (cols + most - 1) // most
    return min(most, ((cols + steps - 1) // steps + 15) // 16 * 16)


@uncounted_helper
def _leading_axis(dst, dst_at, dst_pitch, src, src_at, n, width, cols, out, k, s, d, pad,
                  length, offset, running, partial, program, mark, p):
    """The sums along the leading axis of ``src[src_at:]`` viewed as ``(n, width)`` and
    padded by ``pad`` rows of zeros before it (positions j < ``length``: input row j - pad),
    of its first ``cols`` columns, into ``dst[dst_at + o * dst_pitch + c]`` (o < out, c <
    cols), in steps of about equal width of at most :func:`leading_columns` columns, the
    terms read from ``src`` as they are needed.  By blocks (``running``, see the module's
    docstring), a block program (:func:`_block_program`, in ``program``) run over each
    step's columns, ``partial`` holding a block's suffixes and the next block's prefix (k +
    3 rows of a step), its blocks ``offset`` positions into their pattern (see
    :func:`block_offset`); else each window adds its taps in order."""
    u = np.uint64
    # as many columns as keep the suffixes a block takes in the first-level cache
    held = _inputs_a_block_holds(n, k, d, pad, length, offset) if running else k
    step = _column_step(cols, held, running, partial.itemsize)
    entries = 0
    if running:
        entries = _block_program(program, dst_pitch, width, step, n, k, s, d, pad, length,
                                 offset, out)
    for c0 in range(0, cols, step):
        cw = min(step, cols - c0)
        to0 = dst_at + c0
        at0 = src_at + c0
        if running:
            _run_program(dst, to0, partial, src, at0, program, PROGRAM_AT, entries, cw,
                         (k + 2) * step, mark, p)
            continue
        for o in range(out):
            to = u(to0 + o * dst_pitch)
            at, present = _term_row(src, at0, o * s, pad, n, width)
            _term_into(dst, to, src, at, present, cw, mark, p)
            for t in range(1, k):
                at, present = _term_row(src, at0, o * s + t * d, pad, n, width)
                _add_term(dst, to, dst, to, src, at, present, cw, mark, p)


# A block program (:func:`_block_program`) starts with the key it was made for: its
# entries, then the arguments that made it (so that the axis before the last of every slice
# of a 3-D pass, the same axis each time, runs one program made once); its entries follow,
# rows of simd.PROGRAM_FIELDS.
KEY_FIELDS = 12
PROGRAM_AT = KEY_FIELDS


def program_room(padded: int, out: int, k: int, d: int) -> int:
    """The int64 elements a block program of a leading axis holds at most: its key and an
    entry per suffix, per prefix position and per window, and a few a block and a phase
    (``padded`` positions, a row's, and up to k * d more before them: the offset of a
    poolfold.dask slab's blocks)."""
    positions = padded + k * d
    return KEY_FIELDS + PROGRAM_FIELDS * (3 * positions + d * (k + 3) + out + 8)


_program_room = njit(program_room)


@njit
def new_program(room):
    """An empty block program of ``room`` elements (made for no arguments yet)."""
    program = np.empty(room, np.int64)
    program[:KEY_FIELDS] = -1
    return program


@njit
def _program_of(dims, a):
    """An empty block program with room for leading axis ``a`` of ``dims`` (none where it
    is summed window by window)."""
    if dims[RUNNING, a] != 1:
        return new_program(KEY_FIELDS)
    return new_program(_program_room(dims[PADDED, a], dims[OUT, a], dims[KERNEL, a],
                                     dims[DILATION, a]))


@njit(inline="always")
def _entry(program, e, reset, term, suffix, to, keep):
    """Append an entry to ``program`` (``e`` entries so far), or where it only stores and
    the entry before it only adds (a prefix's last term), fill in that entry's stores: the
    same sums, one entry fewer to run.  Returns the entries."""
    at = PROGRAM_AT + (e - 1) * PROGRAM_FIELDS
    if (reset == 0 and term < 0 and e > 0 and program[at + SUFFIX] < 0
            and program[at + TO] < 0 and program[at + KEEP] < 0):
        program[at + SUFFIX] = suffix
        program[at + TO] = to
        program[at + KEEP] = keep
        return e
    at += PROGRAM_FIELDS
    program[at + RESET] = reset
    program[at + TERM] = term
    program[at + SUFFIX] = suffix
    program[at + TO] = to
    program[at + KEEP] = keep
    return e + 1


@njit(inline="always")
def _prefix_entries(program, e, phase, base, held, upto, d, pad, n, width):
    """Extend the running prefix of the phase's positions from ``base``, which holds
    ``held`` of them, to ``upto``: the first its term (a padding position's zero: +0.0),
    each next one added where it holds an input (a padding position's zero left out).
    Returns the entries."""
    for i in range(held, upto):
        j = phase + (base + i) * d - pad  # the input row of position base + i
        present = 0 <= j < n
        if i == 0:
            e = _entry(program, e, 1 if present else 2, j * width if present else -1, -1,
                       -1, -1)
        elif present:
            e = _entry(program, e, 0, j * width, -1, -1, -1)
    return e


@njit
def _block_program(program, dst_pitch, width, w, n, k, s, d, pad, length, offset, out):
    """The program of a leading axis by blocks (run by :func:`_run_program` over each
    step's columns): along each phase, block by block, the block's suffixes into rows of
    ``partial`` (row t of ``w`` columns for the block's position t), then its windows in
    order, each a suffix of the block plus the next block's prefix so far (a running sum;
    a window that starts the block its whole prefix, kept in row k or k + 1).  Returns its
    entries; a program already made for these arguments is kept as it is.

    Only the sums a window reads are taken: a block's suffixes from its last input down to
    its first window after its first position (none where no window starts past it), and
    no addition of a padding position's zero.  A suffix from before the first input is
    that input's suffix, one from past the last input is zero (its window is then the next
    block's prefix), and a prefix stays as it is over padding.  Adding a zero changes no
    sum but the sign of a zero, so the sums are the whole blocks' sums, grouped as they
    are, wherever the row starts; SAME windows as wide as their axis (63 taps over 64
    inputs, half of the padded row zeros) take half the additions.

    The blocks start ``offset`` positions before the row's first position
    (:func:`block_offset`): the row is taken from there, those positions as padding where
    no window starts.  A window's sum is a suffix of its own positions in one block plus a
    prefix of its own positions in the next, each added from the block's edge, so it is
    the one a longer row that holds it gives, bit for bit, wherever its blocks fall the
    same (a poolfold.dask slab of the whole tensor)."""
    key = (dst_pitch, width, w, n, k, s, d, pad, length, offset, out)
    same = program[0] >= 0
    for i in range(KEY_FIELDS - 1):
        same = same and program[1 + i] == key[i]
    if same:
        return program[0]
    for i in range(KEY_FIELDS - 1):
        program[1 + i] = key[i]
    e = 0
    pad += offset  # position j of the row is position j - offset of the caller's
    length += offset
    for phase in range(min(d, length)):
        chain, first, last = _phase_inputs(phase, d, pad, n, length)
        nxt, whole = k * w, (k + 1) * w
        e = _prefix_entries(program, e, phase, 0, 0, min(k, chain), d, pad, n, width)
        e = _entry(program, e, 0, -1, -1, -1, whole)  # the first block's whole prefix
        for q in range(0, chain, k):  # the block of positions q ... q + k - 1 of the phase
            span = min(k, chain - q)
            after = q + k  # the next block's first position
            reached = 0  # windows starting past the block's first position: [t_lo, reached)
            t_lo = span
            for t in range(1, span):
                if _window_at(phase + (q + t) * d - offset, s, out) >= 0:
                    t_lo = min(t_lo, t)
                    reached = t + 1
            lo, hi = max(first - q, 0), min(last - q, span - 1)  # its inputs' places
            for t in range(hi, max(lo, t_lo) - 1, -1):  # the suffixes it takes
                e = _entry(program, e, 1 if t == hi else 0,
                           (phase + (q + t) * d - pad) * width, -1, -1, t * w)
            held = 0  # the positions of the next block's prefix so far
            for t in range(0, max(1, reached)):
                o = _window_at(phase + (q + t) * d - offset, s, out)
                if o < 0:
                    continue  # no window starts here
                if t == 0:  # the block's whole prefix
                    e = _entry(program, e, 1, -1, whole, o * dst_pitch, -1)
                    continue
                e = _prefix_entries(program, e, phase, after, held, t, d, pad, n, width)
                held = t  # the windows come in order: t grows
                # no input from here to the block's end: the prefix alone
                suffix = -1 if t > hi or lo > hi else max(t, lo) * w
                e = _entry(program, e, 0, -1, suffix, o * dst_pitch, -1)
            if after < chain:  # the next block's whole prefix
                e = _prefix_entries(program, e, phase, after, held, min(k, chain - after),
                                    d, pad, n, width)
                e = _entry(program, e, 0, -1, -1, -1, nxt)
                nxt, whole = whole, nxt
    program[0] = e
    return e


def _run_program(dst, dst_at, partial, src, src_at, program, first, entries, cols, acc_at,
                 mark, p):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(_run_program)
def _run_program_overload(dst, dst_at, partial, src, src_at, program, first, entries, cols,
                          acc_at, mark, p):
    """Run a block program over ``cols`` columns: by
    :func:`poolfold.kernels.simd.run_block_program` (the running sums in registers) where it
    takes the terms (:func:`poolfold.kernels.simd.takes_block_terms`), else (LpPool's
    |x|^p) by numba's loops, the running sums in ``partial[acc_at:]``."""
    if takes_block_terms(src, dst, mark):
        def in_registers(dst, dst_at, partial, src, src_at, program, first, entries, cols,
                         acc_at, mark, p):
            run_block_program(dst, dst_at, partial, src, src_at, program, first, entries,
                              cols, mark)
        return in_registers

    def by_rows(dst, dst_at, partial, src, src_at, program, first, entries, cols, acc_at,
                mark, p):
        u = np.uint64
        acc = u(acc_at)
        for e in range(entries):
            at = first + e * PROGRAM_FIELDS
            reset, term = program[at + RESET], program[at + TERM]
            suffix, to, keep = program[at + SUFFIX], program[at + TO], program[at + KEEP]
            if reset > 0:
                start = narrow_to(-0.0 if reset == 1 else 0.0, partial)
                for c in range(u(cols)):
                    partial[acc + c] = start
            if term >= 0:
                _add_term(partial, acc, partial, acc, src, u(src_at + term), True, cols,
                          mark, p)
            if to >= 0 and suffix >= 0:
                _add(dst, u(dst_at + to), partial, acc, partial, u(suffix), cols)
            elif to >= 0:
                _copy(dst, u(dst_at + to), partial, acc, cols)
            if keep >= 0:
                _copy(partial, u(keep), partial, acc, cols)

    return by_rows


@njit(inline="always")
def _window_at(j, s, out):
    """The output whose window starts at position ``j`` of a row (windows every ``s``
    positions from 0, ``out`` of them), or -1.  Stride 1 without a division: a 64-bit
    division takes tens of cycles, and a block of k positions asks this of each of them."""
    if j < 0:
        return -1
    if s == 1:
        return j if j < out else -1
    o = j // s
    return o if o * s == j and o < out else -1


@njit
def row_pitch(pad: int, length: int, n: int, out: int) -> int:
    """How far apart :func:`_rows_of_slice` lays the rows the last axis is summed over:
    rows of ``length`` padded positions, ``out`` windows, inputs from position ``pad``
    (``n`` of them, those the windows reach).  A row's padding after its inputs is the next
    row's before them, so the rows are as far apart as the longer of the two needs (and at
    least ``out``, so that a doubling's group of rows fits its segment): every window reads
    the zeros and inputs it read in a row of its own, and the last axis takes fewer
    positions (63 taps SAME over 64 inputs: 95 a row, not 126).  A negative ``pad`` (the
    first window starts past the first input) gives rows a whole ``length`` apart."""
    cols = max(0, min(n, length - pad))
    return min(length, max(length - pad, pad + cols, out))


@uncounted_helper
def _rows_of_slice(rows, src, src_at, n_a, n_l, out_a, k_a, s_a, d_a, pad_a, len_a, offset_a,
                   run_a, pad_l, len_l, pitch, partial, program, mark, p):
    """The sums along the axis before the last of ``src[src_at:]`` viewed as ``(n_a, n_l)``,
    output row o at ``rows[o * pitch + pad_l:]`` (the inputs the last axis's windows reach:
    rows of ``len_l`` padded positions, :func:`row_pitch` apart), zeros around them up to
    the last row's ``len_l`` positions."""
    u = np.uint64
    cols = max(0, min(n_l, len_l - pad_l))
    for o in range(out_a):
        at = o * pitch
        for j in range(min(pad_l, pitch)):
            rows[u(at + j)] = 0.0
        for j in range(pad_l + cols, pitch):
            rows[u(at + j)] = 0.0
    for j in range(out_a * pitch, (out_a - 1) * pitch + len_l):
        rows[u(j)] = 0.0
    if cols > 0:
        _leading_axis(rows, pad_l, pitch, src, src_at, n_a, n_l, cols, out_a, k_a, s_a, d_a,
                      pad_a, len_a, offset_a, run_a, partial, program, mark, p)


@uncounted_helper
def _store(y, y_at, y_pitch, sums, pitch, rows, count, lead, lead_at, factors, factors_at,
           mode, p, patch, check):
    """Y's ``rows`` rows (``y_pitch`` apart) of ``count`` outputs from ``sums`` (rows
    ``pitch`` apart): the sum times ``lead[lead_at + r] * factors[factors_at + o]``
    (AVERAGE), its p-th root (ROOT) or itself, a NaN as one quiet NaN, rounded to Y's
    type.  ``patch`` (a float64 redo of float32 averages): only the averages Y holds as inf
    or NaN are stored.  With ``check``, whether an average's sum was not finite (the flag a
    redo follows; LpPool's float64 sums are never redone), else False (the caller noted
    it as the sums were taken)."""
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
        if mode == AVERAGE and check:
            scale = lead[lead_at + r]
            for o in range(count):
                total = np.float64(sums[at + u(o)])
                # an integer or-reduction, which vectorises (a bool one did not)
                flagged |= np.int64(total - total != 0.0)
                v = total * scale * factors[u(factors_at + o)]
                y[to + u(o)] = narrow_to(v if v == v else nan, y)
        elif mode == AVERAGE:
            scale = lead[lead_at + r]
            for o in range(count):
                v = np.float64(sums[at + u(o)]) * scale * factors[u(factors_at + o)]
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
               starts, levels_at, level_pitch, pieces, lanes, lane_sums, sums, lead, lead_at,
               factors, factors_at, mode, p, patch):
    """Sum, scale and store the last axis of ``rows`` rows of padded terms (``src`` from
    ``src_at``, rows ``pitch`` apart, read up to a vector past the last row's end): output
    o's window from position ``shift + o * s``.  By doubling (``running``), a row or a group
    of short rows at a time, the levels in ``src`` from ``levels_at`` on (room for
    :func:`segments`' LEVELS, ``level_pitch`` positions each), averages at stride 1 stored
    from the registers that sum them (but for a ``patch``), each row's outputs alone; else
    a vector's worth of rows at a time, transposed into lanes a segment at a time
    (``starts`` window starts: see :func:`segments`).  Y's rows from ``y_at``, ``y_pitch``
    apart (``patch``: see :func:`_store`).  Whether a sum was not finite."""
    flagged = False
    if running:  # by doubling (``sums`` its outputs)
        group = starts // pitch if s == 1 else 0
        if group > 1:
            # rows of at most half a segment, the levels and the windows of a group of them
            # at a time, as one row (short rows, one at a time, took 1.3x as long: 64
            # outputs; a call per row for the windows, 1.03-1.11x over 64^3 planes).  The
            # windows between one row's outputs and the next's, summed too, add values of
            # the two rows; no output takes them, and one that is not finite only marks the
            # item for the float64 redo, which then stores no average anew
            for r0 in range(0, rows, group):
                g = min(group, rows - r0)
                span = (g - 1) * pitch + out  # window starts, rows' outputs and the gaps
                taken = _doubled_levels(src, src_at + r0 * pitch + shift,
                                        span + (k - 1) * d, k, d, levels_at, level_pitch,
                                        pieces)
                if mode == AVERAGE and not patch:  # each row's windows, averaged as summed
                    for r in range(r0, r0 + g):
                        flagged |= store_averages(y, y_at + r * y_pitch, src, pieces,
                                                  (r - r0) * pitch, taken, out,
                                                  lead[lead_at + r], factors,
                                                  factors_at) != 0
                    continue
                flagged |= _window_sums(sums, 0, src, pieces, taken, 0, span,
                                        1) and mode == AVERAGE
                _store(y, y_at + r0 * y_pitch, y_pitch, sums, pitch, g, out, lead,
                       lead_at + r0, factors, factors_at, mode, p, patch, False)
            return flagged
        for r in range(rows):
            o_a = 0
            while o_a < out:
                p0, o_b, length = _segment(o_a, shift, out, k, s, d, starts)
                taken = _doubled_levels(src, src_at + r * pitch + p0, length, k, d, levels_at,
                                        level_pitch, pieces)
                if mode == AVERAGE and not patch and s == 1:
                    flagged |= store_averages(y, y_at + r * y_pitch + o_a, src, pieces, 0,
                                              taken, o_b - o_a, lead[lead_at + r], factors,
                                              factors_at + o_a) != 0
                else:
                    flagged |= _window_sums(sums, 0, src, pieces, taken, 0, o_b - o_a,
                                            s) and mode == AVERAGE
                    _store(y, y_at + r * y_pitch + o_a, y_pitch, sums, 0, 1, o_b - o_a, lead,
                           lead_at + r, factors, factors_at + o_a, mode, p, patch, False)
                o_a = o_b
        return flagged
    width = vector_width(lanes)
    for g0 in range(0, rows, width):
        loads = min(width, rows - g0)
        o_a = 0
        while o_a < out:
            p0, o_b, length = _segment(o_a, shift, out, k, s, d, starts)
            for j0 in range(0, length, width):
                transpose_tile(lanes, j0 * width, width, min(width, length - j0), src,
                               src_at + g0 * pitch + p0 + j0, pitch, loads)
            count = o_b - o_a
            _lane_sums(lane_sums, 0, width, lanes, width, shift + o_a * s - p0, count, k, s,
                       d)
            step = (count + width - 1) // width * width  # sums' row pitch: whole tiles
            for o0 in range(0, count, width):
                transpose_tile(sums, o0, step, loads, lane_sums, o0 * width, width,
                               min(width, count - o0))
            flagged |= _store(y, y_at + g0 * y_pitch + o_a, y_pitch, sums, step, loads, count,
                              lead, lead_at + g0, factors, factors_at + o_a, mode, p, patch,
                              True)
            o_a = o_b
    return flagged


@uncounted_helper
def _segment(o_a, shift, out, k, s, d, starts):
    """The segment of the last axis from output ``o_a`` on (output o's window from position
    ``shift + o * s``): its first position (that window's first), the output after its
    last, and the positions it spans."""
    p0 = shift + o_a * s
    o_b = min(out, max(o_a + 1, (p0 + starts - shift + s - 1) // s))
    return p0, o_b, shift + (o_b - 1) * s + (k - 1) * d + 1 - p0


@uncounted_helper
def _band(dims, band, bands):
    """Band ``band`` of ``bands`` of a plane's first axis: its outputs ``[oa, ob)`` (about
    equal shares)."""
    out = dims[OUT, 0]
    share = (out + bands - 1) // bands
    oa = min(out, band * share)
    return oa, min(out, oa + share)


@uncounted_helper
def _pass_step(oa, ob, at_once):
    """The outputs of each pass over a band's first-axis outputs ``[oa, ob)``: at most
    ``at_once``, in passes of about equal length (a short last pass would read its windows'
    reach past it for a few outputs)."""
    passes = max(1, (ob - oa + at_once - 1) // at_once)
    return max(1, (ob - oa + passes - 1) // passes)


@uncounted_helper
def _first_axis_from(dims, oa, ob):
    """The first axis as the row of its outputs ``[oa, ob)`` (a band's, or a pass's of it)
    sees it: the padding before its first window's first tap (negative past the input's
    first row), the positions its windows span, and how far into its blocks' pattern it
    starts (see :func:`block_offset`).  Its windows are the plane's, each summed as the
    whole plane sums it, bit for bit."""
    k, s, d = dims[KERNEL, 0], dims[STRIDE, 0], dims[DILATION, 0]
    length = _padded_length(ob - oa, k, s, d) if ob > oa else 0
    return dims[PAD_BEGIN, 0] - oa * s, length, (dims[OFFSET, 0] + oa * s) % (k * d)


@uncounted_helper
def _axis(dims, a):
    """Axis ``a``'s row of ``dims``: input and output sizes, kernel, stride, dilation, the
    padding before the input, the positions a padded row holds, whether by blocks, and
    where its blocks start."""
    return (dims[N, a], dims[OUT, a], dims[KERNEL, a], dims[STRIDE, a], dims[DILATION, a],
            dims[PAD_BEGIN, a], dims[PADDED, a], dims[RUNNING, a] == 1, dims[OFFSET, a])


@njit
def _lane_buffers(starts, segment, running, acc):
    """The last axis's scratch (see :func:`_last_axis`), of ``acc``'s type: window by
    window, a segment's positions in lanes, its outputs' sums in lanes and in rows; by
    doubling (``running``), its outputs' sums (the first two empty).  And the doubling's
    pieces (:func:`_doubled_levels`), one per bit of an int64."""
    t = acc.dtype
    pieces = np.empty(64, np.int64)
    if running:
        return np.empty(0, t), np.empty(0, t), np.empty(starts, t), pieces
    return (np.empty(segment * SLACK, t), np.empty((starts + SLACK) * SLACK, t),
            np.empty((starts + SLACK) * SLACK, t), pieces)


@uncounted_helper
def _rows_1d(x_flat, y_flat, r0, r1, dims, starts, segment, factors, mode, mark, p, rows,
             ones, lanes, lane_sums, sums, pieces, patch):
    """Rows ``[r0, r1)`` of :func:`block_sums_1d` (one at a time by doubling, else a
    vector's worth at a time), in the type of the buffers; whether a sum was not finite."""
    n, out, k, s, d, pad, _, running, _ = _axis(dims, 0)
    width = 1 if running else vector_width(lanes)  # doubling takes a row at a time
    flagged = False
    for g0 in range(r0, r1, width):
        count = min(width, r1 - g0)
        o_a = 0
        while o_a < out:
            q0, o_b, length = _segment(o_a, 0, out, k, s, d, starts)
            for r in range(count):
                _stage_row(rows, r * segment, x_flat, (g0 + r) * n, n, pad - q0, length, mark,
                           p)
            flagged |= _last_axis(y_flat, g0 * out + o_a, out, rows, 0, segment, count,
                                  o_a * s - q0, o_b - o_a, k, s, d, running, starts,
                                  SLACK * segment + SLACK, segment, pieces, lanes,
                                  lane_sums, sums, ones, 0, factors[0], o_a, mode, p, patch)
            o_a = o_b
    return flagged


@kernel(error_model="numpy")
def block_sums_1d(x, y, flagged, dims, segments, factors, mode, mark, p, acc, patch, bands,
                  at_once, start, stop):
    """Pool 1-D rows ``[start, stop)`` of ``x`` (rows, input size) into ``y`` (rows, output
    size, Y's element type), a row at a time by doubling (else a vector's worth of rows at a
    time), staged with their padding a segment at a time: AVERAGE multiplies each window's
    sum by ``factors[0, o]`` (the divisor's inverse), ROOT takes its p-th root.  ``mark``
    selects the term of each element (poolfold.kernels.window_sum); ``dims`` see the
    module's rows; ``segments``, the segmentation of the rows (:func:`segments`); the sums
    are of ``acc``'s type.  A row of a group of rows with a sum that is not finite is marked
    in ``flagged``; with ``patch``, only the groups holding a marked row are summed, and
    only the averages Y holds as inf or NaN stored (a float64 redo of float32 sums: see the
    module's docstring).  ``bands`` and ``at_once`` are 1 (the 2-D and 3-D kernels' bands
    and passes: a row is one item)."""
    starts, segment = segments[STARTS], segments[POSITIONS]
    x_flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    lanes, lane_sums, sums, pieces = _lane_buffers(starts, segment, dims[RUNNING, 0] == 1,
                                                   acc)
    # the staged rows, then the doubling's levels (see _last_axis)
    rows = np.empty(SLACK * segment + SLACK + _level_room(segments[LEVELS], segment),
                    acc.dtype)
    ones = np.ones(SLACK, np.float64)  # the rows' leading factors
    for r0 in range(start, stop, SLACK):
        r1 = min(stop, r0 + SLACK)
        if patch:
            marked = False
            for r in range(r0, r1):
                marked |= flagged[r] != 0
            if marked:
                _rows_1d(x_flat, y_flat, r0, r1, dims, starts, segment, factors, mode, mark,
                         p, rows, ones, lanes, lane_sums, sums, pieces, True)
        elif _rows_1d(x_flat, y_flat, r0, r1, dims, starts, segment, factors, mode, mark, p,
                      rows, ones, lanes, lane_sums, sums, pieces, False):
            for r in range(r0, r1):
                flagged[r] = 1


@uncounted_helper
def _plane_2d(x_flat, x_at, y_flat, y_at, dims, starts, segment, factors, mode, mark, p, part,
              program, row_sums, lanes, lane_sums, sums, pieces, patch, band, bands, at_once):
    """Band ``band`` of ``bands`` of one plane of :func:`block_sums_2d` (see :func:`_band`),
    ``at_once`` of its first axis's outputs a pass, in the type of the buffers; whether a
    sum was not finite."""
    n_a, out_a, k_a, s_a, d_a, _, _, run_a, _ = _axis(dims, 0)
    n_l, out_l, k_l, s_l, d_l, pad_l, len_l, run_l, _ = _axis(dims, 1)
    pitch = row_pitch(pad_l, len_l, n_l, out_l)
    oa, ob = _band(dims, band, bands)
    step = _pass_step(oa, ob, at_once)
    flagged = False
    for pa in range(oa, ob, step):
        pb = min(ob, pa + step)
        pad_a, len_a, offset_a = _first_axis_from(dims, pa, pb)
        _rows_of_slice(row_sums, x_flat, x_at, n_a, n_l, pb - pa, k_a, s_a, d_a, pad_a, len_a,
                       offset_a, run_a, pad_l, len_l, pitch, part, program, mark, p)
        flagged |= _last_axis(y_flat, y_at + pa * out_l, out_l, row_sums, 0, pitch, pb - pa, 0,
                              out_l, k_l, s_l, d_l, run_l, starts, (pb - pa) * len_l + SLACK,
                              segment, pieces, lanes, lane_sums, sums, factors[0], pa,
                              factors[1], 0, mode, p, patch)
    return flagged


@njit
def _plane_buffers_2d(dims, starts, segment, levels, acc, at_once):
    """:func:`_plane_2d`'s scratch of ``acc``'s type (a pass's row sums, then the doubling's
    levels), and the first axis's block program."""
    t = acc.dtype
    rows = at_once * dims[PADDED, 1] + SLACK + _level_room(levels, segment)
    return (np.empty(suffix_positions(dims, 1), t), _program_of(dims, 0), np.empty(rows, t),
            *_lane_buffers(starts, segment, dims[RUNNING, 1] == 1, acc))


@kernel(error_model="numpy")
def block_sums_2d(x, y, flagged, dims, segments, factors, mode, mark, p, acc, patch, bands,
                  at_once, start, stop):
    """Pool work items ``[start, stop)`` of ``x`` (planes, input size) into ``y`` (planes,
    output size), ``bands`` items a plane (bands of its first axis's outputs: see
    :func:`_band`), ``at_once`` of those outputs a pass: the first axis into rows
    :func:`row_pitch` apart, then the last axis; AVERAGE multiplies each window's sum by
    ``factors[0, o0] * factors[1, o1]``.  See :func:`block_sums_1d` for the rest
    (``flagged`` marks items)."""
    starts, segment = segments[STARTS], segments[POSITIONS]
    x_flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    part, program, row_sums, lanes, lane_sums, sums, pieces = _plane_buffers_2d(
        dims, starts, segment, segments[LEVELS], acc, at_once)
    for item in range(start, stop):
        if patch and flagged[item] == 0:
            continue
        plane = item // bands
        if _plane_2d(x_flat, plane * x.shape[1], y_flat, plane * y.shape[1], dims, starts,
                     segment, factors, mode, mark, p, part, program, row_sums, lanes,
                     lane_sums, sums, pieces, patch, item % bands, bands, at_once):
            flagged[item] = 1


@uncounted_helper
def _plane_3d(x_flat, x_at, y_flat, y_at, dims, starts, segment, factors, mode, mark, p, lead,
              part, program_0, program_a, row_sums, sums0, lanes, lane_sums, sums, pieces,
              patch, band, bands, at_once):
    """Band ``band`` of ``bands`` of one plane of :func:`block_sums_3d` (see :func:`_band`),
    ``at_once`` of its first axis's outputs a pass, in the type of the buffers; whether a
    sum was not finite."""
    n_0, out_0, k_0, s_0, d_0, _, _, run_0, _ = _axis(dims, 0)
    n_a, out_a, k_a, s_a, d_a, pad_a, len_a, run_a, offset_a = _axis(dims, 1)
    n_l, out_l, k_l, s_l, d_l, pad_l, len_l, run_l, _ = _axis(dims, 2)
    pitch = row_pitch(pad_l, len_l, n_l, out_l)
    oa, ob = _band(dims, band, bands)
    step = _pass_step(oa, ob, at_once)
    slice_in = n_a * n_l
    flagged = False
    for pa in range(oa, ob, step):
        pb = min(ob, pa + step)
        pad_0, len_0, offset_0 = _first_axis_from(dims, pa, pb)
        _leading_axis(sums0, 0, slice_in, x_flat, x_at, n_0, slice_in, slice_in, pb - pa,
                      k_0, s_0, d_0, pad_0, len_0, offset_0, run_0, part, program_0, mark, p)
        for o0 in range(pa, pb):
            for o in range(out_a):
                lead[o] = factors[0, o0] * factors[1, o]
            _rows_of_slice(row_sums, sums0, (o0 - pa) * slice_in, n_a, n_l, out_a, k_a, s_a,
                           d_a, pad_a, len_a, offset_a, run_a, pad_l, len_l, pitch, part,
                           program_a, _SUMS, p)
            flagged |= _last_axis(y_flat, y_at + o0 * out_a * out_l, out_l, row_sums, 0,
                                  pitch, out_a, 0, out_l, k_l, s_l, d_l, run_l, starts,
                                  out_a * len_l + SLACK, segment, pieces, lanes, lane_sums,
                                  sums, lead, 0, factors[2], 0, mode, p, patch)
    return flagged


@njit
def _plane_buffers_3d(dims, starts, segment, levels, acc, at_once):
    """:func:`_plane_3d`'s scratch of ``acc``'s type (the row sums then the doubling's
    levels, a pass's first-axis sums), and the two leading axes' block programs (each
    slice's axis before the last runs one program, made once)."""
    t = acc.dtype
    rows = dims[OUT, 1] * dims[PADDED, 2] + SLACK + _level_room(levels, segment)
    sums0 = at_once * dims[N, 1] * dims[N, 2]
    return (np.empty(suffix_positions(dims, 2), t), _program_of(dims, 0),
            _program_of(dims, 1), np.empty(rows, t),
            np.empty(sums0, t),
            *_lane_buffers(starts, segment, dims[RUNNING, 2] == 1, acc))


@kernel(error_model="numpy")
def block_sums_3d(x, y, flagged, dims, segments, factors, mode, mark, p, acc, patch, bands,
                  at_once, start, stop):
    """Pool work items ``[start, stop)`` of ``x`` into ``y``, ``bands`` items a 3-D plane
    (bands of its first axis's outputs: see :func:`_band`), ``at_once`` of those outputs a
    pass: the first axis into a stack of slices of its sums, then each slice as
    :func:`block_sums_2d` pools a plane of terms; AVERAGE multiplies each window's sum by
    the product of its axes' ``factors[axis, o]``.  See :func:`block_sums_1d` for the rest
    (``flagged`` marks items)."""
    starts, segment = segments[STARTS], segments[POSITIONS]
    x_flat = x.reshape(x.size)
    y_flat = y.reshape(y.size)
    lead = np.empty(dims[OUT, 1], np.float64)
    part, program_0, program_a, row_sums, sums0, lanes, lane_sums, sums, pieces = \
        _plane_buffers_3d(dims, starts, segment, segments[LEVELS], acc, at_once)
    for item in range(start, stop):
        if patch and flagged[item] == 0:
            continue
        plane = item // bands
        if _plane_3d(x_flat, plane * x.shape[1], y_flat, plane * y.shape[1], dims, starts,
                     segment, factors, mode, mark, p, lead, part, program_0, program_a,
                     row_sums, sums0, lanes, lane_sums, sums, pieces, patch, item % bands,
                     bands, at_once):
            flagged[item] = 1


# The term marker of sums already taken (window_sum's VALUE: each element as it is).
_SUMS = np.empty(0, np.int8)
