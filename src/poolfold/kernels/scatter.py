"""Scatter of values to flat positions (MaxUnpool), never writing out of bounds.

Arrays are ``(N, C, S)`` planes of any strides, so the same kernels serve NCHW tensors and
channels-last ones (seen through a transposed view, no copy).  An index is a flat NCHW
position ``(n*C + c) * S_out + s`` in the output.

Duplicates resolve deterministically: positions are written in row-major (N, C, S) order of
the source, so the last source element wins.  MaxPool's indices keep every plane inside its
own slice of the output, so planes are scattered in parallel, each checking every index before
writing it; a plane that meets an index outside its slice stops, and the caller then falls
back to a full range check and one ordered pass over the whole tensor.
"""

from __future__ import annotations

from . import kernel
from .activation import activate


@kernel()
def scatter_planes(x, indices, y, fill, act_code, act_params, act_table, start, stop):
    """Per plane (n, c) numbered ``p = n*C + c`` in ``[start, stop)``: ``y[n, c] = fill``, then
    ``y[n, c, s] = activation(x[n, c, i])`` where ``indices[n, c, i]`` is the flat position of
    (n, c, s), in order of i.

    Returns whether some plane met an index outside its own slice (that plane stopped there).
    """
    batch, channels, size = x.shape
    plane_out = y.shape[2]
    foreign = False
    for p in range(start, stop):
        n = p // channels
        c = p % channels
        yp = y[n, c]
        for s in range(plane_out):
            yp[s] = fill
        start = p * plane_out
        for i in range(size):
            target = indices[n, c, i] - start
            if target < 0 or target >= plane_out:
                foreign = True
                break
            yp[target] = activate(x[n, c, i], act_code, act_params, act_table)
    return foreign


@kernel()
def first_out_of_range(indices, total):
    """Position of the first flat index outside ``[0, total)``, or -1."""
    for i in range(indices.size):
        if indices[i] < 0 or indices[i] >= total:
            return i
    return -1


@kernel()
def scatter_ordered(x, indices, y, act_code, act_params, act_table):
    """``y[position] = activation(x[n, c, i])`` in row-major (n, c, i) order; the indices are
    checked and y already holds the fill value."""
    batch, channels, size = x.shape
    plane_out = y.shape[2]
    for n in range(batch):
        for c in range(channels):
            for i in range(size):
                target = indices[n, c, i]
                plane = target // plane_out
                y[plane // channels, plane % channels, target % plane_out] = activate(
                    x[n, c, i], act_code, act_params, act_table)
