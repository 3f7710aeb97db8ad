"""MaxPool on chunked arrays: each output chunk is pooled from exactly the input its windows
read, by the in-memory kernels, and its Indices are moved into the whole tensor's numbering.

Along N and C the output chunks are the input's.  Along a spatial axis, output position ``o``
belongs to the input chunk holding its window's centre ``o*s - pad_begin + (K-1)//2`` (K the
dilated extent; clamped into the axis, so windows centred in the padding belong to the first
or last chunk); input chunks holding no window centre get no output chunk.  So "same" pooling
at stride 1 keeps the chunks, and stride s divides them by about s.  Each output chunk reads the input range
its windows cover, ``[o0*s - pb, (o1-1)*s - pb + K)`` clipped to the axis, from the chunks
overlapping it: its own chunk and the halo its windows reach into, no more.  The block is
pooled with a plan whose padding is the true array edges' only, so every window sees all its
taps in order, and ties and NaN resolve exactly as in memory.
"""

from __future__ import annotations

import math

import numpy as np
from dask.base import tokenize

from .. import dtypes
from ..geometry import WindowPlan
from ..kernels.threads import launch
from ..kernels.renumber import renumber
from ..memory import check_size
from ..ops._common import activate
from ..ops.layout import axes, channels_last_order, nchw_order
from ..ops.max_pool import pool_planes
from ..ops.nhwc import pool_nhwc
from . import _graph


