"""MaxPool, every version (1, 8, 10, 11, 12, 22), any spatial rank."""

from __future__ import annotations

import contextlib
import functools
import math
from typing import NamedTuple

import numpy as np

from .. import dtypes, schema
from ..errors import PoolfoldError, PoolfoldTypeError
from ..geometry import (WindowAttributes, WindowPlan, row_major_strides,
                        window_plan)
from ..kernels import background
from ..kernels.max_passes import (AXIS_ROWS, CHANNELS, COLUMN_MAJOR, ITEMS_PER_PLANE,
                                  LANE_CAPACITY, LANE_OUTPUTS, LANES, LAST_MODE,
                                  PLANES_PER_ITEM, ROWS_PER_ITEM, RUN_CAPACITY, SETUP_SIZE,
                                  SHIFTED, STAGE_CAPACITY, VAN_HERK, WORDS, max_passes)
from ..kernels import max_lines as lines
from ..kernels import max_rows as rows
from ..kernels import max_runs as runs
from ..kernels import simd
from ..kernels.native_split import Crew
from ..kernels.plane_lanes import block_planes, max_plane_lanes
from ..kernels.threads import (PIECES_PER_THREAD, BoundLaunch, kernel_threads, launch_split,
                               split_parts)
from ..kernels.window_max import window_max, window_max_separable, window_max_tiles
from ..kernels.words import has_words, word_type, words_view
from ..memory import allocate, check_size, check_table, line_rows
from ._common import CallCache, as_rows, as_tensor, flag, kernel_input, kernel_rows


def resolve_plan(spec, shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode,
                 indexed=True):
    """Check the window attributes against the version, then plan the windows over the
    spatial dims of the NCHW-ordered ``shape`` (``indexed``: see geometry.window_plan)."""
    spec.reject_absent("dilations", dilations is not None)
    spec.reject_absent("ceil_mode", bool(ceil_mode))
    ceil_mode = flag(spec, "ceil_mode", ceil_mode)
    spatial = tuple(int(n) for n in shape[2:])
    attributes = WindowAttributes.validate(
        spec.label, len(spatial), kernel_shape, strides, dilations, pads
    )
    return window_plan(spec.label, spatial, attributes, auto_pad, bool(ceil_mode),
                       indexed=indexed)


def check_index_request(spec, storage_order, return_indices) -> int:
    """Check the Indices output and storage_order against the version; the storage order."""
    if not isinstance(return_indices, (bool, np.bool_)):
        raise PoolfoldTypeError(f"{spec.label}: return_indices must be a bool, got {return_indices!r}")
    if return_indices and "Indices" not in spec.outputs:
        raise PoolfoldError(
            f"{spec.label}: output 'Indices' is not part of this version (it exists from MaxPool-8)"
        )
    spec.reject_absent("storage_order", bool(storage_order))
    return flag(spec, "storage_order", storage_order)


def max_pool_shape(
    input_shape,
    kernel_shape,
    *,
    strides=None,
    pads=None,
    dilations=None,
    auto_pad="NOTSET",
    ceil_mode=False,
    opset=None,
) -> tuple[int, ...]:
    """The shape of MaxPool's Y (and Indices) for an input of ``input_shape``, computed by the
    same geometry as :func:`max_pool` and with the same checks, without touching any data
    (so with no bound on the positions, which only kernels index).

    >>> max_pool_shape((8, 64, 112, 112), [3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    (8, 64, 56, 56)
    """
    spec = schema.resolve("MaxPool", opset)
    if isinstance(input_shape, (str, bytes)) or not hasattr(input_shape, "__iter__"):
        raise PoolfoldTypeError(
            f"{spec.label}: input 'X' shape must be a sequence of integers, got {input_shape!r}"
        )
    shape = tuple(input_shape)
    if any(isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) for n in shape):
        raise PoolfoldTypeError(f"{spec.label}: input 'X' shape must hold integers, got {shape}")
    shape = tuple(int(n) for n in shape)  # plain ints out, whatever integer type came in
    if len(shape) < 3 or min(shape) < 0:
        raise PoolfoldError(
            f"{spec.label}: input 'X' must have rank >= 3 and no negative dim, got shape {shape}"
        )
    plan = resolve_plan(spec, shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode,
                        indexed=False)
    return shape[:2] + plan.out_shape


def max_pool(
    x,
    kernel_shape,
    *,
    strides=None,
    pads=None,
    dilations=None,
    auto_pad="NOTSET",
    ceil_mode=False,
    storage_order=0,
    return_indices=False,
    opset=None,
):
    """ONNX MaxPool on an ``(N, C, D1, ..., Dr)`` array, for any spatial rank r >= 1.

    Returns Y, or ``(Y, Indices)`` with ``return_indices=True``.  ``opset`` selects the
    highest MaxPool version ``<=`` it (default: the latest, 22); that version's attributes and
    types are enforced.  Indices are flat positions in X, plane offset included
    (row-major, or first-axis-fastest with ``storage_order=1``); an empty window yields -inf
    (the minimum for integers) with index -1.  Ties go to the first tap in window order; a NaN
    in the window wins.

    >>> import numpy as np
    >>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    >>> y, i = max_pool(x, [2, 2], strides=[2, 2], return_indices=True)
    >>> y[0, 0].tolist(), i[0, 0].tolist()
    ([[5.0, 7.0], [13.0, 15.0]], [[5, 7], [13, 15]])
    """
    key, launch = _LAUNCHES.find(
        x, (kernel_shape, strides, pads, dilations),
        (auto_pad, ceil_mode, storage_order, return_indices, opset, _forced()))
    if launch is None:
        x, launch = prepare(schema.resolve("MaxPool", opset), x, kernel_shape, strides=strides,
                            pads=pads, dilations=dilations, auto_pad=auto_pad,
                            ceil_mode=ceil_mode, storage_order=storage_order,
                            return_indices=return_indices)
        _LAUNCHES.keep(key, launch)
    y, indices = launch(x)
    return (y, indices) if return_indices else y


_LAUNCHES = CallCache()


