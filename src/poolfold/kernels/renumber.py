"""Indices of a block pooled on its own, renumbered as positions in the whole tensor.

A chunked MaxPool pools each block of X as if it were the whole tensor; its Indices are then
flat positions in the block.  This moves them to the tensor: the block's plane p becomes plane
``plane_base[p]``, and spatial coordinates shift by the block's origin.
"""

from __future__ import annotations

import numpy as np

from . import kernel


# Serial: a chunked MaxPool runs one task per block and its scheduler spreads the tasks over
# the cores, so a block's renumbering has no cores to share out.
@kernel()
def renumber(indices, block_shape, origin, shape, plane_base, column_major):
    """In place, per row p of ``indices`` (planes, outputs): a flat position in the block
    (row-major over ``block_shape``, or first-axis-fastest with ``column_major``, planes of
    ``prod(block_shape)`` one after another) becomes ``plane_base[p]`` plus the flat position
    of the same element in a plane of ``shape``, the block starting at ``origin``; -1 stays.

    One division per index: the fastest-varying axis splits off, and a table maps the rest
    (a line of the block) to where that line starts in the plane.  Decoding every axis took
    as long as the pooling itself."""
    planes, outputs = indices.shape
    rank = block_shape.size
    fast = 0 if column_major else rank - 1
    strides = np.ones(rank, np.int64)  # of the whole plane, in the storage order
    if column_major:
        for a in range(1, rank):
            strides[a] = strides[a - 1] * shape[a - 1]
    else:
        for a in range(rank - 2, -1, -1):
            strides[a] = strides[a + 1] * shape[a + 1]
    line = block_shape[fast]
    lines = 1
    for a in range(rank):
        if a != fast:
            lines *= block_shape[a]
    block_size = lines * line
    # Start in the plane of each line of the block, lines numbered in the storage order.
    line_start = np.empty(lines, np.int64)
    coords = np.zeros(rank, np.int64)
    for t in range(lines):
        start = origin[fast] * strides[fast]
        for a in range(rank):
            if a != fast:
                start += (coords[a] + origin[a]) * strides[a]
        line_start[t] = start
        # Next line: the slow axes count in the storage order, skipping the fast one.
        if column_major:
            for a in range(1, rank):
                coords[a] += 1
                if coords[a] < block_shape[a]:
                    break
                coords[a] = 0
        else:
            for a in range(rank - 2, -1, -1):
                coords[a] += 1
                if coords[a] < block_shape[a]:
                    break
                coords[a] = 0
    fast_stride = strides[fast]
    for p in range(planes):
        row = indices[p]
        local_base = p * block_size
        base = plane_base[p]
        for q in range(outputs):
            v = row[q]
            if v >= 0:
                rest = v - local_base
                t = rest // line
                row[q] = base + line_start[t] + (rest - t * line) * fast_stride
