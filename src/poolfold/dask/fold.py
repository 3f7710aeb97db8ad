"""Col2Im on chunked arrays: the fold continued over the chunks of the block axis L.

Output chunks: N chunks are the input's; C chunks are dim 1's chunks in whole channels (dim 1
is rechunked so that every boundary falls on a multiple of ``prod(block_shape)``); the image
is one chunk per (N, C) chunk.  Every L chunk adds its blocks to the image of its (N, C)
chunk.

The sums are the in-memory ones bit for bit.  In memory a position's sum runs over the block
offsets k in increasing order, which is the blocks l in *decreasing* order (a larger offset
reaches the same position from an earlier block, on every axis).  So the L chunks are
chained from the last to the first, each continuing the accumulator of the one before (float32
for float16 / bfloat16, rounded once at the end), and each folds its blocks as rectangles of
the block grid, the last rectangle first.  Strings concatenate in increasing block order: each
L chunk concatenates its own blocks, and the partial images are joined first to last.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .. import dtypes, schema
from ..errors import PoolfoldError
from ..geometry import WindowPlan
from ..kernels.threads import launch
from ..kernels.fold import fold, fold_tables
from ..memory import check_size, line_rows
from ..ops._common import kernel_input
from ..ops.col2im import fold_identity, fold_plan, fold_strings
from ..ops.col2im import col2im as col2im_in_memory
from . import _graph


def grid_boxes(l0: int, l1: int, grid: tuple[int, ...]) -> list[tuple[tuple, tuple]]:
    """The blocks ``[l0, l1)`` (row-major over ``grid``) as boxes of the grid, each
    ``(start, size)`` and contiguous in that order, in increasing order of l."""
    if l0 >= l1:
        return []
    if len(grid) == 1:
        return [((l0,), (l1 - l0,))]
    inner = math.prod(grid[1:])
    a0, r0 = divmod(l0, inner)
    a1, r1 = divmod(l1, inner)

    def within(a, lo, hi):
        return [((a,) + s, (1,) + z) for s, z in grid_boxes(lo, hi, grid[1:])]

    if a0 == a1:
        return within(a0, r0, r1)
    boxes = []
    if r0:
        boxes += within(a0, r0, inner)
        a0 += 1
    if a1 > a0:
        boxes.append(((a0,) + (0,) * (len(grid) - 1), (a1 - a0,) + tuple(grid[1:])))
    if r1:
        boxes += within(a1, 0, r1)
    return boxes


def box_plan(plan: WindowPlan, start, size) -> WindowPlan:
    """``plan`` for the blocks of one box of its grid: the same image, the grid shifted."""
    pad_begin = tuple(pb - g * s for pb, g, s in zip(plan.pad_begin, start, plan.strides))
    return WindowPlan(plan.in_shape, plan.kernel, plan.strides, plan.dilations, pad_begin,
                      plan.pad_end, tuple(size), plan.label)


def _box_columns(columns, l0, start, size, grid):
    """The columns of one box, (planes, K, blocks of the box)."""
    first = int(np.ravel_multi_index(start, grid)) - l0
    return kernel_input(np.ascontiguousarray(columns[:, :, first:first + math.prod(size)]))


def _fold_step(accumulator, x, l0, plan, image_planes, block_size):
    """Add one L chunk's blocks (columns from block ``l0``) to the accumulator, its boxes
    the last first; the first step of a chain starts from zeros."""
    planes = x.shape[0] * (x.shape[1] // block_size)
    columns = dtypes.value_view(np.ascontiguousarray(x)).reshape(planes, block_size, x.shape[2])
    if accumulator is None:
        accumulator = np.zeros((planes, image_planes),
                               np.float32 if dtypes.is_half(x.dtype) else x.dtype)
    if planes == 0:
        return accumulator
    for start, size in reversed(grid_boxes(l0, l0 + x.shape[2], plan.out_shape)):
        launch(fold, _box_columns(columns, l0, start, size, plan.out_shape), accumulator,
               *fold_tables(box_plan(plan, start, size)), fold_identity(x.dtype), True,
               line_rows(planes, 2 * plan.rank), 0, planes)
    return accumulator


def _fold_finish(accumulator, shape, dtype):
    return accumulator.reshape(shape).astype(dtype, copy=False)


def _strings_part(x, l0, spec, plan, out_shape):
    """One L chunk's strings: its blocks concatenated in increasing order, as objects."""
    block_size = math.prod(plan.kernel)
    planes = out_shape[0] * out_shape[1]
    empty = b"" if x.dtype.kind == "S" else ""
    part = np.full((planes, math.prod(plan.in_shape)), empty, object)
    columns = x.reshape(planes, block_size, x.shape[2])
    for start, size in grid_boxes(l0, l0 + x.shape[2], plan.out_shape):
        box = columns[:, :, int(np.ravel_multi_index(start, plan.out_shape)) - l0:][:, :, :math.prod(size)]
        folded = fold_strings(spec, box.reshape(out_shape[0], -1, box.shape[2]),
                               box_plan(plan, start, size), out_shape)
        part = part + folded.reshape(planes, -1).astype(object)
    return part


