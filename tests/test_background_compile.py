"""A MaxPool kernel compiled in a child process while the direct scan stands in
(poolfold.kernels.background): the first call with an empty numba cache answers from the
stand-in, a later call loads the compiled kernel from the cache, both exact; the switch off
compiles in the process; and the queue of compiles, one child at a time.

The processes pool many small planes without Indices, which goes to the plane-lanes kernel
(max_plane_lanes): it goes through the same stand-in and queue as every kernel that has one,
and compiles in a few seconds, where the passes kernel with Indices takes about 20 (each of
these tests compiles it from an empty cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import oracle
from poolfold.kernels import background, sharing

POOL = dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])  # overlapping, padded
SHAPE = (1, 64, 7, 7)  # many small planes: the plane-lanes kernel

# A child with an empty numba cache: two calls, the background compile awaited, two more.
# It prints what ran each time and saves the results for the parent to check.
_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import poolfold
    from poolfold.kernels import background
    from poolfold.kernels.plane_lanes import max_plane_lanes as kernel

    x = np.load(sys.argv[1])
    pool = json.loads(sys.argv[2])
    report = {"stand_in": [], "cache_hits": 0, "cache_misses": 0}
    results = []
    for step in range(4):
        if step == 2:
            report["waited"] = background.wait(timeout=600)
        results.append(poolfold.max_pool(x, pool["kernel_shape"], strides=pool["strides"],
                                         pads=pool["pads"]))
        report["stand_in"].append(len(kernel.overloads) == 0)
    stats = kernel.stats
    report["cache_hits"] = sum(stats.cache_hits.values())
    report["cache_misses"] = sum(stats.cache_misses.values())
    np.savez(sys.argv[3], *results)
    print(json.dumps(report))
""")


def _run_child(tmp_path, cache, x, switch):
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), background.ENV: switch}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "x.npy"), json.dumps(POOL),
         str(tmp_path / "out.npz")],
        capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out.npz") as saved:
        arrays = [saved[f"arr_{i}"] for i in range(4)]
    return json.loads(done.stdout.strip().splitlines()[-1]), arrays


def _check_against_oracle(x, arrays):
    y, _ = oracle.max_pool(x, **POOL)
    for array in arrays:
        np.testing.assert_array_equal(array, y)


def test_the_direct_scan_stands_in_until_the_child_has_compiled(tmp_path):
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    x[0, 1, 4, 4] = np.nan
    cache = tmp_path / "numba-cache"
    report, arrays = _run_child(tmp_path, cache, x, "1")
    # The first two calls ran the direct scan; once the child was done, the calls loaded the
    # plane-lanes kernel from numba's cache, never compiling it in this process.
    assert report["stand_in"] == [True, True, False, False]
    assert report["waited"] is True
    assert report["cache_hits"] == 1 and report["cache_misses"] == 0
    _check_against_oracle(x, arrays)
    # A later process finds the kernel in the cache from its first call.
    report, arrays = _run_child(tmp_path, cache, x, "1")
    assert report["stand_in"] == [False] * 4
    assert report["cache_hits"] == 1 and report["cache_misses"] == 0
    _check_against_oracle(x, arrays)


def test_switched_off_the_first_call_compiles_the_kernel_itself(tmp_path):
    x = np.random.default_rng(6).standard_normal(SHAPE).astype(np.float32)
    report, arrays = _run_child(tmp_path, tmp_path / "numba-cache", x, "0")
    assert report["stand_in"] == [False] * 4
    assert report["cache_hits"] == 0 and report["cache_misses"] == 1
    _check_against_oracle(x, arrays)


# ----------------------------------------------------------------------- the queue, alone

class _IndexFile:
    def __init__(self):
        self.index = {}

    def _load_index(self):
        return self.index


class _Cache:
    def __init__(self):
        self._cache_file = _IndexFile()

    def _index_key(self, signature, codegen):
        return signature


class _Kernel:
    """What background.ready reads of a numba dispatcher: a fresh one per test."""

    def __init__(self):
        self.overloads = {}
        self._cache = _Cache()
        self.stats = types.SimpleNamespace(cache_path=None)  # where numba caches the kernel
        self.targetctx = self
        self.py_func = self._kernel

    @staticmethod
    def _kernel(value):  # pragma: no cover - never called
        return value

    def typeof_pyval(self, value):
        return type(value).__name__

    def codegen(self):
        return None


@pytest.fixture
def queue(monkeypatch):
    """background.ready with its children replaced by ``python -c CODE`` processes, CODE
    from ``started`` (default: exit 0), each start recorded."""
    monkeypatch.setenv(background.ENV, "1")
    monkeypatch.setattr(background, "_JOBS", {})
    monkeypatch.setattr(background, "_READY", set())
    started = []

    def start(job):
        code = queue.codes.pop(0) if queue.codes else "pass"
        started.append(job.signature)
        return subprocess.Popen([sys.executable, "-c", code])

    class Queue:
        codes: list[str] = []

    queue = Queue()
    queue.started = started
    monkeypatch.setattr(background, "_start", start)
    yield queue
    background.wait(timeout=60)


