"""numba kernels: plain loops over planes, one module per kind of work. They never validate.

Every call goes through :func:`launch`, which sets the thread count and serialises launches:
numba's default threading layer (workqueue) aborts the process when two Python threads run
parallel kernels at once, and each kernel already uses every thread it is given.
"""

from __future__ import annotations

import os
import threading
import warnings

import numba

_LAUNCH = threading.Lock()


def kernel_threads() -> int:
    """``POOLFOLD_NUM_THREADS`` if set (capped at numba's pool size), else numba's setting."""
    available = numba.config.NUMBA_NUM_THREADS
    value = os.environ.get("POOLFOLD_NUM_THREADS")
    if not value:
        return numba.get_num_threads()
    try:
        wanted = int(value)
    except ValueError:
        wanted = 0
    if wanted < 1:
        warnings.warn(f"POOLFOLD_NUM_THREADS={value!r} is not a positive integer; ignored",
                      RuntimeWarning, stacklevel=3)
        return numba.get_num_threads()
    return min(wanted, available)


def launch(kernel, *args):
    """Run ``kernel(*args)`` with poolfold's thread count, one launch at a time."""
    with _LAUNCH:
        previous = numba.get_num_threads()
        numba.set_num_threads(kernel_threads())
        try:
            return kernel(*args)
        finally:
            numba.set_num_threads(previous)
