"""Turning rows into lanes and back.

A pass along the last axis of a channels-first plane reads each row where it lies, which
suits short windows at stride 1 or 2.  For other strides, and for the running maxima of long
windows, ``L`` rows are turned into lanes instead: position m of lane l holds element m of
row l, so that all ``L`` rows advance together along their axis, one vector per position,
and the rows' axis is reduced like any other axis with a contiguous inner run of ``L``.
``L`` (:func:`lane_count`) makes one position a 64-byte cache line.
"""

from __future__ import annotations

import numpy as np

from . import helper, helper_overload


def lane_count(a):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(lane_count)
def _lane_count(a):
    """64 bytes of ``a``'s elements, as a compile-time constant, so that the loops over the
    lanes of one position are unrolled into vector instructions."""
    lanes = 512 // a.dtype.bitwidth
    return lambda a: lanes


@helper
def to_lanes(x, base, rows, n, lanes, lanes_at, phases):
    """Rows ``x[base + l*n:][:n]`` for l below ``rows`` into ``lanes``: element m of row l to
    ``lanes[r*L + l]``, r the row of position m in ``phases`` phases (position m in phase
    ``m % phases``, slot ``m // phases``); lanes past ``rows`` repeat the last row.  Unless
    ``lanes_at`` is None, it gets each element's position, its index in ``x``."""
    u = np.uint64
    width = lane_count(x)
    per_phase = (n + phases - 1) // phases
    for m in range(n):
        r = ((m % phases) * per_phase + m // phases) * width
        for lane in range(width):
            lanes[u(r + lane)] = x[u(base + min(lane, rows - 1) * n + m)]
        if lanes_at is not None:
            for lane in range(width):
                lanes_at[u(r + lane)] = base + min(lane, rows - 1) * n + m


@helper
def from_lanes(lanes, lanes_at, count, rows, dst, dst_at, targets, targets_at):
    """The first ``count`` positions of lanes l below ``rows`` back into rows: lane l to
    ``dst[targets[l]:][:count]`` (positions to ``dst_at[targets_at[l]:]``), a tile of ``L``
    positions at a time: a whole lane at once would read one element per cache line."""
    u = np.uint64
    width = lane_count(lanes)
    for o0 in range(0, count, width):
        c = min(width, count - o0)
        for lane in range(rows):
            to = targets[lane] + o0
            for o in range(c):
                dst[u(to + o)] = lanes[u((o0 + o) * width + lane)]
        if dst_at is not None:
            for lane in range(rows):
                to = targets_at[lane] + o0
                for o in range(c):
                    dst_at[u(to + o)] = lanes_at[u((o0 + o) * width + lane)]
