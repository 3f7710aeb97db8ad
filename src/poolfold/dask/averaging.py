"""AveragePool, LpPool and the global pools on chunked arrays, bit for bit as in memory.

**Windowed pools.**  Output chunks are MaxPool's (:mod:`poolfold.dask.pool`): N and C
chunks are kept, and along a spatial axis an output belongs to the input chunk holding its
window's centre.  Each output chunk is pooled by the in-memory kernels
(:func:`poolfold.ops.averaging.pool_windows`) from the input slab its windows read,
``[o0*s - pb, (o1-1)*s - pb + K)`` clipped to the axis, under a plan of the slab's own
(:func:`slab_plan`) that reproduces the whole tensor's windows exactly:

- its begin padding puts every window where it is in the whole tensor, so each window reads
  the same taps V, in the same order;
- its end padding is the whole tensor's padded extent as seen from the slab,
  ``n + pad_end - hi``, so every window counts the same taps P (count_include_pad=1), the
  ceil-mode overhang past ``n + pad_end`` included (it counts in neither);
- the kernels add each window's taps in order, or as a tree grouped by the taps' places in
  the window (the block sums' doubling), or from partial sums over blocks of k taps (plain
  sums of float32, float16 and bfloat16 input, not LpPool's scaled sums, along an axis of
  many heavily overlapping taps), whose rounding depends on where the blocks fall:
  - the block sums (channels-first, rank 1 to 3) place a leading axis's blocks from the
    whole row's first position, and the slab is told its first output per axis
    (``first_outputs``), so its blocks are the whole tensor's; each column is summed along
    the leading axes on its own, the last axis by doubling, and a window whose float32 sum
    is not finite is summed again in float64 whichever columns the slab holds: every axis
    stays chunked;
  - the separable passes' running sums (:func:`poolfold.ops.averaging.row_start_axes`)
    start where the row starts, and a non-finite value anywhere in a row turns it to direct
    adds: from the first such axis on, the axes are kept whole (:func:`whole_axes`), one
    output chunk, and every task reads the whole axis.

  The slab is pooled with the whole tensor's running-sums choice per axis, and
  channels-last with its channel block (C chunks are cut at multiples of it).

Channels-last, a tensor of one channel takes the channels-first kernels' paths in memory, so
where C > 1 a C chunk of one channel joins its neighbour (windowed and global pools alike).

**Global pools.**  GlobalAveragePool and GlobalLpPool add a whole plane in one pass whose
result depends on the plane's layout in memory (interleaved lanes), so the spatial axes are
rechunked into one chunk (N and C chunks kept) and each chunk is reduced by the in-memory
function.  GlobalMaxPool needs no rechunk: each input chunk finds its winner per plane (the
first NaN, else the first largest value, as flat positions in the whole plane) and the
winners are combined by a tree of tasks, keeping the earliest in the plane's row-major order
on ties, so the result has the bits of the element the in-memory scan keeps.
"""

from __future__ import annotations

from itertools import product

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .. import dtypes
from ..geometry import WindowPlan
from ..memory import check_size
from ..ops._common import activate
from ..ops.averaging import (channel_block_for, pool_global, pool_windows, row_start_axes,
                              running_sum_axes)
from ..ops.layout import axes
from . import _graph
from .pool import output_ranges

# Partial results of GlobalMaxPool combined per task (the tree's fan-in).
COMBINE_FAN_IN = 8


# ---------------------------------------------------------------------------------------------
# windowed pools


def slab_plan(plan: WindowPlan, axis_blocks) -> WindowPlan:
    """``plan`` restricted to one slab: ``axis_blocks`` gives per axis the output range
    ``(o0, o1)`` and the input range ``(lo, hi)`` it reads.  The same windows, taps and
    divisors as ``plan`` (see the module doc)."""
    in_shape, pad_begin, pad_end, out_shape = [], [], [], []
    for a, ((o0, o1), (lo, hi)) in enumerate(axis_blocks):
        in_shape.append(hi - lo)
        pad_begin.append(lo - (o0 * plan.strides[a] - plan.pad_begin[a]))
        pad_end.append(plan.in_shape[a] + plan.pad_end[a] - hi)
        out_shape.append(o1 - o0)
    return WindowPlan(tuple(in_shape), plan.kernel, plan.strides, plan.dilations,
                      tuple(pad_begin), tuple(pad_end), tuple(out_shape), plan.label)


