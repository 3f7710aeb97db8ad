"""A threaded call's pieces run without the GIL (poolfold.kernels.native_split): every piece
once, on the spinning threads as well as the caller, what each returned in order, a kernel's
error raised in the caller, and calls that find the threads asleep, busy, or many at once."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from numba import njit

from poolfold.kernels import handoff, native_split, threads


@njit(nogil=True)
def _stamp(y, owners, start, stop):
    """Add i + 1 to y[i] over the piece, and mark each element with the piece's start."""
    for i in range(start, stop):
        y[i] += i + 1
        owners[i] = start


@njit(nogil=True)
def _count(y, start, stop):
    for i in range(start, stop):
        y[i] += 1
    return stop - start


@njit(nogil=True)
def _any_negative(x, start, stop):
    for i in range(start, stop):
        if x[i] < 0:
            return True
    return False


@njit(nogil=True)
def _raise_in_a_piece(y, bad, start, stop):
    for i in range(start, stop):
        if i == bad:
            raise IndexError("piece out of bounds")
        y[i] = 1


def _native_launch(kernel, count, *args, parts=2):
    """launch_split with a crew, after a plain call has compiled the kernel for ``args``;
    the crew, to check that it ran natively."""
    kernel(*args, 0, 0)
    crew = native_split.Crew()
    return threads.launch_split(kernel, count, *args, parts=parts, crew=crew), crew


@pytest.mark.parametrize("count", [2, 7, 64, 1001])
def test_every_piece_runs_once(count):
    y = np.zeros(count, np.int64)
    owners = np.full(count, -1, np.int64)
    results, crew = _native_launch(_stamp, count, y, owners)
    assert crew.address != 0  # the call ran natively
    assert np.array_equal(y, np.arange(1, count + 1))  # each element once
    starts = np.unique(owners)
    assert len(results) == len(starts) == min(count, 2 * threads.PIECES_PER_THREAD)
    assert results == [None] * len(results)