def _strings_finish(parts, shape, dtype):
    out = parts[0]
    for part in parts[1:]:
        out = out + part
    out = out.reshape(shape)
    return out if dtype.kind == "O" else out.astype(dtype.kind)


def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None, opset=None):
    """:func:`poolfold.col2im` on a chunked ``[N, C*prod(block_shape), L]`` array: the image
    ``[N, C, *image_shape]`` as a dask array, equal bit for bit to the in-memory result.

    Output chunks: N as the input's; C as dim 1's chunks counted in whole channels (dim 1 is
    rechunked where a boundary splits a channel's ``prod(block_shape)`` rows); the image whole,
    one chunk per (N, C) chunk.  The L chunks of an (N, C) chunk fold one after another into
    its image (see the module doc for why this keeps every sum's bits).
    """
    spec = schema.resolve("Col2Im", opset)
    x = _graph.as_dask(spec, x, "input")
    if x.ndim != 3:
        raise PoolfoldError(
            f"{spec.label}: input 'input' must have rank 3 [N, C*prod(block_shape), L], "
            f"got shape {x.shape}"
        )
    # The in-memory checks, on an input with no samples: the same errors, no data touched.
    col2im_in_memory(np.empty((0,) + x.shape[1:], x.dtype), image_shape, block_shape,
                     dilations=dilations, pads=pads, strides=strides, opset=opset)
    image, block, attributes, plan = fold_plan(spec, x.shape, image_shape, block_shape, strides,
                                               dilations, pads)
    block_size = math.prod(block)
    # Whole channels per chunk of dim 1.
    cuts = sorted({-(-int(b) // block_size) for b in _graph.bounds(x.chunks[1])})
    channel_chunks = tuple(int(v) for v in np.diff(cuts)) or (0,)
    x = x.rechunk({1: tuple(c * block_size for c in channel_chunks)})
    n_chunks, l_chunks = x.chunks[0], x.chunks[2]
    image_size = math.prod(image)
    string = dtypes.name(x.dtype) == dtypes.STRING
    accumulator = np.float32 if dtypes.is_half(x.dtype) else x.dtype
    check_size(spec.label, "output", (max(n_chunks), max(channel_chunks)) + image,
               object if string else accumulator)
    l_edges = _graph.bounds(l_chunks)
    token = tokenize(x.name, image, block, attributes, spec.label)
    step_name, name = f"col2im-step-{token}", f"col2im-{token}"
    steps, finals = {}, {}
    out_dtype = np.dtype(x.dtype.kind) if x.dtype.kind in "US" else x.dtype
    for bn, bc in np.ndindex(len(n_chunks), len(channel_chunks)):
        shape = (n_chunks[bn], channel_chunks[bc]) + image
        out_key = (name, bn, bc) + (0,) * len(image)
        if string:
            parts = []
            for j in range(len(l_chunks)):
                key = (step_name, bn, bc, j)
                steps[key] = (_strings_part, (x.name, bn, bc, j), int(l_edges[j]), spec, plan,
                              shape)
                parts.append(key)
            finals[out_key] = (_strings_finish, parts, shape, x.dtype)
            continue
        previous = None
        for j in reversed(range(len(l_chunks))):
            key = (step_name, bn, bc, j)
            steps[key] = (_fold_step, previous, (x.name, bn, bc, j), int(l_edges[j]), plan,
                          image_size, block_size)
            previous = key
        finals[out_key] = (_fold_finish, previous, shape, x.dtype)
    graph = HighLevelGraph({step_name: steps, name: finals},
                           {step_name: {x.name}, name: {step_name}})
    graph = HighLevelGraph.merge(graph, x.dask)
    chunks = (n_chunks, channel_chunks) + tuple((n,) for n in image)
    return da.Array(graph, name, chunks, meta=_graph.meta(2 + len(image), out_dtype))
