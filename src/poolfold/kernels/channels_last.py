"""Channels-last MaxPool's Indices: from positions in the ``(spatial..., C)`` plane that the
window-max kernels record to the NCHW layout the op reports.

A channels-last tensor ``(N, D1, ..., Dr, C)`` is pooled as N planes of rank r + 1 whose last
axis, C, has a window of one; its Indices come back as ``n * plane_size + s * C + c`` (s the
flat spatial position) in an ``(N, out..., C)`` array.  The op reports them as the ai.onnx
MaxPool on the NCHW tensor would: shape ``(N, C, out...)``, values ``(n * C + c) * S + s``.
"""

from __future__ import annotations

import numpy as np

from . import kernel
from .window_max import reported_index


@kernel()
def nchw_indices(recorded, reported, in_shape, column_major, start, stop):
    """recorded : (N, Q, C) int64, positions in the channels-last planes (-1 for none);
    reported : (N, C, Q) int64, filled with the NCHW positions (row-major or, with
    ``column_major``, first-axis-fastest spatial order), -1 kept; for the planes
    ``n*C + c`` in ``[start, stop)``."""
    batch, outputs, channels = recorded.shape
    rank = in_shape.size
    in_strides = np.ones(rank, np.int64)
    for a in range(rank - 2, -1, -1):
        in_strides[a] = in_strides[a + 1] * in_shape[a + 1]
    spatial = in_strides[0] * in_shape[0] if rank else 1
    for task in range(start, stop):
        n = task // channels
        c = task % channels
        base = (n * channels + c) * spatial
        plane_start = n * spatial * channels
        for q in range(outputs):
            position = recorded[n, q, c]
            if position < 0:
                reported[n, c, q] = -1
            else:
                s = (position - plane_start) // channels
                reported[n, c, q] = base + reported_index(s, column_major, in_shape, in_strides)
