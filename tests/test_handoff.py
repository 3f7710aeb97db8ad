"""The spinning threads that take a call's parts (poolfold.kernels.handoff): every part run
once, results in order, errors raised in the caller, concurrent callers served, the setting."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from poolfold.kernels import handoff, threads


def _ranges(parts: int, count: int):
    """launch_split of a Python stand-in kernel: the ranges each piece got, in order."""
    seen = []

    def kernel(tag, start, stop):
        seen.append((start, stop))
        return (tag, start, stop)

    results = threads.launch_split(kernel, count, "t", parts=parts)
    return results, seen


@pytest.mark.parametrize("count", [2, 7, 64, 1000])
def test_every_piece_runs_once_and_results_keep_their_order(count):
    results, seen = _ranges(2, count)
    assert [r[1:] for r in results] == sorted(seen)
    covered = [i for start, stop in seen for i in range(start, stop)]
    assert sorted(covered) == list(range(count))  # each index once


def test_a_pool_thread_error_is_raised_in_the_caller():
    pool = handoff.SpinningPool(1, 100)
    calls = []

    def job():
        calls.append(threading.current_thread().name)
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("from the pool")
        return ["main"]

    with pytest.raises(ValueError, match="from the pool"):
        pool.run(job, 1)
    assert len(calls) == 2
    assert pool.run(lambda: ["again"], 1) == [["again"], ["again"]]  # the pool still serves


def test_threads_left_out_run_nothing():
    pool = handoff.SpinningPool(2, 100)
    ran = []

    def job():
        ran.append(threading.current_thread().name)
        return [len(ran)]

    results = pool.run(job, 1)
    assert len(ran) == 2 and results[1] == []  # the caller and one helper, not the second


def test_a_sleeping_thread_is_woken_for_the_next_call():
    pool = handoff.SpinningPool(1, 1)  # spins a microsecond, then sleeps
    time.sleep(0.05)
    assert pool.sleepers == 1
    names = pool.run(lambda: [threading.current_thread().name], 1)
    assert names[0] == ["poolfold-spin-0"] and names[1] == [threading.main_thread().name]


@pytest.mark.parametrize("native", [True, False])
def test_spun_out_threads_sleep_where_the_platform_lets_them(monkeypatch, native):
    """On Linux the threads sleep in their compiled loop, on the call counter's futex, and
    wake without the GIL; elsewhere (or told so) on a condition variable in Python.  Either
    way every call after they fell asleep, Python job or native, is served."""
    if native and not handoff.NATIVE_SLEEP:
        pytest.skip("the threads sleep in Python on this platform")
    monkeypatch.setattr(handoff, "NATIVE_SLEEP", native)
    pool = handoff.SpinningPool(2, 1)  # spins a microsecond, then sleeps
    deadline = time.monotonic() + 10
    while pool.sleepers < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert int(pool.flags[handoff.SLEEPERS]) == (2 if native else 0)
    assert pool.python_sleepers == (0 if native else 2)
    for n in range(300):  # each call finds the threads asleep, or falling asleep
        names = pool.run(lambda: [threading.current_thread().name], 2)
        assert sorted(name for [name] in names[:2]) == ["poolfold-spin-0", "poolfold-spin-1"]
        if n % 50 == 0:
            pool.park()


def test_publish_wakes_only_where_a_thread_sleeps():
    """publish_call stores the call; the futex is woken only when a sleeper is counted (a
    call with none asleep makes no system call), and a stray wake-up is harmless."""
    flags = np.zeros(handoff.DONE + handoff._LINE, np.int64)
    handoff.publish_call(flags, 6)
    assert flags[handoff.CALL] == 6
    flags[handoff.SLEEPERS] = 1  # a sleeper counted but not waiting: the wake finds none
    handoff.publish_call(flags, 8)
    assert flags[handoff.CALL] == 8


def test_parked_threads_sleep_at_once_and_serve_the_next_call():
    """park() ends the spin of threads that would spin for a minute: they sleep (counted in
    ``sleepers``) without running anything, and the next call wakes them."""
    pool = handoff.SpinningPool(2, 60_000_000)
    ran = []

    def job():
        ran.append(threading.current_thread().name)
        return [len(ran)]

    def park_and_wait_for_sleepers():
        pool.park()
        deadline = time.monotonic() + 10
        while pool.sleepers < 2 and time.monotonic() < deadline:
            time.sleep(0.001)

    try:
        pool.run(job, 2)
        assert pool.sleepers == 0  # spinning for the next call
        park_and_wait_for_sleepers()
        assert pool.sleepers == 2
        assert len(ran) == 3  # the park ran no job
        results = pool.run(job, 2)
        assert sorted(r[0] for r in results) == [4, 5, 6]
        assert len({name for name in ran[3:]}) == 3  # both threads and the caller
    finally:
        # Left spinning, the two threads would burn a core each for a minute, beside the
        # tests that run after this one in the same process.
        park_and_wait_for_sleepers()


def test_a_call_while_another_holds_the_threads_is_refused():
    pool = handoff.SpinningPool(1, 100)
    inside, release = threading.Event(), threading.Event()
    answers = []

    def slow():
        if threading.current_thread() is threading.main_thread():
            return []
        inside.set()
        release.wait(5)
        return []

    caller = threading.Thread(target=lambda: answers.append(pool.run(slow, 1)))
    caller.start()
    assert inside.wait(5)
    assert pool.run(lambda: [], 1) is None  # busy: launch_split uses the sleeping pool
    release.set()
    caller.join(5)
    assert answers == [[[], []]]


def test_concurrent_launches_all_complete():
    """Four Python threads splitting calls at once: one holds the spinning threads, the
    others go to the sleeping pool; every call gets all of its pieces."""
    errors = []

    def caller(seed):
        try:
            for i in range(50):
                count = 3 + (seed * 7 + i) % 40
                results, seen = _ranges(2, count)
                assert sorted(i for a, b in seen for i in range(a, b)) == list(range(count))
        except BaseException as error:  # reported below
            errors.append(error)

    callers = [threading.Thread(target=caller, args=(s,)) for s in range(4)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(60)
    assert not errors


def test_numba_kernel_parts_run_in_parallel_with_the_same_result():
    from numba import njit

    @njit(nogil=True)
    def fill(out, start, stop):
        for i in range(start, stop):
            out[i] = i * 2.0

    out = np.zeros(10_000)
    threads.launch_split(fill, out.size, out, parts=2)
    assert np.array_equal(out, np.arange(10_000) * 2.0)


@pytest.mark.parametrize("value, spin", [("", handoff.DEFAULT_SPIN_US), ("0", 0), ("250", 250)])
def test_spin_setting(monkeypatch, value, spin):
    monkeypatch.setenv(handoff.ENV, value)
    assert handoff.spin_microseconds() == spin


@pytest.mark.parametrize("value", ["-1", "fast", "1.5"])
def test_invalid_spin_setting_warns(monkeypatch, value):
    monkeypatch.setenv(handoff.ENV, value)
    with pytest.warns(RuntimeWarning, match=handoff.ENV):
        assert handoff.spin_microseconds() == handoff.DEFAULT_SPIN_US


def test_no_spinning_threads_with_spin_zero():
    script = (
        "import numpy as np, threading, poolfold\n"
        "from poolfold.kernels import threads\n"
        "x = np.random.default_rng(0).random((2, 8, 300, 300), np.float32)\n"
        "y = poolfold.max_pool(x, [3, 3], strides=[2, 2])\n"
        "assert threads._spinning_pool() is None\n"
        "assert not [t for t in threading.enumerate() if t.name.startswith('poolfold-spin')]\n"
        "print('ok')\n")
    env = {**__import__("os").environ, handoff.ENV: "0", "POOLFOLD_NUM_THREADS": "2",
           "POOLFOLD_BACKGROUND_COMPILE": "0"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
