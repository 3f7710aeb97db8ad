"""Turning rows into lanes and back.

A pass along the last axis of a channels-first plane reads each row where it lies, which
suits short windows at stride 1 or 2.  For other strides, and for the running maxima of long
windows, ``L`` rows are turned into lanes instead: position m of lane l holds element m of
row l, so that all ``L`` rows advance together along their axis, one vector per position,
and the rows' axis is reduced like any other axis with a contiguous inner run of ``L``.
``L`` (:func:`lane_count`) makes one position a 64-byte cache line.

Without positions, and where the rows are at least a vector long, the rows go in and out as
square tiles transposed in registers (:func:`poolfold.kernels.simd.transpose_tile`, a
vector's lanes on a side: ``L`` is a whole number of them): a tile is a vector load and
store per row and a few shuffles, where element by element it is a load and a store per
element (windows of 1x63 over (4,16,256,256) float32 by the separable passes: 5.8 ms
through element by element lanes, 4.5 through tiles).
"""

from __future__ import annotations

import numpy as np

from . import helper_overload, uncounted_helper
from .simd import transpose_tile, vector_width


def lane_count(a):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@helper_overload(lane_count)
def _lane_count(a):
    """64 bytes of ``a``'s elements, as a compile-time constant, so that the loops over the
    lanes of one position are unrolled into vector instructions."""
    lanes = 512 // a.dtype.bitwidth
    return lambda a: lanes


@uncounted_helper
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


@uncounted_helper
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


@uncounted_helper
def to_lanes_tiled(x, base, rows, n, lanes):
    """:func:`to_lanes` in one phase, without positions, for rows of at least a vector
    (:func:`poolfold.kernels.simd.vector_width`): tiles of a vector's lanes square, the last
    tile of a row overlapping the one before it.  Lanes past ``rows`` repeat the last row."""
    width = lane_count(x)
    side = vector_width(x)
    for h in range(0, width, side):
        loads = min(side, rows - h)
        first = base + h * n
        if loads <= 0:  # every lane of this tile repeats the last row
            loads = 1
            first = base + (rows - 1) * n
        for m0 in range(0, n, side):
            m = min(m0, n - side)
            transpose_tile(lanes, m * width + h, width, side, x, first + m, n, loads)


@uncounted_helper
def from_lanes_tiled(lanes, count, rows, dst, to, pitch):
    """:func:`from_lanes` for rows ``pitch`` apart from ``dst[to:]`` (lane l to
    ``dst[to + l*pitch:][:count]``), ``count`` at least a vector: tiles as in
    :func:`to_lanes_tiled`."""
    width = lane_count(lanes)
    side = vector_width(lanes)
    for h in range(0, rows, side):
        stores = min(side, rows - h)
        for o0 in range(0, count, side):
            o = min(o0, count - side)
            transpose_tile(dst, to + h * pitch + o, pitch, stores, lanes, o * width + h, width,
                           side)


@uncounted_helper
def evenly_spaced(targets, count):
    """Whether ``targets[:count]`` step by one pitch (any, for fewer than two); and it."""
    pitch = targets[1] - targets[0] if count > 1 else 0
    for l in range(2, count):
        if targets[l] - targets[l - 1] != pitch:
            return False, pitch
    return True, pitch
