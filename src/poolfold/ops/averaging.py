"""The averaging family: AveragePool, LpPool, GlobalMaxPool, GlobalAveragePool, GlobalLpPool,
every version, any spatial rank, channels-first (ai.onnx) and channels-last (nhwc) alike.

Windows are MaxPool's (:func:`poolfold.ops.max_pool.resolve_plan`).  Per window, V is the
taps inside X and P the taps inside the padded extent; the divisor of AveragePool is |V|
(count_include_pad 0) or |P| (1), both products of per-axis counts since a window is a box.
The kernels are in :mod:`poolfold.kernels.window_sum`; this module checks the call, builds
and bounds their tables, and picks between the plain float64 sums and the scaled sums that
keep LpPool clear of overflow.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from .. import activations, dtypes, schema
from ..errors import PoolfoldError, PoolfoldTypeError
from ..geometry import WindowPlan
from ..kernels.activation import IDENTITY
from ..kernels.native_split import Crew
from ..kernels.plane_lanes import block_planes, sum_plane_lanes
from ..kernels.threads import BoundLaunch, kernel_threads, split_parts
from ..kernels.window_sum import (RUN_ACROSS, RUN_ADD, RUN_EMPTY, RUN_PREFIX, RUN_SUFFIX,
                                  ABS, AS_IS, AVERAGE, AXIS_ROWS, POWER, ROOT, SQUARE, VALUE,
                                  global_max, term_marker, plane_means, plane_sums,
                                  scaled_plane_sums, scaled_window_sums, window_sums)
from ..kernels import window_blocks
from ..kernels.window_rows import (BLOCK_ELEMENTS as ROW_BLOCK_ELEMENTS, POSITION_CHANNELS,
                                   block_pitch, position_sums, window_rows)
from ..memory import allocate, building, check_size, check_table
from ._common import CallCache, activate, as_rows, as_tensor, flag, kernel_rows
from .layout import channels_last_order, is_channels_last, nchw_order
from .max_pool import resolve_plan

# A float64 sum of |x| ** p for x of at most 4 bytes (float32's range: 1.4e-45 to 3.4e38)
# stays within float64's range (4.9e-324 to 1.8e308) for p up to 7; beyond, or for float64
# inputs, LpPool takes the scaled sums.
PLAIN_LP_MAX_P = 7
# Below this p (LpPool-1's float p), the p-th root of a float64 sum of |x| ** p magnifies
# its rounding (2^-53) past float32's u (2^-24): a window of one tap then comes back off by
# up to 2^-13 at p = 2^-40.  The scaled sums give that tap's |x| exactly (its term is 1),
# and every other window is inf there (the root raises a sum of about 2 or more to the
# 2^29-th power or more).
PLAIN_LP_MIN_P = 2.0 ** -29

# Channels-last work items take this many channels at a time (the vectorised run of every
# pass), fewer when one sample's intermediate results would outgrow SCRATCH_BYTES.
CHANNEL_BLOCK = 64
SCRATCH_BYTES = 4 * 2**20


class Layout(NamedTuple):
    """How an input's elements sit: ``outer`` independent groups of ``channels``-long runs
    (NCHW: N*C groups of runs of 1; channels-last: N groups of runs of C)."""

    outer: int
    channels: int
    spatial: tuple[int, ...]


def _layout(shape: tuple[int, ...], channels_last: bool) -> Layout:
    if channels_last:
        return Layout(shape[0], shape[-1], tuple(shape[1:-1]))
    return Layout(shape[0] * shape[1], 1, tuple(shape[2:]))


def _nchw(shape: tuple[int, ...], channels_last: bool) -> tuple[int, ...]:
    return nchw_order(shape) if channels_last else tuple(shape)


def _output_shape(shape, out_spatial, channels_last):
    out_shape = _nchw(shape, channels_last)[:2] + tuple(out_spatial)
    return channels_last_order(out_shape) if channels_last else out_shape


def check_p(spec, p) -> float:
    """LpPool's and GlobalLpPool's p: a float > 0 in version 1, an integer >= 1 after (an
    integral float is taken as that integer)."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise PoolfoldTypeError(f"{spec.label}: attribute 'p' must be a number, got {p!r}")
    value = float(p)
    if spec.attributes["p"].kind == "int":
        if not math.isfinite(value) or value != math.floor(value):
            raise PoolfoldTypeError(
                f"{spec.label}: attribute 'p' must be an integer in this version, got {p!r}"
            )
        if value < 1:
            raise PoolfoldError(f"{spec.label}: attribute 'p' must be >= 1, got {p!r}")
    elif not (value > 0 and math.isfinite(value)):
        raise PoolfoldError(f"{spec.label}: attribute 'p' must be a finite number > 0, got {p!r}")
    return value


def resolve_count_include_pad(spec, count_include_pad) -> int:
    spec.reject_absent("count_include_pad", bool(count_include_pad))
    return flag(spec, "count_include_pad", count_include_pad)


# ---------------------------------------------------------------------------------------------
# windowed pools


class _WholeTables:
    """A plan's divisor per output position and its inverse, the products of its per-axis
    counts, made when first read."""

    def __init__(self, label: str, counts: list | None):
        self.label, self.counts = label, counts

    @functools.cached_property
    def divisor(self) -> np.ndarray:
        if self.counts is None:
            table = np.zeros(1, np.float64)
        else:
            check_table(self.label, "the divisor table",
                        (math.prod(c.size for c in self.counts),), np.float64)
            table = np.ones(1, np.float64)
            for count in self.counts:
                table = np.multiply.outer(table, count).ravel()
        table.flags.writeable = False
        return table

    @functools.cached_property
    def inverse(self) -> np.ndarray:
        with np.errstate(divide="ignore"):
            inverse = 1.0 / self.divisor
        inverse.flags.writeable = False
        return inverse


class WindowTables(NamedTuple):
    axes: np.ndarray  # (AXIS_ROWS, rank) int64, see poolfold.kernels.window_sum
    taps: np.ndarray  # (4, rank, width): first, lo, hi, running-sums case
    axis_counts: np.ndarray  # (rank, width) float64: the per-axis factors of the divisor
    axis_inverse: np.ndarray  # (rank, width) 1 / axis_counts: the divisor's inverse, per axis
    # 2-D plans of at most PLANE_FACTORS_MOST outputs: axis_inverse[0, r] * axis_inverse[1, o]
    # at r * outputs along the last axis + o (the factor the row kernel multiplies a sum
    # by, as it takes it), as (1, n) float64; (1, 1) where every output's is the same, of
    # any 2-D plan; else (1, 0)
    plane_factors: np.ndarray
    # the same factors split in two float32 (window_rows.split_factor), (2, n): float32 sums'
    split_plane_factors: np.ndarray
    # per output position, the divisor (AveragePool) and its inverse (inf for an empty
    # window), made on first use (:class:`_WholeTables`): only the separable passes and an
    # empty input read them, and a 256^3 slab's took 256 MiB
    whole: _WholeTables

    @property
    def divisor(self) -> np.ndarray:
        """The divisor per output position (AveragePool), or a dummy."""
        return self.whole.divisor

    @property
    def inverse(self) -> np.ndarray:
        """1 / divisor (inf for an empty window), what the separable passes multiply by."""
        return self.whole.inverse

    def row_factors(self, dtype: np.dtype) -> np.ndarray:
        """The plane factors the row kernel reads for sums of X of ``dtype``: split for the
        types summed in float32, float64 for float64."""
        return self.plane_factors if dtype.itemsize == 8 else self.split_plane_factors


