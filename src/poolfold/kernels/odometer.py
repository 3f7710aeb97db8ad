"""Row-major counters over several axes, for kernels that work on any rank."""

from __future__ import annotations


from . import helper


@helper
def next_in_shape(counter, shape, axes):
    """Advance ``counter[:axes]`` to the next position in row-major order within
    ``[0, shape[a])``; False (and all zeros) once it wraps past the last position."""
    a = axes - 1
    while a >= 0:
        counter[a] += 1
        if counter[a] < shape[a]:
            return True
        counter[a] = 0
        a -= 1
    return False


@helper
def next_in_ranges(counter, key, lo, hi, axes):
    """Advance ``counter[:axes]`` row-major, each axis within ``[lo[a, key[a]], hi[a, key[a]])``
    (a tap table row chosen by ``key``); False (and back at the start) once it wraps."""
    a = axes - 1
    while a >= 0:
        counter[a] += 1
        if counter[a] < hi[a, key[a]]:
            return True
        counter[a] = lo[a, key[a]]
        a -= 1
    return False
