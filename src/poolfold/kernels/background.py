"""Compiling a kernel that is slow to compile in a child process, while a kernel that compiles
quickly stands in for it.

The separable MaxPool kernel is several times faster than the direct scan on overlapping
windows, but takes 5-13 s to compile against about 1.7 s.  When a call needs a signature of
such a kernel that neither this process nor numba's on-disk cache holds, :func:`ready` says
no and queues that signature; the caller runs its stand-in, then :func:`start_queued` starts
a child process that compiles the signature into numba's cache (at a lower priority).  Once
the child is done, the next call loads the kernel from the cache (tens of milliseconds) and
runs it, and so does every later process.  One child runs at a time; the signatures wait
their turn in order.

Processes starting together compile each signature once: a child holds a lock file beside
numba's cache for its signature (``flock``, released when the child exits, however it
ends).  A process that finds the lock held starts no child of its own for that signature:
its stand-in answers until the other process's child has put the kernel in the cache, and
if that child ends without doing so, the lock is free again and this process takes it.

``POOLFOLD_BACKGROUND_COMPILE=0`` turns this off: the first call compiles the kernel in the
process, as numba does by itself.  :func:`wait` waits for the children (tests, benchmarks).

Peeking at numba's cache without loading it uses numba's cache internals, all in
:func:`_cached`; anything there that is not as expected makes :func:`ready` say yes, which is
numba's own behaviour.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import sharing

if TYPE_CHECKING:  # imported when a compile starts: it is not needed before
    import subprocess

ENV = "POOLFOLD_BACKGROUND_COMPILE"
# A child still compiling after this long is stopped and its kernel compiled in the process
# (the slowest compile measured, the separable kernel with Indices on a busy host, took 14 s).
CHILD_LIMIT_S = 600.0


@dataclass
class _Job:
    kernel: object  # a numba dispatcher
    signature: tuple
    process: subprocess.Popen | None = None
    failed: bool = False
    started: float = 0.0  # time.monotonic() when the child started
    elsewhere: bool = False  # another process's child holds this signature's lock
    lock: int | None = None  # the lock file's descriptor, handed to our child


_LOCK = threading.Lock()
_JOBS: dict[tuple, _Job] = {}  # (kernel's name, signature) -> job, in the order asked
_READY: set[tuple] = set()


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def signature_of(kernel, args) -> tuple:
    """The numba signature a call ``kernel(*args)`` compiles (its arguments' types)."""
    return tuple(kernel.typeof_pyval(a) for a in args)


def ready(kernel, args) -> bool:
    """Whether ``kernel(*args)`` would run without compiling: compiled in this process, or
    in numba's cache (then loaded on the call).  If not, its compile is queued for a child
    process and False returned at once: the caller runs its stand-in, then calls
    :func:`start_queued`.

    True also when background compiles are off, when a child failed (the call then compiles
    in the process and shows numba's own error), or when numba's cache cannot be read."""
    if not enabled():
        return True
    try:
        signature = signature_of(kernel, args)
    except Exception:  # a type numba cannot read: the call itself will say so
        return True
    key = (sharing.name_of(kernel), signature)
    if key in _READY:
        return True
    with _LOCK:
        job = _JOBS.get(key)
        if job is None:
            if signature in kernel.overloads or _cached(kernel, signature):
                _READY.add(key)
                return True
            # Started by start_queued(), once the caller's stand-in has run: the child's
            # start-up would otherwise compete with the stand-in's own compile.
            _JOBS[key] = _Job(kernel, signature)
            return False
        _advance()
        if _finished(job):
            _READY.add(key)
            del _JOBS[key]
            return True
        return False


def _finished(job: _Job) -> bool:
    """Whether a job's call need not wait any more (under ``_LOCK``): compiled by another
    process, or its child is done (the call loads the kernel from the cache; where the child
    failed, or wrote a cache this process cannot read, the call compiles it here, as numba
    would), or it failed to start."""
    return _done_elsewhere(job) or job.failed or (
        job.process is not None and job.process.poll() is not None)


def start_queued() -> None:
    """Start the next queued compile if no child is running (see :func:`ready`)."""
    if _JOBS:
        with _LOCK:
            _advance()


def pending() -> int:
    """How many background compiles are queued or running."""
    with _LOCK:
        _advance()
        return sum(1 for job in _JOBS.values()
                   if not job.failed and not _done_elsewhere(job)
                   and (job.process is None or job.process.poll() is None))


def idle() -> bool:
    """Whether no compile is queued, running, or done but not yet taken up by the call that
    asked for it (whose launch may still stand in for the kernel until its next call)."""
    return not _JOBS


def settled() -> bool:
    """:func:`idle`, once the compiles that are done are taken up (their kernels then run
    from the cache, as :func:`ready` says on their launches' next calls): true before a call
    means no launch of that call stands in."""
    if _JOBS:
        with _LOCK:
            _advance()
            for key, job in list(_JOBS.items()):
                if _finished(job):
                    _READY.add(key)
                    del _JOBS[key]
    return not _JOBS


def wait(timeout: float | None = None) -> bool:
    """Wait until every queued background compile has finished (or ``timeout`` seconds
    passed); True if none is left."""
    import subprocess

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _LOCK:
            _advance()
            running = [job.process for job in _JOBS.values()
                       if job.process is not None and job.process.poll() is None]
            queued = any(job.process is None and not job.failed and not _done_elsewhere(job)
                         for job in _JOBS.values())
        if not running and not queued:
            return True
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        try:
            running[0].wait(timeout=0.1 if queued or left is None else min(left, 0.1))
        except (subprocess.TimeoutExpired, IndexError):
            time.sleep(0.01)


def _advance() -> None:
    """Start the next queued compile when no child is running (under ``_LOCK``)."""
    for job in _JOBS.values():
        if job.process is not None and job.process.poll() is None:
            if time.monotonic() - job.started < CHILD_LIMIT_S:
                return
            job.process.kill()  # stuck: the caller compiles it itself
            job.process.wait()
        if job.process is not None and job.process.returncode != 0:
            job.failed = True
    for job in _JOBS.values():
        if job.process is None and not job.failed and not _done_elsewhere(job):
            job.lock = _claim(job)
            job.elsewhere = job.lock is None
            if job.elsewhere:  # another process compiles it: the next signature's turn
                continue
            if job.lock >= 0 and _cached(job.kernel, job.signature):  # it just did
                os.close(job.lock)
                job.lock, job.elsewhere = None, True
                continue
            try:
                job.process = _start(job)
            finally:
                if job.lock >= 0:  # the child holds the lock now, or there is no child
                    os.close(job.lock)
                job.lock = None
            job.started = time.monotonic()
            if job.process is None:
                job.failed = True
            return


def _done_elsewhere(job: _Job) -> bool:
    """Whether another process's child has put the job's signature in the cache."""
    return job.elsewhere and _cached(job.kernel, job.signature)


# What _claim returns where no lock can be taken (no flock, or no cache directory to put the
# lock in): compile as if no other process could.
_NO_LOCK = -1


def _claim(job: _Job) -> int | None:
    """The descriptor of the signature's lock file (:mod:`.sharing`'s, which in-process
    compiles take too), locked; None if another process holds it; :data:`_NO_LOCK` where
    there is nothing to lock with."""
    descriptor = sharing.open_lock(job.kernel, job.signature)
    if descriptor is None:
        return _NO_LOCK
    if not sharing.try_lock(descriptor):
        os.close(descriptor)
        return None
    return descriptor


def _start(job: _Job) -> subprocess.Popen | None:
    import subprocess

    payload = pickle.dumps([(*sharing.name_of(job.kernel), job.signature)])
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, ENV: "0"}, start_new_session=True,
            pass_fds=() if job.lock is None or job.lock < 0 else (job.lock,))
        process.stdin.write(payload)
        process.stdin.close()
    except (OSError, ValueError):
        return None
    from .notices import announce

    data = getattr(job.signature[0], "dtype", job.signature[0]) if job.signature else ""
    announce(f"poolfold: compiling the {job.kernel.py_func.__name__} kernel for {data} data in "
             f"a background process (once, numba caches it); a quicker kernel answers meanwhile")
    return process


