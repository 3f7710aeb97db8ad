"""The property tests against the oracle, again with numba's bounds checking on.

numba kernels do not check bounds: a missed validation would be a silent out-of-bounds read
or write.  Compiled with ``NUMBA_BOUNDSCHECK=1`` the same kernels raise IndexError instead,
so this runs the oracle property tests of every op and the nhwc ops in a child process with
it set (and a cache directory of its own, so that the checked kernels never mix with the
normal ones), each hypothesis test capped at a few examples: the point is to touch every
kernel path, not to search widely (the normal run does that).  Any IndexError is a validation
gap to fix in poolfold, not here.  The averaging family's kernels are reached by a few cases
of test_average_family.py and by :func:`test_window_sum_paths_match_the_oracle` below (it runs
in both the normal and the checked run).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import oracle
from kernel_types import CHECKED_RUN, SAME_INDEXING
import poolfold
import poolfold.nhwc

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = 4
# Under pytest-xdist: the folder of the run the controlling process started (conftest.py).
CHECKED_RUN_FOLDER = "POOLFOLD_CHECKED_RUN_FOLDER"
# MaxPool-22 takes every pooling type: one type of each width (1, 2, 4 and 8 bytes) compiles
# each kernel variant once.  The run leaves out the types that index as another of their
# width does (kernel_types.py): those drawn by the tests and, by -k, those in test ids.
PROPERTY_TESTS = [
    *(f"tests/test_max_pool.py::test_matches_oracle[MaxPool-22-{t}]"
      for t in ("float32", "float64", "float16", "int8")),
    "tests/test_max_pool.py::test_matches_oracle_per_rank",
    "tests/test_max_pool.py::test_matches_oracle_big_pads_and_dilations",
    "tests/test_max_pool.py::test_each_kernel_path_matches_oracle",
    "tests/test_max_pool_kernels.py::test_forced_kernel_matches_oracle",
    "tests/test_max_pool_kernels.py::test_passes_in_tiny_slabs_match_oracle",
    "tests/test_max_pool_kernels.py::test_rows_forced_match_oracle",
    "tests/test_max_pool_kernels.py::test_rows_by_short_ladders_match_oracle",
    "tests/test_max_pool_kernels.py::test_row_blocks_forced_match_oracle",
    "tests/test_max_pool_kernels.py::test_row_blocks_of_one_row_match_oracle",
    "tests/test_max_pool_kernels.py::test_row_blocks_find_zeros_and_nans_again_in_window_order",
    "tests/test_max_pool_kernels.py::test_lines_forced_match_oracle",
    "tests/test_max_pool_kernels.py::test_lines_hand_picked_match_oracle",
    "tests/test_max_pool_kernels.py::test_lines_cut_planes_into_runs_of_first_axis_outputs",
    "tests/test_max_pool_kernels.py::test_plane_lanes_forced_match_oracle",
    "tests/test_max_pool_kernels.py::test_plane_lanes_match_oracle",
    "tests/test_max_pool_kernels.py::test_forced_kernel_channels_last_matches_oracle",
    "tests/test_max_pool_kernels.py::test_runs_forced_match_oracle",
    "tests/test_max_pool_kernels.py::test_runs_match_oracle",
    "tests/test_max_pool_kernels.py::test_long_windows_through_lane_tiles",
    "tests/test_window_kernels.py::test_tiling_windows_match_the_oracle",
    "tests/test_window_kernels.py::test_few_tiled_planes_are_cut_into_slices_the_threads_share",
    "tests/test_window_kernels.py::test_direct_and_separable_kernels_match_the_oracle",
    "tests/test_window_kernels.py::test_separable_paths_match_the_oracle",
    "tests/test_nhwc.py::test_nhwc_max_unpool_matches_oracle",
    # the explicit vector folds, whose loads numba does not check: they check themselves
    "tests/test_simd.py",
    "tests/test_max_unpool.py::test_inferred_shape_indices",
    "tests/test_max_unpool.py::test_without_output_shape_matches_oracle",
    "tests/test_max_unpool.py::test_with_output_shape_matches_oracle",
    "tests/test_max_unpool.py::test_round_trip",
    "tests/test_col2im.py::test_matches_oracle",
    "tests/test_nhwc.py::test_nhwc_max_pool_matches_oracle",
    # The averaging family (poolfold.kernels.window_sum): every kernel, both layouts, every
    # term kind, running sums, compensated float64 sums and the scaled LpPool sums; float32
    # and float64 only (each signature compiles again here).
    "tests/test_fuzz_boundscheck.py::test_window_cut_by_the_end",
    "tests/test_fuzz_boundscheck.py::test_window_sum_paths_match_the_oracle",
    "tests/test_fuzz_boundscheck.py::test_strided_row_blocks_match_the_oracle",
    # small planes summed as lanes (sum_plane_lanes), float32, its float64 path included
    *("tests/test_average_family.py::test_plane_lanes_sum_as_the_rows_do[x[1, 20, 7, 7]-"
      f"k[7, 7]-p[3, 3, 3, 3]-float32-{kind}]" for kind in ("average", "lp")),
    "tests/test_average_family.py::test_average_pool[4d-x[1, 1, 3, 4, 3, 3]-k[2, 3, 2, 2]-"
    "s[1, 2, 1, 2]-p[1, 0, 1, 1, 0, 1, 0, 1]-ceil-cip-float64]",
    "tests/test_average_family.py::test_lp_pool_large_and_tiny[float64-1e+200-p2]",
    *(f"tests/test_average_family.py::test_global_ops[dtype{d}-[2, 2, 5, 6]]" for d in (2, 3)),
    *(f"tests/test_average_family.py::test_nhwc_global_ops[dtype{d}-shape1]" for d in (1, 2)),
    # channels-last global sums in blocks of channels (position_sums), its float64 path
    *("tests/test_average_family.py::"
      f"test_nhwc_global_pools_sum_channels_in_blocks_as_the_row_kernel_does[dtype1-{s}]"
      for s in ("spatial0", "spatial1")),
    "tests/test_empty_batches.py::test_global_pools",
    # the block sums (window_blocks), every rank, both kinds, segments of long rows, short
    # 1-D windows by doubling, and the float64 redo of float32 sums that are not finite
    "tests/test_average_family.py::test_block_sums_match_oracle",
    "tests/test_average_family.py::test_short_1d_windows_are_summed_by_doubling",
    "tests/test_average_family.py::test_block_sums_of_a_row_do_not_depend_on_its_segments",
    "tests/test_average_family.py::test_block_sums_past_float32_are_taken_again_in_float64",
    # bands of a plane, passes of a band, and poolfold.dask's slabs: block sums whose
    # blocks start before a row's first position
    "tests/test_average_family.py::test_block_sums_in_bands_have_the_planes_bits[3d-phases-"
    "x[1, 1, 9, 10, 21]-k[5, 7, 9]-s[2, 2, 1]-d[2, 1, 2]-ceil-bfloat16-average]",
    "tests/test_average_family.py::test_block_sums_in_bands_have_the_planes_bits[2d-blocks-"
    "in-padding-x[1, 2, 20, 30]-k[7, 30]-p[16, 2, 17, 3]-float32-specials-lp]",
    *(f"tests/test_dask_averaging.py::test_block_sums_random_slabs_match_bits[{seed}]"
      for seed in (0, 1)),
]


def start_checked_run(work: Path) -> subprocess.Popen:
    """Start the bounds-checked run as a child process writing into the folder ``work``:
    its cache, its output (``output.txt``) and, once it is done, its exit status
    (``returncode``), which any process of the test run can wait for.

    conftest.py starts it as soon as pytest has collected this test (under pytest-xdist, the
    controlling process does, once): it compiles every kernel again (minutes of one core),
    beside the main run's own compiles."""
    env = dict(os.environ)
    env.update(
        NUMBA_BOUNDSCHECK="1",
        # The checks are inserted when numba lowers a kernel, before LLVM optimises it, so
        # the lowest optimisation level checks the same reads and writes; it compiled in
        # about half the time (376 against 708 s), on the core the main run's compiles want.
        NUMBA_OPT="0",
        NUMBA_CACHE_DIR=str(work / "numba-cache"),
        POOLFOLD_MAX_EXAMPLES=str(EXAMPLES),
        **{CHECKED_RUN: "1"},
        PYTHONPATH=os.pathsep.join(
            p for p in (str(Path(poolfold.__file__).resolve().parents[1]), str(ROOT / "tests"),
                        env.get("PYTHONPATH")) if p),
    )
    env.pop("PYTEST_XDIST_WORKER", None)
    same_indexing = " and ".join(f"not {t.name}" for t in SAME_INDEXING)
    run = [sys.executable, "-m", "pytest", "-q", "-p", "fuzz.few_examples", "-p",
           "no:cacheprovider", "-p", "no:xdist", "--hypothesis-seed=0", "-k", same_indexing,
           *PROPERTY_TESTS]
    # The exit status goes to a file, written once the output is complete: the test that
    # checks it may run in another process than the one that started the run.
    wrapper = ("import subprocess, sys, pathlib; "
               "code = subprocess.call(sys.argv[2:], stdout=open(pathlib.Path(sys.argv[1], "
               "'output.txt'), 'w'), stderr=subprocess.STDOUT); "
               "pathlib.Path(sys.argv[1], 'returncode.part').write_text(str(code)); "
               "pathlib.Path(sys.argv[1], 'returncode.part').rename("
               "pathlib.Path(sys.argv[1], 'returncode'))")
    return subprocess.Popen([sys.executable, "-c", wrapper, str(work), *run], cwd=ROOT,
                            env=env, start_new_session=True)