def test_one_child_at_a_time_in_the_order_asked(queue):
    kernel = _Kernel()
    queue.codes = ["import time; time.sleep(0.5)", "pass"]
    assert background.ready(kernel, (1,)) is False
    assert queue.started == []  # not before the caller's stand-in has run
    background.start_queued()
    assert queue.started == [("int",)]
    assert background.ready(kernel, ("a",)) is False
    background.start_queued()  # queued behind the first
    assert queue.started == [("int",)]
    assert background.wait(timeout=60) is True
    assert queue.started == [("int",), ("str",)]
    assert background.ready(kernel, (1,)) is True
    assert background.ready(kernel, ("a",)) is True


def test_a_failed_child_lets_the_call_compile_in_the_process(queue):
    kernel = _Kernel()
    queue.codes = ["raise SystemExit(3)"]
    assert background.ready(kernel, (1.5,)) is False
    background.start_queued()
    background.wait(timeout=60)
    assert background.ready(kernel, (1.5,)) is True


def test_a_stuck_child_is_stopped_and_the_call_compiles_in_the_process(queue, monkeypatch):
    kernel = _Kernel()
    queue.codes = ["import time; time.sleep(60)"]
    assert background.ready(kernel, (7,)) is False
    background.start_queued()
    process = background._JOBS[next(iter(background._JOBS))].process
    monkeypatch.setattr(background, "CHILD_LIMIT_S", 0.0)
    assert background.ready(kernel, (7,)) is True
    assert process.returncode is not None  # killed, not left running


def test_a_signature_compiled_here_or_cached_is_ready_at_once(queue):
    kernel = _Kernel()
    kernel.overloads[("int",)] = object()
    kernel._cache._cache_file.index[("str",)] = "kernel-1.nbc"
    assert background.ready(kernel, (2,)) is True
    assert background.ready(kernel, ("b",)) is True
    assert queue.started == []


def test_unreadable_cache_internals_mean_compile_here(queue):
    kernel = _Kernel()
    del kernel._cache  # as with a numba whose cache looks different
    assert background.ready(kernel, (2,)) is True
    assert queue.started == []


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("no", False),
                                       ("1", True), ("", True)])
def test_the_switch(monkeypatch, value, on):
    monkeypatch.setenv(background.ENV, value)
    assert background.enabled() is on


def _hold_lock(kernel, signature):
    """Take the signature's compile lock as another process's child would (flock locks of
    two open files conflict within one process too)."""
    import fcntl

    handle = open(sharing.lock_path(kernel, signature), "w")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_a_signature_another_process_compiles_starts_no_child(queue, tmp_path):
    kernel = _Kernel()
    kernel.stats.cache_path = str(tmp_path)
    held = _hold_lock(kernel, ("int",))
    assert background.ready(kernel, (1,)) is False
    background.start_queued()
    assert queue.started == []  # the other process compiles it: the stand-in answers
    assert background.pending() == 1
    kernel._cache._cache_file.index[("int",)] = "kernel-1.nbc"  # ...and has cached it
    assert background.pending() == 0
    assert background.wait(timeout=10) is True
    assert background.ready(kernel, (1,)) is True
    assert queue.started == []
    held.close()


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_a_lock_left_without_the_kernel_is_taken_over(queue, tmp_path):
    kernel = _Kernel()
    kernel.stats.cache_path = str(tmp_path)
    held = _hold_lock(kernel, ("int",))
    assert background.ready(kernel, (1,)) is False
    background.start_queued()
    assert background.ready(kernel, ("a",)) is False  # not held: queued behind nothing
    background.start_queued()
    assert queue.started == [("str",)]
    held.close()  # the other process's child ended without caching the kernel
    assert background.wait(timeout=60) is True
    assert queue.started == [("str",), ("int",)]
    assert background.ready(kernel, (1,)) is True


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_our_child_holds_the_lock_until_it_ends(tmp_path, monkeypatch):
    """The real start: the child inherits the locked descriptor, and the lock is free once
    it exits, whatever its end."""
    monkeypatch.setenv(background.ENV, "1")
    monkeypatch.setattr(background, "_JOBS", {})
    monkeypatch.setattr(background, "_READY", set())
    kernel = _Kernel()
    kernel.stats.cache_path = str(tmp_path)
    job = background._Job(kernel, ("int",))
    job.lock = background._claim(job)
    assert job.lock is not None and job.lock >= 0
    process = background._start(job)  # a child that cannot import this fake kernel: it
    os.close(job.lock)                  # starts Python, fails and exits
    assert background._claim(background._Job(kernel, ("int",))) is None  # the child holds it
    process.wait(timeout=60)
    again = background._claim(background._Job(kernel, ("int",)))
    assert again is not None and again >= 0
    os.close(again)