# A pass runs on van Herk partial sums where windows overlap this much: each output then
# costs one or two reads instead of its taps.  Measured, one thread, float32, stride 1, on
# a busy host: passes whose rows hold one element per position (a channels-first last axis)
# add taps at about 0.6 ns each and keep partial sums at about 3 ns per position (15 taps:
# 10.0 ms either way over 1.6 M positions; 63 taps: 40 against 9.4), so from 16 taps on;
# passes over runs of positions (vectorised across the run) from six (9 taps: 9.1 against
# 7.2; 63 taps: 55 against 7.3).
PREFIX_MIN_TAPS = 6
PREFIX_MIN_TAPS_SINGLE = 16


def uses_running_sums(n: int, out: int, k: int, single: bool = False) -> bool:
    """Whether a plain pass over an axis of ``n`` inputs, ``out`` outputs and windows of
    ``k`` taps subtracts running sums rather than adding each window's taps; ``single``:
    its rows hold one element per position."""
    least = PREFIX_MIN_TAPS_SINGLE if single else PREFIX_MIN_TAPS
    return k >= least and out * k > 3 * n


def is_scaled(kind: str, dtype: np.dtype, p: float) -> bool:
    """Whether LpPool takes the scaled sums (the ``(m, s)`` pairs) for ``dtype`` and ``p``."""
    return kind == "lp" and (np.dtype(dtype).itemsize > 4 or not
                             PLAIN_LP_MIN_P <= p <= PLAIN_LP_MAX_P)


# LpPool-1 takes p as a float, and below 1 its root magnifies the rounding of the sum of
# |x|^p 1/p times: float64 sums of float64 X then miss the contract's bound (u = 2^-53) at
# any p < 1.  There the scaled sums take their terms, sums and root in double-doubles
# (kernels.double_double), told by this marker (None: plain float64).  The narrower types'
# bound (u = 2^-24) leaves float64 sums room (see PLAIN_LP_MIN_P).
_DOUBLE_DOUBLE = np.empty(0, np.float64)


def precise_sums(kind: str, dtype: np.dtype, p: float) -> np.ndarray | None:
    """The scaled sums' ``precise`` argument for ``dtype`` and ``p`` (see _DOUBLE_DOUBLE)."""
    return _DOUBLE_DOUBLE if kind == "lp" and np.dtype(dtype).itemsize == 8 and p < 1 else None


# Windows of at most this many taps along the last axis, and on the other axes together, are
# summed one row of outputs at a time (window_rows): X read (outer taps / outer strides)
# times, no plane-sized intermediate.  Measured, one thread, float32, (4, 16, 256, 256)
# stride 1: 7x7 in about a fifth of the separable passes' time, 15x15 in about a third;
# beyond, the taps of the other axes re-read X too often and the running sums win.
ROW_MAX_LAST_TAPS = 64
ROW_MAX_OUTER_TAPS = 24


def takes_row_sums(plan: WindowPlan, dtype: np.dtype, kind: str, p: float) -> bool:
    """Whether :func:`pool_windows` sums row by row (:func:`window_rows`): AveragePool of
    any type, or LpPool's |x| or x^2 of a type of at most 4 bytes (a power per re-read would
    cost more than the passes' one per element; float64 LpPool takes the scaled sums),
    over a window small enough (ROW_MAX_*_TAPS).  Depends on the window and the type
    alone, never on the size of the tensor or its layout: a slab of it (poolfold.dask)
    takes the same path."""
    return (takes_row_terms(dtype, kind, p)
            and plan.kernel[-1] <= ROW_MAX_LAST_TAPS
            and math.prod(plan.kernel[:-1]) <= ROW_MAX_OUTER_TAPS)


def takes_row_terms(dtype: np.dtype, kind: str, p: float) -> bool:
    """The type rule of :func:`takes_row_sums`: AveragePool of any type, LpPool's |x| or
    x^2 of a type of at most 4 bytes."""
    if kind == "average":
        return True
    return np.dtype(dtype).itemsize <= 4 and not is_scaled(kind, dtype, p) and p in (1.0, 2.0)


# The block sums' accumulator types, told to the kernels by a marker array's type.
_FLOAT32_SUMS, _FLOAT64_SUMS = np.empty(0, np.float32), np.empty(0, np.float64)

# The block sums' kernel per spatial rank (window_blocks).
BLOCK_SUM_KERNELS = {1: window_blocks.block_sums_1d, 2: window_blocks.block_sums_2d,
                     3: window_blocks.block_sums_3d}


def takes_block_sums(plan: WindowPlan, dtype: np.dtype, kind: str, p: float,
                     channels: int) -> bool:
    """Whether :func:`pool_windows` sums by block sums (:mod:`poolfold.kernels.window_blocks`):
    one element per position, spatial rank 1 to 3, X of at most 4 bytes (averages summed in
    float32, and in float64 where that is not finite; LpPool's terms in float64, which they
    cannot overflow: not its scaled sums), over a window the row sums do not take, a 1-D
    average's windows that overlap enough (:func:`doubles_rows`), or a window of
    :data:`BLOCK_MIN_TAPS` taps or more over 2 or 3 axes.  Depends on the window, the type
    and the layout alone, never on the size of the tensor: a slab of it (poolfold.dask)
    takes the same path."""
    return (channels == 1 and plan.rank in BLOCK_SUM_KERNELS
            and np.dtype(dtype).itemsize <= 4 and not is_scaled(kind, dtype, p)
            and block_rows_fit(plan)
            and (not takes_row_sums(plan, dtype, kind, p) or doubles_rows(plan, kind)
                 or (plan.rank > 1 and math.prod(plan.kernel) >= BLOCK_MIN_TAPS)))


# The block sums lay each axis out as its padded row, every position from the first window's
# first tap to the last window's last: where windows neither overlap nor touch (a stride past
# the window's reach), or a window reaches past BLOCK_MOST_SPAN positions (a dilation far
# past the input), that row is mostly positions no window reads, and the separable passes,
# which visit the windows' taps, take the plan: pads (2, 2^40) with a dilation of 2^40 over
# 2 inputs asked 400 TiB of scratch, a stride of 2^40 8 TiB.  The doubling's segments of
# 1024 window starts also span the window, so its cost grows with it where the passes' does
# not: float32 SAME over (1,4,262144), two threads, doubling against passes, k=2049 1.5 /
# 2.9 ms, 4097 3.2 / 4.2, 6001 4.4 / 4.9, 8193 3.0 / 3.0, 20001 14.2 / 4.0, 70001 64 / 2.9.
BLOCK_MOST_SPAN = 8192