def _cached(kernel, signature) -> bool:
    """Whether numba's on-disk cache holds ``signature`` of ``kernel``, for this machine and
    this source, without loading (and linking) the code.

    numba has no public way to ask this, so this is its own index lookup, as in numba's
    ``Cache.load_overload``: the dispatcher's private ``_cache``, ``Cache._index_key`` and
    ``Cache._cache_file._load_index``, checked against numba 0.68.1.  Where any of them is
    missing or behaves otherwise, every signature counts as cached: the call compiles it in
    the process, as numba does on its own."""
    try:
        cache = kernel._cache
        key = cache._index_key(signature, kernel.targetctx.codegen())
        return cache._cache_file._load_index().get(key) is not None
    except Exception:  # numba's internals changed, or the kernel has no cache
        return True


def _forget_jobs() -> None:  # a forked child has none of the parent's children
    _JOBS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_jobs)


def _compile_from_stdin() -> None:
    """The child: compile each (module, kernel, signature) read from stdin into the cache."""
    import importlib

    if hasattr(os, "nice"):
        os.nice(10)  # yield to the work of the process that asked
    for module, qualname, signature in pickle.loads(sys.stdin.buffer.read()):
        kernel = importlib.import_module(module)
        for part in qualname.split("."):
            kernel = getattr(kernel, part)
        # numba's own compile: this child holds the signature's lock already (the parent
        # handed over its descriptor), which sharing's compile would wait for
        type(kernel).compile(kernel, signature)


if __name__ == "__main__":
    _compile_from_stdin()
