"""Handing a call's parts to the pool's threads in microseconds: threads that spin a while.

A thread of :class:`concurrent.futures.ThreadPoolExecutor` sleeps on a lock between calls,
and waking it costs more than many calls' whole kernels: 50-70 us for an empty part on a
2-core virtual machine (measured), where a batch-1 (1,64,56,56) 3x3 MaxPool takes 90 us on
one thread.  So, as onnxruntime's and OpenMP's pools do, poolfold's threads spin for a while
after each part (``POOLFOLD_SPIN_US``, default :data:`DEFAULT_SPIN_US`) before they sleep:

- the caller publishes a call by bumping a counter (an atomic store, :func:`_store_release`);
  a spinning thread sees it within a few hundred nanoseconds, without holding the GIL (the
  spin is a numba loop of atomic loads);
- a thread that sees a call waits a little more (:data:`GRACE_SPINS`) before it takes the
  GIL back, so that the caller has reached its own part's kernel and released the GIL: a
  thread that finds the GIL held sleeps on it, and waking it costs what the spin saves;
- a thread that finishes its parts says so by another atomic store and spins for the next
  call, and the caller spins (then sleeps in short steps) until every thread has finished.

A native call (:mod:`.native_split`) takes no GIL at all: the spinning thread's loop
(:func:`serve_calls`) calls the published function itself and goes on spinning.  Calls are
numbered, even for a Python job and odd for a native call, so that one load tells a thread
what it sees.

A thread that has spun out sleeps.  On Linux it sleeps inside its compiled loop, on the
call counter's futex (:func:`_sleep_until_called`), and the call that bumps the counter wakes
it (:func:`publish`): it wakes without the GIL, straight into that loop.  A thread woken
through Python instead (a condition variable, the fallback elsewhere) must take the GIL to
return from its wait while the caller, back from its kernel, wants it too: measured on 2
CPUs, MaxPool 3x3 over (1,832,7,7) called 5 ms after the last call took 224-247 us on two
threads that way, 110-169 on one.

An empty hand-off costs about 8 us this way (measured on the same machine), so calls of a
few tens of microseconds of work gain from a second thread.  Spinning threads keep their
cores busy for ``POOLFOLD_SPIN_US`` after each call (onnxruntime's threads spin too by
default); ``POOLFOLD_SPIN_US=0`` hands parts to sleeping threads instead.  One call uses
the spinning threads at a time: a call made while another holds them (from another Python
thread) goes to the sleeping pool (:mod:`.threads`).
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
import warnings

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import affinity, kernel

ENV = "POOLFOLD_SPIN_US"
DEFAULT_SPIN_US = 1000
# Pauses a thread that has seen a call spins before it takes the GIL back (see the module
# doc): about 3 us (measured: an empty hand-off took 13 us with 20, 8 us with 100).
GRACE_SPINS = 100
# A flag per 64-byte line, so that one thread's stores do not evict the line another spins on.
_LINE = 8
# The flags' layout.  The first line: the call's number (bumped to publish a call; odd for a
# native call, :mod:`.native_split`, even for a Python job), and a native call's entry,
# frame and helper count.  Then a line each: the open native call (-1: none), the threads
# inside it, its pieces' claims, whether a piece raised, the threads asleep on the call
# counter's futex; then each thread's last finished Python job.
CALL, ENTRY, FRAME, HELPERS = range(4)
OPEN, ACTIVE, CLAIMS, ERROR, SLEEPERS = (_LINE * line for line in range(1, 6))
DONE = 6 * _LINE
PYTHON, NATIVE = 0, 1
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")
# Linux's futex system call by number, where the threads sleep in their compiled loop: the
# low 32 bits of the int64 call counter are the futex word, which needs a little-endian
# machine.  Elsewhere they sleep on a condition variable (see the module doc).
_FUTEX_CALL = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    platform.machine().lower())
NATIVE_SLEEP = (sys.platform.startswith("linux") and _FUTEX_CALL is not None
                and sys.byteorder == "little")
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129  # FUTEX_WAIT and FUTEX_WAKE, process-private
_WAKE_ALL = 2**31 - 1


def _element_pointer(context, builder, array_type, array, index):
    view = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, view, [index])


def _atomic_load(ordering: str, doc: str):
    """An intrinsic ``load(flags, index)``: ``flags[index]`` read atomically, ``ordering``
    being LLVM's ("acquire", "seq_cst")."""
    @intrinsic
    def load(typingctx, flags, index):
        def codegen(context, builder, signature, args):
            pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
            return builder.load_atomic(pointer, ordering, 8)

        return types.int64(flags, types.intp), codegen

    load.__doc__ = doc
    return load


