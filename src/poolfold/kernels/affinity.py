"""Keeping the kernel pool's threads off the calling thread's core (Linux), when asked to.

A woken thread is placed on the core of the thread that woke it when the scheduler finds that
cheap, and then the two halves of a call run one after the other on one core while the other
idles, until the scheduler's next balancing tick moves one.  So the pool's threads may run on
every core allowed but the one the caller runs on when it hands them work; the mask is set
again only when the caller has moved or the pool has grown, and never pins a thread to one
core.

Measured only on a 2-core virtual machine, in a loop of 3 ms MaxPool calls: without steering
8-77% of the calls took 4.5-6 ms (their threads sharing one core), with it 3-7%.  One machine
is not evidence enough to rewrite the masks of every user's threads, so steering is opt-in:
``POOLFOLD_STEER_THREADS=1`` steers, unset or ``0`` does not.  The setting is read once per
process, at its first threaded call (:func:`steering`).
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

ENV = "POOLFOLD_STEER_THREADS"

_WORKERS: list[int] = []  # the pool threads' native ids (the pool starts them as it needs)
_STEERED: tuple[int, int] | None = None  # (the caller's core left out, workers steered)


def register_worker() -> None:
    """The pool's thread initializer: note the thread, to steer it."""
    _WORKERS.append(threading.get_native_id())


def _forget_workers() -> None:  # a forked child has none of the parent's threads
    global _STEERED
    _WORKERS.clear()
    _STEERED = None
    steering.cache_clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


@functools.lru_cache(maxsize=1)
def steering() -> bool:
    """Whether the pool's threads are steered: only under ``POOLFOLD_STEER_THREADS=1``
    (another value than ``0`` or ``1`` warns, and means off)."""
    value = os.environ.get(ENV, "").strip()
    if value and value not in ("0", "1"):
        warnings.warn(f"{ENV}={value!r} is neither 0 nor 1; ignored", RuntimeWarning,
                      stacklevel=2)
    return value == "1"


@functools.lru_cache(maxsize=1)
def _current_cpu_reader():
    """The C library's ``sched_getcpu``, or None (found on the first steered call: importing
    ctypes would add to every process's start-up)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        import ctypes

        # called holding the GIL, and without errno's copy: a call takes half the time (a
        # vDSO read, nothing to wait for), and it is made on every threaded call
        reader = ctypes.PyDLL(None).sched_getcpu
        reader.restype = ctypes.c_int
        return reader if reader() >= 0 else None
    except (OSError, AttributeError):  # no such call in this C library
        return None


def steer_workers() -> None:
    """Let the pool's threads run anywhere allowed but on the calling thread's core, if
    :func:`steering` says so."""
    global _STEERED
    if not steering():
        return
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
