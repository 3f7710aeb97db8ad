"""How kernels are launched and announced: the split of work among threads, and the one line
the command line prints when numba compiles a kernel rather than loading it from its cache."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from poolfold import kernels


@pytest.mark.parametrize("threads, count", [("1", 7), ("2", 7), ("2", 1), ("3", 2), ("2", 0)])
def test_launch_split_covers_the_range_once_in_contiguous_parts(monkeypatch, threads, count):
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", threads)
    parts = []
    lock = threading.Lock()

    def kernel(tag, start, stop):
        assert tag == "args first"
        with lock:
            parts.append((start, stop))

    kernels.launch_split(kernel, count, "args first")
    parts.sort()
    want = max(1, min(count, kernels.kernel_threads()))
    assert len(parts) == want
    assert parts[0][0] == 0 and parts[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # no gap, no overlap
    sizes = [stop - start for start, stop in parts]
    assert max(sizes) - min(sizes) <= 1  # even shares


@pytest.mark.parametrize("work, want", [
    (0, 1),
    (2 * kernels.MIN_WORK_PER_PART - 1, 1),  # too little for two parts: the calling thread
    (2 * kernels.MIN_WORK_PER_PART, 2),
    (3 * kernels.MIN_WORK_PER_PART, 3),
    (100 * kernels.MIN_WORK_PER_PART, 4),  # never more parts than threads
])
def test_launch_split_gives_each_part_enough_work(monkeypatch, work, want):
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "4")
    monkeypatch.setattr(kernels.numba.config, "NUMBA_NUM_THREADS", 4)
    parts = []
    lock = threading.Lock()

    def kernel(start, stop):
        with lock:
            parts.append((threading.get_ident(), start, stop))

    kernels.launch_split(kernel, 10, work=work)
    assert len(parts) == want == kernels.split_parts(10, work)
    assert sorted(p[1:] for p in parts)[0][0] == 0 and max(p[2] for p in parts) == 10
    if want == 1:
        assert parts[0][0] == threading.get_ident()  # no hand-off to the pool


@pytest.mark.parametrize("threads", ["1", "3"])
def test_launch_split_returns_what_each_part_returned_in_order(monkeypatch, threads):
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", threads)
    monkeypatch.setattr(kernels.numba.config, "NUMBA_NUM_THREADS", 3)

    def kernel(start, stop):
        return (start, stop)

    want = [(0, 6)] if threads == "1" else [(0, 2), (2, 4), (4, 6)]
    assert kernels.launch_split(kernel, 6) == want


def test_thread_count_follows_the_environment_as_it_changes(monkeypatch):
    monkeypatch.setattr(kernels.numba.config, "NUMBA_NUM_THREADS", 4)
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "3")
    assert kernels.kernel_threads() == 3
    os.environ["POOLFOLD_NUM_THREADS"] = "1"
    assert kernels.kernel_threads() == 1
    monkeypatch.delenv("POOLFOLD_NUM_THREADS")
    assert kernels.kernel_threads() == kernels._numba_threads()
    assert kernels._environment_value("POOLFOLD_NO_SUCH_VARIABLE") is None


def test_launch_split_raises_what_a_part_raises(monkeypatch):
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "2")

    def kernel(start, stop):
        if start > 0:
            raise ZeroDivisionError("second part")

    with pytest.raises(ZeroDivisionError, match="second part"):
        kernels.launch_split(kernel, 4)


CHILD = r"""
import numpy as np, poolfold
from poolfold import kernels
kernels.announce_compiles()
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