def block_rows_fit(plan: WindowPlan) -> bool:
    """Whether the block sums' padded rows suit ``plan`` (see BLOCK_MOST_SPAN): kernel,
    stride and dilation alone, as a poolfold.dask slab's plan has them."""
    return all(s <= (k - 1) * d + 1 <= BLOCK_MOST_SPAN
               for k, s, d in zip(plan.kernel, plan.strides, plan.dilations))


# Windows of 2 or 3 axes with this many taps or more go to the block sums, channels-first,
# though the row sums could take them: the row sums re-read X once per outer tap.  Measured,
# float32, two threads, stride 1, SAME, block sums' time over the row sums': k x k over
# (4,16,256,256) k=9 0.84, 11 0.66, 13 0.62, 15 0.60; over (8,3,512,512) 0.99, 0.87, 0.75,
# 0.74; over (1,64,112,112) 0.97, 0.88, 0.72, 0.63; over (16,64,28,28) 1.12, 0.89, 0.72,
# 0.61; over (1,3,1024,1024) 1.37, 1.22, 1.03, 0.90; over (1,256,14,14) 2.40-1.95 (a
# window past the plane); 15x7 0.73, 15x3 0.63-1.12, 8x2 1.11; 3-D 3x5x5 1.29-1.51, 2x8x8
# 1.01, 4x4x15 0.69, 1x15x15 0.62.
BLOCK_MIN_TAPS = 128


# A band of a plane's first axis (block_bands), and a pass over a band's outputs
# (block_pass_outputs), spans at least this many of its windows' spans: each reads its
# windows' reach past its share again.
BAND_LEAST_SPANS = 4


