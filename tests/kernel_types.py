"""The element types a test runs poolfold's kernels on: fewer in the bounds-checked run.

The bounds-checked run (test_fuzz_boundscheck.py) compiles every kernel signature it meets
again, at about 10 s of one core each.  A kernel indexes the same way for every type of one
width: int8 and uint8 differ only in how two elements compare, float16 and bfloat16 only in
how their 16-bit words turn into floats.  That run keeps one type of each such pair (int8,
float16): the other compiled the same reads and writes again.  Every other run tests every
type.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np

# Set by test_fuzz_boundscheck.start_checked_run.
CHECKED_RUN = "POOLFOLD_CHECKED_RUN"
# Types whose kernels index exactly as those of the type kept in their place.
SAME_INDEXING = {np.dtype(np.uint8): np.dtype(np.int8),
                 np.dtype(ml_dtypes.bfloat16): np.dtype(np.float16)}


def kernel_types(types):
    """``types`` as a list, without :data:`SAME_INDEXING`'s types in the bounds-checked run
    (unless nothing else is left)."""
    types = list(types)
    if os.environ.get(CHECKED_RUN) != "1":
        return types
    kept = [t for t in types if np.dtype(t) not in SAME_INDEXING]
    return kept or types
