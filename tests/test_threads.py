"""Thread safety, the POOLFOLD_NUM_THREADS setting and the POOLFOLD_STEER_THREADS one.

Calls from several Python threads at once must be safe and give the results of a single-threaded
call; the kernel thread count (POOLFOLD_NUM_THREADS) must not change any result, and an invalid
value warns (RuntimeWarning) and is ignored.  The scratch rows that threads write side by side
lie on cache lines of their own.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest

import poolfold
from poolfold.kernels import affinity, environment, threads
from poolfold.memory import LINE_BYTES, line_rows

THREADS = 4
ROUNDS = 10


def _inputs():
    rng = np.random.default_rng(42)
    x = rng.standard_normal((2, 4, 17, 15)).astype(np.float32)
    x[0, 1, 3:6, 3:6] = 1.5  # ties
    x[1, 2, 7, 7] = np.nan
    y, i = poolfold.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1], return_indices=True)
    # duplicates (overlapping windows share maxima): the last in row-major order must win
    dup = np.concatenate([i[:, :, :1], i[:, :, :-1]], axis=2)
    cols = rng.standard_normal((2, 3 * 6, 7 * 3)).astype(np.float32)
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return dict(x=x, y=y, i=i, dup=dup, cols=cols, x_nhwc=x_nhwc, shape=x.shape)


def _compute(d):
    pooled, indices = poolfold.max_pool(d["x"], [3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                        return_indices=True)
    so = poolfold.max_pool(d["x"], [2, 3], dilations=[2, 1], storage_order=1,
                           return_indices=True)[1]
    unpooled = poolfold.max_unpool(d["y"], d["i"], [3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                   output_shape=d["shape"])
    duplicates = poolfold.max_unpool(np.arange(d["y"].size, dtype=np.float64)
                                     .reshape(d["y"].shape), d["dup"], [3, 3], strides=[2, 2],
                                     pads=[1, 1, 1, 1], output_shape=d["shape"])
    folded = poolfold.col2im(d["cols"], [8, 5], [2, 3], dilations=[1, 1], strides=[1, 1])
    nhwc_y, nhwc_i = poolfold.nhwc.max_pool(d["x_nhwc"], [3, 3], strides=[2, 2],
                                            return_indices=True, activation="LeakyRelu",
                                            activation_params=[0.5])
    return dict(pooled=pooled, indices=indices, so=so, unpooled=unpooled,
                duplicates=duplicates, folded=folded, nhwc_y=nhwc_y, nhwc_i=nhwc_i)


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for key in want:
        g, w = got[key], want[key]
        assert g.dtype == w.dtype and g.shape == w.shape, key
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), key  # bit for bit, NaN too


def test_concurrent_calls_give_single_threaded_results():
    d = _inputs()
    reference = _compute(d)
    barrier = threading.Barrier(THREADS)

    def worker(_):
        barrier.wait(timeout=60)
        return [_compute(d) for _ in range(ROUNDS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS)))
    assert len(results) == THREADS
    for rounds in results:
        assert len(rounds) == ROUNDS
        for result in rounds:
            _assert_same(result, reference)


def test_concurrent_calls_with_different_shapes():
    """Different geometries at once (separate cached plans, different kernels)."""
    rng = np.random.default_rng(1)
    cases = [(rng.standard_normal((1, 3, 9 + k, 11)).astype(np.float32), [2 + k % 2, 2], k)
             for k in range(THREADS)]
    expected = [poolfold.max_pool(x, kernel, strides=[1 + k % 2, 1], return_indices=True)
                for x, kernel, k in cases]
    barrier = threading.Barrier(THREADS)

    def worker(index):
        x, kernel, k = cases[index]
        barrier.wait(timeout=60)
        return [poolfold.max_pool(x, kernel, strides=[1 + k % 2, 1], return_indices=True)
                for _ in range(ROUNDS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS)))
    for (want_y, want_i), rounds in zip(expected, results):
        for y, i in rounds:
            np.testing.assert_array_equal(y, want_y)
            np.testing.assert_array_equal(i, want_i)


# ------------------------------------------------------------------------------ POOLFOLD_NUM_THREADS

SCRIPT = r"""
import json, sys, warnings
import numpy as np
sys.path.insert(0, {tests!r})
import test_threads
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = test_threads._compute(test_threads._inputs())
np.savez(sys.argv[1], **result)
print(json.dumps([[w.category.__name__, str(w.message)] for w in caught
                  if "POOLFOLD_NUM_THREADS" in str(w.message)]))