def _least_first_axis_outputs(plan: WindowPlan) -> int:
    """The first-axis outputs whose windows span BAND_LEAST_SPANS windows' spans: the
    fewest a band or a pass of the block sums takes."""
    span = (plan.kernel[0] - 1) * plan.dilations[0] + 1
    return -(-BAND_LEAST_SPANS * span // plan.strides[0])


def block_bands(plan: WindowPlan, planes: int, threads: int) -> int:
    """Work items a plane the block sums cut it into, bands of its first axis's outputs
    (window_blocks._band), where fewer planes than threads would leave threads idle (a
    single 3-D volume was one work item): as many as make an item for every thread, each
    band at least BAND_LEAST_SPANS windows' spans long.  Each window is summed as in the
    whole plane, bit for bit, so the bands may depend on the size and the threads."""
    if plan.rank < 2 or planes >= threads:
        return 1
    longest = plan.out_shape[0] // _least_first_axis_outputs(plan)
    return int(max(1, min(-(-threads // planes), longest, plan.out_shape[0])))


# A pass of the block sums over a work item's first-axis outputs (window_blocks: the first
# axis's sums of a pass, a 2-D pass's rows or a 3-D pass's slices) keeps that scratch within
# this many bytes, where its windows allow: the second-level cache of most x86 cores.
PASS_BYTES = 1 << 19


def block_pass_outputs(plan: WindowPlan, acc_itemsize: int) -> int:
    """The first-axis outputs a pass of the block sums takes at once (window_blocks'
    ``at_once``): as many as keep the first axis's sums within PASS_BYTES, but at least
    BAND_LEAST_SPANS windows' spans (each pass reads its windows' reach past it again, as
    a band does), and at most the axis's outputs.  A whole plane's sums at once were
    allocated afresh by every kernel call: 7x7x7 over (1,1,256,256,256) on two threads
    faulted in 17 thousand pages a call, 59 ms of system time in a 59 ms call.  Each window
    is summed as in the whole plane, bit for bit, so the passes may depend on the size."""
    if plan.rank < 2:
        return 1
    if plan.rank == 2:
        last = window_blocks.padded_length(plan.out_shape[1], plan.kernel[1], plan.strides[1],
                                           plan.dilations[1])
        per_output = last * acc_itemsize
    else:
        per_output = plan.in_shape[1] * plan.in_shape[2] * acc_itemsize
    least = _least_first_axis_outputs(plan)
    return int(max(1, min(plan.out_shape[0], max(least, PASS_BYTES // max(1, per_output)))))


def doubles_rows(plan: WindowPlan, kind: str) -> bool:
    """Whether a 1-D average the row sums could take goes to the block sums, which sum the
    row by doubling: windows of k >= 2s taps at stride 1 or from stride 5 on (the row sums'
    vector strided sums stop at stride 4), of k >= 5s at strides 2 to 4 (the doubling sums
    every position, the row sums only the windows').  Measured, float32, two threads, the
    row sums against the doubling: over (4,16,65536), k=2 1.42 against 1.19 ms, 3 1.39 /
    1.28, 63 4.15 / 2.05, k=64 s=8 6.2 / 1.0; over (8,24,8192), k=3 d=3 0.58 / 0.61, k=5 s=2
    0.48 / 0.63, k=9 s=2 0.57 / 0.66, k=12 s=2 0.67 / 0.68, k=16 s=2 0.75 / 0.61, k=12 s=3
    0.55 / 0.57, k=16 s=3 0.66 / 0.51, k=8 s=4 0.44 / 0.42, k=16 s=4 0.64 / 0.46, k=20 s=4
    0.68 / 0.53, k=10 s=5 0.73 / 0.48, k=6 s=6 0.48 / 0.46."""
    if kind != "average" or plan.rank != 1:
        return False
    k, s = plan.kernel[0], plan.strides[0]
    return k >= (5 * s if 2 <= s <= 4 else 2 * s)


def doubles_last_axis(n: int, out: int, k: int) -> bool:
    """Whether the block sums take their last axis by doubling (window_blocks) rather than
    window by window: windows of two taps or more that overlap, on average."""
    return k >= 2 and out * k > n


def block_sum_dims(plan: WindowPlan, running: tuple[bool, ...],
                   first_outputs: tuple[int, ...] | None = None) -> np.ndarray:
    """The block sums' per-axis table (window_blocks' rows N ... OFFSET).  ``first_outputs``:
    per axis, the whole tensor's output that is ``plan``'s first (a poolfold.dask slab's),
    whose blocks are then placed as the whole tensor's (window_blocks.block_offset)."""
    dims = np.zeros((window_blocks.DIM_ROWS, plan.rank), np.int64)
    for a in range(plan.rank):
        out, k, s, d = plan.out_shape[a], plan.kernel[a], plan.strides[a], plan.dilations[a]
        offset = window_blocks.block_offset(first_outputs[a], k, s, d) if first_outputs else 0
        dims[:, a] = (plan.in_shape[a], out, k, s, d, plan.pad_begin[a],
                      window_blocks.padded_length(out, k, s, d), int(running[a]), offset)
    dims.flags.writeable = False
    return dims


def block_sum_segments(plan: WindowPlan, running: tuple[bool, ...]) -> np.ndarray:
    """The block sums' segmentation of the last axis (window_blocks.segments)."""
    out, k, s, d = plan.out_shape[-1], plan.kernel[-1], plan.strides[-1], plan.dilations[-1]
    return window_blocks.segments(k, d, running[-1], window_blocks.padded_length(out, k, s, d))


def _check_block_scratch(label: str, plan: WindowPlan, running: tuple[bool, ...],
                         segments: np.ndarray, at_once: int) -> None:
    """Bound the block sums' scratch before any work (what window_blocks' kernels allocate,
    from ``segments`` and ``at_once``)."""
    dims = block_sum_dims(plan, running)
    padded = dims[window_blocks.PADDED]
    slack = window_blocks.SLACK
    starts, positions = segments[window_blocks.STARTS], segments[window_blocks.POSITIONS]
    levels = window_blocks.level_room(int(segments[window_blocks.LEVELS]), int(positions))
    need = 3 * slack * positions + levels + 2 * (starts + slack) * slack + slack
    if plan.rank > 1:
        leading = int(dims[window_blocks.KERNEL, :-1].max())  # window_blocks.suffix_positions
        rows = at_once if plan.rank == 2 else plan.out_shape[1]
        need += (leading + 3) * window_blocks.COLUMNS + rows * int(padded[-1]) + slack
        for axis in range(plan.rank - 1):  # the leading axes' block programs (int64)
            need += window_blocks.program_room(int(padded[axis]), int(plan.out_shape[axis]),
                                               int(dims[window_blocks.KERNEL, axis]),
                                               int(dims[window_blocks.DILATION, axis]))
    if plan.rank == 3:
        need += at_once * plan.in_shape[1] * plan.in_shape[2]
    check_table(label, "the block sums' scratch", (int(need),), np.float64)


def takes_position_sums(plan: WindowPlan, dtype: np.dtype, kind: str, p: float) -> bool:
    """Whether a channels-last GlobalAveragePool or GlobalLpPool (``plan``: its window over
    every position) sums by :func:`position_sums`: where the row kernel would take the
    window, and past its size, which does not bind a sum over positions, for the terms
    summed in float32 or |x| and x^2 (over (8,56,56,64), float32: 316 us by the windowed
    sums, 48 channels-first); float64 averages past it keep the windowed sums' compensated
    float64 adds."""
    if kind == "average" and np.dtype(dtype).itemsize == 8:
        return takes_row_sums(plan, dtype, kind, p)
    return takes_row_terms(dtype, kind, p)


# Channels-first planes of at least 2 axes, at least SUM_LANES_FEWEST_PLANES of them, are
# summed many at once as lanes (sum_plane_lanes) where they take the row sums: up to
# SUM_LANES_MOST_INPUT elements (SUM_LANES_MOST_INPUT_8 for 8-byte types), whose rows are too
# short for the row kernel's loops, and up to SUM_LANES_MOST_UNBLOCKED where the row kernel
# cannot take their rows in blocks (window_rows.block_pitch).  Measured on 2 threads,
# lanes' time over rows', float32 AveragePool: 3x3 stride 1 over (1,512,7,7) 0.18,
# (1,192,17,17) 0.65-0.75, (1,64,24,24) 0.80-0.84, (1,192,24,24) 0.86-1.04, (1,192,28,28)
# 0.99-1.24, (1,192,32,32) 1.74 (every row of a block in one cache set), (1,192,35,35)
# 1.05-1.10; 3x3 stride 2 over (1,192,17,17) 0.41, over (1,192,24,24) 0.72, over
# (1,192,35,35) 0.88; (1,64,12,12,12) 3x3x3 0.32; float16 0.17-0.86; LpPool p=2
# 0.22-0.92; float64 0.29-0.72 up to 16x16 planes, 1.13 over (1,384,17,17) at stride 1;
# 16 planes 0.72-0.90, 8 planes 0.83-1.31 (a vector of float32 lanes half filled); 1-D rows
# 1.08-1.59.
SUM_LANES_MOST_INPUT = 576
SUM_LANES_MOST_INPUT_8 = 256
SUM_LANES_MOST_UNBLOCKED = 2048
SUM_LANES_FEWEST_PLANES = 16


def takes_plane_lanes(plan: WindowPlan, itemsize: int, channels: int, planes: int) -> bool:
    """Whether the row sums of ``planes`` channels-first planes of ``itemsize``-byte values
    take them many at once as lanes (:func:`sum_plane_lanes`).  The sums are bit for bit
    the row kernel's, so unlike :func:`takes_row_sums` this may depend on the tensor's
    size."""
    if channels != 1 or plan.rank < 2 or planes < SUM_LANES_FEWEST_PLANES:
        return False
    size = math.prod(plan.in_shape)
    if size <= (SUM_LANES_MOST_INPUT_8 if itemsize == 8 else SUM_LANES_MOST_INPUT):
        return True
    return size <= SUM_LANES_MOST_UNBLOCKED and not block_pitch(
        plan.in_shape[-1], plan.strides[-1], plan.out_shape[-1])


def running_sum_axes(plan: WindowPlan, dtype: np.dtype, kind: str, p: float = 2.0,
                     one_channel: bool = True) -> tuple[bool, ...]:
    """Per axis, whether :func:`pool_windows` reduces it by running sums.  Only plain sums
    (float32, float16, bfloat16; not LpPool's scaled sums) ever do.  Unlike a window's own
    taps, a running-sum pass's result depends on where its rows start, and a non-finite
    value anywhere in a row turns the whole row to direct adds: poolfold.dask keeps such
    axes whole (:func:`row_start_axes`; not the block sums').  ``one_channel``: one element
    per position (channels-first, or one channel), whose last axis's rows are single
    elements in the separable passes; the block sums take their last axis by doubling where
    its windows overlap (:func:`doubles_last_axis`)."""
    blocks = one_channel and takes_block_sums(plan, dtype, kind, p, 1)
    if (np.dtype(dtype).itemsize == 8 or is_scaled(kind, dtype, p)
            or (takes_row_sums(plan, dtype, kind, p) and not blocks)):
        return (False,) * plan.rank
    last = plan.rank - 1
    return tuple((doubles_last_axis(n, out, k) if blocks
                  else uses_running_sums(n, out, k, single=one_channel))
                 if a == last else uses_running_sums(n, out, k)
                 for a, (n, out, k) in enumerate(zip(plan.in_shape, plan.out_shape,
                                                     plan.kernel)))


def row_start_axes(plan: WindowPlan, dtype: np.dtype, kind: str, p: float = 2.0,
                   one_channel: bool = True) -> tuple[bool, ...]:
    """Per axis, whether its sums depend on where a row of it starts (poolfold.dask keeps
    such axes whole): the axes :func:`running_sum_axes` names, none of the block sums'.
    Their leading axes place their blocks from the whole row's first position, which a
    slab is told (:func:`pool_windows`' ``first_outputs``), and their last axis doubles, a
    window's sum a tree over its own values grouped by their places in the window alone."""
    if one_channel and takes_block_sums(plan, dtype, kind, p, 1):
        return (False,) * plan.rank
    return running_sum_axes(plan, dtype, kind, p, one_channel)


# The largest 2-D output plane whose averages' factors the row kernel reads from a table
# (WindowTables.plane_factors, 64 KiB): its blocks of short rows then store in one loop, not
# a loop per row of a few dozen outputs (3x3 with pads 1 over (1,192,35,35), one thread:
# 150-168 us -> 135-142).
PLANE_FACTORS_MOST = 8192


@functools.lru_cache(maxsize=256)
def window_tables(plan: WindowPlan, divisor: str | None,
                  running: tuple[bool, ...] | None = None) -> WindowTables:
    """The kernels' tables for ``plan``: per axis (size, outputs, kernel, stride, dilation,
    the outputs whose window is uncut, whether to use running sums), the tap table, and with
    ``divisor`` "valid" or "padded" the per-output-position count |V| or |P| (cached: a
    model repeats its calls; the kernels only read these tables).  ``running``: per axis,
    whether its pass keeps running sums (:func:`running_sum_axes`; None: no axis does)."""
    with building(plan.label, "the windows' tables"):
        return _window_tables(plan, divisor, running)


def _window_tables(plan: WindowPlan, divisor: str | None, running) -> WindowTables:
    """:func:`window_tables`, allocations unguarded."""
    taps = plan.taps
    rank = plan.rank
    axes = np.zeros((AXIS_ROWS, rank), np.int64)
    counts = []
    for a in range(rank):
        n, k, s, d = plan.in_shape[a], plan.kernel[a], plan.strides[a], plan.dilations[a]
        out, pb, pe = plan.out_shape[a], plan.pad_begin[a], plan.pad_end[a]
        lo, hi = taps.lo[a, :out], taps.hi[a, :out]
        inside = np.flatnonzero((lo == 0) & (hi == k))
        uncut = (int(inside[0]), int(inside[-1]) + 1) if inside.size else (0, 0)
        prefix = running is not None and bool(running[a])
        axes[:, a] = (n, out, k, s, d, *uncut, prefix)
        if divisor == "valid":
            counts.append(np.maximum(hi - lo, 0).astype(np.float64))
        elif divisor == "padded":
            # taps inside [-pb, n + pe): j from 0 (a window starts at or after -pb) up to the
            # first past n + pe; the ceil-mode overhang beyond counts in neither V nor P
            start = np.arange(out, dtype=np.int64) * s - pb
            counts.append(np.minimum(k, np.maximum(0, (n + pe - start + d - 1) // d))
                          .astype(np.float64))
    axis_counts = np.ones((rank, taps.first.shape[1]), np.float64)
    for a, count in enumerate(counts):
        axis_counts[a, :count.size] = count
    tap_table = np.stack([taps.first, taps.lo, taps.hi, _running_cases(plan, running)])
    with np.errstate(divide="ignore"):
        axis_inverse = 1.0 / axis_counts
    plane_factors = np.zeros((1, 0), np.float64)
    outputs = [axis_inverse[a, :out] for a, out in enumerate(plan.out_shape)]
    if rank == 2 and divisor is not None and all(f.size and (f == f[0]).all() for f in outputs):
        # every output's factor the same (count_include_pad, or no window cut): one entry,
        # which the row kernel holds in a register (3x3 with pads 1 over (1,192,35,35), one
        # thread: 128 -> 114 us; a table beside X and Y costs its loads and its cache lines)
        plane_factors = np.array([[outputs[0][0] * outputs[1][0]]])
    elif rank == 2 and math.prod(plan.out_shape) <= PLANE_FACTORS_MOST:
        plane_factors = np.multiply.outer(outputs[0], outputs[1]).reshape(1, -1)
    hi = plane_factors.astype(np.float32)
    with np.errstate(invalid="ignore"):  # inf - inf: an empty window's NaN, as in the kernel
        split_plane_factors = np.concatenate([hi, (plane_factors - hi).astype(np.float32)])
    for array in (axes, tap_table, axis_counts, axis_inverse, plane_factors,
                  split_plane_factors):
        array.flags.writeable = False
    return WindowTables(axes, tap_table, axis_counts, axis_inverse, plane_factors,
                        split_plane_factors,
                        _WholeTables(plan.label, None if divisor is None else counts))


def _running_cases(plan: WindowPlan, running) -> np.ndarray:
    """Per axis kept as running sums and output, how the kernel gets the window's sum from
    blocks of k taps along each dilation phase (see poolfold.kernels.window_sum.RUN_*):
    worked out here once per plan rather than by divisions per output in the kernel."""
    taps = plan.taps
    cases = np.full(taps.first.shape, RUN_ADD, np.int64)
    for a in range(plan.rank):
        if running is None or not running[a]:
            continue
        n, k, d, out = plan.in_shape[a], plan.kernel[a], plan.dilations[a], plan.out_shape[a]
        first, lo, hi = taps.first[a, :out], taps.lo[a, :out], taps.hi[a, :out]
        q0, q1 = first + lo * d, first + (hi - 1) * d
        phase = q0 % d
        t0, t1 = (q0 - phase) // d, (q1 - phase) // d
        m = (n - phase + d - 1) // d
        case = np.full(out, RUN_ADD, np.int64)
        case[t1 % k == k - 1] = RUN_SUFFIX
        case[t1 == m - 1] = RUN_SUFFIX
        case[t0 % k == 0] = RUN_PREFIX
        case[t0 // k != t1 // k] = RUN_ACROSS
        case[lo >= hi] = RUN_EMPTY
        cases[a, :out] = case
    return cases


def channel_block_for(plan: WindowPlan, channels: int) -> int:
    """Channels per work item: a vector's worth at least, fewer than all when one sample's
    intermediate results would outgrow SCRATCH_BYTES."""
    if channels == 1:
        return 1
    per_channel = 8 * math.prod(plan.in_shape)
    fitting = max(8, SCRATCH_BYTES // max(per_channel, 1))
    return int(min(channels, CHANNEL_BLOCK, fitting))


def _check_scratch(label, plan: WindowPlan, block: int, pairs: bool) -> None:
    """Bound the kernels' scratch (see window_sums) before any work."""
    largest, rows, inner = 1, math.prod(plan.in_shape), block
    for a in range(plan.rank - 1, -1, -1):
        rows //= plan.in_shape[a]
        largest = max(largest, rows * plan.out_shape[a] * inner, plan.in_shape[a] * inner)
        inner *= plan.out_shape[a]
    staged = math.prod(plan.in_shape) * block  # the first pass's float64 copy of an item
    check_table(label, "the window sums' scratch", (4 * largest + staged,), np.float64)
    if pairs:
        check_table(label, "the scaled sums' scratch", (4 * largest,), np.float64)


def _check_row_scratch(label, plan: WindowPlan, channels: int) -> None:
    """Bound window_rows' scratch before any work: an input row's sums (a block of rows,
    up to BLOCK_ELEMENTS, for short ones) and as many outputs' sums, float64 at most."""
    row = max(plan.in_shape[-1] * channels, ROW_BLOCK_ELEMENTS)
    check_table(label, "the row sums' scratch",
                (2 * row + plan.out_shape[-1] * channels,), np.float64)


def pool_windows(label: str, x: np.ndarray, plan: WindowPlan, channels_last: bool, kind: str,
                 count_include_pad: int = 0, p: float = 2.0, *,
                 running: tuple[bool, ...] | None = None,
                 channel_block: int | None = None,
                 first_outputs: tuple[int, ...] | None = None) -> np.ndarray:
    """AveragePool (``kind`` "average") or LpPool ("lp") of a validated input.

    ``running`` (per axis) and ``channel_block`` impose the passes' running-sums choice and
    the channels-last work items' width instead of deriving them from ``plan``, and
    ``first_outputs`` (per axis, the whole tensor's output that is ``plan``'s first) places
    the block sums' blocks as the whole tensor's: poolfold.dask pools a slab with the whole
    tensor's choices, so that every output has its bits."""
    return _windows_launch(label, x.shape, x.dtype, plan, channels_last, kind,
                           count_include_pad, float(p), running, channel_block, first_outputs,
                           kernel_threads())(x)


class _Launch:
    """What the averaging family's launches share: a call allocates Y, writes the values
    of a tensor whose windows are all empty (``empty``) or runs ``kernel`` over ``count``
    work items in ``parts``, on X and Y as :meth:`_arrays` hands them over, then
    ``arguments``."""

    empty = None
    kernel = None
    # The work launch_split caps the pieces by (see there), or None: the windowed pools keep
    # PIECES_PER_THREAD pieces a thread, the global ones one piece a thread for a small
    # call.  A piece is a Python call of the kernel: a global pool adds once per element,
    # where a window's taps cost several times that, and 8 pieces made (1,1000,13,13)
    # 0.080 ms on 2 threads (0.030 on one), 0.038-0.041 in 2; the windowed pools gain from
    # the pieces' balance (3x3 over (1,192,35,35): 0.20 in 8 pieces, 0.27 in 2).
    work = None
    flat = False  # the kernel takes X and Y as flat arrays
    y_rows = False  # ...or Y as one value per plane
    flags = False  # the kernel marks its items in an array after Y (the block sums)
    redo_arguments = None  # the block sums' float64 redo of the marked items

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = allocate(self.label, "Y", self.out_shape, self.dtype, size_checked=True)
        if self.empty is not None:
            y[...] = self.empty
        if self.kernel is None:
            return y
        xs = kernel_rows(x, self.outer, self.value_type)
        ys = as_rows(y, self.outer, self.value_type)
        if not self.flags:
            self.bound(*self._arrays(xs, ys))
            return y
        flagged = np.zeros(self.count, np.int8)
        self.bound(xs, ys, flagged)
        if self.redo_arguments is not None and flagged.any():
            self.redo(xs, ys, flagged)
        return y

    @functools.cached_property
    def redo(self) -> BoundLaunch:
        """The block sums again in float64 over the items whose float32 sums were not
        finite, storing the averages Y holds as inf or NaN (compiled on its first need)."""
        return BoundLaunch(self.kernel, self.count, self.redo_arguments, self.parts,
                           self.work, Crew())

    @functools.cached_property
    def bound(self) -> BoundLaunch:
        """The kernel with its arguments after X and Y bound, found on the first call."""
        return BoundLaunch(self.kernel, self.count, self.arguments, self.parts, self.work,
                           self.crew)

    @functools.cached_property
    def value_type(self) -> np.dtype:
        """The kernels' view of X's type, found on the first call."""
        return dtypes.value_type(self.dtype)

    def _arrays(self, xs, ys) -> tuple:
        if self.flat:
            return xs.reshape(-1), ys.reshape(-1)
        return xs, ys.reshape(-1) if self.y_rows else ys


class _WindowsLaunch(_Launch):
    """Everything :func:`pool_windows` does besides touching its arrays, for one plan, input
    shape and type, op, thread count and imposed choices: the output's size check, the
    kernel and its arguments, its parts.  Built once (:func:`_windows_launch`), as a model
    repeats its calls."""

    def __init__(self, label, shape, dtype, plan, channels_last, kind, count_include_pad, p,
                 running, channel_block, first_outputs, threads):
        layout = _layout(shape, channels_last)
        self.label = label
        self.dtype = dtype
        self.crew = Crew()  # its threaded calls run without the GIL once compiled
        self.outer = layout.outer
        self.out_shape = _output_shape(shape, plan.out_shape, channels_last)
        check_size(label, "Y", self.out_shape, dtype)
        if math.prod(self.out_shape) == 0:
            return
        average = kind == "average"
        divisor = ("padded" if count_include_pad else "valid") if average else None
        if running is None:
            running = running_sum_axes(plan, dtype, kind, p, layout.channels == 1)
        tables = window_tables(plan, divisor, running)
        if math.prod(plan.in_shape) == 0:  # every window empty: 0 / divisor, or LpPool's 0
            # 0 * (1 / divisor): NaN where the divisor is 0, the NaN the kernels'
            # multiplication gives (its sign is the CPU's), so that a slab of the tensor that
            # holds no input (poolfold.dask) has the bits the whole tensor's kernel gives
            with np.errstate(invalid="ignore"):
                values = (0.0 * tables.inverse if average
                          else np.zeros(math.prod(plan.out_shape)))
            per_position = values.astype(dtype)
            self.empty = per_position.reshape(
                (1,) + plan.out_shape + (1,) if channels_last else (1, 1) + plan.out_shape)
            return
        work = math.prod(shape) + math.prod(self.out_shape) * 4
        mode, transform = _sum_mode("average" if average else "lp", p)
        self.flat = True
        if not any(running) and takes_row_sums(plan, dtype, kind, p):
            _check_row_scratch(label, plan, layout.channels)
            rows = layout.outer * (math.prod(plan.out_shape) // plan.out_shape[-1])
            if takes_plane_lanes(plan, dtype.itemsize, layout.channels, layout.outer):
                block = block_planes(self.value_type, layout.outer, threads)
                self.kernel, self.count = sum_plane_lanes, -(-layout.outer // block)
                self.flat = False
                self.arguments = (tables.axes, tables.taps, tables.axis_inverse,
                                  tables.row_factors(dtype), mode,
                                  term_marker(transform), float(p), block)
                self.parts = split_parts(self.count, work, threads)
                return
            self.kernel, self.count = window_rows, rows
            self.arguments = (tables.axes, tables.taps, tables.axis_inverse,
                              tables.row_factors(dtype), layout.channels, mode,
                              term_marker(transform), float(p))
            self.parts = split_parts(rows, work, threads)
            return
        if takes_block_sums(plan, dtype, kind, p, layout.channels):
            segments = block_sum_segments(plan, running)
            # float64 sums' passes as long as float32 ones' (a redo is rare)
            at_once = block_pass_outputs(plan, 4 if average else 8)
            _check_block_scratch(label, plan, running, segments, at_once)
            self.kernel = BLOCK_SUM_KERNELS[plan.rank]
            bands = block_bands(plan, layout.outer, threads)
            self.count, self.flat = layout.outer * bands, False
            # averages sum in float32, a plane whose float32 sum is not finite again in
            # float64 (redo); LpPool's terms |x|^p would lose their small values to float32's
            # range: float64 throughout
            shared = (block_sum_dims(plan, running, first_outputs), segments,
                      tables.axis_inverse, mode, term_marker(transform), float(p))
            self.arguments = (*shared, _FLOAT32_SUMS if average else _FLOAT64_SUMS, False,
                              bands, at_once)
            self.redo_arguments = (*shared, _FLOAT64_SUMS, True, bands,
                                   at_once) if average else None
            self.flags = True
            self.parts = split_parts(self.count, work, threads)
            return
        block = channel_block_for(plan, layout.channels) if channel_block is None else min(
            channel_block, layout.channels)
        scaled = is_scaled(kind, dtype, p)
        group = 1 if scaled or layout.channels > 1 else _plane_group(plan, layout.outer)
        _check_scratch(label, plan, block * group, scaled)
        blocks = -(-layout.channels // block)
        self.count = layout.outer * blocks if layout.channels > 1 else -(-layout.outer // group)
        self.parts = split_parts(self.count, work, threads)
        if scaled:
            self.kernel, self.flat = scaled_window_sums, False
            self.arguments = (tables.axes, tables.taps, layout.channels, block, float(p),
                              precise_sums(kind, dtype, p))
            return
        self.kernel = window_sums
        self.arguments = _window_sums_arguments(tables, dtype, average, p, layout.channels,
                                                block, group)


# A model's calls repeat; each entry holds only references to its plan's cached tables.
_windows_launch = functools.lru_cache(maxsize=256)(_WindowsLaunch)


def _window_sums_arguments(tables, dtype, average, p, channels, block, group) -> tuple:
    """``window_sums``'s arguments after X and Y.  float64 averages are divided axis by axis
    (a float64 sum may overflow where the average does not), and summed with compensation."""
    wide = dtype.itemsize == 8
    axis_counts = tables.axis_counts if average and wide else None
    mode, transform = _sum_mode("average" if average else "lp", p)
    return (tables.axes, tables.taps, tables.inverse, axis_counts, channels, block, group,
            AS_IS if axis_counts is not None else mode, term_marker(transform), float(p),
            _COMPENSATE if wide else None)


# Channels-first planes are pooled this many elements at a time at most (several small
# planes as one work item): their intermediate results stay in the core's own cache.
GROUP_ELEMENTS = 16384


def _plane_group(plan: WindowPlan, outers: int) -> int:
    return int(max(1, min(outers, GROUP_ELEMENTS // max(1, math.prod(plan.in_shape)))))


# The marker that asks window_sums to compensate its sums (float64 inputs).
_COMPENSATE = np.empty(0, np.float64)


def average_pool(x, kernel_shape, *, strides=None, pads=None, dilations=None,
                 auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, opset=None):
    """ONNX AveragePool on an ``(N, C, D1, ..., Dr)`` array, any spatial rank r >= 1.

    Each output is the sum of its window's taps inside X divided by their count
    (``count_include_pad=0``) or by the count of taps inside the padded extent (1); a
    window with no tap inside X gives NaN with 0, and 0 with 1.  Sums are exact to float64
    rounding and Y is rounded to X's type.  ``opset`` selects the highest AveragePool
    version ``<=`` it (default: the latest, 22).

    >>> import numpy as np
    >>> average_pool(np.arange(4.0).reshape(1, 1, 4), [2]).tolist()
    [[[0.5, 1.5, 2.5]]]
    """
    key, launch = _CALLS.find(x, (kernel_shape, strides, pads, dilations),
                              ("AveragePool", auto_pad, ceil_mode, count_include_pad, opset))
    if launch is None:
        x, launch = prepare_average_pool(
            schema.resolve("AveragePool", opset), x, kernel_shape, strides=strides, pads=pads,
            dilations=dilations, auto_pad=auto_pad, ceil_mode=ceil_mode,
            count_include_pad=count_include_pad)
        _CALLS.keep(key, launch)
    return launch(x)


# The launches of AveragePool and LpPool calls checked before (see CallCache).
_CALLS = CallCache()


def prepare_average_pool(spec, x, kernel_shape, *, strides=None, pads=None, dilations=None,
                         auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, activation=None,
                         activation_params=None):
    """:func:`average_pool`'s checks, or for a ``spec`` of the nhwc domain the channels-last
    AveragePool's (:func:`poolfold.nhwc.average_pool`, its fused activation included): X as
    the kernels take it, and the launch that pools it, which serves any X of this shape and
    type."""
    channels_last = is_channels_last(spec)
    # Each domain's order of the checks as released, so that an input with several faults
    # meets the same error as before (and as in poolfold.dask): count_include_pad first in
    # ai.onnx, after X and the activation in the nhwc domain.
    if not channels_last:
        count_include_pad = resolve_count_include_pad(spec, count_include_pad)
    x = as_tensor(spec, x, "X")
    act = activations.resolve(spec, activation, activation_params, x.dtype)
    if channels_last:
        count_include_pad = resolve_count_include_pad(spec, count_include_pad)
    plan = resolve_plan(spec, _nchw(x.shape, channels_last), kernel_shape, strides, pads,
                        dilations, auto_pad, ceil_mode)
    return x, _prepared_launch(spec.label, x, plan, channels_last, "average",
                               count_include_pad, 2.0, act)


def lp_pool(x, kernel_shape, *, p=2, strides=None, pads=None, dilations=None,
            auto_pad="NOTSET", ceil_mode=0, opset=None):
    """ONNX LpPool on an ``(N, C, D1, ..., Dr)`` array: ``(sum of |x| ** p over the
    window's taps inside X) ** (1/p)``, padding adding nothing; an empty window gives 0.
    No spurious overflow or underflow: where ``|x| ** p`` would leave the accumulator's
    range the sums are scaled by the window's largest |x|.

    >>> import numpy as np
    >>> lp_pool(np.array([[[3.0, 4.0]]]), [2]).tolist()
    [[[5.0]]]
    """
    key, launch = _CALLS.find(x, (kernel_shape, strides, pads, dilations),
                              ("LpPool", p, auto_pad, ceil_mode, opset))
    if launch is None:
        x, launch = prepare_lp_pool(schema.resolve("LpPool", opset), x, kernel_shape, p=p,
                                    strides=strides, pads=pads, dilations=dilations,
                                    auto_pad=auto_pad, ceil_mode=ceil_mode)
        _CALLS.keep(key, launch)
    return launch(x)


def prepare_lp_pool(spec, x, kernel_shape, *, p=2, strides=None, pads=None, dilations=None,
                    auto_pad="NOTSET", ceil_mode=0):
    """:func:`lp_pool`'s checks (channels-last for a ``spec`` of the nhwc domain): X as the
    kernels take it, and the launch that pools it, which serves any X of this shape and
    type."""
    channels_last = is_channels_last(spec)
    p = check_p(spec, p)
    x = as_tensor(spec, x, "X")
    plan = resolve_plan(spec, _nchw(x.shape, channels_last), kernel_shape, strides, pads,
                        dilations, auto_pad, ceil_mode)
    return x, _prepared_launch(spec.label, x, plan, channels_last, "lp", 0, p,
                               activations.NONE)


def _prepared_launch(label, x, plan, channels_last, kind, count_include_pad, p, act):
    """A prepared AveragePool's or LpPool's launch for X's shape and type: Y of a checked X,
    the activation applied."""
    launch = _windows_launch(label, x.shape, x.dtype, plan, channels_last, kind,
                             count_include_pad, float(p), None, None, None,
                             kernel_threads())
    if act.code == IDENTITY:
        return launch
    return lambda x: activate(launch(x), act)


# ---------------------------------------------------------------------------------------------
# global pools


def pool_global(label: str, x: np.ndarray, channels_last: bool, kind: str,
                p: float = 2.0) -> np.ndarray:
    """GlobalMaxPool ("max"), GlobalAveragePool ("average") or GlobalLpPool ("lp") of a
    validated input: every spatial axis reduced to 1."""
    return _global_launch(label, x.shape, x.dtype, channels_last, kind, float(p),
                          kernel_threads())(x)


class _GlobalLaunch(_Launch):
    """Everything :func:`pool_global` does besides touching its arrays, for one input shape
    and type, op and thread count (see :class:`_WindowsLaunch`)."""

    keys = None  # GlobalMaxPool: the signed type X and Y are read as, their bits

    def __init__(self, label, shape, dtype, channels_last, kind, p, threads):
        layout = _layout(shape, channels_last)
        self.label = label
        self.dtype = dtype
        self.crew = Crew()  # its threaded calls run without the GIL once compiled
        self.outer = layout.outer
        self.out_shape = _output_shape(shape, (1,) * len(layout.spatial), channels_last)
        check_size(label, "Y", self.out_shape, dtype)
        size = math.prod(layout.spatial)
        if math.prod(self.out_shape) == 0:
            return
        if size == 0:  # an empty plane: max -inf, average 0/0, Lp-norm 0
            self.empty = {"max": -np.inf, "average": np.nan, "lp": 0.0}[kind]
            return
        work = self.work = math.prod(shape)
        self.count = layout.outer
        self.parts = split_parts(layout.outer, work, threads)
        if kind == "max":
            signed = _SIGNED[dtype.itemsize]
            self.kernel, self.keys = global_max, signed
            self.arguments = (size, layout.channels, _key_order(dtype))
            return
        scaled = is_scaled(kind, dtype, p)
        mode, transform = _sum_mode(kind, p)
        if layout.channels == 1:
            self.y_rows = True
            if scaled:
                self.kernel = scaled_plane_sums
                self.arguments = (size, float(p), precise_sums(kind, dtype, p))
            elif kind == "average" and dtype.itemsize < 8:
                self.kernel, self.arguments = plane_means, (size,)
            else:
                self.kernel = plane_sums
                self.arguments = (size, mode, transform, term_marker(transform), float(p),
                                  dtype.itemsize == 8)
            return
        # channels-last: one window over the positions, the channels as the vectorised run
        self.flat = True
        plan = _whole_axis_plan(label, size)
        tables = window_tables(plan, "valid" if kind == "average" else None)
        if takes_position_sums(plan, dtype, kind, p):  # the row kernel's sums
            self.count = layout.outer * -(-layout.channels // POSITION_CHANNELS)
            self.parts = split_parts(self.count, work, threads)
            self.kernel = position_sums
            self.arguments = (size, layout.channels, float(tables.axis_inverse[0, 0]), mode,
                              term_marker(transform), float(p))
            return
        block = min(layout.channels, CHANNEL_BLOCK)
        self.count = layout.outer * -(-layout.channels // block)
        self.parts = split_parts(self.count, work, threads)
        if scaled:
            self.flat = False
            self.kernel = scaled_window_sums
            self.arguments = (tables.axes, tables.taps, layout.channels, block, float(p),
                              precise_sums(kind, dtype, p))
            return
        self.kernel = window_sums
        self.arguments = _window_sums_arguments(tables, dtype, kind == "average", p,
                                                layout.channels, block, 1)

    def _arrays(self, xs, ys) -> tuple:
        if self.keys is not None:
            return xs, xs.view(self.keys), ys.view(self.keys)
        return super()._arrays(xs, ys)


_global_launch = functools.lru_cache(maxsize=256)(_GlobalLaunch)


_SIGNED = {2: np.int16, 4: np.int32, 8: np.int64}


@functools.lru_cache(maxsize=8)
def _key_order(dtype: np.dtype) -> np.ndarray:
    """What turns a float's bits, read as a signed integer, into a key that sorts as the
    values (see poolfold.kernels.window_sum.global_max): the mask that flips every bit but
    the sign of the negative ones, and the keys of +inf and -inf."""
    bits = dtype.itemsize * 8
    signed = _SIGNED[dtype.itemsize]
    mask = (1 << (bits - 1)) - 1
    infinities = np.array([np.inf, -np.inf]).astype(dtype).view(signed).astype(np.int64)
    keys = np.where(infinities < 0, infinities ^ mask, infinities)
    order = np.array([mask, keys[0], keys[1]], np.int64)
    order.flags.writeable = False
    return order


def _sum_mode(kind: str, p: float):
    if kind == "average":
        return AVERAGE, VALUE
    return ROOT, ABS if p == 1 else SQUARE if p == 2 else POWER


@functools.lru_cache(maxsize=64)
def _whole_axis_plan(label: str, size: int) -> WindowPlan:
    """One window over an axis of ``size`` positions (the spatial axes flattened)."""
    return WindowPlan((size,), (size,), (1,), (1,), (0,), (0,), (1,), label)


def global_max_pool(x, *, opset=None):
    """ONNX GlobalMaxPool: the largest value of each ``(n, c)`` plane, Y of shape
    ``(N, C, 1, ..., 1)``; NaN propagates; an empty plane gives -inf."""
    return _global_call("GlobalMaxPool", x, opset)


def global_average_pool(x, *, opset=None):
    """ONNX GlobalAveragePool: the mean of each ``(n, c)`` plane, Y of shape
    ``(N, C, 1, ..., 1)``; an empty plane gives NaN."""
    return _global_call("GlobalAveragePool", x, opset)


def global_lp_pool(x, *, p=2, opset=None):
    """ONNX GlobalLpPool: ``(sum of |x| ** p) ** (1/p)`` over each ``(n, c)`` plane, Y of
    shape ``(N, C, 1, ..., 1)``; an empty plane gives 0."""
    return _global_call("GlobalLpPool", x, opset, p)


def _global_call(op: str, x, opset, p=2):
    key, launch = _CALLS.find(x, (), (op, p, opset))
    if launch is None:
        x, launch = prepare_global_pool(schema.resolve(op, opset), x, p=p)
        _CALLS.keep(key, launch)
    return launch(x)


# What each global pool reduces a plane by (see pool_global).
GLOBAL_KINDS = {"GlobalMaxPool": "max", "GlobalAveragePool": "average", "GlobalLpPool": "lp"}


def prepare_global_pool(spec, x, *, p=2):
    """The checks of the global pool ``spec`` names (channels-last in the nhwc domain; ``p``
    GlobalLpPool's only): X as the kernels take it, and the launch that pools it, which
    serves any X of this shape and type."""
    kind = GLOBAL_KINDS[spec.op]
    if kind == "lp":
        p = check_p(spec, p)
    x = as_tensor(spec, x, "X")
    return x, _global_launch(spec.label, x.shape, x.dtype, is_channels_last(spec), kind,
                             float(p), kernel_threads())