def _aligned_channels(chunks: tuple[int, ...], block: int) -> tuple[int, ...]:
    """``chunks`` with every boundary moved down to a multiple of ``block`` (boundaries that
    meet are merged): the slabs' channel blocks are then the whole tensor's."""
    edges = _graph.bounds(chunks)
    cuts = sorted({int(e) // block * block for e in edges[1:-1]} - {0})
    edges = [0] + cuts + [int(edges[-1])]
    return tuple(b - a for a, b in zip(edges, edges[1:]) if b > a) or chunks


def _windows_block(arrays, placements, block_shape, dtype, label, plan, kind,
                   count_include_pad, p, channels_last, running, block, first_outputs, act):
    """One output chunk: assemble its input slab and pool it as in memory."""
    x = _graph.assemble(arrays, placements, block_shape, dtype)
    y = pool_windows(label, x, plan, channels_last, kind, count_include_pad, p,
                     running=running, channel_block=block, first_outputs=first_outputs)
    return y if act is None else activate(y, act)


def whole_axes(plan: WindowPlan, dtype, kind: str, p: float, one_channel: bool
               ) -> tuple[bool, ...]:
    """Per spatial axis, whether the chunked op keeps it whole (see the module's docstring):
    every axis from the first whose sums depend on where its rows start on (none of the
    block sums')."""
    starts = row_start_axes(plan, dtype, kind, p, one_channel)
    first = next((a for a, r in enumerate(starts) if r), plan.rank)
    return tuple(a >= first for a in range(plan.rank))


def pool_windows_chunked(spec, x: da.Array, plan: WindowPlan, kind: str,
                         count_include_pad: int = 0, p: float = 2.0,
                         channels_last: bool = False, act=None) -> da.Array:
    """The chunked AveragePool (``kind`` "average") or LpPool ("lp") of a checked dask array
    ``x`` (NCHW, or channels-last)."""
    ndim = x.ndim
    n_axis, c_axis, spatial_axes = axes(ndim, channels_last)
    spatial = plan.in_shape
    one_channel = not channels_last or x.shape[c_axis] == 1
    running = running_sum_axes(plan, x.dtype, kind, p, one_channel)
    whole = whole_axes(plan, x.dtype, kind, p, one_channel)
    block = None
    if channels_last and x.shape[c_axis] > 1:
        chunks = x.chunks[c_axis]
        if any(whole):
            block = channel_block_for(plan, x.shape[c_axis])
            chunks = _aligned_channels(chunks, block)
        # In memory, a channels-last tensor of one channel takes the channels-first kernels'
        # paths: a chunk of one channel joins the one before it (a multiple of the block).
        chunks = _no_single_channel(chunks)
        if chunks != x.chunks[c_axis]:
            x = x.rechunk({c_axis: chunks})
    per_axis = []  # per spatial axis: [(o0, o1, lo, hi, pieces)]
    for a, axis in enumerate(spatial_axes):
        edges = _graph.bounds(x.chunks[axis])
        n, s, pb = spatial[a], plan.strides[a], plan.pad_begin[a]
        span = (plan.kernel[a] - 1) * plan.dilations[a] + 1
        entries = []
        if whole[a]:  # the whole axis, read whole: the rows the in-memory passes see
            entries.append((0, plan.out_shape[a], 0, n, _graph.pieces(edges, 0, n)))
        else:
            for _, o0, o1 in output_ranges(n, edges, plan.out_shape[a], s,
                                           pb - (span - 1) // 2):
                lo = max(0, o0 * s - pb)
                hi = min(n, (o1 - 1) * s - pb + span)
                if hi <= lo:  # every window of the chunk lies in the padding
                    lo = hi = min(max(0, o0 * s - pb), n)
                entries.append((o0, o1, lo, hi, _graph.pieces(edges, lo, hi)))
        per_axis.append(entries)
    out_spatial_chunks = tuple(tuple(e[1] - e[0] for e in entries) for entries in per_axis)
    n_chunks, c_chunks = x.chunks[n_axis], x.chunks[c_axis]
    # The largest block's outputs must fit in memory, as the in-memory call's would.
    biggest = (max(n_chunks), max(c_chunks)) + tuple(max(c) for c in out_spatial_chunks)
    check_size(spec.label, "Y", biggest, x.dtype)
    tasks = {}
    token = tokenize(x.name, plan, kind, count_include_pad, p, channels_last, act, spec.label)
    prefix = "average-pool" if kind == "average" else "lp-pool"
    parts = _graph.Parts(x, prefix, token)
    for bn, bc in np.ndindex(len(n_chunks), len(c_chunks)):
        for combo_index in np.ndindex(*[len(e) for e in per_axis]):
            combo = [per_axis[a][j] for a, j in enumerate(combo_index)]
            sub = slab_plan(plan, [((e[0], e[1]), (e[2], e[3])) for e in combo])
            keys, placements, block_shape = _graph.slab_inputs(
                x.name, n_axis, c_axis, (bn, n_chunks[bn]), (bc, c_chunks[bc]), spatial_axes,
                [(e[2], e[3], e[4]) for e in combo], ndim, parts)
            key = (bn,) + combo_index + (bc,) if channels_last else (bn, bc) + combo_index
            first_outputs = tuple(e[0] for e in combo)
            tasks[key] = (_windows_block, keys, placements, block_shape, x.dtype, spec.label,
                          sub, kind, count_include_pad, p, channels_last, running, block,
                          first_outputs, act)
    if channels_last:
        y_chunks = (n_chunks,) + out_spatial_chunks + (c_chunks,)
    else:
        y_chunks = (n_chunks, c_chunks) + out_spatial_chunks
    return _graph.arrays_from_tasks(prefix, tasks, [x], [(y_chunks, _graph.meta(ndim, x.dtype),
                                                          None)], token, parts)[0]


# ---------------------------------------------------------------------------------------------
# global pools


def _global_block(x, label, channels_last, kind, p):
    return pool_global(label, x, channels_last, kind, p)


def pool_global_chunked(spec, x: da.Array, kind: str, p: float = 2.0,
                        channels_last: bool = False) -> da.Array:
    """The chunked GlobalMaxPool ("max"), GlobalAveragePool ("average") or GlobalLpPool
    ("lp") of a checked dask array ``x``."""
    ndim = x.ndim
    n_axis, c_axis, spatial_axes = axes(ndim, channels_last)
    biggest = tuple(max(x.chunks[axis]) if axis in (n_axis, c_axis) else 1
                    for axis in range(ndim))
    check_size(spec.label, "Y", biggest, x.dtype)
    split = any(len(x.chunks[axis]) > 1 for axis in spatial_axes)
    if kind == "max" and split and x.size:
        return _global_max(spec, x, channels_last)
    rechunk = {axis: -1 for axis in spatial_axes}
    if channels_last and x.shape[c_axis] > 1 and 1 in x.chunks[c_axis]:
        # In memory, a channels-last tensor of one channel is summed as planes (in another
        # order than C > 1 takes): a chunk of one channel joins its neighbour.
        rechunk[c_axis] = _no_single_channel(x.chunks[c_axis])
    x = x.rechunk(rechunk)
    chunks = tuple((1,) if axis in spatial_axes else x.chunks[axis] for axis in range(ndim))
    name = f"global-{kind}-pool-" + tokenize(x.name, kind, p, channels_last, spec.label)
    return da.map_blocks(_global_block, x, spec.label, channels_last, kind, p, chunks=chunks,
                         dtype=x.dtype, meta=_graph.meta(ndim, x.dtype), name=name)


def _no_single_channel(chunks: tuple[int, ...]) -> tuple[int, ...]:
    """``chunks`` (more than one element in all) with each chunk of 1 merged into the one
    before it (the first into the one after)."""
    merged = []
    for size in (c for c in chunks if c):
        if merged and (size == 1 or merged[-1] == 1):
            merged[-1] += size
        else:
            merged.append(size)
    return tuple(merged)


def _bits(a: np.ndarray) -> np.ndarray:
    """``a``'s elements as unsigned integers of its width: selected without touching a value."""
    return a.view(f"u{a.dtype.itemsize}")


def _max_partial(block, origin, spatial, channels_last):
    """Per plane of one chunk: the element the in-memory scan would keep of it (the first
    NaN, else the first largest value), its flat position in the whole plane, and whether
    it is a NaN."""
    if channels_last:
        block = np.moveaxis(block, -1, 1)
    nb, cb = block.shape[:2]
    flat = block.reshape(nb, cb, -1)
    values = flat.astype(np.float32) if dtypes.is_half(flat.dtype) else flat
    nan = np.isnan(values)
    has_nan = nan.any(axis=-1)
    top = np.where(nan, -np.inf, values).max(axis=-1)
    first = np.where(has_nan, nan.argmax(axis=-1), (values == top[..., None]).argmax(axis=-1))
    winner = np.take_along_axis(flat, first[..., None], axis=-1)[..., 0]
    local = np.unravel_index(first, block.shape[2:])
    position = np.ravel_multi_index(tuple(i + o for i, o in zip(local, origin)), spatial)
    return winner, position.astype(np.int64), has_nan


def _max_combine(partials, out_shape=None):
    """The winners of several chunks of the same planes: any NaN beats every number, the
    larger number beats the smaller, and of equals (NaN and NaN, 0.0 and -0.0) the earlier
    in the plane wins.  ``out_shape``: the last combine, which returns Y's block."""
    value, position, nan = partials[0]
    bits = _bits(value).copy()
    key = value.astype(np.float32) if dtypes.is_half(value.dtype) else value
    for other, other_position, other_nan in partials[1:]:
        other_key = other.astype(np.float32) if dtypes.is_half(other.dtype) else other
        earlier = other_position < position
        better = np.where(nan | other_nan, other_nan & (~nan | earlier),
                          (other_key > key) | ((other_key == key) & earlier))
        bits = np.where(better, _bits(other), bits)
        key = np.where(better, other_key, key)
        position = np.where(better, other_position, position)
        nan = nan | other_nan
    value = bits.view(value.dtype)
    if out_shape is not None:
        return value.reshape(out_shape)
    return value, position, nan


def _global_max(spec, x: da.Array, channels_last: bool) -> da.Array:
    """GlobalMaxPool without rechunking: a winner per chunk and plane, combined by a tree."""
    ndim = x.ndim
    n_axis, c_axis, spatial_axes = axes(ndim, channels_last)
    spatial = tuple(x.shape[axis] for axis in spatial_axes)
    token = tokenize(x.name, channels_last, spec.label)
    layers, dependencies = {}, {}
    partial_name = f"global-max-pool-partial-{token}"
    partial = {}
    spatial_edges = [_graph.bounds(x.chunks[axis]) for axis in spatial_axes]
    for index in product(*[range(len(c)) for c in x.chunks]):
        if any(x.chunks[axis][index[axis]] == 0 for axis in spatial_axes):
            continue
        origin = tuple(int(spatial_edges[i][index[axis]]) for i, axis in enumerate(spatial_axes))
        partial[(partial_name,) + index] = (_max_partial, (x.name,) + index, origin, spatial,
                                            channels_last)
    layers[partial_name], dependencies[partial_name] = partial, {x.name}
    out_name = f"global-max-pool-{token}"
    n_chunks, c_chunks = x.chunks[n_axis], x.chunks[c_axis]
    level, previous = 0, partial_name
    groups = {}
    for bn, bc in product(range(len(n_chunks)), range(len(c_chunks))):
        keys = []
        for combo in product(*[range(len(x.chunks[axis])) for axis in spatial_axes]):
            if any(x.chunks[axis][j] == 0 for axis, j in zip(spatial_axes, combo)):
                continue  # an empty chunk has no winner (x has elements: others do)
            index = [0] * ndim
            index[n_axis], index[c_axis] = bn, bc
            for axis, j in zip(spatial_axes, combo):
                index[axis] = j
            keys.append((partial_name,) + tuple(index))
        groups[(bn, bc)] = keys
    while max(len(keys) for keys in groups.values()) > COMBINE_FAN_IN:
        level += 1
        name = f"global-max-pool-combine-{level}-{token}"
        layer = {}
        for (bn, bc), keys in groups.items():
            combined = []
            for j in range(0, len(keys), COMBINE_FAN_IN):
                key = (name, bn, bc, j // COMBINE_FAN_IN)
                layer[key] = (_max_combine, keys[j:j + COMBINE_FAN_IN])
                combined.append(key)
            groups[(bn, bc)] = combined
        layers[name], dependencies[name] = layer, {previous}
        previous = name
    final = {}
    ones = (1,) * len(spatial_axes)
    for (bn, bc), keys in groups.items():
        nb, cb = n_chunks[bn], c_chunks[bc]
        if channels_last:
            key, shape = (out_name, bn) + (0,) * len(ones) + (bc,), (nb,) + ones + (cb,)
        else:
            key, shape = (out_name, bn, bc) + (0,) * len(ones), (nb, cb) + ones
        final[key] = (_max_combine, keys, shape)
    layers[out_name], dependencies[out_name] = final, {previous}
    graph = HighLevelGraph.merge(HighLevelGraph(layers, dependencies), x.dask)
    if channels_last:
        chunks = (n_chunks,) + tuple((1,) for _ in ones) + (c_chunks,)
    else:
        chunks = (n_chunks, c_chunks) + tuple((1,) for _ in ones)
    return da.Array(graph, out_name, chunks, meta=_graph.meta(ndim, x.dtype))