"""


def _run_script(tmp_path, name, value):
    env = dict(os.environ)
    env.pop("POOLFOLD_NUM_THREADS", None)
    if value is not None:
        env["POOLFOLD_NUM_THREADS"] = value
    out = tmp_path / f"{name}.npz"
    script = SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    warned = json.loads(result.stdout.strip().splitlines()[-1])
    with np.load(out) as f:
        return {k: f[k] for k in f.files}, warned


def test_num_threads_setting_does_not_change_results(tmp_path):
    default, warned_default = _run_script(tmp_path, "default", None)
    one, warned_one = _run_script(tmp_path, "one", "1")
    assert warned_default == [] and warned_one == []
    _assert_same(one, default)
    _assert_same(default, _compute(_inputs()))  # and the same as in this process


def test_invalid_num_threads_warns_and_still_works(tmp_path):
    default, _ = _run_script(tmp_path, "default", None)
    bad, warned = _run_script(tmp_path, "bad", "abc")
    assert warned, "no warning for POOLFOLD_NUM_THREADS='abc'"
    assert all(category == "RuntimeWarning" for category, _ in warned)
    assert "abc" in warned[0][1]
    _assert_same(bad, default)


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_invalid_num_threads_in_process(monkeypatch, value):
    x = np.random.default_rng(3).standard_normal((1, 2, 6, 6)).astype(np.float32)
    monkeypatch.delenv("POOLFOLD_NUM_THREADS", raising=False)
    want = poolfold.max_pool(x, [2, 2], return_indices=True)
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", value)
    with pytest.warns(RuntimeWarning, match="POOLFOLD_NUM_THREADS"):
        got = poolfold.max_pool(x, [2, 2], return_indices=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("value", ["1", "2", "64"])
def test_valid_num_threads_in_process(monkeypatch, value):
    x = np.random.default_rng(4).standard_normal((2, 3, 9, 8)).astype(np.float32)
    monkeypatch.delenv("POOLFOLD_NUM_THREADS", raising=False)
    want = poolfold.max_pool(x, [3, 2], strides=[2, 1], return_indices=True)
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", value)  # 64: capped at numba's pool size
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = poolfold.max_pool(x, [3, 2], strides=[2, 1], return_indices=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_num_threads_is_read_afresh_each_call(monkeypatch):
    """kernel_threads keeps no copy of the setting: one made, changed, emptied or removed
    through os.environ counts from the next call."""
    numba_threads = threads._numba_threads()
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "1")
    assert threads.kernel_threads() == 1
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "2")
    assert threads.kernel_threads() == min(2, numba.config.NUMBA_NUM_THREADS)
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "")
    assert threads.kernel_threads() == numba_threads
    monkeypatch.delenv("POOLFOLD_NUM_THREADS")
    assert threads.kernel_threads() == numba_threads


@pytest.mark.parametrize("value", ["3", "", " 2 ", "é", "a=b"])
def test_environment_reads_what_os_environ_holds(monkeypatch, value):
    """The settings' reader (os.environ's own dict of bytes on POSIX) sees every write made
    through os.environ, as os.environ.get does: a value set, changed and removed."""
    name = "POOLFOLD_TEST_SETTING"
    monkeypatch.delenv(name, raising=False)
    assert environment.read(name) is None
    monkeypatch.setenv(name, value)
    assert environment.read(name) == os.environ.get(name) == value
    monkeypatch.setenv(name, value + "0")
    assert environment.read(name) == value + "0"
    monkeypatch.delenv(name)
    assert environment.read(name) is None


def test_unset_num_threads_follows_numba_once_its_layer_runs():
    """Unset, the count is NUMBA_NUM_THREADS until numba's threading layer starts, then
    numba.get_num_threads (what numba.set_num_threads set): in a child, as starting the layer
    here would change this process for the tests after."""
    script = ("import numba\n"
              "from poolfold.kernels import threads\n"
              "before = threads.kernel_threads()\n"
              "numba.set_num_threads(1)\n"
              "print(before, threads.kernel_threads())\n")
    env = {k: v for k, v in os.environ.items() if k != "POOLFOLD_NUM_THREADS"}
    env["NUMBA_NUM_THREADS"] = "2"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "1"]


# ---------------------------------------------------------------------------- POOLFOLD_STEER_THREADS

@pytest.fixture
def steering_read_afresh():
    """The steering setting is read once per process: read it again in the test, and after."""
    affinity.steering.cache_clear()
    yield
    affinity.steering.cache_clear()


def _masks_set_by_threaded_calls(monkeypatch, setting, cpus):
    """The affinity masks two threaded calls set, the process allowed ``cpus`` CPUs (faked:
    no thread's mask really changes)."""
    if setting is None:
        monkeypatch.delenv(affinity.ENV, raising=False)
    else:
        monkeypatch.setenv(affinity.ENV, setting)
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "2")
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 2)
    monkeypatch.setattr(affinity, "_STEERED", None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    masks = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, mask: masks.append(mask))
    for _ in range(2):  # the first call may be the one that starts the pool's thread
        threads.launch_split(lambda start, stop: None, 4)
    return masks


