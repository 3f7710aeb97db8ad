"""How kernels are launched and announced: the split of work among threads, and the one line
the command line prints when numba compiles a kernel rather than loading it from its cache."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numba
import numpy as np
import pytest

import oracle
import poolfold
from poolfold.kernels import affinity, threads


@pytest.mark.parametrize("num_threads, count", [("1", 7), ("2", 7), ("2", 1), ("3", 2), ("2", 0),
                                               ("2", 100)])
def test_launch_split_covers_the_range_once_in_contiguous_pieces(monkeypatch, num_threads, count):
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", num_threads)
    pieces = []
    lock = threading.Lock()

    def kernel(tag, start, stop):
        assert tag == "args first"
        with lock:
            pieces.append((start, stop, threading.get_ident()))

    threads.launch_split(kernel, count, "args first")
    pieces.sort()
    parts = max(1, min(count, threads.kernel_threads()))
    want = 1 if parts == 1 else min(count, parts * threads.PIECES_PER_THREAD)
    assert len(pieces) == want
    assert len({thread for _, _, thread in pieces}) <= parts
    assert pieces[0][0] == 0 and pieces[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))  # no gap, no overlap
    sizes = [stop - start for start, stop, _ in pieces]
    assert max(sizes) - min(sizes) <= 1  # even shares


@pytest.mark.parametrize("work, want", [
    (0, 1),
    (2 * threads.MIN_WORK_PER_PART - 1, 1),  # too little for two parts: the calling thread
    (2 * threads.MIN_WORK_PER_PART, 2),
    (3 * threads.MIN_WORK_PER_PART, 3),
    (100 * threads.MIN_WORK_PER_PART, 4),  # never more parts than threads
])
def test_launch_split_gives_each_part_enough_work(monkeypatch, work, want):
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "4")
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 4)
    pieces = []
    lock = threading.Lock()

    def kernel(start, stop):
        with lock:
            pieces.append((threading.get_ident(), start, stop))

    threads.launch_split(kernel, 100, work=work)
    assert threads.split_parts(100, work) == want
    # more than one piece a thread only where each piece has MIN_WORK_PER_PIECE of work
    most = max(want, min(want * threads.PIECES_PER_THREAD, work // threads.MIN_WORK_PER_PIECE))
    assert len(pieces) == (1 if want == 1 else most)
    assert len({p[0] for p in pieces}) <= want
    assert min(p[1] for p in pieces) == 0 and max(p[2] for p in pieces) == 100
    if want == 1:
        assert pieces[0][0] == threading.get_ident()  # no hand-off to the pool


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_row_kernel_splits_a_single_plane_across_threads(channels_last):
    """One plane (or one channels-last sample) of many output rows: the row kernel's work
    items are ranges of its rows, as many parts as the work allows, the values unchanged."""
    from poolfold.ops import max_pool as module

    spec = poolfold.schema.resolve("MaxPool", None)
    x = np.random.default_rng(0).standard_normal((1, 1, 600, 600)).astype(np.float32)
    plan = module.resolve_plan(spec, x.shape, [5, 5], [3, 3], None, None, "NOTSET", False)
    want = oracle.max_pool(x, [5, 5], strides=[3, 3])[0]
    if channels_last:
        launch = module._ChannelsLastLaunch(spec.label, 1, 1, x.dtype, plan, False, 0, None,
                                            2)
        tables, y = launch.tables, launch(np.moveaxis(x, 1, -1).copy())[0]
        y = np.moveaxis(y, -1, 1)
    else:
        launch = module._PoolLaunch(spec.label, (1, 1), x.dtype, plan, False, 0, None, -1, 2)
        tables, y = launch.rows, launch(x)[0]
    assert launch.kernel == "rows" and tables.items > 1 and launch.parts == 2
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("num_threads", ["1", "3"])
def test_launch_split_returns_what_each_piece_returned_in_order(monkeypatch, num_threads):
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", num_threads)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 3)

    def kernel(start, stop):
        return (start, stop)

    want = [(0, 6)] if num_threads == "1" else [(i, i + 1) for i in range(6)]
    assert threads.launch_split(kernel, 6) == want


def test_a_slow_thread_takes_fewer_pieces(monkeypatch):
    """The pieces are claimed in turn: while the calling thread is held up in its first piece,
    the pool's thread runs all the others."""
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "2")
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    caller = threading.get_ident()
    ran = []

    def kernel(start, stop):
        ran.append(threading.get_ident())
        time.sleep(0.3 if threading.get_ident() == caller else 0.001)
        return start

    assert threads.launch_split(kernel, 8) == list(range(8))
    assert ran.count(caller) == 1 and len(ran) == 8


@pytest.mark.skipif(affinity._current_cpu_reader() is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux's CPU affinity calls and two allowed CPUs")
def test_pool_threads_are_kept_off_the_callers_cpu(monkeypatch, request):
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "2")
    monkeypatch.setenv(affinity.ENV, "1")
    monkeypatch.setattr(affinity, "_STEERED", None)
    affinity.steering.cache_clear()
    request.addfinalizer(affinity.steering.cache_clear)  # the next test reads its own setting
    for _ in range(2):  # the first call may be the one that starts the pool's thread
        threads.launch_split(lambda start, stop: None, 4)
    steered_from, steered = affinity._STEERED
    assert steered_from in os.sched_getaffinity(0)
    assert steered == len(affinity._WORKERS) >= 1
    for worker in affinity._WORKERS:
        assert os.sched_getaffinity(worker) == os.sched_getaffinity(0) - {steered_from}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_threaded_calls_on_a_pool_of_its_own(monkeypatch):
    """A forked child has none of its parent's pool threads: its first threaded call starts
    a pool of its own instead of waiting forever on the parent's."""
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "2")
    threads.launch_split(lambda start, stop: None, 4)  # the parent's pool is running
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        status = 1
        try:
            done = threads.launch_split(lambda start, stop: (start, stop), 4)
            status = 0 if done == [(i, i + 1) for i in range(4)] else 1
        finally:
            os._exit(status)
    deadline = time.monotonic() + 60
    while True:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's threaded call never finished")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0


def test_launch_split_raises_what_a_part_raises(monkeypatch):
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "2")

    def kernel(start, stop):
        if start > 0:
            raise ZeroDivisionError("second part")

    with pytest.raises(ZeroDivisionError, match="second part"):
        threads.launch_split(kernel, 4)


CHILD = r"""
import numpy as np, poolfold
from poolfold.kernels import notices
notices.announce_compiles()
x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
i = np.array([[[[5, 7], [13, 15]]]])
poolfold.max_unpool(np.ones((1, 1, 2, 2), np.float32), i, [2, 2], strides=[2, 2])
poolfold.max_unpool(np.ones((1, 1, 2, 2), np.float32), i, [2, 2], strides=[2, 2])
"""


def test_compiles_are_announced_once_and_cached_kernels_not(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def stderr_lines():
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stderr.strip().splitlines()

    first = stderr_lines()
    assert first == ["poolfold: compiling the scatter_planes kernel for float32 data: once, "
                     "numba caches it for later runs"]
    assert stderr_lines() == []  # a later process loads it from the cache
