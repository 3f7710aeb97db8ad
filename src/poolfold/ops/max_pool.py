"""MaxPool, every version (1, 8, 10, 11, 12, 22), any spatial rank."""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import dtypes, schema
from ..errors import PoolfoldError, PoolfoldTypeError
from ..geometry import WindowAttributes, WindowPlan, row_major_strides, window_plan
from ..kernels import background, kernel_threads, launch_split, split_parts
from ..kernels.window_max import window_max, window_max_separable, window_max_tiles
from ..kernels.words import has_words, word_type, words_view
from ..memory import allocate, check_size
from ._common import as_tensor, flag


def resolve_plan(spec, shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode):
    """Check the window attributes against the version, then plan the windows over the
    spatial dims of the NCHW-ordered ``shape``."""
    spec.reject_absent("dilations", dilations is not None)
    spec.reject_absent("ceil_mode", bool(ceil_mode))
    ceil_mode = flag(spec, "ceil_mode", ceil_mode)
    spatial = tuple(int(n) for n in shape[2:])
    attributes = WindowAttributes.validate(
        spec.label, len(spatial), kernel_shape, strides, dilations, pads
    )
    return window_plan(spec.label, spatial, attributes, auto_pad, bool(ceil_mode))


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
    same geometry as :func:`max_pool` and with the same checks, without touching any data.

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
    plan = resolve_plan(spec, shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
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
    spec = schema.resolve("MaxPool", opset)
    x, launch = prepare(spec, x, kernel_shape, strides=strides, pads=pads, dilations=dilations,
                        auto_pad=auto_pad, ceil_mode=ceil_mode, storage_order=storage_order,
                        return_indices=return_indices)
    y, indices = launch(x)
    return (y, indices) if return_indices else y


def prepare(spec, x, kernel_shape, *, strides=None, pads=None, dilations=None,
            auto_pad="NOTSET", ceil_mode=False, storage_order=0, return_indices=False):
    """:func:`max_pool`'s checks: X as the kernels take it, and the launch that pools it into
    ``(Y, Indices or None)``, which serves any X of this shape and type."""
    storage_order = check_index_request(spec, storage_order, return_indices)
    x = as_tensor(spec, x, "X")
    plan = resolve_plan(spec, x.shape, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode)
    return x, _pool_launch(spec.label, x.shape[:2], x.dtype, plan, return_indices,
                           storage_order, -1, kernel_threads())


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


def pool_planes(label: str, x: np.ndarray, plan: WindowPlan, return_indices: bool,
                storage_order: int, slab_rows: int | None = -1):
    """Run the kernel on a validated NCHW-style input: Y, and Indices (or None).

    ``slab_rows`` -1 lets :func:`_separable_slab` choose between the kernels; tests force the
    direct scan (None) or the separable passes with a given slab height, which are still
    refused for a plan they cannot stage (:func:`separable_staging`)."""
    launch = _pool_launch(label, x.shape[:2], x.dtype, plan, return_indices, storage_order,
                          slab_rows, kernel_threads())
    return launch(x)


class _PoolLaunch:
    """Everything a MaxPool call does besides touching its arrays, for one plan, (N, C),
    type, output choice and thread count: the outputs' size check, the kernel, its tables and
    its parts.  Built once (:func:`_pool_launch`), as a model repeats its calls: these
    choices cost a small call more than its kernel does."""

    def __init__(self, label, nc, dtype, plan, return_indices, storage_order, slab_rows,
                 threads):
        self.label = label
        self.dtype = dtype
        self.out_shape = tuple(nc) + plan.out_shape
        check_size(label, "Y", self.out_shape, dtype)
        if return_indices:
            check_size(label, "Indices", self.out_shape, np.int64)
        self.return_indices = return_indices
        self.planes = nc[0] * nc[1]
        taps, dims = plan.taps, plan.dims
        self.tables = (taps.first, taps.lo, taps.hi, *dims, storage_order == 1,
                       _empty_value(dtype))
        in_size, out_size = math.prod(plan.in_shape), math.prod(plan.out_shape)
        work = self.planes * (in_size + out_size * (2 if return_indices else 1))
        self.parts = split_parts(self.planes, work, threads)  # one group of planes per thread
        self.dims = (dims.in_shape, dims.out_shape)
        # Windows that tile the input: one fused pass (tests force the other kernels by
        # giving slab_rows).
        self.tiles = slab_rows == -1 and storage_order == 0 and tiles_fit(plan, dtype.itemsize)
        self.separable = None
        self.separable_ready = False  # known to run without compiling (see _separable_ready)
        self.stand_in = slab_rows == -1  # the direct scan may stand in while it compiles
        if not self.tiles:
            item_bytes = dtype.itemsize + (8 if return_indices else 0)
            if slab_rows == -1:
                slab_rows = _separable_slab(plan, item_bytes, self.parts,
                                            self.planes * out_size * item_bytes)
            # None: the direct scan (whatever chose the passes, they cannot stage this plan)
            staging = separable_staging(plan, dtype.itemsize) if slab_rows is not None else None
            self.separable = None if staging is None else (slab_rows, *staging)
        # The direct scan's tables (a plane's strides, a whole window's tap offsets), for
        # every plan the tiling kernel does not take: the direct scan may stand in for the
        # separable passes.
        self.direct = None if self.tiles else (row_major_strides(plan.in_shape),
                                               plan.window_offsets)
        self.value_type = dtypes.value_view(np.empty(0, dtype)).dtype
        # The tiling kernel reads a plane's pairs as words: its planes always pair (an even
        # last dim), so the view needs none of words_view's checks (a small call's
        # microsecond).
        self.words = word_type(dtype.itemsize) if self.tiles else None

    def __call__(self, x: np.ndarray):
        y = allocate(self.label, "Y", self.out_shape, self.dtype, size_checked=True)
        indices = allocate(self.label, "Indices", self.out_shape, np.int64, size_checked=True) \
            if self.return_indices else None
        planes = self.planes
        if planes == 0:
            return y, indices
        xs = np.ascontiguousarray(x).reshape(planes, -1).view(self.value_type)
        index_rows = indices.reshape(planes, -1) if indices is not None else None
        ys = y.reshape(planes, -1).view(self.value_type)
        if self.tiles:
            launch_split(window_max_tiles, planes, xs, ys, index_rows, *self.dims,
                         xs.view(self.words), parts=self.parts)
            return y, indices
        arguments = (xs, ys, index_rows, *self.tables)  # index_rows None: no index code
        if self.separable is not None:
            separable = (*arguments, *self.separable, words_view(xs))
            if self.separable_ready or self._separable_ready(separable):
                launch_split(window_max_separable, planes, *separable, parts=self.parts)
                return y, indices
        launch_split(window_max, planes, *arguments, *self.direct,
                     np.empty((planes, 2, len(self.dims[0])), np.int64), parts=self.parts)
        if self.separable is not None:
            background.start_queued()  # the separable kernel's compile, once this call is done
        return y, indices

    def _separable_ready(self, arguments) -> bool:
        """Whether the separable kernel can run without compiling here: if it cannot, the
        direct scan, which compiles in a third of the time, stands in while a child process
        compiles it into numba's cache (:mod:`poolfold.kernels.background`).  A plan whose
        kernel a test forced (``slab_rows``) always runs on it."""
        self.separable_ready = not self.stand_in or background.ready(
            window_max_separable, (*arguments, 0, 0))  # + the planes' [start, stop)
        return self.separable_ready


# A model's calls repeat; each entry holds only references to its plan's cached tables.
_pool_launch = functools.lru_cache(maxsize=256)(_PoolLaunch)


@functools.lru_cache(maxsize=64)
def _empty_value(dtype: np.dtype):
    """What an empty window yields, as the scalar the kernels take (one per dtype)."""
    return dtypes.value_view(dtypes.lowest(dtype))[()]