needs_affinity = pytest.mark.skipif(affinity._current_cpu_reader() is None,
                                    reason="needs Linux's CPU affinity calls")


@needs_affinity
@pytest.mark.parametrize("setting, cpus, steered", [
    ("1", 4, True),  # on, on any machine
    ("1", 2, True),
    ("0", 2, False),  # off, even where it was measured to help
    (None, 2, False),  # unset: off (opt-in), on the one machine shape measured as elsewhere
    (None, 4, False),
])
def test_steer_threads_setting(monkeypatch, steering_read_afresh, setting, cpus, steered):
    assert bool(_masks_set_by_threaded_calls(monkeypatch, setting, cpus)) == steered


@needs_affinity
def test_invalid_steer_threads_warns_and_means_unset(monkeypatch, steering_read_afresh):
    with pytest.warns(RuntimeWarning, match="POOLFOLD_STEER_THREADS"):
        masks = _masks_set_by_threaded_calls(monkeypatch, "yes", 2)
    assert not masks


def test_a_small_call_is_one_piece_per_thread_and_a_large_one_more():
    """Each piece is a Python call of the kernel, which holds the GIL while the others wait:
    pieces beyond one a thread only where each has MIN_WORK_PER_PIECE of work, and as many
    for every thread.  The pieces cover the range once, in order, whatever their count."""
    from poolfold.kernels import threads

    def pieces(start, stop):
        return (start, stop)

    def run(work):
        done = threads.launch_split(pieces, 100, work=work, parts=2)
        assert [p for piece in done for p in range(*piece)] == list(range(100))
        return len(done)

    assert run(threads.MIN_WORK_PER_PIECE) == 2  # one a thread
    assert run(None) == 2 * threads.PIECES_PER_THREAD  # work unknown: as many as ever
    assert run(100 * threads.MIN_WORK_PER_PIECE) == 2 * threads.PIECES_PER_THREAD
    # as many pieces a thread on each: 3 pieces on 2 threads would leave one two thirds
    assert run(3 * threads.MIN_WORK_PER_PIECE) == 2
    assert run(5 * threads.MIN_WORK_PER_PIECE) == 4


def test_a_split_must_take_enough_work_off_the_busiest_part():
    """The call waits for its busiest part: a split that takes less than MIN_WORK_PER_PART
    off it runs in the calling thread."""
    from poolfold.kernels.threads import MIN_WORK_PER_PART, split_parts

    # three planes on two threads: the busiest part keeps two thirds
    assert split_parts(3, 3 * MIN_WORK_PER_PART - 3, 2) == 1
    assert split_parts(3, 3 * MIN_WORK_PER_PART, 2) == 2
    assert split_parts(2, 2 * MIN_WORK_PER_PART, 2) == 2  # halves
    assert split_parts(64, 4 * MIN_WORK_PER_PART, 2) == 2
    assert split_parts(64, 4 * MIN_WORK_PER_PART, 4) == 4
    assert split_parts(5, 5 * MIN_WORK_PER_PART, 4) == 3  # 4 parts keep 2 of 5 as well
    assert split_parts(64, MIN_WORK_PER_PART, 2) == 1  # too little work for two parts


@pytest.mark.parametrize("rows, row_shape", [(1, (2,)), (16, (4,)), (5, (2, 3)), (3, (9,)),
                                             (4, (0,))])
def test_line_rows_give_each_work_item_cache_lines_of_its_own(rows, row_shape):
    """The per-item counters two threads write must never share a cache line."""
    scratch = line_rows(rows, *row_shape)
    assert scratch.shape == (rows, *row_shape) and scratch.dtype == np.int64
    starts = [scratch[r].__array_interface__["data"][0] for r in range(rows)]
    assert all(start % LINE_BYTES == 0 for start in starts)
    width = max(math.prod(row_shape), 1) * 8
    ends = [start + width for start in starts]
    # no row's bytes reach the line the next row starts on
    assert all(-(-end // LINE_BYTES) * LINE_BYTES <= nxt for end, nxt in zip(ends, starts[1:]))
    scratch[...] = np.arange(scratch.size).reshape(scratch.shape)
    assert np.array_equal(scratch.reshape(rows, -1), np.arange(scratch.size).reshape(rows, -1))
