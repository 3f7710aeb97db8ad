"""Scatter of values to flat positions (MaxUnpool), never writing out of bounds.

Duplicates resolve deterministically: positions are written in row-major order of the source,
so the last source element wins.  MaxPool's indices keep every plane inside its own slice of
the output, so planes are scattered in parallel, each checking every index before writing it;
a plane that meets an index outside its slice stops, and the caller then falls back to a full
range check and one row-major pass over the whole tensor.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True, nogil=True)
def scatter_planes(x, indices, y):
    """Per plane p: ``y[p] = 0``, then ``y.flat[indices[p, i]] = x[p, i]`` in order of i.

    Returns, per plane, the first i whose index lies outside plane p's slice
    ``[p * S_out, (p + 1) * S_out)`` of the flat output (the plane stops there), or -1."""
    planes, size = x.shape
    plane_out = y.shape[1]
    foreign = np.full(planes, -1, np.int64)
    for p in prange(planes):
        yp = y[p]
        yp[:] = 0
        start = p * plane_out
        for i in range(size):
            target = indices[p, i] - start
            if target < 0 or target >= plane_out:
                foreign[p] = i
                break
            yp[target] = x[p, i]
    return foreign


@njit(cache=True, nogil=True)
def first_out_of_range(indices, total):
    """Position of the first flat index outside ``[0, total)``, or -1."""
    for i in range(indices.size):
        if indices[i] < 0 or indices[i] >= total:
            return i
    return -1


@njit(cache=True, nogil=True)
def scatter_flat(x, indices, y):
    """``y[indices[i]] = x[i]`` for every i in order, on flat arrays (indices checked)."""
    for i in range(x.size):
        y[indices[i]] = x[i]
