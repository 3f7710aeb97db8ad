"""The property tests against the oracle, again with numba's bounds checking on.

numba kernels do not check bounds: a missed validation would be a silent out-of-bounds read
or write.  Compiled with ``NUMBA_BOUNDSCHECK=1`` the same kernels raise IndexError instead,
so this runs the oracle property tests of every op and the nhwc ops in a child process with
it set (and a cache directory of its own, so that the checked kernels never mix with the
normal ones), each hypothesis test capped at a few examples: the point is to touch every
kernel path, not to search widely (the normal run does that).  Any IndexError is a validation
gap to fix in poolfold, not here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = 4
# MaxPool-22 takes every pooling type: one item size of each kind (1, 2, 4 and 8 bytes, and
# both half types) compiles each kernel variant once.
PROPERTY_TESTS = [
    *(f"tests/test_max_pool.py::test_matches_oracle[MaxPool-22-{t}]"
      for t in ("float32", "float64", "float16", "bfloat16", "int8")),
    "tests/test_max_pool.py::test_matches_oracle_per_rank",
    "tests/test_max_pool.py::test_matches_oracle_big_pads_and_dilations",
    "tests/test_max_pool.py::test_each_kernel_path_matches_oracle",
    "tests/test_max_pool_kernels.py::test_forced_kernel_matches_oracle",
    "tests/test_max_pool_kernels.py::test_passes_in_tiny_slabs_match_oracle",
    "tests/test_max_pool_kernels.py::test_forced_kernel_channels_last_matches_oracle",
    "tests/test_window_kernels.py::test_tiling_windows_match_the_oracle",
    "tests/test_window_kernels.py::test_direct_and_separable_kernels_match_the_oracle",
    "tests/test_window_kernels.py::test_separable_paths_match_the_oracle",
    "tests/test_nhwc.py::test_nhwc_max_unpool_matches_oracle",
    "tests/test_max_unpool.py::test_inferred_shape_indices",
    "tests/test_max_unpool.py::test_without_output_shape_matches_oracle",
    "tests/test_max_unpool.py::test_with_output_shape_matches_oracle",
    "tests/test_max_unpool.py::test_round_trip",
    "tests/test_col2im.py::test_matches_oracle",
    "tests/test_nhwc.py::test_nhwc_max_pool_matches_oracle",
]


def start_checked_run() -> tuple[subprocess.Popen, Path]:
    """The bounds-checked run as a child process and the folder of its cache and output.

    conftest.py starts it as soon as pytest has collected this test: it compiles every
    kernel again (minutes of one core), and the main run, compiling on one core too, leaves
    the other idle until then."""
    work = Path(tempfile.mkdtemp(prefix="poolfold-boundscheck-"))
    env = dict(os.environ)
    env.update(
        NUMBA_BOUNDSCHECK="1",
        NUMBA_CACHE_DIR=str(work / "numba-cache"),
        POOLFOLD_MAX_EXAMPLES=str(EXAMPLES),
        PYTHONPATH=os.pathsep.join(
            p for p in (str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH")) if p),
    )
    with open(work / "output.txt", "w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "fuzz.few_examples", "-p",
             "no:cacheprovider", "--hypothesis-seed=0", *PROPERTY_TESTS],
            cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)
    return process, work


def test_property_tests_pass_with_bounds_checking(request):
    process, work = getattr(request.config, "poolfold_checked_run", None) or start_checked_run()
    try:
        process.wait(timeout=3000)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = (work / "output.txt").read_text()
    shutil.rmtree(work, ignore_errors=True)
    assert "IndexError" not in output, output[-8000:]
    assert process.returncode == 0, output[-8000:]
    assert " passed" in output and "no tests ran" not in output, output[-2000:]


def test_window_cut_by_the_end(tmp_path):
    """Found by the bounds-checked run of the parallel kernels: a (1, 1, 1) input, kernel 2,
    pads [0, 2] indexed past the end of the 1-element last axis (float16 here; float32,
    float64, int8 and bfloat16 did the same).  The serial kernels read only in-bounds taps."""
    script = textwrap.dedent("""
        import numpy as np, poolfold
        y, i = poolfold.max_pool(np.array([[[-2.0]]], np.float16), [2], pads=[0, 2],
                                 return_indices=True)
        assert y.tolist() == [[[-2.0, -np.inf]]] and i.tolist() == [[[0, -1]]]
    """)
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