def stop_checked_run(process: subprocess.Popen) -> None:
    """Kill a checked run that is still going, its pytest child included."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_property_tests_pass_with_bounds_checking(request):
    shared = os.environ.get(CHECKED_RUN_FOLDER)
    started = getattr(request.config, "poolfold_checked_run", None)
    if shared:  # started by pytest-xdist's controlling process
        work, process = Path(shared), None
    elif started:
        work, process = started
    else:  # run alone, outside conftest's collection hook
        work = Path(tempfile.mkdtemp(prefix="poolfold-boundscheck-"))
        process = start_checked_run(work)
    returncode = work / "returncode"
    deadline = time.monotonic() + 3000
    try:
        while not returncode.exists():
            assert time.monotonic() < deadline, "the bounds-checked run took over 50 minutes"
            assert process is None or process.poll() is None or returncode.exists(), (
                "the bounds-checked run ended without an exit status")
            time.sleep(0.5)
    finally:
        if process is not None:
            stop_checked_run(process)
    output = (work / "output.txt").read_text()
    code = int(returncode.read_text())
    shutil.rmtree(work, ignore_errors=True)
    assert "IndexError" not in output, output[-8000:]
    assert code == 0, output[-8000:]
    assert " passed" in output and "no tests ran" not in output, output[-2000:]


def test_window_cut_by_the_end():
    """Found by the bounds-checked run of the parallel kernels: a (1, 1, 1) input, kernel 2,
    pads [0, 2] indexed past the end of the 1-element last axis (float16 here; float32,
    float64, int8 and bfloat16 did the same).  The serial kernels read only in-bounds taps.
    It runs in the bounds-checked run too (PROPERTY_TESTS), where a read past the end
    raises."""
    y, i = poolfold.max_pool(np.array([[[-2.0]]], np.float16), [2], pads=[0, 2],
                             return_indices=True)
    assert y.tolist() == [[[-2.0, -np.inf]]] and i.tolist() == [[[0, -1]]]


# ------------------------------------------------------------------ the averaging family

# The paths of poolfold.kernels.window_sum and window_rows that no case of
# test_average_family.py takes with float32 data: long stride-1 windows (running sums) for
# each term kind and both layouts, the separable passes adding each output's taps, the row
# sums (strided and not, both layouts, cut windows at both ends), and LpPool's scaled sums
# for a p past 7.  float32 only, so that the bounds-checked run compiles few signatures.
# (shape, kernel, strides, op, p): shape (N, C, D) as the oracle takes it; "nhwc." ops get
# it channels-last.
WINDOW_SUM_PATHS = [
    ((1, 1, 300), [80], [1], "average", None),  # running sums, one element per position
    ((1, 1, 300), [80], [1], "lp", 1),
    ((1, 1, 300), [80], [1], "lp", 2),
    ((1, 1, 300), [80], [1], "lp", 3),
    ((1, 1, 300), [80], [1], "lp", 9),  # scaled sums
    ((1, 3, 300), [80], [1], "nhwc.average", None),  # running sums over runs of channels
    ((1, 3, 300), [80], [1], "nhwc.lp", 1),
    ((1, 3, 300), [80], [1], "nhwc.lp", 9),
    ((2, 2, 9, 9), [3, 3], [1, 1], "lp", 3),  # separable passes, planes grouped
    ((1, 3, 9, 9), [3, 3], [1, 1], "nhwc.lp", 3),
    ((2, 1, 50), [3], [2], "lp", 3),
    ((2, 2, 9, 9), [3, 3], [1, 1], "average", None),  # row sums
    ((2, 2, 9, 9), [3, 4], [1, 1], "average", None),  # row sums, rows in blocks
    ((2, 2, 9, 9), [2, 4], [1, 1], "lp", 2),
    ((2, 2, 9, 9), [3, 2], [2, 3], "lp", 2),
    ((2, 1, 50), [3], [2], "average", None),
    ((1, 3, 9, 9), [3, 3], [1, 1], "nhwc.average", None),
    ((1, 3, 9, 9), [2, 3], [3, 2], "nhwc.lp", 1),
]


# Blocks of short channels-first rows at a stride (window_rows' _store_block): each row's
# outputs fit in its input row over the stride, rounded up.  (shape, kernel, strides,
# pads, op, p, dtype)
STRIDED_ROW_BLOCKS = [
    ((2, 3, 16, 16), [2, 2], [2, 2], None, "average", None, np.float32),  # a literal stride
    ((1, 2, 12, 12), [3, 3], [2, 2], [1, 1, 0, 0], "average", None, np.float32),  # cut first
    ((1, 2, 15, 20), [3, 5], [3, 5], None, "average", None, np.float32),  # a stride of 5
    ((1, 2, 6, 8, 8), [2, 3, 2], [2, 2, 2], None, "lp", 2, np.float32),
    ((1, 2, 12, 12), [3, 3], [2, 2], [1, 1, 0, 0], "average", None, np.float16),
    # half rows summed in vectors into the float32 accumulator
    ((1, 2, 9, 11), [5, 5], [1, 1], [2, 2, 2, 2], "average", None, ml_dtypes.bfloat16),
    # rows the stride does not divide: a block's rows at a pitch rounded up to it
    ((2, 3, 13, 13), [3, 3], [2, 2], [1, 1, 1, 1], "average", None, np.float32),
    ((1, 2, 11, 16), [5, 5], [3, 3], [2, 2, 2, 2], "lp", 2, np.float32),
    # rows cut along the axis before the last in one block with uncut ones, each with its
    # own input rows and divisor; rows whose window lies wholly in padding
    ((1, 2, 9, 9), [7, 7], [1, 1], [3, 3, 3, 3], "average", None, np.float32),
    ((1, 2, 4, 6, 6), [2, 3, 3], [1, 1, 1], [1, 1, 1, 1, 1, 1], "average", None, np.float32),
    ((1, 2, 5, 8), [2, 2], [1, 1], [3, 0, 3, 0], "average", None, np.float32),
    ((1, 2, 9, 9), [3, 3], [1, 1], [1, 1, 1, 1], "lp", 2, np.float32),
]


@pytest.mark.parametrize("shape,kernel,strides,pads,op,p,dtype", STRIDED_ROW_BLOCKS)
def test_strided_row_blocks_match_the_oracle(shape, kernel, strides, pads, op, p, dtype):
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 4).astype(dtype)
    x[..., ::5] = 2  # ties
    keywords = dict(strides=strides, pads=pads, **({} if p is None else {"p": p}))
    want, info = (oracle.average_pool if op == "average" else oracle.lp_pool)(
        x, kernel, **keywords)
    got = (poolfold.average_pool if op == "average" else poolfold.lp_pool)(x, kernel, **keywords)
    oracle.assert_within_bound(got, want, info, dtype, op)


@pytest.mark.parametrize(
    "shape,kernel,strides,op,p", WINDOW_SUM_PATHS,
    ids=[f"{op}-p{p}-{list(shape)}-k{kernel}-s{strides}"
         for shape, kernel, strides, op, p in WINDOW_SUM_PATHS])
def test_window_sum_paths_match_the_oracle(shape, kernel, strides, op, p):
    rng = np.random.default_rng(sum(shape) + (p or 0))
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x[..., ::7] = rng.integers(-3, 4, x[..., ::7].shape)  # exact ties and cancellations
    pads = [3, 5] if len(kernel) == 1 else [1, 2, 2, 1]
    keywords = dict(strides=strides, pads=pads, **({} if p is None else {"p": p}))
    base = op.removeprefix("nhwc.")
    want, info = (oracle.average_pool if base == "average" else oracle.lp_pool)(
        x, kernel, **keywords)
    if op.startswith("nhwc."):
        function = poolfold.nhwc.average_pool if base == "average" else poolfold.nhwc.lp_pool
        got = np.moveaxis(function(np.moveaxis(x, 1, -1).copy(), kernel, **keywords), -1, 1)
    else:
        function = poolfold.average_pool if base == "average" else poolfold.lp_pool
        got = function(x, kernel, **keywords)
    oracle.assert_within_bound(got, want, info, np.float32, base)
