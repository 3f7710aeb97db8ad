"""numba kernels: plain loops over planes, one module per kind of work. They never validate.

Kernels are serial and compiled with ``nogil=True``; :mod:`.threads` runs one over parts of
its range on a pool of Python threads, :mod:`.affinity` keeps that pool's threads off the
caller's core where that helps, :mod:`.notices` says when numba compiles a kernel,
:mod:`.background` compiles the slowest ones in a child process, :mod:`.sharing` has
processes that start together compile each kernel once, and :mod:`.caching` loads a cached
kernel without parsing what only linking needs.
"""

from __future__ import annotations

import numba
from numba import types
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic, overload

from . import caching, linking, sharing


def kernel(**options):
    """The decorator of a kernel (a function Python calls): numba's ``njit`` with a disk
    cache (:mod:`.caching`) and without the GIL (``options`` add to those), each compile
    shared with the other processes that need it at the same time (:mod:`.sharing`)."""
    jit = numba.njit(nogil=True, **options)
    return lambda function: sharing.share_compiles(caching.enable(jit(function)))

# The decorator of a kernel's helpers, which only other kernels call: numba then builds none
# of the wrappers that let Python call a compiled function (argument unboxing and a C entry
# point), less code for LLVM to optimise on a first call (measured: 10-20% of the MaxPool
# kernels' first compile), and no machine code of the helper's own (:mod:`.linking`).
if linking.AVAILABLE:
    helper = numba.njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True,
                        pipeline_class=linking.HelperCompiler)
    _OVERLOAD_OPTIONS = dict(pipeline_class=linking.HelperCompiler)
else:  # pragma: no cover - another numba's layout
    helper = numba.njit(cache=True, nogil=True, no_cpython_wrapper=True,
                        no_cfunc_wrapper=True)
    _OVERLOAD_OPTIONS = {}


# The decorator of a helper that allocates no array and keeps none past its return, called in
# a kernel's hot loop: compiled without numba's reference counting, so it reads and writes
# its caller's arrays (alive across the call) as they are.  Where a helper's arrays are
# counted, the counts its inlined helpers add around each call are atomic and, where that
# helper branches much, not pruned: 40% of long 3-D MaxPool windows' time went to counting
# the arrays of the runs kernel's per-row ladder.
if linking.AVAILABLE:
    uncounted_helper = numba.njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True,
                                  pipeline_class=linking.HelperCompiler, _nrt=False)
else:  # pragma: no cover - another numba's layout
    uncounted_helper = numba.njit(cache=True, nogil=True, no_cpython_wrapper=True,
                                  no_cfunc_wrapper=True, _nrt=False)


def helper_overload(function, **options):
    """``numba.extending.overload`` for the kernels: each implementation it picks is compiled
    as a helper is (linked into its callers only)."""
    return overload(function, jit_options=_OVERLOAD_OPTIONS, **options)


@intrinsic
def read_only(typingctx, array):
    """``array`` typed read-only, the same array: a helper that reads either a kernel's input
    (always read-only, see :func:`poolfold.ops._common.kernel_input`) or the kernel's own
    scratch then compiles once, not once per kind (seconds per type and kernel)."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        return impl_ret_borrowed(context, builder, signature.return_type, args[0])

    return array.copy(readonly=True)(array), codegen
