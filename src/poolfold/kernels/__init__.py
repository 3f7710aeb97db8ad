"""numba kernels: plain loops over planes, one module per kind of work. They never validate.

Kernels are serial and compiled with ``nogil=True``.  A kernel that works on many planes (or
elements) takes a ``[start, stop)`` range of them as its last two arguments, and
:func:`launch_split` runs it over one contiguous part per thread, from a pool of Python
threads: numba releases the GIL inside such kernels, so the parts run in parallel.  Serial
kernels compile several times faster than ``parallel=True`` ones (numba's parfors passes and
the outlined loop body cost most of a first call), and the pool needs no numba threading
layer, whose default (workqueue) aborts the process when two Python threads run parallel
kernels at once.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numba
from numba.core import event
from numba.np.ufunc import parallel as _numba_parallel  # imported by numba itself already

# The decorator of a kernel's helpers, which only other kernels call: numba then builds none
# of the wrappers that let Python call a compiled function (argument unboxing and a C entry
# point), less code for LLVM to optimise on a first call (measured: 10-20% of the MaxPool
# kernels' first compile).
helper = numba.njit(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def kernel_threads() -> int:
    """``POOLFOLD_NUM_THREADS`` if set (capped at numba's thread count), else numba's setting.

    Read on every call (a bad value warns whatever the call's size); its parse is kept per
    text, as a model asks this several times a run."""
    value = _environment_value("POOLFOLD_NUM_THREADS")
    if not value:
        return _numba_threads()
    wanted = _parse_threads(value)
    if wanted is None:
        warnings.warn(f"POOLFOLD_NUM_THREADS={value!r} is not a positive integer; ignored",
                      RuntimeWarning, stacklevel=3)
        return _numba_threads()
    return min(wanted, numba.config.NUMBA_NUM_THREADS)


def _environment_value(name: str) -> str | None:
    """``os.environ.get(name)``, which costs more than a small kernel when the variable is
    unset (its KeyError is raised and caught each time): on POSIX the environment's own
    dictionary of encoded names is read instead, where Python keeps it."""
    data = getattr(os.environ, "_data", None)
    if os.name != "posix" or not isinstance(data, dict):
        return os.environ.get(name)
    value = data.get(os.fsencode(name))
    return None if value is None else os.fsdecode(value)


@functools.lru_cache(maxsize=16)
def _parse_threads(value: str) -> int | None:
    try:
        wanted = int(value)
    except ValueError:
        return None
    return wanted if wanted >= 1 else None


def _numba_threads() -> int:
    """numba's thread count: what ``numba.set_num_threads`` set, if anything started numba's
    threading layer (asking would start it, a cost poolfold's kernels do not need)."""
    if _numba_parallel._is_initialized:
        return numba.get_num_threads()
    return numba.config.NUMBA_NUM_THREADS


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _WORKERS.clear()
            _POOL = ThreadPoolExecutor(max(1, numba.config.NUMBA_NUM_THREADS - 1),
                                       thread_name_prefix="poolfold",
                                       initializer=_register_worker)
        return _POOL


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    global _POOL, _STEERED
    _POOL = None
    _WORKERS.clear()
    _STEERED = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


# Keeping the pool's threads off the caller's core (Linux).  A woken thread is placed on the
# core of the thread that woke it when the scheduler finds that cheap, and then the two halves
# of a call run one after the other on one core while the other idles, until the scheduler's
# next balancing tick moves one (measured: a third of the calls of a 3 ms MaxPool took twice
# as long, in runs of several, their threads sharing one core).  So the pool's threads may run
# on every core allowed but the one the caller runs on when it hands them work; the mask is
# set again only when the caller has moved or the pool has grown, and never pins a thread to
# one core.
_WORKERS: list[int] = []  # the pool threads' native ids (the pool starts them as it needs)
_STEERED: tuple[int, int] | None = None  # (the caller's core left out, workers steered)


def _register_worker() -> None:
    _WORKERS.append(threading.get_native_id())


@functools.lru_cache(maxsize=1)
def _current_cpu_reader():
    """The C library's ``sched_getcpu``, or None (found on the first threaded call: importing
    ctypes would add to every process's start-up)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        import ctypes

        reader = ctypes.CDLL(None, use_errno=True).sched_getcpu
        reader.restype = ctypes.c_int
        return reader if reader() >= 0 else None
    except (OSError, AttributeError):  # no such call in this C library
        return None


def _steer_workers() -> None:
    """Let the pool's threads run anywhere allowed but on the calling thread's core."""
    global _STEERED
    current_cpu = _current_cpu_reader()
    if current_cpu is None:
        return
    cpu = current_cpu()
    steered = (cpu, len(_WORKERS))
    if steered == _STEERED or cpu < 0:
        return
    try:
        allowed = os.sched_getaffinity(0) - {cpu}
        if allowed:
            for worker in _WORKERS[:steered[1]]:
                os.sched_setaffinity(worker, allowed)
    except OSError:  # a worker that has gone, or a mask the system refuses: leave them be
        return
    _STEERED = steered


class _CompileNotices(event.Listener):
    """A numba compile-event listener: one line per poolfold kernel that numba compiles
    (a cache miss) rather than loads from its cache, for the outermost kernel only."""

    def __init__(self):
        self.stream = None  # None: whatever sys.stderr is when a line is written
        self._depth = threading.local()

    def on_start(self, ev):
        depth = getattr(self._depth, "value", 0)
        self._depth.value = depth + 1
        function = ev.data["dispatcher"].py_func
        if depth == 0 and function.__module__.startswith(__name__):
            types = [str(getattr(t, "dtype", t)) for t in ev.data["args"][:1]]
            self._write(f"poolfold: compiling the {function.__name__} kernel for "
                        f"{', '.join(types)} data: once, numba caches it for later runs")

    def on_end(self, ev):
        # A compile already under way when the listener was registered ends unseen.
        self._depth.value = max(0, getattr(self._depth, "value", 0) - 1)

    def _write(self, line: str) -> None:
        try:
            print(line, file=self.stream if self.stream is not None else sys.stderr, flush=True)
        except (OSError, ValueError):  # a closed or broken stream must not fail the compile
            pass


_NOTICES: _CompileNotices | None = None


def announce_compiles(stream=None) -> None:
    """From now on, say on ``stream`` (default: the current stderr) whenever a kernel is being
    compiled.  Calling it again only changes the stream: one line per compile, however often
    it is called."""
    global _NOTICES
    with _POOL_LOCK:
        if _NOTICES is None:
            _NOTICES = _CompileNotices()
            event.register("numba:compile", _NOTICES)
        _NOTICES.stream = stream


def announce(line: str) -> None:
    """Write ``line`` where compiles are announced (:func:`announce_compiles`), if anywhere."""
    if _NOTICES is not None:
        _NOTICES._write(line)


def launch(kernel, *args):
    """Run the serial ``kernel(*args)`` in the calling thread."""
    return kernel(*args)


# The least work (elements a kernel reads and writes) worth a part of its own.  Handing a part
# to a pool thread and waiting for it costs far more than the few microseconds of the hand-off
# itself where the cores are virtual: a pool thread that has gone idle waits for its core to be
# woken.  Measured on a quiet 2-core virtual machine, MaxPool 3x3 / 2x2 on batch-1 inputs of
# 100 Ki to 1.6 Mi elements, one thread against two: two took 1.2-2.3x as long up to about
# 400 Ki elements of work ((1,64,56,56) 3x3 stride 2: 0.28 against 0.40-0.59 ms), broke even
# near 1 Mi and won from there ((1,128,112,112): 0.88-1.2 against 1.45-1.54 ms).  So a call
# is split only where each part gets at least this much.
MIN_WORK_PER_PART = 2**18

# Pieces per thread of a threaded call (see launch_split): each costs a kernel call (3 us for
# the MaxPool kernels' 21 arguments) and they let the threads even out a slow core.
PIECES_PER_THREAD = 4


def split_parts(count: int, work: int | None = None, threads: int | None = None) -> int:
    """How many parts :func:`launch_split` runs ``count`` planes (or elements) in, on
    ``threads`` threads (default: :func:`kernel_threads`)."""
    if threads is None:
        threads = kernel_threads()  # every call: a bad POOLFOLD_NUM_THREADS warns at any size
    if count <= 1 or (work is not None and work < 2 * MIN_WORK_PER_PART):
        return 1
    parts = min(count, threads)
    return max(1, parts if work is None else min(parts, work // MIN_WORK_PER_PART))


def launch_split(kernel, count: int, *args, work: int | None = None,
                 parts: int | None = None) -> list:
    """Run ``kernel(*args, start, stop)`` over ``[0, count)`` on ``parts`` threads (poolfold's
    thread count), the calling thread one of them; what each piece returned, in order.

    A threaded call is cut into :data:`PIECES_PER_THREAD` contiguous pieces per thread, which
    the threads claim in turn: a thread that runs slower (its core taken by another process,
    or by the host of a virtual machine) takes fewer pieces, where with one fixed half per
    thread the call waited for the slow half.

    ``work`` (elements the call reads and writes, if the caller knows it) caps the parts so
    each has at least :data:`MIN_WORK_PER_PART`: a small call runs in the calling thread.
    ``parts``: what :func:`split_parts` already gave the caller, to not ask twice."""
    if parts is None:
        parts = split_parts(count, work)
    if parts == 1:
        return [kernel(*args, 0, count)]
    pieces = min(count, parts * PIECES_PER_THREAD)
    bounds = [count * i // pieces for i in range(pieces + 1)]
    claims = itertools.count()  # next() on it is atomic: each piece is claimed once

    def run_pieces() -> list:
        done = []
        while True:
            piece = next(claims)
            if piece >= pieces:
                return done
            done.append((piece, kernel(*args, bounds[piece], bounds[piece + 1])))

    pool = _pool()
    _steer_workers()
    futures = [pool.submit(run_pieces) for _ in range(parts - 1)]
    try:
        done = run_pieces()
    finally:
        theirs = [future.result() for future in futures]  # all waited for, even on an error
    for pieces_done in theirs:
        done += pieces_done
    return [result for _, result in sorted(done, key=lambda d: d[0])]