def _atomic_store(ordering: str, doc: str):
    """An intrinsic ``store(flags, index, value)``: ``flags[index] = value`` (an integer)
    stored atomically, ``ordering`` being LLVM's ("release", "seq_cst")."""
    @intrinsic
    def store(typingctx, flags, index, value):
        def codegen(context, builder, signature, args):
            pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
            builder.store_atomic(context.cast(builder, args[2], signature.args[2], types.int64),
                                 pointer, ordering, 8)
            return context.get_dummy_value()

        return types.void(flags, types.intp, value), codegen

    store.__doc__ = doc
    return store


_load_acquire = _atomic_load(
    "acquire", "``flags[index]``, read atomically: a loop of plain loads may read it once only.")
_store_release = _atomic_store(
    "release", "``flags[index] = value``, stored atomically after every store before it.")
load_sequential = _atomic_load(
    "seq_cst", "``flags[index]``, read atomically in the one order all threads agree on.")
store_sequential = _atomic_store(
    "seq_cst", "``flags[index] = value``, stored atomically in the one order all threads agree on.")


@intrinsic
def fetch_add(typingctx, flags, index, value):
    """``flags[index] += value`` atomically (sequentially consistent); the value before."""
    def codegen(context, builder, signature, args):
        pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", pointer, context.cast(
            builder, args[2], signature.args[2], types.int64), "seq_cst")

    return types.int64(flags, types.intp, value), codegen


@intrinsic
def call_entry(typingctx, entry, frame):
    """Call the function ``void(i8*)`` at address ``entry`` on ``frame``
    (:mod:`.native_split`)."""
    def codegen(context, builder, signature, args):
        function = builder.inttoptr(args[0], ir.FunctionType(
            ir.VoidType(), [cgutils.voidptr_t]).as_pointer())
        builder.call(function, [builder.inttoptr(args[1], cgutils.voidptr_t)])
        return context.get_dummy_value()

    return types.void(types.int64, types.int64), codegen


