"""Every kernel frees what it allocates.

Helpers called in the kernels' hot loops are compiled without numba's reference counting
(:data:`poolfold.kernels.uncounted_helper`): the arrays they read are their callers'.  One
that called a counted function returning an array (a view, counted once more) would keep that
array alive forever, and its scratch with it; one that allocated would not compile.  So, in a
process with numba's allocation statistics on, every kernel of every op runs, and what numba
allocated in those calls is freed by their end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import numpy as np
    import poolfold
    from numba.core.runtime import rtsys
    from poolfold.ops import max_pool as mp

    rng = np.random.default_rng(0)

    def forced(x, kw, kernel, indices):
        with mp.forced_kernel(kernel):
            poolfold.max_pool(x, return_indices=indices, **kw)

    calls = []
    for shape, kw in [((2, 3, 9, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),
                      ((2, 3, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
                      ((2, 3, 20, 24), dict(kernel_shape=[9, 9], pads=[4] * 4)),
                      ((2, 3, 7, 8, 9), dict(kernel_shape=[3, 3, 3], pads=[1] * 6)),
                      ((2, 3, 400), dict(kernel_shape=[63], pads=[31, 31])),
                      ((2, 3, 9, 11), dict(kernel_shape=[3, 3], dilations=[2, 1]))]:
        x = rng.standard_normal(shape).astype(np.float32)
        x.flat[::7] = np.nan
        for kernel in mp.KERNELS:
            for indices in (False, True):
                calls.append(lambda x=x, kw=kw, k=kernel, i=indices: forced(x, kw, k, i))
    x = rng.standard_normal((2, 3, 12, 13, 7)).astype(np.float32)
    h = x.astype(np.float16)
    last = x.transpose(0, 2, 3, 4, 1).copy()
    y, i = poolfold.max_pool(x, [3, 3, 3], strides=[3, 3, 3], return_indices=True)
    calls += [
        lambda: poolfold.average_pool(x, [3, 3, 3], pads=[1] * 6, count_include_pad=0),
        lambda: poolfold.average_pool(h, [2, 5, 3], strides=[2, 1, 1]),
        lambda: poolfold.lp_pool(x, [3, 3, 3], p=3),
        # the block sums (window_blocks), one kernel per spatial rank
        lambda: poolfold.average_pool(x, [5, 7, 7], pads=[2, 3, 3] * 2),
        lambda: poolfold.lp_pool(x[:, :, 0], [25, 7], p=2, pads=[6, 0, 6, 0]),
        lambda: poolfold.average_pool(x[:, :, 0, 0].copy(), [70], pads=[35, 35]),
        lambda: poolfold.global_average_pool(x),
        lambda: poolfold.global_max_pool(h),
        lambda: poolfold.global_lp_pool(x, p=2),
        lambda: poolfold.nhwc.max_pool(last, [3, 3, 3]),
        lambda: poolfold.nhwc.average_pool(last, [3, 3, 3]),
        lambda: poolfold.col2im(rng.standard_normal((2, 27, 20)).astype(np.float32),
                                np.array([6, 7]), np.array([3, 3])),
        lambda: poolfold.max_unpool(y, i, [3, 3, 3], strides=[3, 3, 3],
                                    output_shape=np.array(x.shape)),
    ]

    def run_all():
        ran = 0
        for call in calls:
            try:
                call()
                ran += 1
            except ValueError:  # a forced kernel that cannot pool the call refuses it
                pass
        return ran

    run_all()  # compiles, and fills every cache
    before = rtsys.get_allocation_stats()
    ran = run_all()
    after = rtsys.get_allocation_stats()
    alloc, free = after.alloc - before.alloc, after.free - before.free
    mi_alloc, mi_free = after.mi_alloc - before.mi_alloc, after.mi_free - before.mi_free
    print(ran, len(calls), alloc, free, mi_alloc, mi_free)
    assert ran > 60 and alloc > 0, (ran, alloc)
    assert (alloc, mi_alloc) == (free, mi_free), (alloc, free, mi_alloc, mi_free)
""")



def test_kernels_free_what_they_allocate():
    env = dict(os.environ, NUMBA_NRT_STATS="1", POOLFOLD_BACKGROUND_COMPILE="0",
               POOLFOLD_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
