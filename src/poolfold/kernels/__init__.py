"""numba kernels: plain loops over planes, one module per kind of work. They never validate.

Kernels are serial and compiled with ``nogil=True``; :mod:`.threads` runs one over parts of
its range on a pool of Python threads, :mod:`.affinity` keeps that pool's threads off the
caller's core where that helps, :mod:`.notices` says when numba compiles a kernel, and
:mod:`.background` compiles the slowest ones in a child process.
"""

from __future__ import annotations

import numba

# The decorator of a kernel's helpers, which only other kernels call: numba then builds none
# of the wrappers that let Python call a compiled function (argument unboxing and a C entry
# point), less code for LLVM to optimise on a first call (measured: 10-20% of the MaxPool
# kernels' first compile).
helper = numba.njit(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