@intrinsic
def _futex(typingctx, flags, index, operation, value):
    """``futex(&flags[index], operation, value)``, the word being ``flags[index]``'s low 32
    bits, through the C library's ``syscall`` (resolved by name when the code is loaded, so
    that numba's cache holds no address); nothing, returning -1, where
    :data:`NATIVE_SLEEP` is false."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        if not NATIVE_SLEEP:
            return ir.Constant(i64, -1)
        pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        syscall = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall")
        word = builder.and_(context.cast(builder, args[3], signature.args[3], types.int64),
                            ir.Constant(i64, 0xFFFFFFFF))
        return builder.call(syscall, [
            ir.Constant(i64, _FUTEX_CALL), builder.ptrtoint(pointer, i64),
            context.cast(builder, args[2], signature.args[2], types.int64), word,
            ir.Constant(i64, 0)])  # no timeout

    return types.int64(flags, types.intp, operation, value), codegen


@intrinsic
def _yield_core(typingctx):
    """Give the core to another thread that is ready to run on it, if any (the C library's
    ``sched_yield``, resolved by name when the code is loaded); nothing where there is no
    such call (not a POSIX system)."""
    def codegen(context, builder, signature, args):
        if os.name == "posix":
            give_up = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
            builder.call(give_up, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _pause(typingctx):
    """The processor's spin-wait hint (x86 ``pause``), which frees the core's resources for
    its other hardware thread; nothing elsewhere."""
    def codegen(context, builder, signature, args):
        if _X86:
            hint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                ir.VoidType(), []), "llvm.x86.sse2.pause")
            builder.call(hint, [])
        return context.get_dummy_value()

    return types.void(), codegen


# Pauses between a spinning thread's offers of its core to another thread ready to run on it
# (see _yield_core).  A thread woken from sleep by a call may be put on the caller's core
# (the scheduler places a woken thread beside its waker where that looks cheap) and take it
# over: once its pieces were done it spun there for the next call while the caller, its own
# pieces unfinished, waited for the core until the spin ended.  Measured, 2 CPUs, MaxPool
# 3x3 at stride 2 with ceil_mode over (1,192,56,56) called 2 ms after the threads were put to
# sleep (as poolfold.backend calls a pool after an onnxruntime stretch): median 213 us and a
# tenth of the calls over 1.2 ms, where one thread took 156 and 174 (median, 90th
# percentile); with an offer every 256 pauses (a few microseconds) 162-175 and 183-199.
# Where no other thread is ready, the offer returns at once.
YIELD_PAUSES = 256


# Two compiled functions in all, for the first threaded call of a process: 0.14 s to
# compile them with an empty cache, 5 ms to load them from it.
@kernel()
def _store_and_spin(flags, store_at, stored, index, seen, spins, grace):
    """Store ``stored`` at ``flags[store_at]`` (none where ``store_at`` < 0), then return
    ``flags[index]`` once it is no longer ``seen`` (after ``grace`` more pauses), or
    ``seen`` after ``spins`` pauses; in one call, so that a thread that finishes a part does
    not take the GIL before it spins for the next call."""
    if store_at >= 0:
        _store_release(flags, store_at, stored)
    for _ in range(spins):
        value = _load_acquire(flags, index)
        if value != seen:
            for _ in range(grace):
                _pause()
            return value
        _pause()
    return seen


@njit(inline="always")
def publish(flags, call):
    """Publish call number ``call`` (every store before it seen by a thread that sees it),
    and wake the threads asleep on the counter's futex, if any.  The store and the count's
    load are both sequentially consistent, as are a sleeping thread's count and its check of
    the counter (:func:`_sleep_until_called`): either the caller sees the sleeper, or the
    sleeper sees the call."""
    store_sequential(flags, CALL, call)
    if load_sequential(flags, SLEEPERS) > 0:
        _futex(flags, CALL, _FUTEX_WAKE, _WAKE_ALL)


@kernel()
def publish_call(flags, call):
    """:func:`publish`, for Python."""
    publish(flags, call)


@njit(inline="always")
def _sleep_until_called(flags, seen):
    """Sleep on the call counter's futex until a call after ``seen`` is published (the wait
    returns at once where the counter has already moved; a wake-up for nothing waits again)."""
    fetch_add(flags, SLEEPERS, 1)
    while load_sequential(flags, CALL) == seen:
        _futex(flags, CALL, _FUTEX_WAIT, seen)
    fetch_add(flags, SLEEPERS, -1)


@kernel()
def serve_calls(flags, worker, seen, spins, grace, sleep_here, sleep_now):
    """A spinning thread's loop: run the native calls published after call ``seen``
    (:mod:`.native_split`) as they come, without the GIL; return the number of the first
    Python job published (after ``grace`` more pauses, see the module doc).  Once ``spins``
    pauses pass without a call (at once with ``sleep_now``), the thread sleeps in this loop
    until the next call with ``sleep_here`` (:data:`NATIVE_SLEEP`), else returns ``seen``
    to sleep in Python."""
    left = 0 if sleep_now else spins
    while True:
        call = _load_acquire(flags, CALL)
        if call == seen:
            if left > 0:
                left -= 1
                _pause()
                if left % YIELD_PAUSES == 0:  # see YIELD_PAUSES
                    _yield_core()
                continue
            if not sleep_here:
                return seen
            _sleep_until_called(flags, seen)
            left = spins
            continue
        seen = call
        if call % 2 != NATIVE:  # a Python job: see SpinningPool._next_call
            for _ in range(grace):
                _pause()
            return call
        if worker < flags[HELPERS]:
            fetch_add(flags, ACTIVE, 1)  # joined: the caller now waits for this thread ...
            if load_sequential(flags, OPEN) == call:  # ... if it has not closed the call
                call_entry(flags[ENTRY], flags[FRAME])
            fetch_add(flags, ACTIVE, -1)
        left = spins


@kernel()
def _spin_until_all(flags, first, count, value, spins):
    """Whether ``flags[first + w*_LINE]`` became ``value`` for every w < count within
    ``spins`` pauses."""
    for w in range(count):
        at = first + w * _LINE
        while _load_acquire(flags, at) != value:
            if spins <= 0:
                return False
            spins -= 1
            _pause()
    return True


def spin_microseconds() -> int:
    """``POOLFOLD_SPIN_US``: how long an idle thread spins for the next call (0: it sleeps at
    once, and calls go to the sleeping pool).  Read when the spinning threads start."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return DEFAULT_SPIN_US
    try:
        spin = int(value)
        if spin >= 0:
            return spin
    except ValueError:
        pass
    warnings.warn(f"{ENV}={value!r} is not a whole number of microseconds; "
                  f"{DEFAULT_SPIN_US} is used", RuntimeWarning, stacklevel=3)
    return DEFAULT_SPIN_US