def prepare(spec, x, kernel_shape, *, strides=None, pads=None, dilations=None,
            auto_pad="NOTSET", ceil_mode=False, storage_order=0, return_indices=False):
    """:func:`max_pool`'s checks: X as the kernels take it, and the launch that pools it into
    ``(Y, Indices or None)``, which serves any X of this shape and type."""
    storage_order = check_index_request(spec, storage_order, return_indices)
    x = as_tensor(spec, x, "X")
    plan = resolve_plan(spec, x.shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    return x, _pool_launch(spec.label, x.shape[:2], x.dtype, plan, return_indices,
                           storage_order, _forced(), -1, kernel_threads())


@functools.lru_cache(maxsize=512)
def tiles_fit(plan: WindowPlan, itemsize: int) -> bool:
    """Whether the windows tile the input (kernel 2, stride 2, dilation 1 on every axis,
    none cut by padding or by an axis's end), over two or three axes with an even last dim,
    of elements that pair into words: ``poolfold.kernels.window_max.window_max_tiles``."""
    if plan.rank not in (2, 3) or plan.in_shape[-1] % 2 or not has_words(itemsize):
        return False
    return all(k == 2 and s == 2 and d == 1 and before == 0 and 2 * out <= n
               for k, s, d, before, out, n in zip(plan.kernel, plan.strides, plan.dilations,
                                                  plan.pad_begin, plan.out_shape,
                                                  plan.in_shape))


# The fewest work items the tiling kernel's call is cut into where there are threads to
# share it: fewer planes than this are cut into slices along their first axis (see
# tile_slices).
TILE_ITEMS_PER_THREAD = 8


def tile_slices(plan: WindowPlan, planes: int, threads: int) -> int:
    """Into how many slices along the first axis the tiling kernel cuts each of ``planes``
    planes, so that ``threads`` threads can share a call of few large planes (a batch-1
    RGB image, one plane of a microscopy slice): the fewest that make
    :data:`TILE_ITEMS_PER_THREAD` items a thread, or a window's row each, each slice whole
    windows (the axis as long as its windows reach; a slice count that divides its
    windows); 1 where the call has items enough, or one thread."""
    wanted = -(-TILE_ITEMS_PER_THREAD * threads // max(planes, 1))
    out = plan.out_shape[0]
    if threads <= 1 or wanted <= 1 or plan.in_shape[0] != 2 * out:
        return 1
    return next(cut for cut in range(min(wanted, out), out + 1) if out % cut == 0)


@functools.lru_cache(maxsize=512)
def separable_staging(plan: WindowPlan, itemsize: int):
    """Where the separable passes stage their results along each axis, or None when they
    cannot stage this plan (cached, as plans are: a model repeats its calls; the kernels
    only read these tables).

    Along each axis but the first (unless it is the only one) the passes reduce at every
    window start: ``starts[a]`` of them, none if no window lies wholly inside the axis.  The
    rows after those would hold windows running off the end; the outputs whose window the
    padding cuts take them instead, in order.  ``slot[a, o]`` is the staged row of output o
    (its window start, or its spare row); ``cut[a, :cut_count[a]]`` the cut outputs that
    keep an in-bounds tap.  None when the cut windows outnumber the spare rows, or a dim
    is 0.

    The last axis is reduced at its outputs only (``pairs``, staged in output order) when
    its stride is 2, its dilation 1, its extent even, with no more outputs than half the
    extent, and elements of ``itemsize`` bytes can be read by pairs as one word: see
    ``poolfold.kernels.window_max._pairs_pass``."""
    if min(plan.in_shape) == 0:
        return None
    taps = plan.taps
    rank, width = plan.rank, taps.first.shape[1]
    last = rank - 1
    n_last = plan.in_shape[last]
    pairs = (plan.strides[last] == 2 and plan.dilations[last] == 1 and n_last % 2 == 0
             and plan.out_shape[last] <= n_last // 2 and has_words(itemsize))
    starts = np.zeros(rank, np.int64)
    slot = np.zeros((rank, width), np.int64)
    cut = np.zeros((rank, width), np.int64)
    cut_count = np.zeros(rank, np.int64)
    for a in range(rank):
        out, n, k, d = plan.out_shape[a], plan.in_shape[a], plan.kernel[a], plan.dilations[a]
        inside = (taps.lo[a, :out] == 0) & (taps.hi[a, :out] == k)
        cut_outputs = np.flatnonzero(~inside)
        if a == last and pairs:
            slot[a, :out] = np.arange(out)
        else:
            starts[a] = n - (k - 1) * d if inside.any() else 0
            if a > 0 or rank == 1:  # the first axis of several is reduced at its outputs only
                if starts[a] + cut_outputs.size > n:
                    return None
            slot[a, :out] = taps.first[a, :out]
            slot[a, cut_outputs] = starts[a] + np.arange(cut_outputs.size)
        kept = cut_outputs[taps.lo[a, cut_outputs] < taps.hi[a, cut_outputs]]
        cut[a, :kept.size] = kept
        cut_count[a] = kept.size
    staged_shape = plan.in_shape[:last] + (n_last // 2 if pairs else n_last,)
    return (starts, slot, cut, cut_count, pairs, row_major_strides(plan.in_shape),
            row_major_strides(staged_shape))


@functools.lru_cache(maxsize=512)
def _separable_slab(plan: WindowPlan, item_bytes: int, threads: int, output_bytes: int):
    """Outputs along the first axis per slab for the separable passes, or None when a direct
    scan is the better choice.

    The passes visit each input position once per tap of each axis but the first, and only
    the rows the outputs need along the first, in vectorised loops (about 8x cheaper per
    visit); then each output reads its result.  A direct scan visits each output's whole
    window, and first pays about four taps' worth per output to find it (measured: 8-15 ns
    per output plus about 2 ns per tap, against about 0.25 ns per vectorised visit), so it
    wins only when the windows skip most of the input (a 1x1 window at stride 4, say).  The
    passes need two scratch slabs per thread: slabs are sized to stay in cache (256 KiB)
    and, all threads together, under 10% of the outputs' size or 64 KiB, whichever is more
    (slabs of a few rows cost small calls more than their scratch saves: the bundled model's
    MaxPools, 100-200 KiB of output, ran 15-40% faster with whole-plane slabs than with
    three-row ones); if even one row of outputs cannot fit, scan directly.  Cached: a model repeats its calls, and this arithmetic costs
    more than a small call's kernel."""
    vectorised = 8
    per_output = 4
    n, k, out = plan.in_shape, plan.kernel, plan.out_shape
    size = math.prod(n)
    if size == 0:  # a 0-size axis with pads: every window is empty, nothing to stage
        return None
    separable = size * sum(k[1:] if plan.rank > 1 else k) / vectorised + math.prod(out)
    if plan.rank > 1:
        separable += out[0] * k[0] * size / n[0] / vectorised
    if separable >= math.prod(out) * (math.prod(k) + per_output):
        return None
    if plan.rank == 1:
        return 1
    row_bytes = size // n[0] * item_bytes
    budget = min(256 * 1024, max(64 * 1024, 0.1 * output_bytes / (2 * threads)))
    step = plan.strides[0]
    extent = (k[0] - 1) * plan.dilations[0] + 1
    fitting = int((budget / row_bytes - extent) // step) + 1  # (rows - 1)*step + extent inputs
    return min(fitting, out[0]) if fitting >= 1 else None


# The kernels MaxPool chooses from (:func:`choose_kernel`), by the names tests force them by.
TILES, ROWS, ROW_BLOCKS, LINES, PLANE_LANES, RUNS, PASSES, SEPARABLE, DIRECT = (
    "tiles", "rows", "row_blocks", "lines", "plane_lanes", "runs", "passes", "separable",
    "direct")
KERNELS = (TILES, ROWS, ROW_BLOCKS, LINES, PLANE_LANES, RUNS, PASSES, SEPARABLE, DIRECT)


@functools.lru_cache(maxsize=512)
def choose_kernel(plan: WindowPlan, itemsize: int, storage_order: int,
                  forced: str | None = None, by_rows: bool = False,
                  lanes: int = 1, planes: int = 0) -> tuple[str, str]:
    """The kernel that pools ``plan`` over elements of ``itemsize`` bytes, and why.
    ``by_rows``: the call can be pooled by rows (no Indices); ``lanes``: channels-last
    samples of that many channels (1: channels-first planes); ``planes``: how many
    channels-first planes the call pools (0: not channels-first planes).

    - ``plane_lanes`` (``max_plane_lanes``): small channels-first planes without Indices,
      of a float type, a block of planes at a time as the lanes of vectors
      (:func:`_plane_lanes_win`).

    - ``lines`` (``max_lines``): 2-D channels-first planes without Indices, short windows
      along rows a stride divides, every row folded along the last axis first as one stream
      (:func:`_lines_win`).
    - ``row_blocks`` (``max_row_blocks``): channels-first planes without Indices whose rows
      are short (:func:`row_blocks_fit`), a block of rows reduced along the last axis in one
      loop, where it was measured faster (:func:`_row_blocks_win`).  Short 1-D rows it does
      not take go by passes, not rows.
    - ``tiles`` (``window_max_tiles``): 2x2(x2) windows at stride 2 that tile the input, row
      -major Indices: one fused pass reading pairs of elements as words; without Indices,
      only rows too long for the blocks.
    - ``runs`` (``max_runs``): channels-first planes without Indices, at
      dilation 1, with a long window (:func:`_runs_win`): streamed running maxima, whose
      cost does not grow with the window.
    - ``rows`` (``max_rows``): channels-first planes or channels-last samples without
      Indices, where it was measured faster than the kernels below (:func:`_rows_win`).
    - ``direct`` (``window_max``): a 0-size axis (every window is empty), or windows that skip
      most of the input (a 1x1x1 window at stride 8, say), where visiting each output's own
      taps beats passes over every input position (:func:`_passes_cost`).
    - ``separable`` (``window_max_separable``): the few short windows it was measured to
      pool faster than ``max_passes`` (:func:`_separable_wins`).
    - ``passes`` (``max_passes``): everything else, one axis at a time, long windows by van
      Herk / Gil-Werman runs.

    ``forced`` (tests, :func:`forced_kernel`) picks a kernel if it can pool the plan, else
    the choice falls back to the rules above and says so."""
    prefix = ""
    if forced is not None:
        refusal = _cannot_run(forced, plan, itemsize, storage_order, by_rows, lanes)
        if refusal is None:
            return forced, f"forced: {forced}"
        prefix = f"forced {forced} refused ({refusal}); "
    if min(plan.in_shape) == 0:
        return DIRECT, prefix + "a 0-size axis: every window is empty"
    if by_rows and lanes == 1 and _runs_win(plan, itemsize, planes):
        return RUNS, prefix + "long windows without Indices, by streamed running maxima"
    if by_rows and lanes == 1 and _plane_lanes_win(plan, itemsize, planes):
        return PLANE_LANES, prefix + "small planes without Indices, many at once as lanes"
    if by_rows and lanes == 1 and _lines_win(plan, itemsize):
        return LINES, prefix + "2-D rows without Indices, folded along the last axis first"
    blocks = by_rows and lanes == 1 and row_blocks_fit(plan)
    if blocks and _row_blocks_win(plan, itemsize):
        return ROW_BLOCKS, prefix + "short rows without Indices, a block of them at a time"
    if lanes == 1 and storage_order == 0 and tiles_fit(plan, itemsize):
        return TILES, prefix + "2x2 windows tiling the input, at stride 2"
    if by_rows and (_rows_win_lanes(plan, itemsize) if lanes > 1 else
                    _rows_win(plan, itemsize) and not (blocks and plan.rank == 1)):
        return ROWS, prefix + "channels-first planes without Indices, where rows were faster"
    passes, direct = _passes_cost(plan)
    if direct <= passes:
        return DIRECT, prefix + f"windows skip most of the input ({direct:.3g} < {passes:.3g})"
    if _separable_wins(plan, itemsize) and separable_staging(plan, itemsize) is not None:
        return SEPARABLE, prefix + "short windows the older separable passes do faster"
    return PASSES, prefix + "separable passes"


def _separable_wins(plan: WindowPlan, itemsize: int) -> bool:
    """Where the older separable kernel (``window_max_separable``) was measured faster than
    ``max_passes`` (one thread, ranks 1-3, windows 2-5 at strides 2-4, no long window; at
    stride 1 the passes are faster):

    - 1- and 2-byte types, whatever the window: 1.2-8x faster (uint8 3x3 at stride 3, 0.39
      against 1.9 ms; float16 1-D windows of 4 at stride 3, 0.92 against 8.0 ms), but for
      uint8 2-D 2x2 or 3x3 windows at stride 2 (0.8x, kept for simplicity);
    - 4-byte types with windows of at most three taps along the last axis, in 1-D (1.5-2.3x)
      or at strides of 3 and more (1.2-2.2x, 3x3x3 at stride 3: 1.7 against 2.8 ms); longer
      windows go to ``max_passes`` (5x5 at stride 3: 2.7 against 6.3 ms);
    - 8-byte types with such windows in 1-D only (1.4-1.7x; in 2-D the passes were up to 2x
      faster)."""
    last = plan.rank - 1
    if plan.strides[last] < 2 or any(_van_herk(k, s) for k, s in zip(plan.kernel,
                                                                       plan.strides)):
        return False  # stride 1: as fast by passes, or faster (uint8 1-D 3 taps, 0.5 vs 1.8 ms)
    if itemsize <= 2:
        return True
    if plan.kernel[last] > 3:
        return False
    if itemsize == 4:
        return plan.rank == 1 or plan.strides[last] >= 3
    return plan.rank == 1


# The longest window along an axis of several that ``max_rows`` takes (it folds every tap of
# the leading axes): 2-D stride-1 windows of 15 were faster by rows (7.4 against 10.2 ms by
# van Herk runs over (4,16,256,256)), of 21 slower (12.4 against 11.1).
ROWS_LONGEST_WINDOW = 16


# The shortest last-axis window ``max_rows`` reduces by a ladder of runs (``_ladder``),
# where its log4(k) + 1 passes over every input position beat k / 2 sweeps over the outputs:
# windows of at least 8 taps, at a stride of at most an eighth of the window.
LADDER_TAPS = 8


def ladder_wins(kernel: int, stride: int) -> bool:
    return kernel >= LADDER_TAPS and stride * LADDER_TAPS <= kernel


# The longest row of ``max_row_blocks``'s scratch (``OUT_PITCH`` * stride, at least the input
# row), and the elements of one block of rows: rows longer than this run vectorised loops by
# themselves.
ROW_BLOCK_PITCH = 256
ROW_BLOCK_ELEMENTS = 2048


# The largest planes (elements) and the most in-bounds taps an output has on average for
# max_plane_lanes to take a call (see _plane_lanes_win); 8-byte types' 1-D and 2-D planes up to
# PLANE_LANES_MOST_INPUT_8.
PLANE_LANES_MOST_INPUT = 1024
PLANE_LANES_MOST_INPUT_8 = 256
PLANE_LANES_MOST_TAPS = 100
# The longest 1-D window it takes unforced: 3 to 9 taps were measured faster as lanes; 63
# taps over (16384, 256) took 4.1-4.7 ms as lanes, 1.7 by running maxima.
PLANE_LANES_LONGEST_1D = 9
# The fewest planes it takes unforced: a block of 64 float32 planes pools them all at once.
PLANE_LANES_FEWEST_PLANES = 4
# The most taps (outputs times the in-bounds taps of each) of a plane of a half type in 1-D
# and 2-D, whose stride-1 rows the row blocks pool fast.
PLANE_LANES_MOST_HALF_TAPS = 8192
# The most (output, window tap) pairs its table is built from: planes padded far beyond
# their size have many outputs, and long windows many taps, even where few are in bounds.
PLANE_LANES_MOST_PAIRS = 2**20


def plane_lanes_fit(plan: WindowPlan, itemsize: int) -> bool:
    """Whether ``max_plane_lanes`` can pool the plan's planes: of a float type (a 1-byte
    type's tiles of 64 x 64 took 3 s to compile), some input element, and small enough:
    planes and outputs of at most PLANE_LANES_MOST_INPUT elements, whose lists of taps make
    a table of at most PLANE_LANES_MOST_INPUT times PLANE_LANES_MOST_TAPS entries, built from
    at most PLANE_LANES_MOST_PAIRS pairs (the kernel's scratch and table stay small)."""
    outputs = math.prod(plan.out_shape)
    return (itemsize >= 2 and min(plan.in_shape) > 0
            and math.prod(plan.in_shape) <= PLANE_LANES_MOST_INPUT
            and outputs <= PLANE_LANES_MOST_INPUT
            and outputs * math.prod(plan.kernel) <= PLANE_LANES_MOST_PAIRS
            and _mean_taps(plan) <= PLANE_LANES_MOST_TAPS)


def _mean_taps(plan: WindowPlan) -> float:
    """The in-bounds taps of an output's window, on average over the outputs (the plan's
    tap table: per axis, taps ``[lo, hi)`` of each output lie inside)."""
    taps, mean = plan.taps, 1.0
    for a, out in enumerate(plan.out_shape):
        mean *= float(np.maximum(taps.hi[a, :out] - taps.lo[a, :out], 0).mean())
    return mean


def _plane_lanes_win(plan: WindowPlan, itemsize: int, planes: int) -> bool:
    """Where ``max_plane_lanes`` was measured faster than the kernels below it, one thread
    (new time over old): float32 3x3 over (1,832,7,7) 0.23 (0.038 against 0.167 ms;
    onnxruntime 0.062), 2x2 at stride 2 over (1,832,14,14) 0.37, 3x3 over (1,512,14,14)
    0.41, over (1,192,28,28) 0.79, at stride 2 over (1,480,28,28) 0.67; over planes of
    49 to 1000 elements, windows 2x2 to 7x7, 3 to 9 taps in 1-D, 3x3x3, strides 1 and 2 and
    dilation 2: 0.14-0.94 (3x3x3 over (1,100,8,8,8) 0.31; 5x5 over (1,256,20,20) 0.76 in one
    run, 1.25 in another), float64 0.1-0.95 up to 256
    elements in 1-D and 2-D (1.03-1.42 over larger ones), 3-D 0.14-0.51; even 4 to 16
    planes, 0.24-0.57.  float16 0.17-0.89 where a 1-D or 2-D plane's outputs read at most
    :data:`PLANE_LANES_MOST_HALF_TAPS` taps (3x3 over (1,192,28,28), 6724 taps: 0.74), but
    3x3 over 32x32 (9000) 1.0-1.18 and 5x5 over 30x30 (20700) 1.24 against the row blocks;
    3-D 0.16-0.31.  Not over planes of 3136 (3x3 at stride 2 over
    (1,64,56,56): 1.13) nor 4096 (2x2x2 at stride 2 over 16x16x16: 1.32), whose rows the
    other kernels vectorise well, nor where an output reads more than
    :data:`PLANE_LANES_MOST_TAPS` taps on average (a long window reads them all, where the
    running maxima cost a few comparisons an element whatever the window).  Up to 100 taps
    (49 before), float32, the SPP pools of YOLO-style networks and the like, two threads,
    against the best other kernel: 9x9 over (1,256,20,20) 0.126 against 0.23 ms by runs
    (onnxruntime 0.16), 11x11 0.163 against 0.23, 9x9 over (1,64,28,28) 0.081 against 0.19,
    13x13 over (1,256,14,14) (88 taps inside on average) 0.095 against 0.38; but 11x11 over
    (1,64,32,32) (101 taps) 0.148 against 0.093, 15x15 over (4,64,24,24) 0.55 against
    0.29.  float16 beyond PLANE_LANES_MOST_HALF_TAPS where the row blocks cannot take the
    window (8 taps and more along the last axis): 9x9 over (1,256,20,20) 0.118 against
    0.174 by passes (onnxruntime 0.15)."""
    if planes < PLANE_LANES_FEWEST_PLANES or not plane_lanes_fit(plan, itemsize):
        return False
    if plan.rank == 1 and plan.kernel[0] > PLANE_LANES_LONGEST_1D:
        return False
    if plan.rank >= 3 or itemsize == 4:
        return True
    if itemsize == 2:  # (the row blocks take no last-axis window of 8 taps and more)
        return (math.prod(plan.out_shape) * _mean_taps(plan) <= PLANE_LANES_MOST_HALF_TAPS
                or plan.kernel[-1] >= LADDER_TAPS)
    return math.prod(plan.in_shape) <= PLANE_LANES_MOST_INPUT_8


def row_blocks_fit(plan: WindowPlan) -> bool:
    """Whether ``max_row_blocks`` can pool the plan's channels-first planes: short rows
    (:data:`ROW_BLOCK_PITCH`), a last-axis window too short for a ladder of runs, and some
    input column that a window reaches."""
    out_pitch, _, data = _row_block_layout(plan)
    return (plan.kernel[-1] < LADDER_TAPS and data >= 1
            and out_pitch * plan.strides[-1] <= ROW_BLOCK_PITCH)


# The longest input rows (in bytes) of 4- and 8-byte types whose stride-1 windows the row
# blocks take in 2-D (28 float32, 14 float64), and in 3-D and up (8 float32, 4 float64):
# measured against the passes in _row_blocks_win.
SHORT_ROW_BYTES = 112
SHORT_ROW_BYTES_3D = 32


def _row_blocks_win(plan: WindowPlan, itemsize: int) -> bool:
    """Where ``max_row_blocks`` was measured faster than the other kernels (one thread,
    float32, float16, bfloat16, uint8 and float64, ranks 1-3), of the plans it can take:

    - at a last-axis stride of 2 or more, every type and rank: 1.2-2.5x faster than the
      row kernel (3x3 at stride 2 over (1,64,56,56): 0.074 against 0.11 ms; float16, 0.060
      against 0.16; 3-D 3x3x3 over (2,16,32,32,32): 0.49 against 0.81, uint8 0.37 against 0.90
      by the separable kernel), and than the 2x2 tiles for every type (2 threads, new over
      old: float32 (1,3,224,224) 0.50, (1,64,112,112) 0.78, (8,64,56,56) 0.86,
      (2,32,64,64,64) 0.96; uint8 and int8 0.61-0.98 over the same, one int8 3-D case 1.17;
      float16 over (8,64,56,56): 0.36 against 1.1 ms);
    - at stride 1, the half types (3x3 over (8,32,80,80): 0.66 against 1.8 ms by passes;
      3x3x3, 1.7 against 2.8), 1-byte types up to 2-D (3x3 over (8,32,80,80), 0.51 against
      0.62), and 2-D windows the passes would take van Herk runs for (float32 5x5 over
      (4,32,56,56): 0.50 against 1.3 ms; the row kernel 0.66).

    - in 3-D and up, windows whose last axis the passes would take by van Herk runs
      (:func:`_last_axis_runs_lose`).

    - at stride 1, 4- and 8-byte types' rows of at most :data:`SHORT_ROW_BYTES` in 2-D
      (3x3 over (1,832,7,7), the last MaxPools of an Inception network: 0.12 against 0.30
      ms; over about 400,000 float32 in planes of 7x7, 14x14 and 28x28, 0.77, 0.49 and 0.34
      against 1.98, 0.67 and 0.37 by passes; float64 7x7 0.54 against 0.98), and of at most
      :data:`SHORT_ROW_BYTES_3D` in 3-D and up (3x3x3 over (1,1166,7,7,7), 1.7 against 2.2;
      float64 0.79 against 0.90), where the passes' loops run over rows too short to
      vectorise.

    Not 4- and 8-byte types' short windows at stride 1 over longer rows, whose passes run
    over whole planes (3x3 over (8,32,80,80): 1.01 against 1.09 ms; 40x40 0.26 against 0.28;
    3-D 14x14x14 0.67 against 1.07; 1-D 3 taps over (64,64,32): 0.082 against 0.095), nor
    1-byte 3-D ones (0.90 against 1.5); nor windows of more than
    :data:`ROWS_LONGEST_WINDOW` taps along a leading axis, each of which the blocks fold per
    output row (63x1 over (4,16,256,256): 25 ms, where the passes take 24 for 63x63)."""
    if max(plan.kernel[:-1], default=1) > ROWS_LONGEST_WINDOW:
        return False
    if plan.strides[-1] >= 2 or itemsize == 2:
        return True
    if itemsize >= 4 and plan.rank >= 2 and plan.in_shape[-1] * itemsize <= (
            SHORT_ROW_BYTES if plan.rank == 2 else SHORT_ROW_BYTES_3D):
        return True
    if plan.rank > 2:
        return _last_axis_runs_lose(plan)
    if itemsize == 1:
        return True
    return plan.rank == 2 and any(_van_herk(k, s) for k, s in zip(plan.kernel, plan.strides))


# The most taps a window has along its leading axes for the row kernels to take it where the
# passes would run van Herk runs along the last axis (see _last_axis_runs_lose).
ROWS_MOST_LEADING_TAPS = 25


def _last_axis_runs_lose(plan: WindowPlan) -> bool:
    """Whether the passes would take the last axis of a window of 3-D and up by van Herk
    runs (a channels-first last axis goes through lanes then, transposed), and the window
    has at most :data:`ROWS_MOST_LEADING_TAPS` taps along its other axes, each of which the
    row kernels fold per output row.  Measured, one thread, stride 1, by rows (short rows: in
    blocks) against the passes (ms): 5x5x5 over (2,8,48,48,48) 6.1 against 9.0 (float64
    13.9 against 17.9, uint8 4.2 against 4.2), 3x3x5 4.1 against 8.7 (uint8 2.3 against
    3.7), 3x3x7 6.2 against 12.5; over (1,4,16,64,400), 5x5x5 4.4 against 7.5 (uint8 1.1
    against 3.3), 3x5x7 over (1,8,8,32,1000) 3.9 against 7.9; but 7x7x5 19 against 18, and
    where only a leading axis takes runs, 5x5x3 8.2 against 3.8."""
    leading = math.prod(plan.kernel[:-1])
    return _van_herk(plan.kernel[-1], plan.strides[-1]) and leading <= ROWS_MOST_LEADING_TAPS


def _row_block_layout(plan: WindowPlan) -> tuple[int, int, int]:
    """``max_row_blocks``'s OUT_PITCH, PADDED_ROW and DATA_COLUMNS (see the kernel): the
    padded row is as long as the windows reach, its input columns those they read.  Its rows
    lie ``OUT_PITCH * stride`` apart, the output row's own length where a row's padding
    after it may share elements with the next row's padding before it (Y is then written
    where it lies), else as many strides as the padded row needs."""
    last = plan.rank - 1
    k, s, d = plan.kernel[last], plan.strides[last], plan.dilations[last]
    out, shift = plan.out_shape[last], plan.pad_begin[last]
    padded = (out - 1) * s + (k - 1) * d + 1
    data = min(plan.in_shape[last], padded - shift)
    if shift + data <= out * s and padded <= out * s + shift:
        return out, padded, data
    return -(-padded // s), padded, data


def _rows_win(plan: WindowPlan, itemsize: int) -> bool:
    """Where ``max_rows`` was measured faster than the other kernels (two threads, float32,
    uint8, float16 and float64, ranks 1-3), of the plans it can take:

    - 1-D windows, of any length: 1.1-10x faster than the passes (windows of 4 at stride 4,
      2.9 against 5.5 ms; over (4,16,65536) at stride 1, 2.4 against 31 ms for 8 taps, 3.6
      against 27 for 256, 4.5 against 26 for 4096: long windows go by a ladder of runs);
    - windows of at most 16 taps per axis at a last-axis stride of 3 or more, where the other
      kernels reduce every input row along the last axis and rows reduce only the output rows
      (2-D 5x5 at stride 3, 0.50 against 1.4 ms; 8x8 at stride 8, 6.4 against 10.4 ms);
    - at a last-axis stride of 2, 2-D windows (3x3 over (1,64,112,112): 0.22 against 0.26
      ms; uint8 5x5 over (4,16,256,256): 0.75 against 1.2), and 3-D ones but for 1-byte types
      (3x3x3 over (2,32,64,64,64): 5.0 against 7.3 ms; float64 3x3x3, 2.0 against 3.7; uint8
      5x5x5, 1.4 against 1.0);
    - 2-D windows where the passes would take van Herk runs (2-D 7x7 at stride 1: 5.8 against
      11.2 ms; 3x7, 3.8 against 9.7 ms), but for the half types, whose every tap is widened
      to float32 here, where the runs widen about three per position (float16 9x9: 14 against
      7.1 ms);
    - in 3-D and up, windows whose last axis the passes would take by van Herk runs
      (:func:`_last_axis_runs_lose`).

    Not short windows at stride 1, nor 3-D at that stride: the passes' loops run over whole
    planes, rows over one row at a time (3-D 3x3x3 over (2,16,40,40,40): 4.8 against 2.5 ms;
    2-D 3x3 over (1,64,56,56), 0.41 against 0.26 ms)."""
    if plan.rank == 1:
        return True
    if max(plan.kernel) > ROWS_LONGEST_WINDOW:
        return False
    if plan.strides[-1] >= 3:
        return True
    if plan.strides[-1] == 2:
        return plan.rank == 2 or itemsize > 1
    if plan.rank > 2:
        return _last_axis_runs_lose(plan)
    return itemsize != 2 and any(_van_herk(k, s) for k, s in zip(plan.kernel, plan.strides))


def _rows_win_lanes(plan: WindowPlan, itemsize: int) -> bool:
    """Where ``max_rows`` was measured to pool channels-last samples faster than the passes
    (one thread; float32 but where said): windows of at most 16 taps per axis (each output
    row folds its window's input rows, vectorised over whole rows of W*C elements)

    - at a last-axis stride of 2 or more, where the passes reduce every input position along
      the last axis (3x3 at stride 2 over (1,56,56,64): 0.07 against 0.12 ms; (8,112,112,3):
      0.36 against 2.6; 2x2 over (8,112,112,24): 0.52 against 1.2; uint8 3x3, 0.40 against
      1.2; 3-D 3x3x3 over (2,32,32,32,16): 0.28 against 1.5);
    - at stride 1, where a row's uncut outputs are one stream along it (tap t of element i is
      element i + t*d*C): 7x7 over (4,256,256,16), 8.8 against 14 ms; 3x3 over (8,56,56,8),
      0.17 against 0.25; 3-D 5x5x5 over (2,48,48,48,8), 9.1 against 15 (float16 5.3 against
      24, uint8 1.9 against 6.2); 1-D 5 taps over (4,8192,3), 0.065 against 0.49;

    but not 8-byte 1-D windows of 8 taps and more, which the passes fold by van Herk runs
    (float64 15 taps over (4,8192,16): 2.2 against 1.4 ms)."""
    if max(plan.kernel) > ROWS_LONGEST_WINDOW:
        return False
    return not (itemsize == 8 and plan.rank == 1 and plan.strides[0] == 1
                and plan.kernel[0] >= LADDER_TAPS)


def _cannot_run(kernel: str, plan: WindowPlan, itemsize: int, storage_order: int,
                by_rows: bool, lanes: int = 1):
    """Why ``kernel`` cannot pool ``plan`` (over channels-last samples of ``lanes``
    channels, 1 for channels-first planes), or None when it can."""
    if kernel not in KERNELS:
        return f"no kernel named {kernel!r}; the kernels are {', '.join(KERNELS)}"
    if kernel in (ROWS, ROW_BLOCKS) and not by_rows:
        return "Indices, or channels-last planes"
    if kernel in (ROWS, ROW_BLOCKS) and min(plan.in_shape) == 0:
        return "a 0-size axis"
    if kernel == ROW_BLOCKS and lanes > 1:
        return "channels-last samples of several channels"
    if kernel == ROW_BLOCKS and not row_blocks_fit(plan):
        return (f"a last-axis window of {LADDER_TAPS} taps or more, rows longer than "
                f"{ROW_BLOCK_PITCH} elements, or no window reaching an input column")
    if kernel == LINES and (not by_rows or lanes > 1):
        return "Indices, or channels-last samples"
    if kernel == LINES and not lines_fit(plan):
        return f"a 0-size axis, or a last-axis window of more than {LINES_MOST_TAPS} taps"
    if kernel == PLANE_LANES and (not by_rows or lanes > 1):
        return "Indices, or channels-last samples"
    if kernel == PLANE_LANES and not plane_lanes_fit(plan, itemsize):
        return (f"a 1-byte type, a 0-size axis, planes of more than {PLANE_LANES_MOST_INPUT} "
                f"elements, or more than {PLANE_LANES_MOST_TAPS} taps an output")
    if kernel == TILES and not (storage_order == 0 and tiles_fit(plan, itemsize)):
        return "the windows do not tile the input (or storage_order 1)"
    if kernel == RUNS and (not by_rows or lanes > 1):
        return "Indices, or channels-last samples"
    if kernel == RUNS and not runs_fit(plan):
        return ("a 0-size axis, a dilation, or rows padded past twice their inputs and "
                f"{RUNS_EXTRA_PADDING} positions")
    if kernel in (PASSES, SEPARABLE) and min(plan.in_shape) == 0:
        return "a 0-size axis"
    if kernel == SEPARABLE and separable_staging(plan, itemsize) is None:
        return "the separable passes cannot stage this plan"
    return None


# The most positions of padding ``max_runs`` holds in a padded row beyond as many as the
# row has inputs (see :func:`runs_fit`).
RUNS_EXTRA_PADDING = 1024


def runs_fit(plan: WindowPlan) -> bool:
    """Whether ``max_runs`` can pool the plan's channels-first planes: no 0-size axis, no
    dilation but along axes of a one-tap window (its blocks of rows are consecutive rows),
    and windows that overlap or touch along the last axis, whose padded rows it holds:
    every position from the first window to the last, so at most twice the row's inputs
    and :data:`RUNS_EXTRA_PADDING` more (a stride of 2^40 past a window of 100 asked 12 TiB
    of scratch for two outputs, a window of 2^31 taps SAME over one input 28 GiB; the
    other kernels take windows cut to the inputs)."""
    if min(plan.in_shape) == 0:
        return False
    return (plan.strides[-1] <= plan.kernel[-1]
            and _runs_padded_row(plan) <= 2 * plan.in_shape[-1] + RUNS_EXTRA_PADDING
            and all(d == 1 or k == 1 for k, d in zip(plan.kernel, plan.dilations)))


def _runs_padded_row(plan: WindowPlan) -> int:
    """The positions of a padded row ``max_runs`` holds along the last axis: its padding
    before the inputs and the inputs, or every window's reach, whichever is longer."""
    return max(plan.pad_begin[-1] + plan.in_shape[-1],
               (plan.out_shape[-1] - 1) * plan.strides[-1] + plan.kernel[-1])


# The shortest window along an axis for which ``max_runs`` is chosen over the row kernels at
# stride 1 (at stride s, 8*s), and in 3-D and up the fewest taps a window at stride 1 has
# (see _runs_win).
RUNS_KERNEL = 7
RUNS_KERNEL_HALF = 5
RUNS_TAPS = 200
# The shortest rows (elements) ``max_runs`` is chosen for in 2-D and up, whose each output
# row costs it a few calls of its vector folds (9x9 over (1,256,14,14): 0.41 ms by runs,
# 0.34 by passes, 0.066 as plane lanes; 13x13 over (1,256,20,20), 0.27 by runs, 0.54 by
# rows; float16 and bfloat16, widened as they are read, from 32: 13x13 over (1,256,20,20),
# 0.21 by runs, 0.18 by passes; 15x15 over (4,64,24,24), 0.28 and 0.22); and in 1-D, the
# shortest window and the longest row (bytes), each folded whole where the row kernel folds
# a chunk at a time.
RUNS_SHORTEST_ROW = 16
RUNS_SHORTEST_ROW_HALF = 32
RUNS_KERNEL_1D = 9
RUNS_LONGEST_ROW = 8192


def _runs_win(plan: WindowPlan, itemsize: int, planes: int) -> bool:
    """Where ``max_runs`` was measured faster than the other kernels (two threads, float32,
    windows with SAME pads at stride 1 but where said; ms, runs against the best other), of
    the plans that the plane lanes (small planes) and the row blocks (short rows, windows of
    at most 7 along them: 7x7 over (8,64,56,56), 0.93 against 1.69) do not take in 2-D and
    up:

    - 2-D and up, windows the row kernels take (at most :data:`ROWS_LONGEST_WINDOW` taps
      an axis) with an axis of at least :data:`RUNS_KERNEL` taps (float16 and bfloat16 in
      2-D: :data:`RUNS_KERNEL_HALF`, 5x5 0.94 against 2.0 ms by passes and 1.07 by rows, but
      uint8 0.61 against 0.47) at stride 1, or 8 times the stride: over (4,16,256,256), 7x7
      1.46 against 1.83, 9x9 1.36 against 2.84, 15x15
      at stride 2 1.36 against 1.35; 9x9 over (1,256,14,14) 0.25 against 0.34; but 5x5 1.56
      against 1.35, 9x9 at stride 2 1.38 against 1.01, 3x7 and 7x3 the same;
    - 3-D and up at stride 1, windows of at least :data:`RUNS_TAPS` taps: 7x7x7 over
      (2,8,64,64,64) 4.3 against 6.8; but 5x5x5 3.5 against 3.9 there and 0.18 against
      0.15 over (1,4,32,32,32);
    - 2-D and up, longer windows that overlap (at least three times the stride), which the
      separable passes took: 31x31 1.8 against 7.1, 63x63 1.9 against 8.4, 31x31 at stride
      2 1.4 against 6.0, 32x32 at stride 8 1.1 against 3.9; 33x33 over (1,8,512,512) 1.3
      against 3.1; 3-D 15x15x15 over (2,8,64,64,64) 3.8 against 10.2;
    - 1-D, windows of :data:`RUNS_KERNEL_1D` taps and more at a stride of at most an
      eighth of them, over rows of at most :data:`RUNS_LONGEST_ROW` bytes, whose cut windows
      the row kernel's ladder takes one at a time: over (16384, 256), 9 taps 1.44 against
      1.56, 63 taps 1.7 against 3.1; over (64, 4096), 63 taps 0.088 against 0.093; not over
      longer rows, which the row kernel folds a chunk at a time while in cache (63 taps over
      (64, 65536): 1.80 against 1.57)."""
    if not runs_fit(plan) or _plane_lanes_win(plan, itemsize, planes):
        return False  # small planes (9x9 over (1,64,7,7): 0.012 ms as lanes, 0.049 by runs)
    pairs = [(k, s) for k, s in zip(plan.kernel, plan.strides)]
    if plan.rank == 1:
        (k, s), = pairs
        return (k >= RUNS_KERNEL_1D and k >= 8 * s
                and plan.in_shape[0] * itemsize <= RUNS_LONGEST_ROW)
    shortest_row = RUNS_SHORTEST_ROW_HALF if itemsize == 2 else RUNS_SHORTEST_ROW
    if plan.in_shape[-1] < shortest_row or (row_blocks_fit(plan)
                                                 and _row_blocks_win(plan, itemsize)):
        return False  # short rows (7x7 over (8,64,56,56): 0.83 ms by row blocks, 1.53 by runs)
    if max(plan.kernel) > ROWS_LONGEST_WINDOW:
        return any(k >= 3 * s for k, s in pairs if k > 1)
    if plan.rank >= 3 and max(plan.strides) == 1 and math.prod(plan.kernel) >= RUNS_TAPS:
        return True
    shortest = RUNS_KERNEL_HALF if itemsize == 2 and plan.rank == 2 else RUNS_KERNEL
    return any((s == 1 and k >= shortest) or k >= 8 * s for k, s in pairs)


class RunsTables(NamedTuple):
    """``max_runs``'s tables (see :mod:`poolfold.kernels.max_runs`); ``items`` is how many
    work items the call is cut into."""

    axes: np.ndarray
    setup: np.ndarray
    items: int


# The input a work item of ``max_runs`` covers, at most (unless its windows' rows along the
# first axis take more): its stages and suffixes then stay in a core's cache.
RUNS_SLAB_BYTES = 512 * 1024
# The suffixes a leading axis's pass before the last holds at once, by strips of its rows
# (3-D 63x63x63 over (2,8,64,64,64), whole rows of 16 KiB: 4.8 ms; in strips, 4.5).
RUNS_STRIP_BYTES = 256 * 1024
# The padded rows laddered together along the last axis, at most (one by one, rows of 64
# float32 took half of the ladder's time in each level's set-up).
RUNS_LADDER_BYTES = 8 * 1024


@functools.lru_cache(maxsize=256)
def runs_tables(label: str, plan: WindowPlan, planes: int, itemsize: int,
                parts: int) -> RunsTables:
    """Compute and bound the tables and scratch sizes of :func:`max_runs` for ``planes``
    planes cut into work items for ``parts`` threads: slabs of output rows along the first
    axis, as many as fit :data:`RUNS_SLAB_BYTES`, and enough for every thread.  The kernel
    reads and writes within these sizes and checks none of them."""
    rank = plan.rank
    ins, outs = plan.in_shape, plan.out_shape
    axes = np.zeros((runs.AXIS_ROWS, rank), np.int64)
    for a in range(rank):
        axes[:, a] = (ins[a], outs[a], plan.kernel[a], plan.strides[a], plan.pad_begin[a])
    k0, s0 = plan.kernel[0], plan.strides[0]
    setup = np.zeros(runs.SETUP_SIZE, np.int64)
    stage = suffixes = prefix = 0
    if rank == 1:  # whole planes, as many as fit the slab, enough for every thread
        per_item = max(1, RUNS_SLAB_BYTES // (ins[0] * itemsize))
        per_item = max(1, min(per_item, -(-planes // (parts * PIECES_PER_THREAD))))
        setup[runs.PLANES_PER_ITEM] = per_item
        items = -(-planes // per_item)
    else:
        row_bytes = math.prod(ins[1:]) * itemsize
        rows_per_item = (RUNS_SLAB_BYTES // row_bytes - k0) // s0 + 1
        # but enough rows that neighbouring slabs share at most a third of their input rows
        # (one output row a slab of 2048x2048 planes redid each row 60 times for 63x63)
        overlap = max(k0 - s0, 0)
        rows_per_item = max(rows_per_item, -(-2 * overlap // s0), 1)
        if planes < parts * PIECES_PER_THREAD:  # enough items for every thread's pieces
            rows_per_item = min(rows_per_item,
                                -(-outs[0] * planes // (parts * PIECES_PER_THREAD)))
        rows_per_item = max(1, min(rows_per_item, outs[0]))
        items_per_plane = -(-outs[0] // rows_per_item)
        # each leading axis's pass: units of n rows of `inner` elements into out_n rows
        units, inner = 1, math.prod(ins)
        for a in range(rank - 1):
            n = min(ins[0], (rows_per_item - 1) * s0 + k0) if a == 0 else ins[a]
            out_n = rows_per_item if a == 0 else outs[a]
            inner //= ins[a]
            suffixes = max(suffixes, min(plan.kernel[a], n) * inner)
            prefix = max(prefix, inner)
            units *= out_n
            if a < rank - 2:  # written to a stage; the last one's rows go on to the last axis
                stage = max(stage, units * inner)
        setup[runs.ROWS_PER_ITEM] = rows_per_item
        setup[runs.ITEMS_PER_PLANE] = items_per_plane
        items = planes * items_per_plane
    # the padded rows the last axis reads, as many as fit RUNS_LADDER_BYTES and the rows
    # there are to ladder: each row's elements from a cache line on (after at least its
    # padding), each row's windows within its pitch, a whole number of lines; and the
    # ladder's two halves
    last = rank - 1
    line = runs.LINE_BYTES // itemsize
    row_at = -(-plan.pad_begin[last] // line) * line
    pitch = -(-_runs_padded_row(plan) // line) * line
    rows = setup[runs.PLANES_PER_ITEM] if rank == 1 else (
        setup[runs.ROWS_PER_ITEM] if rank == 2 else outs[rank - 2])
    batch = max(1, min(RUNS_LADDER_BYTES // (pitch * itemsize), rows))
    check_table(label, "the running maxima's scratch",
                (2 * stage + suffixes + prefix + 3 * batch * pitch + row_at,),
                np.dtype(f"V{itemsize}"))
    setup[runs.STAGE] = stage
    setup[runs.SUFFIXES] = suffixes
    setup[runs.PREFIX] = prefix
    setup[runs.PADDED_ROW] = batch * pitch + row_at
    setup[runs.LADDER] = 2 * batch * pitch
    setup[runs.STRIP_BYTES] = RUNS_STRIP_BYTES
    setup[runs.ROW_PITCH] = pitch
    setup[runs.ROWS_LADDERED] = batch
    setup[runs.ROW_AT] = row_at
    return RunsTables(axes, setup, items)


def _passes_cost(plan: WindowPlan) -> tuple[float, float]:
    """Rough costs, in vectorised element visits, of the separable passes and of the direct
    scan.  The passes run from the last axis to the first, each over what the passes before it
    left (the pass over an axis of stride s leaves about 1/s of its input), visiting each of
    its outputs once per tap (about three for a van Herk axis, whatever its window) in
    vectorised loops, or, for a last axis read an output at a time (strides above 2), in
    loops about 3x dearer per visit.  A direct scan visits each output's whole window, one tap
    at a time (about 16x dearer per visit), after about four taps' worth of work finding it.
    (Measured, one thread: 8x8 windows at stride 8 took 19 ms by passes against 33 ms direct;
    3-D 2x2x2 at stride 4, 1.4 ms by passes against 3.3 direct; 3-D 1x1x1 at stride 8, 0.21
    against 0.14.)"""
    vectorised, strided, direct = 8, 8 / 3, 1 / 2  # visits per unit of cost, by kind of loop
    per_output = 4
    outputs = math.prod(plan.out_shape)
    passes = float(outputs)
    left = float(math.prod(plan.in_shape))
    for a in range(plan.rank - 1, -1, -1):
        k, s = plan.kernel[a], plan.strides[a]
        left = left / plan.in_shape[a] * plan.out_shape[a]  # this pass's outputs
        per_visit = strided if a == plan.rank - 1 and s > 2 else vectorised
        passes += left * (3 if _van_herk(k, s) else k) / per_visit
    return passes, outputs * (math.prod(plan.kernel) + per_output) / direct


# Windows at least this long along an axis are reduced by van Herk / Gil-Werman runs (about
# three folds per position whatever the window, and two per output) rather than tap by tap,
# where they overlap enough (see _van_herk).  Measured, one thread, float32: 7x7 stride 1
# took 0.65x the time with runs from 4 or 5 taps on than tap by tap; 3x3 took 4x longer with
# runs; 8x8 at stride 8 gained nothing from them.
VAN_HERK_KERNEL = 5


def _van_herk(kernel: int, stride: int) -> bool:
    """Whether an axis is reduced by van Herk runs: a long window (tap by tap, a stride-s
    pass folds about kernel/s taps per position, runs about three) that overlaps its
    neighbours."""
    return kernel >= VAN_HERK_KERNEL and kernel >= 3 * stride


# The input a work item of the separable passes covers, at most (unless one row of the first
# axis is larger): small enough that its intermediate results stay in cache between passes.
SLAB_BYTES = 128 * 1024
# Rank-1 rows go through lanes (see poolfold.kernels.lanes) a lane-width of rows at a time when
# those rows take at most this much; longer rows are cut into slabs, one row at a time.
LANE_GROUP_BYTES = 16 * 2**20


def _uncut_outputs(plan: WindowPlan, a: int) -> tuple[int, int]:
    """The outputs ``[lo, hi)`` along axis ``a`` whose window has every tap inside the input:
    a range, as windows move monotonically along the axis ((0, 0) when there are none)."""
    taps, out, k = plan.taps, plan.out_shape[a], plan.kernel[a]
    inside = np.flatnonzero((taps.lo[a, :out] == 0) & (taps.hi[a, :out] == k))
    return (int(inside[0]), int(inside[-1]) + 1) if inside.size else (0, 0)


class PassesTables(NamedTuple):
    """``max_passes``'s tables for one plan, plane count, type and output choice (see
    :mod:`poolfold.kernels.max_passes` for each field); ``items`` is how many work items the
    call is cut into."""

    axes: np.ndarray
    taps: np.ndarray
    setup: np.ndarray
    words: bool  # a channels-first last axis read as words (stride 2)
    lanes: bool  # a channels-first last axis read through lanes
    items: int


@functools.lru_cache(maxsize=256)
def passes_tables(label: str, plan: WindowPlan, planes: int, itemsize: int,
                  return_indices: bool, storage_order: int, channels: int,
                  parts: int) -> PassesTables:
    """Compute and bound every table and scratch size of :func:`max_passes` for ``planes``
    planes of ``channels`` elements per spatial position (1 channels-first, C channels-last),
    cut into work items for ``parts`` threads.  The kernel reads and writes within these
    sizes and checks none of them."""
    rank, last = plan.rank, plan.rank - 1
    ins, outs = plan.in_shape, plan.out_shape
    width = 64 // itemsize  # lanes per position (poolfold.kernels.lanes.lane_count)
    taps = plan.taps
    axes = np.zeros((AXIS_ROWS, rank), np.int64)
    for a in range(rank):
        k = plan.kernel[a]
        axes[:, a] = (ins[a], outs[a], k, plan.strides[a], plan.dilations[a],
                      *_uncut_outputs(plan, a), _van_herk(k, plan.strides[a]))
    van_herk = axes[VAN_HERK].astype(bool)
    # how a channels-first last axis is read: through lanes for van Herk runs (which need
    # the rows' positions in order), as words at stride 2, else where the rows lie: shifted at
    # stride 1, an output at a time at other strides, but for 1- and 2-byte types, whose
    # conversions (to float32, for the comparisons) then cost 3-6x what lanes cost
    words = lanes = False
    if channels == 1:
        stride = plan.strides[last]
        if van_herk[last]:
            lanes = True
        elif stride == 2 and has_words(itemsize) and (planes * math.prod(ins)) % 2 == 0:
            words = True
        else:
            lanes = stride >= 2 and itemsize < 4
    plane_bytes = math.prod(ins) * channels * itemsize
    per_item, rows_per_item, items_per_plane = 1, outs[0], 1
    if rank == 1 and lanes and width * plane_bytes <= LANE_GROUP_BYTES:
        per_item = max(1, min(planes, width))  # a lane per row
    elif plane_bytes <= SLAB_BYTES or (rank == 1 and not lanes):
        per_item = max(1, min(planes, SLAB_BYTES // max(plane_bytes, 1)))
    else:  # slabs of a few output rows along the first axis of one plane
        row_bytes = plane_bytes // ins[0]
        span = (plan.kernel[0] - 1) * plan.dilations[0] + 1
        rows_per_item = (SLAB_BYTES // row_bytes - span) // plan.strides[0] + 1
        # but enough rows that a slab's passes over its other axes redo at most half again
        # the rows they need (the slabs overlap by span - stride rows): channels-last 7x7 at
        # stride 1 with 64 KiB rows got one output row per slab and redid each row 7 times
        overlap = max(span - plan.strides[0], 0)
        rows_per_item = max(1, min(outs[0], max(rows_per_item,
                                                -(-2 * overlap // plan.strides[0]))))
        items_per_plane = -(-outs[0] // rows_per_item)
    if items_per_plane == 1 and parts > 1:  # enough items for every thread's pieces
        per_item = max(1, min(per_item, -(-planes // (parts * PIECES_PER_THREAD))))
    # the largest slab: its extent along each axis, and its outputs along the first
    span0 = (rows_per_item - 1) * plan.strides[0] + (plan.kernel[0] - 1) * plan.dilations[0] + 1
    extent = (min(ins[0], span0) if items_per_plane > 1 else ins[0],) + ins[1:]
    out_rows = (rows_per_item,) + outs[1:]
    phases = [1 if van_herk[a] else plan.strides[a] for a in range(rank)]
    stage = run = 1
    inner = channels
    for a in range(last, -1, -1):
        block = out_rows[a] * inner  # a unit's outputs of this pass
        units = per_item * math.prod(extent[:a])
        if a > 0:  # written in the phases of the pass over axis a - 1
            n, p = extent[a - 1], phases[a - 1]
            # Rows in phases: a stride beyond the axis leaves all but n phases empty, and the
            # kernel never reaches them (a stride of 2**31 over 4 rows asked for 128 GiB).
            stage = max(stage, min(p, n) * -(-n // p) * (units // n) * block)
        elif channels > 1 and return_indices:  # channels-last positions, transposed after
            stage = max(stage, units * block)
        if van_herk[a]:
            run = max(run, 2 * extent[a] * (width if a == last and lanes else inner))
        inner = block
    if channels > 1 and return_indices:  # the input's positions, for the first pass
        stage = max(stage, per_item * math.prod(extent) * channels)
    lane_capacity = lane_outputs = 0
    if lanes:
        p = phases[last]
        lane_capacity = min(p, extent[last]) * -(-extent[last] // p) * width
        lane_outputs = out_rows[last]
    # scratch each work item allocates, refused before any work if the machine cannot hold it
    check_table(label, "the separable passes' scratch",
                (2 * stage + run + lane_capacity + lane_outputs * width,),
                np.dtype(f"V{itemsize + (8 if return_indices else 0)}"))
    setup = np.zeros(SETUP_SIZE, np.int64)
    setup[CHANNELS] = channels
    setup[LAST_MODE] = LANES if lanes else WORDS if words else SHIFTED
    setup[PLANES_PER_ITEM] = per_item
    setup[ROWS_PER_ITEM] = rows_per_item
    setup[ITEMS_PER_PLANE] = items_per_plane
    setup[COLUMN_MAJOR] = storage_order == 1 and return_indices
    setup[STAGE_CAPACITY] = stage
    setup[RUN_CAPACITY] = run
    setup[LANE_CAPACITY] = lane_capacity
    setup[LANE_OUTPUTS] = lane_outputs
    items = planes * items_per_plane if items_per_plane > 1 else -(-planes // per_item)
    tap_table = np.stack([taps.first, taps.lo, taps.hi])
    for array in (axes, tap_table, setup):
        array.flags.writeable = False  # shared by every call of the plan
    return PassesTables(axes, tap_table, setup, words, lanes, items)


def _leading_outputs(plan: WindowPlan) -> int:
    """The output rows of a plane: its outputs along every axis but the last."""
    return math.prod(plan.out_shape[:-1])


class RowsTables(NamedTuple):
    """``max_rows``'s tables for one plan and plane count (see
    :mod:`poolfold.kernels.max_rows`); ``items`` is how many work items the call is cut
    into; ``long_windows`` the kernel's argument of that name: True where the last axis
    goes by a ladder of runs or edge scans, else None."""

    axes: np.ndarray
    taps: np.ndarray
    lead: np.ndarray
    setup: np.ndarray
    items: int
    long_windows: bool | None


@functools.lru_cache(maxsize=256)
def rows_tables(label: str, plan: WindowPlan, planes: int, parts: int,
                lanes: int = 1, blocks: bool = False) -> RowsTables:
    """Compute and bound :func:`max_rows`'s tables and scratch for ``planes`` channels-first
    planes (``lanes`` 1), or channels-last samples of ``lanes`` channels, cut into work items
    for ``parts`` threads: whole planes, or, when there are too few planes for every
    thread's pieces, ranges of output rows of each.  ``blocks``: ``max_row_blocks``'s, whose
    work items are blocks of output rows across planes."""
    rank, last = plan.rank, plan.rank - 1
    outs = plan.out_shape
    taps = plan.taps
    # elements between rows of each leading axis, and between taps of the last one
    pitch = row_major_strides(plan.in_shape) * lanes
    axes = np.zeros((rows.AXIS_ROWS, rank), np.int64)
    for a in range(rank):
        axes[:, a] = (plan.in_shape[a], outs[a], plan.kernel[a], plan.strides[a],
                      plan.dilations[a], *_uncut_outputs(plan, a),
                      plan.dilations[a] * pitch[a])
    # per leading axis and output: the plane offset of the rows of its first in-bounds tap,
    # and how many in-bounds taps it has
    lead = np.zeros((2, max(last, 1), taps.first.shape[1]), np.int64)
    for a in range(last):
        out = outs[a]
        lo, hi = taps.lo[a, :out], taps.hi[a, :out]
        lead[rows.AT, a, :out] = (taps.first[a, :out] + lo * plan.dilations[a]) * pitch[a]
        lead[rows.TAPS, a, :out] = np.maximum(hi - lo, 0)
    # the input rows one output row's window reaches: a tap count per leading axis, never
    # more than the axis holds (a kernel of 2**40 taps over 3 rows reaches 3)
    most_rows = math.prod(min(k, n) for k, n in zip(plan.kernel[:last], plan.in_shape[:last]))
    check_table(label, "the row kernel's scratch",
                (most_rows + plan.in_shape[last] * (lanes + 1),), np.dtype("V8"))
    lead_out = math.prod(outs[:last])
    setup = np.zeros(rows.SETUP_SIZE, np.int64)
    setup[rows.MOST_ROWS] = most_rows
    setup[rows.LANES] = lanes
    if blocks:
        # blocks of consecutive output rows, across planes, of about ROW_BLOCK_ELEMENTS
        out_pitch, padded, data = _row_block_layout(plan)
        pitch = out_pitch * plan.strides[last]
        total = planes * lead_out
        block_rows = max(1, ROW_BLOCK_ELEMENTS // pitch)
        if parts > 1:
            block_rows = max(1, min(block_rows, -(-total // (parts * PIECES_PER_THREAD))))
        check_table(label, "the row kernel's blocks",
                    (block_rows * (pitch + out_pitch) + padded,), np.dtype("V8"))
        setup[rows.ROWS_PER_ITEM] = block_rows
        setup[rows.OUT_PITCH] = out_pitch
        setup[rows.PADDED_ROW] = padded
        setup[rows.DATA_COLUMNS] = data
        return _rows_tables(axes, taps, lead, setup, -(-total // block_rows))
    items_per_plane = 1
    if parts > 1 and planes < parts * PIECES_PER_THREAD:
        items_per_plane = min(lead_out, -(-parts * PIECES_PER_THREAD // planes))
    rows_per_item = -(-lead_out // items_per_plane)
    items_per_plane = -(-lead_out // rows_per_item)
    setup[rows.ROWS_PER_ITEM] = rows_per_item
    setup[rows.ITEMS_PER_PLANE] = items_per_plane
    k, s, d, width = (plan.kernel[last], plan.strides[last], plan.dilations[last],
                      plan.in_shape[last])
    if lanes == 1 and ladder_wins(k, s):
        # two rows of a chunk's span (a chunk of outputs reaching 4 windows' extent past the
        # first, so that little is found twice), no longer than the row, where every window
        # the ladder pools lies
        extent = (k - 1) * d + 1
        chunk = max(rows.LADDER_CHUNK, 4 * extent // s)
        span = min((chunk - 1) * s + extent, width)
        check_table(label, "the row kernel's ladder", (2 * span,), np.dtype("V8"))
        setup[rows.LADDER_SIZE] = 2 * span
    # running maxima for cut windows of 8 taps and more: a call per row (its arrays'
    # reference counts) costs shorter windows more than folding their few taps in place
    setup[rows.EDGE_SCANS] = lanes == 1 and k >= LADDER_TAPS and _edges_scan(plan)
    return _rows_tables(axes, taps, lead, setup, planes * items_per_plane)


def _rows_tables(axes, taps, lead, setup, items: int) -> RowsTables:
    """The tables as the row kernels take them, read-only: every call of the plan shares
    them."""
    tap_table = np.stack([taps.first, taps.lo, taps.hi])
    for array in (axes, tap_table, lead, setup):
        array.flags.writeable = False
    long_windows = True if setup[rows.LADDER_SIZE] or setup[rows.EDGE_SCANS] else None
    return RowsTables(axes, tap_table, lead, setup, items, long_windows)


# The most bytes of a work item's folded rows (``max_lines``'s ``lines``): a plane's share
# stays in the core's own cache between the two steps.
LINES_BYTES = 64 * 1024
# The longest last-axis window ``max_lines`` folds tap by tap (longer ones go by runs).
LINES_MOST_TAPS = 8
# The most (output row, leading tap) pairs its table is built from.
LINES_MOST_PAIRS = 2**20


def lines_stream(plan: WindowPlan) -> bool:
    """Whether ``max_lines`` folds a work item's rows along the last axis as one strided
    stream: where a row is a whole number of strides long, and that many outputs hold the
    row's own."""
    n, s = plan.in_shape[-1], plan.strides[-1]
    return n % s == 0 and n // s >= plan.out_shape[-1]


def _lines_win(plan: WindowPlan, itemsize: int) -> bool:
    """Where ``max_lines`` was measured faster than the kernel chosen before it (row blocks,
    rows or passes; new time over old, one thread and two, float32 unless named): 2-D
    windows of 2 or 3 taps an axis, at strides 1 and 2 along rows a stream takes.
    3x3 at stride 2 over (1,64,56,56) 0.81 and 0.76, over (8,64,112,112) 0.89 and 0.77, a
    ReLU's output 0.73 and 0.73, with ceil_mode over (1,256,54,54) 0.69 and 0.82, over
    (32,64,56,56) 0.80 and 0.81, float64 0.55 and 0.61; 3x3 at stride 1 over
    (8,64,112,112) 0.81 and 0.84, dilated 0.68-0.86; 2x2 at stride 2 0.80-0.95.  Not:
    rows a stream cannot take (3x3 at stride 2 over 55 columns: 4.3 and 4.1, a fold per
    row), windows of 4 taps or more (4x4 at stride 2 0.78 and 1.12, 7x7 1.07 and 1.15, 8x8
    at stride 8 1.32 and 1.23), strides of 3 (0.98 and 1.30), float16 and bfloat16 (1.40-1.47
    and 1.04-1.20 over (8,64,112,112)), 1-byte types (int8 0.68-1.07, uint8 0.92-1.04), 3-D
    (2x2x2 at stride 2 over (2,32,64,64,64) 1.23 and 1.29; 3x3x3 0.94 and 1.10)."""
    return (plan.rank == 2 and itemsize >= 4 and max(plan.kernel) <= 3
            and plan.strides[-1] <= 2 and lines_stream(plan) and lines_fit(plan))


def lines_fit(plan: WindowPlan) -> bool:
    """Whether ``max_lines`` can pool the plan's channels-first planes: some input element,
    a last-axis window of at most LINES_MOST_TAPS taps (each output folds every tap of its
    window: a long window costs it a comparison per tap, where the passes' running maxima
    cost three an element), and at most LINES_MOST_PAIRS (output row, leading tap) pairs."""
    return (min(plan.in_shape) > 0 and plan.kernel[-1] <= LINES_MOST_TAPS
            and _leading_outputs(plan) * math.prod(plan.kernel[:-1]) <= LINES_MOST_PAIRS)


class LinesTables(NamedTuple):
    """``max_lines``'s tables for one plan and plane count (see
    :mod:`poolfold.kernels.max_lines`); ``items`` is how many work items the call is cut
    into."""

    dims: np.ndarray
    first: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    setup: np.ndarray
    runs: np.ndarray
    lead_first: np.ndarray
    lead_starts: np.ndarray
    items: int


@functools.lru_cache(maxsize=256)
def lines_tables(label: str, plan: WindowPlan, planes: int, itemsize: int,
                 parts: int) -> LinesTables:
    """Compute and bound ``max_lines``'s tables and scratch for ``planes`` channels-first
    planes cut into work items for ``parts`` threads: runs of output rows under runs of
    outputs along the first axis, as long as keeps a run's folded rows within LINES_BYTES,
    and enough runs for every thread's pieces where the planes are few."""
    last = plan.rank - 1
    n, out, k = plan.in_shape[last], plan.out_shape[last], plan.kernel[last]
    s = plan.strides[last]
    taps = plan.taps
    dims = np.array([plan.in_shape, plan.out_shape, plan.kernel, plan.strides,
                     plan.dilations], np.int64)
    # the last axis's outputs whose windows lie inside the row: a run, since their first
    # taps grow with the output
    whole = np.flatnonzero((taps.lo[last, :out] == 0) & (taps.hi[last, :out] == k))
    inner_lo, inner_hi = (int(whole[0]), int(whole[-1]) + 1) if whole.size else (0, 0)
    # one stream over a run of rows where each row is a whole number of strides long that
    # holds the row's outputs: row r's output j then lies r*pitch + j along the stream
    stream = lines_stream(plan)
    pitch = n // s if stream else out
    # each output row's input rows (over the leading axes), in window order
    if last == 0:
        row_first, rows_read = np.array([0, 1], np.int64), np.zeros(1, np.int64)
    else:
        leading = WindowPlan(plan.in_shape[:last], plan.kernel[:last], plan.strides[:last],
                             plan.dilations[:last], plan.pad_begin[:last],
                             plan.pad_end[:last], plan.out_shape[:last], plan.label)
        rows_read, row_first = plane_lanes_tables(leading, 1)
    out_rows = _leading_outputs(plan)
    under = out_rows // (plan.out_shape[0] if last > 0 else 1)  # output rows a first-axis
    first_out = out_rows // under                                 # output spans

    def runs_of(chunk: int) -> np.ndarray:
        """Per run of ``chunk`` first-axis outputs: its output rows and the input rows they
        read ([lo, hi), none for windows wholly in the padding)."""
        bounds = np.arange(0, first_out + chunk, chunk).clip(max=first_out) * under
        runs = np.zeros((len(bounds) - 1, 4), np.int64)
        runs[:, 0], runs[:, 1] = bounds[:-1], bounds[1:]
        for r, (g_lo, g_hi) in enumerate(runs[:, :2]):
            read = rows_read[row_first[g_lo]:row_first[g_hi]]
            if read.size:
                runs[r, 2:] = read.min(), read.max() + 1
        return runs

    chunk = first_out
    runs = runs_of(chunk)
    while chunk > 1 and np.max(runs[:, 3] - runs[:, 2]) * pitch * itemsize > LINES_BYTES:
        chunk = -(-chunk // 2)
        runs = runs_of(chunk)
    if parts > 1 and planes * len(runs) < parts * PIECES_PER_THREAD:
        chunk = max(1, min(chunk, first_out * planes // (parts * PIECES_PER_THREAD)))
        runs = runs_of(chunk)
    most_rows = max(1, int(np.max(runs[:, 3] - runs[:, 2])))
    check_table(label, "the line kernel's scratch", (most_rows * pitch,), np.dtype("V8"))
    # each output row's reads as offsets into its run's lines
    run_of_row = np.repeat(np.arange(len(runs)), (runs[:, 1] - runs[:, 0]))
    lead_starts = (rows_read - np.repeat(runs[run_of_row, 2], np.diff(row_first))) * pitch
    setup = np.zeros(lines.SETUP_SIZE, np.int64)
    setup[[lines.PITCH, lines.STREAM, lines.INNER_LO, lines.INNER_HI, lines.MOST_ROWS]] = (
        pitch, stream, inner_lo, inner_hi, most_rows)
    tables = (dims, taps.first, taps.lo, taps.hi, setup, runs, row_first, lead_starts)
    for array in tables:
        array.flags.writeable = False
    return LinesTables(*tables, planes * len(runs))


def _edges_scan(plan: WindowPlan) -> bool:
    """Whether ``max_rows`` finds the cut windows of the last axis by running maxima from
    each end of a row (``_edge_scans``): at dilation 1, with the cut windows before the uncut
    ones all starting at the row's start, those after them all ending at its end, and no
    empty window."""
    last = plan.rank - 1
    if plan.dilations[last] != 1:
        return False
    taps, out, n = plan.taps, plan.out_shape[last], plan.in_shape[last]
    uncut_lo, uncut_hi = _uncut_outputs(plan, last)
    if uncut_lo == uncut_hi:
        uncut_lo = uncut_hi = out
    begin = taps.first[last, :out] + taps.lo[last, :out]
    end = taps.first[last, :out] + taps.hi[last, :out]
    if np.any(end <= begin):
        return False
    return bool(np.all(begin[:uncut_lo] == 0) and np.all(end[uncut_hi:] == n))


def plane_lanes_row_fold(plan: WindowPlan) -> tuple[WindowPlan, np.ndarray]:
    """Whether ``max_plane_lanes`` folds the last axis first, where the planes lie: where
    its windows tile each row (no padding before it, a stride that is the row's length over
    the outputs', and every window within one stride, so that none reaches past the row),
    with more than one tap.  Returns the plan the lanes then pool (the last axis the folded
    outputs, a window of one there) and (taps, stride, dilation), taps 0 for none.  Measured
    in one process, new time over old, one thread and two: 2x2 at stride 2 over (8,64,28,28)
    0.92 and 0.90, over (1,832,14,14) 0.96 and 0.97; 3x3 at stride 3 over (1,256,18,18) 1.0
    and 0.91; 2 taps at stride 2 over (1,128,300) 1.06 and 1.03."""
    n, k, s, d = plan.in_shape[-1], plan.kernel[-1], plan.strides[-1], plan.dilations[-1]
    out = plan.out_shape[-1]
    if k < 2 or plan.pad_begin[-1] != 0 or out * s != n or (k - 1) * d >= s:
        return plan, np.zeros(3, np.int64)
    folded = WindowPlan(plan.in_shape[:-1] + (out,), plan.kernel[:-1] + (1,),
                        plan.strides[:-1] + (1,), plan.dilations[:-1] + (1,),
                        plan.pad_begin[:-1] + (0,), plan.pad_end[:-1] + (0,), plan.out_shape,
                        plan.label)
    return folded, np.array([k, s, d], np.int64)


def plane_lanes_row_groups(folded: WindowPlan, row_fold: np.ndarray,
                           value_type: np.dtype) -> np.ndarray:
    """Whether ``max_plane_lanes`` folds the rows its row fold left in groups straight into
    Y, without lanes: 2-D planes whose rows were folded (``folded``, the plan after that
    fold), windows that tile the columns too (no padding before, a stride that is the
    column's length over the outputs', every window within one stride), over folded rows
    no longer than a vector.  Returns (taps, stride, width), taps 0 for none."""
    none = np.zeros(3, np.int64)
    if row_fold[0] == 0 or folded.rank != 2:
        return none
    k, s, d = folded.kernel[0], folded.strides[0], folded.dilations[0]
    width = folded.out_shape[1]
    if (folded.pad_begin[0] != 0 or folded.out_shape[0] * s != folded.in_shape[0]
            or (k - 1) * d >= s or d != 1 or width > simd.vector_lanes(value_type)):
        return none
    return np.array([k, s, width], np.int64)


def plane_lanes_tables(plan: WindowPlan, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``max_plane_lanes``'s taps (:mod:`poolfold.kernels.plane_lanes`): the in-bounds input
    positions of every output's window in window order, times ``block`` (the lanes of a
    position), output o's from ``tap_first[o]`` to ``tap_first[o + 1]``."""
    # each (output, tap) pair's input offset and whether it lies inside the input (the
    # plan's tap table), over the axes so far: shaped (outputs along each axis..., taps along
    # each axis...)
    table = plan.taps
    at, inside = np.zeros((), np.int64), np.ones((), bool)
    for a, (k, d, out, step) in enumerate(zip(plan.kernel, plan.dilations, plan.out_shape,
                                              row_major_strides(plan.in_shape))):
        j = np.arange(k, dtype=np.int64)[None, :]
        where = table.first[a, :out, None] + j * d  # (out, k)
        kept = (j >= table.lo[a, :out, None]) & (j < table.hi[a, :out, None])
        grown = at.shape[:a] + (1,) + at.shape[a:] + (1,)
        axis = (1,) * a + (out,) + (1,) * a + (k,)
        at = at.reshape(grown) + (where * step).reshape(axis)
        inside = inside.reshape(grown) & kept.reshape(axis)
    outputs = math.prod(plan.out_shape)
    at, inside = at.reshape(outputs, -1), inside.reshape(outputs, -1)
    tap_first = np.zeros(outputs + 1, np.int64)
    np.cumsum(inside.sum(axis=1), out=tap_first[1:])
    return at[inside] * block, tap_first


class KernelOverride:
    """Tests only (:func:`forced_kernel`): the kernel to force, and the kernels that ran."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.ran: list[str] = []


_OVERRIDE: KernelOverride | None = None


@contextlib.contextmanager
def forced_kernel(kernel: str):
    """Tests only: every MaxPool inside runs on ``kernel`` (one of :data:`KERNELS`) where it
    can pool the plan (see :func:`choose_kernel`), never a stand-in; yields the override,
    whose ``ran`` lists the kernel each call ran.  Forced launches are cached apart from
    chosen ones."""
    global _OVERRIDE
    previous, _OVERRIDE = _OVERRIDE, KernelOverride(kernel)
    try:
        yield _OVERRIDE
    finally:
        _OVERRIDE = previous


def _forced() -> str | None:
    return None if _OVERRIDE is None else _OVERRIDE.kernel


def pool_planes(label: str, x: np.ndarray, plan: WindowPlan, return_indices: bool,
                storage_order: int, slab_rows: int | None = -1, kernel: str | None = None):
    """Run the kernel on a validated NCHW-style input: Y, and Indices (or None).

    :func:`choose_kernel` picks the kernel, unless a test forces one: ``kernel`` (or
    :func:`forced_kernel`), or, for the older separable kernel, ``slab_rows`` (None: the
    direct scan; n: the separable passes in slabs of n output rows)."""
    if slab_rows != -1:
        kernel = DIRECT if slab_rows is None else SEPARABLE
    launch = _pool_launch(label, x.shape[:2], x.dtype, plan, return_indices, storage_order,
                          kernel or _forced(), slab_rows, kernel_threads())
    return launch(x)


class _PoolLaunch:
    """Everything a MaxPool call does besides touching its arrays, for one plan, (N, C),
    type, output choice, forced kernel and thread count: the outputs' size check, the kernel
    (:func:`choose_kernel`), its tables and its parts.  Built once (:func:`_pool_launch`), as
    a model repeats its calls: these choices cost a small call more than its kernel does.
    ``kernel_name`` is the kernel the last call ran (a stand-in's while the chosen kernel
    compiles), ``reason`` why the kernel was chosen."""

    def __init__(self, label, nc, dtype, plan, return_indices, storage_order, forced,
                 slab_rows, threads):
        self.label = label
        self.dtype = dtype
        self.out_shape = tuple(nc) + plan.out_shape
        check_size(label, "Y", self.out_shape, dtype)
        if return_indices:
            check_size(label, "Indices", self.out_shape, np.int64)
        self.return_indices = return_indices
        merged = 1
        if storage_order == 0:  # row-major Indices keep their flat offsets
            plan, merged = plan.planes_from_leading_axes()
        self.planes = nc[0] * nc[1] * merged
        self.forced = forced
        self.kernel, self.reason = choose_kernel(plan, dtype.itemsize, storage_order, forced,
                                                 not return_indices, planes=self.planes)
        self.kernel_name = None
        self.crew = Crew()  # its threaded calls run without the GIL once compiled
        taps, dims = plan.taps, plan.dims
        self.tables = (taps.first, taps.lo, taps.hi, *dims, storage_order == 1,
                       _empty_value(dtype))
        in_size, out_size = math.prod(plan.in_shape), math.prod(plan.out_shape)
        work = self.planes * (in_size + out_size * (2 if return_indices else 1))
        self.work = work
        self.parts = split_parts(self.planes, work, threads)  # one group of planes per thread
        self.dims = (dims.in_shape, dims.out_shape)
        self.plan = plan
        self.ready = False  # the chosen kernel known to run without compiling (see _ready)
        self.stand_in = forced is None  # the direct scan may stand in while it compiles
        self.value_type = dtypes.value_type(dtype)
        self.passes = None
        self.separable = None
        self.rows = None
        self.runs = None
        self.lanes = None
        self.lines = None
        if self.kernel == LINES and self.planes > 0:
            self.lines = lines_tables(label, plan, self.planes, dtype.itemsize,
                                      split_parts(self.planes, work, threads))
            self.parts = split_parts(self.lines.items, work, threads)
        elif self.kernel == PLANE_LANES:
            block = block_planes(self.value_type, self.planes, threads)
            tapped, row_fold = plane_lanes_row_fold(plan)
            row_fold = np.concatenate([row_fold, plane_lanes_row_groups(tapped, row_fold,
                                                                        self.value_type)])
            self.lanes = (*plane_lanes_tables(tapped, block), block, row_fold,
                          -(-self.planes // block))
            # Its transposes and each output's taps cost about two elements of the other
            # kernels' work, so a part pays for its hand-off from half their work.  Measured,
            # 2 CPUs, one part against two (ms): 3x3 over (1,832,7,7) 0.048-0.056 against
            # 0.043; 3x3 at stride 2 over (1,256,13,13) 0.029-0.031 against 0.031.
            self.work = work = 2 * work
            self.parts = split_parts(self.lanes[-1], work, threads)
        elif self.kernel in (ROWS, ROW_BLOCKS) and self.planes > 0:
            # parts as the output rows allow, not the planes: rows split a plane
            self.rows = rows_tables(label, plan, self.planes,
                                    split_parts(self.planes * _leading_outputs(plan), work,
                                                threads),
                                    blocks=self.kernel == ROW_BLOCKS)
            self.parts = split_parts(self.rows.items, work, threads)
        elif self.kernel == RUNS and self.planes > 0:
            self.runs = runs_tables(label, plan, self.planes, dtype.itemsize, self.parts)
            self.parts = split_parts(self.runs.items, work, threads)
        elif self.kernel == PASSES and self.planes > 0:
            self.passes = passes_tables(label, plan, self.planes, dtype.itemsize,
                                        return_indices, storage_order, 1, self.parts)
            # slabs of large planes: as many parts as the work allows, even for one plane
            self.parts = split_parts(self.passes.items, work, threads)
            self.words = word_type(dtype.itemsize) if self.passes.words else None
            # what the kernel takes for words it does not read (the type it compiles for)
            self.no_words = kernel_input(
                words_view(np.empty((0, 1), self.value_type)).reshape(-1))
        elif self.kernel == SEPARABLE:
            if slab_rows is None or slab_rows == -1:
                item_bytes = dtype.itemsize + (8 if return_indices else 0)
                slab_rows = _separable_slab(plan, item_bytes, self.parts,
                                            self.planes * out_size * item_bytes) or 1
            self.separable = (slab_rows, *separable_staging(plan, dtype.itemsize))
        # The direct scan's tables (a plane's strides, a whole window's tap offsets): the
        # direct scan may stand in for a kernel still compiling.
        self.direct = None if self.kernel == TILES else (row_major_strides(plan.in_shape),
                                                         plan.window_offsets)
        # The tiling kernel reads a plane's pairs as words: its planes always pair (an even
        # last dim), so the view needs none of words_view's checks (a small call's
        # microsecond).
        self.kernel_planes = self.planes
        if self.kernel == TILES:
            self.words = word_type(dtype.itemsize)
            # few planes: each cut into slices of whole windows along its first axis, so
            # that the threads share them (the kernel splits a call by planes only)
            cut = tile_slices(plan, self.planes, threads)
            if cut > 1:
                self.kernel_planes = self.planes * cut
                sliced = plan.first_axis_cut(cut).dims
                self.dims = (sliced.in_shape, sliced.out_shape)
            # Its one pass costs about half an element of the other kernels' work, so a
            # part pays for its hand-off from twice their work.  Measured, 2 CPUs, one thread
            # against two: (1,3,224,224) 0.044-0.053 ms against 0.050-0.056; (1,1,512,512)
            # 0.075 against 0.060; (1,3,320,320) 0.124 against 0.092.
            self.parts = split_parts(self.kernel_planes, work // 2, threads)
        self.bound = self._bound()

    def _bound(self) -> BoundLaunch | None:
        """The kernels that take X and Y and then only the plan's tables, those tables
        bound (:class:`~poolfold.kernels.threads.BoundLaunch`); None for the others."""
        if self.planes == 0:
            return None
        empty = self.tables[-1]
        if self.kernel in (ROWS, ROW_BLOCKS):
            tables = self.rows
            kernel, count = (rows.max_rows if self.kernel == ROWS else rows.max_row_blocks,
                             tables.items)
            constants = (tables.axes, tables.taps, tables.lead, tables.setup, empty)
            if self.kernel == ROWS:
                constants += (tables.long_windows,)
        elif self.kernel == LINES:
            tables = self.lines
            kernel, count = lines.max_lines, tables.items
            constants = (tables.dims, tables.first, tables.lo, tables.hi, tables.setup,
                         tables.runs, tables.lead_first, tables.lead_starts, empty)
        elif self.kernel == RUNS:
            kernel, count = runs.max_runs, self.runs.items
            constants = (self.runs.axes, self.runs.setup, empty)
        elif self.kernel == PLANE_LANES:
            starts, tap_first, block, row_fold, blocks = self.lanes
            kernel, count = max_plane_lanes, blocks
            constants = (starts, tap_first, block, row_fold, empty)
        else:
            return None
        return BoundLaunch(kernel, count, constants, self.parts, self.work, self.crew)

    def __call__(self, x: np.ndarray):
        y = allocate(self.label, "Y", self.out_shape, self.dtype, size_checked=True)
        indices = allocate(self.label, "Indices", self.out_shape, np.int64, size_checked=True) \
            if self.return_indices else None
        planes = self.planes
        if planes == 0:
            return y, indices
        xs = kernel_rows(x, planes, self.value_type)
        index_rows = indices.reshape(planes, -1) if indices is not None else None
        ys = as_rows(y, planes, self.value_type)
        kernel = self.kernel
        bound = self.bound
        if bound is not None:
            if self.ready or self._ready(bound.kernel, (xs, ys, *bound.constants)):
                bound(xs, ys)
            else:
                kernel = self._stand_in(xs, ys, index_rows)
        elif kernel == TILES:
            slices = self.kernel_planes  # planes, or slices of them (see __init__)
            if slices != planes:
                xs, ys = xs.reshape(slices, -1), ys.reshape(slices, -1)
                index_rows = index_rows.reshape(slices, -1) if index_rows is not None else None
            launch_split(window_max_tiles, slices, xs, ys, index_rows, *self.dims,
                         xs.view(self.words), parts=self.parts, work=self.work, crew=self.crew)
        elif kernel == PASSES:
            tables = self.passes
            words = xs.reshape(-1).view(self.words) if tables.words else self.no_words
            arguments = (xs, ys, index_rows, words, tables.axes, tables.taps, tables.setup,
                         self.tables[-1])
            if self.ready or self._ready(max_passes, arguments):
                launch_split(max_passes, tables.items, *arguments, parts=self.parts,
                             work=self.work, crew=self.crew)
            else:
                kernel = self._stand_in(xs, ys, index_rows)
        elif kernel == SEPARABLE:
            arguments = (xs, ys, index_rows, *self.tables, *self.separable, words_view(xs))
            if self.ready or self._ready(window_max_separable, arguments):
                launch_split(window_max_separable, planes, *arguments, parts=self.parts,
                             work=self.work, crew=self.crew)
            else:
                kernel = self._stand_in(xs, ys, index_rows)
        else:
            self._direct(xs, ys, index_rows)
        self.kernel_name = kernel
        if self.forced is not None and _OVERRIDE is not None:
            _OVERRIDE.ran.append(kernel)
        return y, indices

    def _direct(self, xs, ys, index_rows):
        launch_split(window_max, self.planes, xs, ys, index_rows, *self.tables, *self.direct,
                     line_rows(self.planes, 2, len(self.dims[0])), parts=self.parts,
                     crew=self.crew)

    def _stand_in(self, xs, ys, index_rows) -> str:
        """The direct scan, which compiles in a fraction of the time, answers while a child
        process compiles the chosen kernel (:mod:`poolfold.kernels.background`): over the
        whole window, or, for values alone over windows of more than
        :data:`STAND_IN_MOST_TAPS` taps, an axis at a time (:meth:`_axis_by_axis`)."""
        if index_rows is None and math.prod(self.plan.kernel) > STAND_IN_MOST_TAPS:
            self._axis_by_axis(xs, ys)
        else:
            self._direct(xs, ys, index_rows)
        background.start_queued()  # the chosen kernel's compile, once this call is done
        return DIRECT

    def _axis_by_axis(self, xs, ys):
        """The direct scan along each axis in turn, the last first, each pass over the last
        one's outputs: the first maximum along the last axis of each row, then of those
        along the axis before, ..., is the window's first maximum in window order (row-major),
        and its first NaN (31x31x31 windows over (2,8,32,32,32), first call with an empty
        cache: 7.4 s by the whole window, each output's 29791 taps)."""
        plan = self.plan
        ones, zeros = (1,) * plan.rank, (0,) * plan.rank
        shape = plan.in_shape
        x = xs.view(self.dtype).reshape((1, self.planes) + shape)
        for a in range(plan.rank - 1, -1, -1):
            def only(values, elsewhere, a=a):  # axis a's value, ``elsewhere``'s on the others
                return elsewhere[:a] + (values[a],) + elsewhere[a + 1:]

            step = WindowPlan(shape, only(plan.kernel, ones), only(plan.strides, ones),
                              only(plan.dilations, ones), only(plan.pad_begin, zeros),
                              only(plan.pad_end, zeros), only(plan.out_shape, shape),
                              plan.label)
            launch = _pool_launch(self.label, (1, self.planes), self.dtype, step, False, 0,
                                  DIRECT, -1, kernel_threads())
            x = launch(x)[0]
            shape = step.out_shape
        ys.view(self.dtype).reshape(x.shape)[...] = x

    def _ready(self, kernel, arguments) -> bool:
        """Whether ``kernel`` can run without compiling here: if it cannot, its compile is
        queued for a child process and the direct scan stands in (:meth:`_stand_in`).  A
        kernel a test forced always runs."""
        self.ready = not self.stand_in or background.ready(
            kernel, (*arguments, 0, 0))  # + the work items' [start, stop)
        return self.ready


# Windows of more taps than this have the direct scan stand in an axis at a time.
STAND_IN_MOST_TAPS = 64

# A model's calls repeat; each entry holds only references to its plan's cached tables.
_pool_launch = functools.lru_cache(maxsize=256)(_PoolLaunch)


def pool_channels_last(label: str, x: np.ndarray, plan: WindowPlan, return_indices: bool,
                       storage_order: int):
    """Pool a validated channels-last ``(N, D1..Dr, C)`` input with the separable passes or,
    without Indices where it was faster, the row kernel, the channels riding along as each
    position's contiguous run: ``(Y, Indices or None)``, Y channels-last and Indices NCHW
    (shape and values).  None where neither takes the call (:func:`choose_kernel` picks the
    direct scan, a test forces another kernel, an empty tensor) or is still compiling: the
    caller pools it as NCHW-style planes."""
    launch = _channels_last_launch(label, x.shape[0], x.shape[-1], x.dtype, plan,
                                   return_indices, storage_order, _forced(), kernel_threads())
    return launch(x) if launch.native else None


class _ChannelsLastLaunch:
    """:class:`_PoolLaunch` for :func:`pool_channels_last`: ``max_passes``'s or
    ``max_rows``'s tables for N samples of C elements per position, or ``native`` False."""

    def __init__(self, label, n, c, dtype, plan, return_indices, storage_order, forced,
                 threads):
        self.out_shape = (n,) + plan.out_shape + (c,)
        self.index_shape = (n, c) + plan.out_shape
        if not return_indices:  # NCHW Indices would not keep their offsets
            plan, merged = plan.planes_from_leading_axes()
            n *= merged
        kernel, self.reason = choose_kernel(plan, dtype.itemsize, storage_order, forced,
                                            not return_indices, lanes=c)
        if forced is None and kernel not in (DIRECT, ROWS, ROW_BLOCKS):
            kernel = PASSES  # the kernel of channels-last samples, but for rows
        self.native = (kernel in (PASSES, ROWS, ROW_BLOCKS) and n * c > 0
                       and (forced is None or forced == kernel))
        if not self.native:
            return
        self.label = label
        self.dtype = dtype
        self.forced = forced
        self.kernel_name = None
        self.crew = Crew()
        check_size(label, "Y", self.out_shape, dtype)
        if return_indices:
            check_size(label, "Indices", self.index_shape, np.int64)
        self.return_indices = return_indices
        self.samples = n
        in_size, out_size = math.prod(plan.in_shape), math.prod(plan.out_shape)
        work = n * c * (in_size + out_size * (2 if return_indices else 1))
        self.work = work
        self.kernel = kernel
        if kernel in (ROWS, ROW_BLOCKS):  # row blocks: one channel, channels-first planes
            self.tables = rows_tables(label, plan, n,
                                      split_parts(n * _leading_outputs(plan), work, threads), c,
                                      blocks=kernel == ROW_BLOCKS)
        else:
            self.tables = passes_tables(label, plan, n, dtype.itemsize, return_indices,
                                        storage_order, c, split_parts(n, work, threads))
        self.parts = split_parts(self.tables.items, work, threads)
        self.value_type = dtypes.value_type(dtype)
        self.no_words = kernel_input(words_view(np.empty((0, 1), self.value_type)).reshape(-1))
        self.empty_value = _empty_value(dtype)
        self.ready = False
        self.stand_in = forced is None

    def __call__(self, x: np.ndarray):
        y = allocate(self.label, "Y", self.out_shape, self.dtype, size_checked=True)
        indices = allocate(self.label, "Indices", self.index_shape, np.int64,
                           size_checked=True) if self.return_indices else None
        n = self.samples
        xs = kernel_rows(x, n, self.value_type)
        tables = self.tables
        ys = as_rows(y, n, self.value_type)
        if self.kernel == ROWS:
            kernel = rows.max_rows
            arguments = (xs, ys, tables.axes, tables.taps, tables.lead, tables.setup,
                         self.empty_value, tables.long_windows)
        elif self.kernel == ROW_BLOCKS:
            kernel = rows.max_row_blocks
            arguments = (xs, ys, tables.axes, tables.taps, tables.lead, tables.setup,
                         self.empty_value)
        else:
            kernel = max_passes
            # C = 1 is channels-first: its last axis may be read as words
            words = xs.reshape(-1).view(self.no_words.dtype) if tables.words else self.no_words
            arguments = (xs, ys, None if indices is None else indices.reshape(n, -1), words,
                         tables.axes, tables.taps, tables.setup, self.empty_value)
        if not self.ready:
            self.ready = not self.stand_in or background.ready(kernel, (*arguments, 0, 0))
            if not self.ready:
                return None  # the NCHW-style planes' launch stands in and starts the compile
        launch_split(kernel, tables.items, *arguments, parts=self.parts, work=self.work,
                     crew=self.crew)
        self.kernel_name = self.kernel
        if self.forced is not None and _OVERRIDE is not None:
            _OVERRIDE.ran.append(self.kernel)
        return y, indices


_channels_last_launch = functools.lru_cache(maxsize=256)(_ChannelsLastLaunch)


@functools.lru_cache(maxsize=64)
def _empty_value(dtype: np.dtype):
    """What an empty window yields, as the scalar the kernels take (one per dtype)."""
    return dtypes.value_view(dtypes.lowest(dtype))[()]
