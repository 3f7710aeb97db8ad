"""Indices of a block pooled on its own, renumbered as positions in the whole tensor.

A chunked MaxPool pools each block of X as if it were the whole tensor; its Indices are then
flat positions in the block.  This moves them to the tensor: the block's plane p becomes plane
``plane_base[p]``, and spatial coordinates shift by the block's origin.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True, nogil=True)
def renumber(indices, block_shape, origin, shape, plane_base, column_major):
    """In place, per row p of ``indices`` (planes, outputs): a flat position in the block
    (row-major over ``block_shape``, or first-axis-fastest with ``column_major``, planes of
    ``prod(block_shape)`` one after another) becomes ``plane_base[p]`` plus the flat position
    of the same element in a plane of ``shape``, the block starting at ``origin``; -1 stays."""
    planes, outputs = indices.shape
    rank = block_shape.size
    block_size = 1
    for a in range(rank):
        block_size *= block_shape[a]
    strides = np.ones(rank, np.int64)  # of the whole plane, in the storage order
    if column_major:
        for a in range(1, rank):
            strides[a] = strides[a - 1] * shape[a - 1]
    else:
        for a in range(rank - 2, -1, -1):
            strides[a] = strides[a + 1] * shape[a + 1]
    for p in prange(planes):
        row = indices[p]
        local_base = p * block_size
        for q in range(outputs):
            v = row[q]
            if v < 0:
                continue
            rest = v - local_base
            position = plane_base[p]
            if column_major:
                for a in range(rank):
                    position += (rest % block_shape[a] + origin[a]) * strides[a]
                    rest //= block_shape[a]
            else:
                for a in range(rank - 1, -1, -1):
                    position += (rest % block_shape[a] + origin[a]) * strides[a]
                    rest //= block_shape[a]
            row[q] = position