def _pauses_per_microsecond(flags: np.ndarray) -> float:
    """How many spin iterations take a microsecond here (a pause lasts 10-150 cycles,
    by processor), measured on an unchanging flag."""
    count = 20000
    _store_and_spin(flags, -1, 0, 0, flags[0], 10, 0)  # compiled or loaded before timing
    start = time.perf_counter()
    _store_and_spin(flags, -1, 0, 0, flags[0], count, 0)
    elapsed = max(time.perf_counter() - start, 1e-6)
    return max(count / (elapsed * 1e6), 1.0)


class SpinningPool:
    """``workers`` threads that run a call's job beside the caller: a Python job
    (:meth:`run`), or a kernel's pieces without the GIL (:meth:`run_native`)."""

    def __init__(self, workers: int, spin_us: int):
        self.workers = workers
        self.flags = np.zeros(DONE + _LINE * workers, np.int64)  # see CALL, OPEN, DONE
        self.flags[OPEN] = -1
        rate = _pauses_per_microsecond(self.flags)
        self.spins = max(1, int(spin_us * rate))
        self.grace = GRACE_SPINS
        self.job = None
        self.helpers = 0
        self.results: list = [None] * workers
        self.calls = 0
        self.parking_call = -1  # a call that tells the threads to sleep now (see park)
        self.python_sleepers = 0  # threads asleep on ``wake`` (where not NATIVE_SLEEP)
        self.wakes = 0  # bumped to wake the sleeping threads
        self.wake = threading.Condition()
        self.busy = threading.Lock()  # one call at a time holds the threads
        started = threading.Barrier(workers + 1)
        for w in range(workers):
            threading.Thread(target=self._serve, args=(w, started), daemon=True,
                             name=f"poolfold-spin-{w}").start()
        started.wait()  # every thread registered (affinity steers those it knows)

    def _serve(self, w: int, started: threading.Barrier) -> None:
        affinity.register_worker()
        started.wait()
        flags, done_at = self.flags, DONE + _LINE * w
        seen = 0
        sleep_now = False
        while True:
            call = serve_calls(flags, w, seen, self.spins, self.grace, NATIVE_SLEEP, sleep_now)
            sleep_now = False
            if call == seen:  # spun long enough: sleep until a call wakes the threads
                self._sleep(seen)
                continue  # the call that woke it, and those after it
            seen = call
            if call == self.parking_call:  # told to sleep now, not to spin: see park()
                if NATIVE_SLEEP:
                    sleep_now = True  # in the compiled loop
                else:
                    self._sleep(seen)
                continue
            try:
                self.results[w] = self.job() if w < self.helpers else []
            except BaseException as error:  # the caller raises it
                self.results[w] = error
            _store_and_spin(flags, done_at, seen, 0, seen, 0, 0)

    @property
    def sleepers(self) -> int:
        """How many of the threads sleep (in their compiled loop, or in Python)."""
        return int(self.flags[SLEEPERS]) + self.python_sleepers

    def _sleep(self, seen: int) -> None:
        """Sleep in Python until a call after ``seen`` is published, or the threads are
        woken (where the threads cannot sleep in their compiled loop)."""
        with self.wake:
            self.python_sleepers += 1
            wakes = self.wakes
            while self.wakes == wakes and int(self.flags[CALL]) == seen:
                self.wake.wait()
            self.python_sleepers -= 1

    def _next_call(self, mode: int) -> int:
        """The next call's number: even for a Python job, odd for a native call."""
        self.calls += 1
        return 2 * self.calls + mode

    def _wake_sleepers(self) -> None:
        """Wake the threads that sleep in Python (those asleep in their compiled loop are
        woken by :func:`publish`).  After a Python job is published: a thread that checked
        the call before it went to sleep counted itself a sleeper first, so it is woken.  A
        native call wakes them before it is published (it publishes itself, see
        :mod:`.native_split`) and does not wait for them: they may join it, or the next."""
        if self.python_sleepers:
            with self.wake:
                self.wakes += 1
                self.wake.notify_all()

    def park(self) -> None:
        """Stop the threads' spin now: they sleep until the next call.  Where other work
        follows on this process's cores (onnxruntime's stretches between a model's pooling
        nodes), threads spinning on through it took a core from it (googlenet through
        poolfold.backend: its Convs 1.6-2x slower than in one session; 25.4 against 22.1 ms
        a run parked).  The next call wakes them, as it wakes threads that spun out."""
        if not self.busy.acquire(blocking=False):
            return  # a call holds the threads: it is not spinning idle
        try:
            self.parking_call = self._next_call(PYTHON)
            _store_and_spin(self.flags, CALL, self.parking_call, 0, 0, 0, 0)
        finally:
            self.busy.release()

    def run(self, job, helpers: int) -> list | None:
        """``job()`` on ``helpers`` of the threads and the caller at once: what each
        returned (the caller's last; ``[]`` for the threads left out), or None where another
        call holds the threads.  An exception raised by any of them is raised here, once all
        have finished."""
        if not self.busy.acquire(blocking=False):
            return None
        try:
            self.job = job
            self.helpers = helpers
            call = self._next_call(PYTHON)
            publish_call(self.flags, call)
            self._wake_sleepers()
            try:
                mine = job()
            except BaseException as error:
                mine = error
            while not _spin_until_all(self.flags, DONE, self.workers, call, self.spins):
                time.sleep(50e-6)  # long parts: their end is waited for in short sleeps
            results = self.results + [mine]
            self.job = None
            self.results = [None] * self.workers
        finally:
            self.busy.release()
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    def run_native(self, runner, bounds, results, helpers: int, address: int, returns,
                   arguments: tuple) -> int | None:
        """``runner`` (:func:`poolfold.kernels.native_split.run_pieces`) over the pieces
        ``bounds`` on the caller and ``helpers`` of the threads: what it returned (1 if a
        piece raised), or None where another call holds the threads."""
        if not self.busy.acquire(blocking=False):
            return None
        try:
            self._wake_sleepers()
            return runner(self.flags, self._next_call(NATIVE), bounds, results, helpers,
                          address, returns, *arguments)
        finally:
            self.busy.release()
