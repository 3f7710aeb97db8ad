"""How many threads a kernel runs on, and the pool of Python threads that runs it.

A kernel that works on many planes (or elements) takes a ``[start, stop)`` range of them as
its last two arguments, and :func:`launch_split` runs it over contiguous parts of the range,
the calling thread one of the threads: numba releases the GIL inside such kernels, so the
parts run in parallel.  The other threads spin a while between calls (:mod:`.handoff`), or,
with ``POOLFOLD_SPIN_US=0`` or while another call holds those, are a sleeping pool's.  A
launch that passes a :class:`~.native_split.Crew` has its pieces run without the GIL
(:mod:`.native_split`).  Serial kernels compile several times faster than
``parallel=True`` ones (numba's parfors passes and the outlined loop body cost most of a
first call), and the pool needs no numba threading layer, whose default (workqueue) aborts
the process when two Python threads run parallel kernels at once.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba.np.ufunc import parallel as _numba_parallel

from . import affinity, environment, handoff, native_split

_POOL: ThreadPoolExecutor | None = None
_SPINNING: handoff.SpinningPool | bool | None = None  # False: POOLFOLD_SPIN_US=0
_POOL_LOCK = threading.Lock()


def kernel_threads() -> int:
    """``POOLFOLD_NUM_THREADS`` if set (capped at numba's thread count), else numba's setting.

    Read on every call (a bad value warns whatever the call's size; read as
    :mod:`.environment` says, at a third of ``os.environ``'s cost); its parse is kept per
    text, as a model asks this several times a run."""
    value = environment.read("POOLFOLD_NUM_THREADS")
    if not value:
        return _numba_threads()
    wanted = _parse_threads(value)
    if wanted is None:
        warnings.warn(f"POOLFOLD_NUM_THREADS={value!r} is not a positive integer; ignored",
                      RuntimeWarning, stacklevel=3)
        return _numba_threads()
    return min(wanted, numba.config.NUMBA_NUM_THREADS)


@functools.lru_cache(maxsize=16)
def _parse_threads(value: str) -> int | None:
    try:
        wanted = int(value)
    except ValueError:
        return None
    return wanted if wanted >= 1 else None


def _numba_threads() -> int:
    """numba's thread count: what ``numba.set_num_threads`` set, once something has started
    numba's threading layer (``set_num_threads`` itself does); ``NUMBA_NUM_THREADS`` before
    that, as ``numba.get_num_threads`` would start the layer, a cost poolfold's kernels do not
    need.  ``numba.threading_layer()`` is numba's public way to tell: it raises ValueError
    until the layer has started.  Its module's flag tells the same in one attribute read,
    where the raise and catch cost 0.4 us of the 8 us of Python a small call spends (a
    layer once started stays started: the flag reads False only before that)."""
    if getattr(_numba_parallel, "_is_initialized", None) is False:
        return numba.config.NUMBA_NUM_THREADS
    try:
        numba.threading_layer()
    except ValueError:
        return numba.config.NUMBA_NUM_THREADS
    return numba.get_num_threads()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max(1, numba.config.NUMBA_NUM_THREADS - 1),
                                       thread_name_prefix="poolfold",
                                       initializer=affinity.register_worker)
        return _POOL


def _spinning_pool() -> handoff.SpinningPool | None:
    """The threads that spin between calls (:mod:`.handoff`), started on the first threaded
    call; None where ``POOLFOLD_SPIN_US`` is 0."""
    global _SPINNING
    with _POOL_LOCK:
        if _SPINNING is None:
            spin_us = handoff.spin_microseconds()
            _SPINNING = handoff.SpinningPool(max(1, numba.config.NUMBA_NUM_THREADS - 1),
                                             spin_us) if spin_us > 0 else False
        return _SPINNING or None


def park_spinning_threads() -> None:
    """Put the spinning threads to sleep now rather than after their spin (see
    :meth:`poolfold.kernels.handoff.SpinningPool.park`): before work that needs the cores."""
    spinning = _SPINNING
    if spinning:
        spinning.park()


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    global _POOL, _SPINNING
    _POOL = None
    _SPINNING = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def launch(kernel, *args):
    """Run the serial ``kernel(*args)`` in the calling thread."""
    return kernel(*args)


# The least work (elements a kernel reads and writes) worth a part of its own.  Handing a part
# to a sleeping pool thread costs 50-70 us on a 2-core virtual machine (its core must be
# woken); the spinning threads of :mod:`.handoff` take a part in about 8 us, so a part is
# worth it from a few tens of microseconds of work.  Measured, 2 CPUs, in one sitting with
# this at 2**18 and at 2**16, the best of 300 calls (ms): MaxPool 3x3 s2 over (1,64,56,56)
# 0.090-0.097 -> 0.074-0.076, with Indices 0.19-0.20 -> 0.11-0.12; 3x3 s2 ceil over
# (1,512,27,27) 0.354-0.358 -> 0.210-0.245; GlobalAveragePool over (8,512,7,7) 0.083 -> 0.067;
# and no change beyond the noise (+-10%) for 2x2 over (1,3,224,224), channels-last 3x3 s2 over
# (1,56,56,64), AveragePool 3x3 over (1,192,35,35) and MaxUnpool 2x2 over (1,64,28,28).
MIN_WORK_PER_PART = 2**16

# Pieces per thread of a threaded call (see launch_split): each costs a kernel call (3 us for
# the MaxPool kernels' 21 arguments) and they let the threads even out a slow core.
PIECES_PER_THREAD = 4
# The least work (elements read and written) of a piece beyond the first of each thread: a
# call is one Python call of the kernel per piece, which unboxes its arrays holding the GIL
# while the other threads wait for it.  Measured, 2 CPUs, MaxPool 3x3 s2 over (1,64,56,56)
# (250 Ki elements of work): 0.098 ms in 8 pieces, 0.069 in 2.
MIN_WORK_PER_PIECE = 2**18
# The same for a piece run without the GIL (:mod:`.native_split`), where a piece costs the
# kernel's own setup only (its scratch arrays: about 1 us for the row kernels).  Measured, 2
# CPUs, MaxPool 3x3 s2 over (1,64,56,56) (250 Ki elements): 29-37 us in 2 pieces, 34-45 in 8.
MIN_WORK_PER_NATIVE_PIECE = 2**17


def split_parts(count: int, work: int | None = None, threads: int | None = None) -> int:
    """How many parts :func:`launch_split` runs ``count`` planes (or elements) in, on
    ``threads`` threads (default: :func:`kernel_threads`)."""
    if threads is None:
        threads = kernel_threads()  # every call: a bad POOLFOLD_NUM_THREADS warns at any size
    if count <= 1 or (work is not None and work < 2 * MIN_WORK_PER_PART):
        return 1
    parts = min(count, threads)
    if work is None:
        return max(1, parts)
    parts = max(1, min(parts, work // MIN_WORK_PER_PART))
    # The call waits for its busiest part, ceil(count / parts) of the count items: a split
    # that takes less than MIN_WORK_PER_PART off the caller's share costs more than it saves
    # (three planes on two threads: 2x2 over (1,3,224,224) took 0.054-0.070 ms, 0.047 on one)
    while parts > 1 and work - work * -(-count // parts) // count < MIN_WORK_PER_PART:
        parts -= 1
    # and no more parts than that busiest share needs (5 items on 4 threads: 3 parts keep 2
    # items each at most, as 4 do)
    while parts > 1 and -(-count // (parts - 1)) == -(-count // parts):
        parts -= 1
    return parts


def launch_split(kernel, count: int, *args, work: int | None = None,
                 parts: int | None = None, crew: native_split.Crew | None = None) -> list:
    """Run ``kernel(*args, start, stop)`` over ``[0, count)`` on ``parts`` threads (poolfold's
    thread count), the calling thread one of them; what each piece returned, in order.

    A threaded call is cut into :data:`PIECES_PER_THREAD` contiguous pieces per thread, which
    the threads claim in turn: a thread that runs slower (its core taken by another process,
    or by the host of a virtual machine) takes fewer pieces, where with one fixed half per
    thread the call waited for the slow half.

    ``work`` (elements the call reads and writes, if the caller knows it) caps the parts so
    each has at least :data:`MIN_WORK_PER_PART`, and the pieces beyond one a thread so each
    has :data:`MIN_WORK_PER_PIECE`: a small call runs in the calling thread.  ``parts``:
    what :func:`split_parts` already gave the caller, to not ask twice.

    With a ``crew`` (the caller's, kept for every call of the same kernel on arguments of
    the same types), the pieces run without the GIL (:mod:`.native_split`): then a piece
    costs no Python, only the kernel's own setup, and the pieces beyond one a thread need
    only :data:`MIN_WORK_PER_NATIVE_PIECE` each."""
    if parts is None:
        parts = split_parts(count, work)
    recorded = getattr(RECORDING, "calls", None)
    if recorded is not None:
        recorded.append((kernel, count, args, work, parts, crew))
    if parts == 1:
        return [kernel(*args, 0, count)]
    host = getattr(HOSTED, "host", None)
    if host is not None and crew is not None and crew.resolve(kernel, args):
        return _run_hosted(host, crew, kernel, count, parts, work, args)
    spinning = _SPINNING or _spinning_pool()  # the lock only until the threads start
    if crew is not None and spinning is not None and crew.resolve(kernel, args):
        done = _run_native(spinning, crew, kernel, count, parts, work, args)
        if done is not None:
            return done
    pieces = _piece_count(count, parts, work, MIN_WORK_PER_PIECE)
    bounds = [count * i // pieces for i in range(pieces + 1)]
    claims = itertools.count()  # next() on it is atomic: each piece is claimed once

    def run_pieces() -> list:
        done = []
        while True:
            piece = next(claims)
            if piece >= pieces:
                return done
            done.append((piece, kernel(*args, bounds[piece], bounds[piece + 1])))

    affinity.steer_workers()
    everyone = spinning.run(run_pieces, parts - 1) if spinning is not None else None
    if everyone is None:  # no spinning threads, or another call holds them: sleeping ones
        pool = _pool()
        futures = [pool.submit(run_pieces) for _ in range(parts - 1)]
        try:
            mine = run_pieces()
        finally:
            everyone = [future.result() for future in futures]  # all waited for, even on
        everyone.append(mine)                                    # an error
    done = [piece for pieces_done in everyone for piece in pieces_done]
    return [result for _, result in sorted(done, key=lambda d: d[0])]


class BoundLaunch:
    """``launch_split(kernel, count, *arrays, *constants, ...)`` with all but the leading
    ``arrays`` (a call's X and Y) fixed, as a launch repeats it: once a call has run natively
    the next ones go straight to :meth:`~.handoff.SpinningPool.run_native` with the pieces
    kept, and a one-part call straight to the kernel.

    A batch-1 call spends as much around its kernel as the kernel's second thread saves:
    measured, 2 CPUs, MaxPool 3x3 at stride 2 over (1,64,56,56), a half of the kernel
    16.7 us, the split as one compiled call 19.8, the same through :func:`launch_split`
    and its checks 23.5 (3.5 us of Python a call).  Anything else (no spinning threads yet,
    another call holding them, a piece that raised, a kernel that returns a value) takes
    :func:`launch_split`'s way, which also raises a kernel's error."""

    __slots__ = ("kernel", "count", "constants", "parts", "work", "crew", "_native")

    def __init__(self, kernel, count: int, constants: tuple, parts: int, work: int | None,
                 crew: native_split.Crew):
        self.kernel = kernel
        self.count = count
        self.constants = constants
        self.parts = parts
        self.work = work
        self.crew = crew
        self._native = None  # (pool, bounds, results, helpers, address) once one ran natively

    def __call__(self, *arrays) -> None:
        if self.parts == 1:
            recorded = getattr(RECORDING, "calls", None)
            if recorded is not None:
                recorded.append((self.kernel, self.count, (*arrays, *self.constants),
                                 self.work, 1, self.crew))
            self.kernel(*arrays, *self.constants, 0, self.count)
            return
        native = self._native
        if native is not None and native[0] is _SPINNING \
                and getattr(HOSTED, "host", None) is None:  # not a forked child's, not hosted
            pool, bounds, results, helpers, address = native
            affinity.steer_workers()
            if pool.run_native(native_split.run_pieces, bounds, results, helpers, address,
                               None, (*arrays, *self.constants)) == 0:
                return
        launch_split(self.kernel, self.count, *arrays, *self.constants, parts=self.parts,
                     work=self.work, crew=self.crew)
        crew = self.crew
        if (_SPINNING and crew.address and crew.returns is None
                and crew.kernel is self.kernel
                and crew.split == (self.count, self.parts, self.work)):
            self._native = (_SPINNING, crew.bounds, crew.scratch, self.parts - 1,
                            crew.address)


def _piece_count(count: int, parts: int, work: int | None, least: int) -> int:
    """How many pieces a call of ``count`` items on ``parts`` threads is cut into:
    :data:`PIECES_PER_THREAD` a thread, but where ``work`` is known only as many as give
    each piece beyond the first of a thread ``least`` elements of work, a whole number a
    thread (3 pieces on 2 threads of equal speed leave one of them two thirds of the call);
    never more than the items."""
    pieces = parts * PIECES_PER_THREAD
    if work is not None:
        pieces = max(parts, min(pieces, work // least) // parts * parts)
    return min(count, pieces)


# This thread's host pool, where its kernels run inside a host's call: (the address of the
# host's parallel-for function, its context), set by :mod:`poolfold.session_ops` while one
# of poolfold's nodes runs inside onnxruntime, whose own threads then take the pieces.
HOSTED = threading.local()

# This thread's record of its launches, where :mod:`poolfold.session_ops` set ``calls`` to
# a list: each launch_split call (and each one-part BoundLaunch call, which calls its kernel
# itself) appends ``(kernel, count, args, work, parts, crew)``, which :func:`replay` runs
# again.
RECORDING = threading.local()


def replay(recorded: tuple) -> None:
    """A launch recorded by :data:`RECORDING` run again, on the same arrays."""
    kernel, count, args, work, parts, crew = recorded
    launch_split(kernel, count, *args, work=work, parts=parts, crew=crew)


def _run_hosted(host: tuple[int, int], crew, kernel, count: int, parts: int,
                work: int | None, args: tuple) -> list:
    """:func:`launch_split`'s call run on the host's threads
    (:func:`poolfold.kernels.native_split.run_pieces_hosted`): what each piece returned.  A
    piece that raised makes the whole call run again in Python, which raises the error."""
    split = (count, parts, work)
    if split != crew.split:
        crew.cut(split, count, _piece_count(count, parts, work, MIN_WORK_PER_NATIVE_PIECE))
    bounds, results = crew.bounds, crew.results()
    if crew.returns is None:
        results = np.zeros(len(bounds) - 1, np.int64)  # calls on several threads at once
    flags = np.zeros(handoff.ERROR + 1, np.int64)
    address, context = host
    if native_split.run_pieces_hosted(flags, bounds, results, address, context, parts,
                                      crew.address, crew.returns, *args):
        return [kernel(*args, 0, count)]
    if crew.returns is None:
        return [None] * (len(bounds) - 1)
    return [type(crew.returns)(r) for r in results.tolist()]


def _run_native(spinning, crew, kernel, count: int, parts: int, work: int | None,
                args: tuple) -> list | None:
    """:func:`launch_split`'s call run by :func:`poolfold.kernels.native_split.run_pieces`:
    what each piece returned, or None where another call holds the spinning threads.  A
    piece that raised (the kernel's own bounds checks) makes the whole call run again in
    Python, which raises the error."""
    split = (count, parts, work)
    if split != crew.split:  # a launch's calls are cut alike: the cut is kept
        crew.cut(split, count, _piece_count(count, parts, work, MIN_WORK_PER_NATIVE_PIECE))
    bounds, results = crew.bounds, crew.results()
    affinity.steer_workers()
    raised = spinning.run_native(native_split.run_pieces, bounds, results, parts - 1,
                                 crew.address, crew.returns, args)
    if raised is None:
        return None
    if raised:
        return [kernel(*args, 0, count)]
    if crew.returns is None:
        return [None] * (len(bounds) - 1)
    return [type(crew.returns)(r) for r in results.tolist()]