def output_ranges(n: int, edges: np.ndarray, out: int, stride: int, offset: int):
    """Per non-empty output chunk along one axis: ``(chunk, o0, o1)``, in order: the outputs
    whose window centre ``o*stride - offset`` (clamped into the axis) lies in input chunk
    ``chunk`` (see the module doc)."""
    if n == 0:
        return [(0, 0, out)]
    ranges = []
    chunks = len(edges) - 1
    o0 = 0
    for j in range(chunks):
        if j == chunks - 1:
            o1 = out
        else:  # first output whose window centre lies at or after the next chunk
            o1 = min(out, max(0, -(-(int(edges[j + 1]) + offset) // stride)))
        if o1 > o0:
            ranges.append((j, o0, o1))
            o0 = o1
    return ranges


def block_plan(plan: WindowPlan, axis_blocks) -> WindowPlan:
    """``plan`` restricted to one block: ``axis_blocks`` gives per axis the output range
    ``(o0, o1)`` and the input range ``(lo, hi)`` it reads.  Padding only where ``plan``'s
    windows leave the array."""
    in_shape, pad_begin, pad_end, out_shape = [], [], [], []
    for a, ((o0, o1), (lo, hi)) in enumerate(axis_blocks):
        s = plan.strides[a]
        span = (plan.kernel[a] - 1) * plan.dilations[a] + 1
        pb = lo - (o0 * s - plan.pad_begin[a])
        in_shape.append(hi - lo)
        pad_begin.append(pb)
        out_shape.append(o1 - o0)
        pad_end.append(max(0, (o1 - o0 - 1) * s - pb + span - (hi - lo)))
    return WindowPlan(tuple(in_shape), plan.kernel, plan.strides, plan.dilations,
                      tuple(pad_begin), tuple(pad_end), tuple(out_shape), plan.label)


def global_indices(local: np.ndarray, block_spatial, origin, spatial, plane0, channels,
                   storage_order: int) -> np.ndarray:
    """Indices of a block pooled on its own (NCHW-shaped, flat in the block), in place, as
    flat positions in the whole X: plane ``(n*C + c)``, position offset by the block's
    ``origin``, in the same storage order; -1 (an empty window) stays -1."""
    nb, cb = local.shape[:2]
    n0, c0 = plane0
    planes = ((n0 + np.arange(nb, dtype=np.int64))[:, None] * channels
              + (c0 + np.arange(cb, dtype=np.int64))[None, :])
    launch(renumber, local.reshape(nb * cb, -1), np.array(block_spatial, np.int64),
           np.array(origin, np.int64), np.array(spatial, np.int64),
           (planes * math.prod(spatial)).reshape(-1), storage_order == 1)
    return local


def _pool_block(arrays, placements, block_shape, dtype, label, plan, return_indices,
                storage_order, channels_last, act, origin, spatial, plane0, channels):
    """One output chunk: assemble its input block, pool it, renumber its Indices."""
    x = _graph.assemble(arrays, placements, block_shape, dtype)
    if channels_last:
        nb, cb = x.shape[0], x.shape[-1]
    else:
        nb, cb = x.shape[:2]
    out_spatial = plan.out_shape
    if min(plan.in_shape) == 0:  # every window of this chunk lies in the padding
        y_shape = (nb, cb) + out_spatial
        if channels_last:
            y_shape = channels_last_order(y_shape)
        y = np.full(y_shape, dtypes.lowest(dtype), dtype)
        local = np.full((nb, cb) + out_spatial, -1, np.int64) if return_indices else None
    elif channels_last:
        y, local = pool_nhwc(label, x, plan, return_indices, storage_order)
    else:
        y, local = pool_planes(label, x, plan, return_indices, storage_order)
    if channels_last:
        y = activate(y, act)
    if not return_indices:
        return y
    indices = global_indices(local, plan.in_shape, origin, spatial, plane0, channels,
                             storage_order) if local.size else local
    return y, indices


def pool(spec, x, plan: WindowPlan, return_indices: bool, storage_order: int,
         channels_last: bool = False, act=None):
    """The chunked MaxPool of a checked dask array ``x`` (NCHW, or channels-last): Y, and
    Indices or None."""
    ndim = x.ndim
    n_axis, c_axis, spatial_axes = axes(ndim, channels_last)
    spatial = plan.in_shape
    channels = x.shape[c_axis]
    per_axis = []  # per spatial axis: [(o0, o1, lo, hi, pieces)]
    for a, axis in enumerate(spatial_axes):
        edges = _graph.bounds(x.chunks[axis])
        s, pb = plan.strides[a], plan.pad_begin[a]
        span = (plan.kernel[a] - 1) * plan.dilations[a] + 1
        entries = []
        centre = (span - 1) // 2
        for _, o0, o1 in output_ranges(spatial[a], edges, plan.out_shape[a], s, pb - centre):
            lo = max(0, o0 * s - pb)
            hi = min(spatial[a], (o1 - 1) * s - pb + span)
            lo = min(lo, hi) if hi > lo else 0
            hi = max(hi, lo)
            entries.append((o0, o1, lo, hi, _graph.pieces(edges, lo, hi)))
        per_axis.append(entries)
    out_spatial_chunks = tuple(tuple(e[1] - e[0] for e in entries) for entries in per_axis)
    n_chunks, c_chunks = x.chunks[n_axis], x.chunks[c_axis]
    # The largest block's outputs must fit in memory, as the in-memory call's would.
    biggest = (max(n_chunks), max(c_chunks)) + tuple(max(c) for c in out_spatial_chunks)
    check_size(spec.label, "Y", biggest, x.dtype)
    if return_indices:
        check_size(spec.label, "Indices", biggest, np.int64)
    n_edges, c_edges = _graph.bounds(n_chunks), _graph.bounds(c_chunks)
    tasks = {}
    token = tokenize(x.name, plan, return_indices, storage_order, channels_last, act,
                     spec.label)
    parts = _graph.Parts(x, "max-pool", token)
    for bn, bc in np.ndindex(len(n_chunks), len(c_chunks)):
        for combo_index in np.ndindex(*[len(e) for e in per_axis]):
            combo = [per_axis[a][j] for a, j in enumerate(combo_index)]
            sub = block_plan(plan, [((e[0], e[1]), (e[2], e[3])) for e in combo])
            keys, placements, block_shape = _graph.slab_inputs(
                x.name, n_axis, c_axis, (bn, n_chunks[bn]), (bc, c_chunks[bc]), spatial_axes,
                [(e[2], e[3], e[4]) for e in combo], ndim, parts)
            origin = tuple(e[2] for e in combo)
            block = (bn, bc) + combo_index
            if channels_last:
                block = channels_last_order(block)
            tasks[block] = (_pool_block, keys, placements, block_shape, x.dtype, spec.label, sub,
                            return_indices, storage_order, channels_last, act, origin, spatial,
                            (int(n_edges[bn]), int(c_edges[bc])), channels)
    i_chunks = (n_chunks, c_chunks) + out_spatial_chunks
    y_chunks = channels_last_order(i_chunks) if channels_last else i_chunks
    outputs = [(y_chunks, _graph.meta(ndim, x.dtype), None)]
    if return_indices:
        # Indices are NCHW-shaped: a channels-last block (n, spatial..., c) is (n, c, spatial...).
        outputs.append((i_chunks, _graph.meta(ndim, np.int64),
                        nchw_order if channels_last else None))
    arrays = _graph.arrays_from_tasks("max-pool", tasks, [x], outputs, token, parts)
    return (arrays[0], arrays[1]) if return_indices else (arrays[0], None)
