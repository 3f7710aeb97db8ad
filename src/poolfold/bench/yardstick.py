"""The memory-speed yardstick of a pooling call: read X once, write Y once.

``np.copyto`` of a call's bytes writes as much as it reads, which no pool does (a 3x3 stride-2
pool writes a quarter of what it reads): it is not the limit of a reduction.  This kernel is:
Y's bytes, as 8-byte words, are each the maximum of the next run of X's words, so it streams X
once and writes Y once, vectorised, on poolfold's own threads.  A pool can only be slower.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..kernels.threads import launch_split


@njit(cache=True, nogil=True)
def _stream(x, y, per, start, stop):
    for j in range(start, stop):
        lo = j * per
        hi = min(lo + per, x.size)
        held = x[lo] if lo < x.size else np.uint64(0)
        for i in range(lo + 1, hi):
            held = max(held, x[i])
        y[j] = held


def _words(nbytes: int) -> int:
    return max(1, nbytes // 8)


def stream_runner(x_bytes: int, y_bytes: int):
    """A call that reads ``x_bytes`` and writes ``y_bytes`` as a pool does, once each."""
    x = np.ones(_words(x_bytes), np.uint64)
    y = np.empty(_words(y_bytes), np.uint64)
    per = -(-x.size // y.size)

    def run():
        launch_split(_stream, y.size, x, y, per, work=x.size + y.size)
        return y

    return run