def test_results_in_piece_order_with_their_type():
    y = np.zeros(100, np.int64)
    results, crew = _native_launch(_count, 100, y)
    assert crew.returns == 0
    assert results == [100 * (p + 1) // 8 - 100 * p // 8 for p in range(8)]
    assert all(type(r) is int for r in results)
    x = np.ones(100)
    x[77] = -1
    found, crew = _native_launch(_any_negative, 100, x)
    assert crew.returns is False and found.count(True) == 1 and found[77 * 8 // 100] is True


def test_a_kernel_error_is_raised_in_the_caller():
    y = np.zeros(64, np.int64)
    _raise_in_a_piece(y, -1, 0, 64)
    crew = native_split.Crew()
    with pytest.raises(IndexError, match="piece out of bounds"):
        threads.launch_split(_raise_in_a_piece, 64, y, 50, parts=2, crew=crew)
    assert crew.address != 0
    y[:] = 0  # the threads serve the next call
    threads.launch_split(_raise_in_a_piece, 64, y, -1, parts=2, crew=crew)
    assert y.sum() == 64


def test_the_spinning_thread_takes_pieces():
    """The spinning thread claims pieces too (a thread asleep when a call comes is woken
    for the later ones, so the calls go on until it has joined twice: on a host whose cores
    are all busy, as under the bounds-checked child's compiles, it joined 2 calls in 30 s)."""
    pool = threads._spinning_pool()
    if pool is None or pool.workers < 1:
        pytest.skip("no spinning threads")
    y = np.zeros(2, np.int64)
    _count(y, 0, 0)
    crew = native_split.Crew()
    assert crew.resolve(_count, (y,))
    crew.cut((2, 2, None), 2, 2)
    bounds, results = crew.bounds, crew.results()
    joined, calls = 0, 0
    deadline = time.monotonic() + 60
    while joined < 2 and time.monotonic() < deadline:
        assert pool.run_native(native_split.run_pieces, bounds, results, 1, crew.address,
                               crew.returns, (y,)) == 0
        calls += 1
        # the 2 pieces, then one failed claim by each thread that joined
        joined += int(pool.flags[handoff.CLAIMS]) - 3
        time.sleep(1e-4)
    assert y.tolist() == [calls, calls]  # each piece once a call, whoever ran it
    assert joined == 2


def test_a_bound_launch_runs_natively_from_its_second_call(monkeypatch):
    """A launch's bound kernel (threads.BoundLaunch): its first threaded call goes through
    launch_split, which finds the kernel's native entry; the next ones go straight to the
    spinning threads with the pieces kept, and every call runs each piece once, on the
    arrays of that call."""
    if threads._spinning_pool() is None:
        pytest.skip("no spinning threads")
    through_python = []
    real = threads.launch_split

    def spy(*args, **options):
        through_python.append(args[0])
        return real(*args, **options)

    monkeypatch.setattr(threads, "launch_split", spy)
    owners = np.full(64, -1, np.int64)
    _stamp(np.zeros(64, np.int64), owners, 0, 0)  # compiled for these types
    bound = threads.BoundLaunch(_stamp, 64, (owners,), 2, None, native_split.Crew())
    for _ in range(5):
        y = np.zeros(64, np.int64)  # a new array each call, as a launch's Y
        owners[:] = -1
        bound(y)
        assert np.array_equal(y, np.arange(1, 65))
        assert len(np.unique(owners)) == 2 * threads.PIECES_PER_THREAD
    assert through_python == [_stamp]  # the first call only
    assert bound._native[1] is bound.crew.bounds


def test_a_bound_launch_raises_a_pieces_error_and_serves_the_next_call():
    if threads._spinning_pool() is None:
        pytest.skip("no spinning threads")
    y = np.zeros(64, np.int64)
    _raise_in_a_piece(y, -1, 0, 64)
    bad = np.zeros(1, np.int64)
    good = threads.BoundLaunch(_raise_in_a_piece, 64, (-1,), 2, None, native_split.Crew())
    good(y)
    good(y)
    assert good._native is not None and y.sum() == 64
    failing = threads.BoundLaunch(_raise_in_a_piece, 64, (50,), 2, None, good.crew)
    with pytest.raises(IndexError, match="piece out of bounds"):
        failing(bad.repeat(64))
    y[:] = 0
    good(y)  # the kept entry and pieces still serve
    assert y.sum() == 64


def test_a_one_part_bound_launch_calls_the_kernel_alone():
    y = np.zeros(10, np.int64)
    owners = np.full(10, -1, np.int64)
    bound = threads.BoundLaunch(_stamp, 10, (owners,), 1, None, native_split.Crew())
    bound(y)
    assert y.tolist() == list(range(1, 11)) and set(owners.tolist()) == {0}
    assert bound._native is None


def test_crew_waits_for_the_kernel_to_compile():
    @njit(nogil=True)
    def fresh(y, start, stop):
        for i in range(start, stop):
            y[i] = 2
    y = np.zeros(10)
    crew = native_split.Crew()
    assert not crew.resolve(fresh, (y,))  # not compiled for these types yet
    threads.launch_split(fresh, 10, y, parts=2, crew=crew)  # through Python: compiles it
    assert y.tolist() == [2] * 10
    assert crew.resolve(fresh, (y,))


def test_concurrent_callers_all_complete():
    errors = []

    def caller(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(30):
                count = int(rng.integers(2, 500))
                y = np.zeros(count, np.int64)
                owners = np.zeros(count, np.int64)
                _stamp(y, owners, 0, 0)
                threads.launch_split(_stamp, count, y, owners, parts=2,
                                     crew=native_split.Crew())
                assert np.array_equal(y, np.arange(1, count + 1))
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    workers = [threading.Thread(target=caller, args=(s,)) for s in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not any(w.is_alive() for w in workers)
    assert not errors


def test_calls_while_the_threads_sleep_between_them():
    """With a spin of a microsecond the threads are asleep at most calls: the caller runs
    the pieces without waiting for them, and wakes them for later calls."""
    script = """
import time
import numpy as np
from poolfold.kernels import native_split, threads
from numba import njit

@njit(nogil=True)
def kernel(y, start, stop):
    for i in range(start, stop):
        y[i] += 1

y = np.zeros(1000, np.int64)
kernel(y, 0, 0)
crew = native_split.Crew()
for n in range(300):
    threads.launch_split(kernel, 1000, y, parts=2, crew=crew)
    if n % 3 == 0:
        time.sleep(0.001)
threads.park_spinning_threads()
threads.launch_split(kernel, 1000, y, parts=2, crew=crew)
assert crew.address != 0
assert (y == 301).all(), y
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ,
                                            "POOLFOLD_SPIN_US": "1",
                                            "POOLFOLD_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@njit(nogil=True)
def _row_sums(x, y, start, stop):
    """A kernel that takes a view of each row (numba counts references on views)."""
    for i in range(start, stop):
        row = x[i]
        y[i] = row.sum()


def test_kernels_that_take_views_leave_the_arrays_as_they_were():
    """The threads call the kernel on the caller's arrays without their reference-counted
    owner: the results are right and no reference is kept or lost."""
    x = np.arange(64 * 5, dtype=np.float64).reshape(64, 5)
    y = np.zeros(64)
    _row_sums(x, y, 0, 0)
    counts = sys.getrefcount(x), sys.getrefcount(y)
    crew = native_split.Crew()
    for _ in range(100):
        y[:] = 0
        threads.launch_split(_row_sums, 64, x, y, parts=2, crew=crew)
        assert np.array_equal(y, x.sum(axis=1))
    assert crew.address != 0
    assert (sys.getrefcount(x), sys.getrefcount(y)) == counts


# ---------------------------------------------------------------- pieces on a host's threads

_HOST_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_int64)


class _Host:
    """A host's parallel-for as ``pf_parallel`` is one (poolfold.session_ops): calls
    ``entry(frame)`` on ``threads`` Python threads at once (ctypes lets the GIL go), and
    returns when all are done; it records each call's context and thread count."""

    def __init__(self):
        self.calls = []
        self.function = _HOST_TYPE(self._run)
        self.address = ctypes.cast(self.function, ctypes.c_void_p).value
        self._entry_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def _run(self, context, entry, frame, count):
        self.calls.append((context, count))
        run = self._entry_type(entry)
        workers = [threading.Thread(target=run, args=(frame,)) for _ in range(count)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()


def _hosted_launch(kernel, count, *args, parts=2):
    kernel(*args, 0, 0)  # compiled through Python first, as a crew needs
    host = _Host()
    crew = native_split.Crew()
    threads.HOSTED.host = (host.address, 1234)
    try:
        return threads.launch_split(kernel, count, *args, parts=parts, crew=crew), host
    finally:
        threads.HOSTED.host = None


@pytest.mark.parametrize("count", [2, 7, 1001])
def test_hosted_pieces_run_once_each(count):
    """Inside a host's call (one of poolfold's nodes in onnxruntime's session), a split call's
    pieces go to the host's threads, each piece once, and nothing of poolfold's own pool."""
    y = np.zeros(count, np.int64)
    owners = np.full(count, -1, np.int64)
    results, host = _hosted_launch(_stamp, count, y, owners, parts=3)
    assert host.calls == [(1234, 3)]
    assert np.array_equal(y, np.arange(1, count + 1))
    assert len(results) == len(np.unique(owners)) == min(count, 3 * threads.PIECES_PER_THREAD)


def test_hosted_results_in_piece_order():
    y = np.zeros(100, np.int64)
    results, host = _hosted_launch(_count, 100, y)
    assert len(host.calls) == 1
    assert results == [100 * (p + 1) // 8 - 100 * p // 8 for p in range(8)]
    assert all(type(r) is int for r in results)


def test_hosted_piece_that_raises_is_raised_in_the_caller():
    """A piece that raises flags the call, which runs again through Python and raises."""
    y = np.zeros(50, np.int64)
    _raise_in_a_piece(y, -1, 0, 0)
    host = _Host()
    threads.HOSTED.host = (host.address, 0)
    try:
        with pytest.raises(IndexError, match="piece out of bounds"):
            threads.launch_split(_raise_in_a_piece, 50, y, 31, parts=2,
                                 crew=native_split.Crew())
    finally:
        threads.HOSTED.host = None
    assert len(host.calls) == 1


def test_without_a_host_the_pool_runs_the_pieces():
    y = np.zeros(64, np.int64)
    owners = np.full(64, -1, np.int64)
    assert getattr(threads.HOSTED, "host", None) is None
    results, crew = _native_launch(_stamp, 64, y, owners)
    assert crew.address != 0 and np.array_equal(y, np.arange(1, 65))
