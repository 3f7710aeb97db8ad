"""Kernels compiled once between processes that start together.

numba compiles a kernel's signature in every process that calls it before it is in numba's
disk cache: the workers of a dask cluster on one machine, a pool of processes or the test
suite's workers (processes that share a cache folder), started at once, each spend the same
seconds of a core on the same kernel (a MaxPool kernel takes 8-15 s) and write the same
cache entry. Here a process about to compile a signature first takes that signature's lock
file beside numba's cache (``flock``, released however the process ends). A process that
finds the lock held waits for it, then compiles as numba does: numba looks in its cache
first, where the other process has just put the kernel, and loads it in a fraction of a
second. One core compiles; the others are free meanwhile.

The lock is taken only where the calling thread does not hold numba's compiler lock: not for
a kernel whose compile another compile asks for (the outer one holds its own lock), and never
by a thread that would wait for another process while it keeps this process's other threads
from compiling (one of them could hold the lock it waits for).  No process waits longer than
:data:`WAIT_LIMIT_S`: one stopped while it held the lock leaves the others to compile on
their own.  Where there is nothing to lock with (no ``flock``, no on-disk cache, a cache
folder that cannot be written), kernels compile as numba compiles them.  :mod:`.background`
children compile under the same locks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time

from numba.core import sigutils
from numba.core.compiler_lock import global_compiler_lock

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locks, each process compiles
    fcntl = None

# How long a process waits for another's compile before compiling itself: the slowest compile
# measured, a MaxPool kernel with Indices on a busy 2-core host, took about 60 s.
WAIT_LIMIT_S = 300.0
_POLL_S = (0.01, 0.2)  # the first and the longest pause between tries


def name_of(kernel) -> tuple[str, str]:
    """A kernel's module and qualified name: the same in every process."""
    return kernel.py_func.__module__, kernel.py_func.__qualname__


def lock_path(kernel, signature: tuple) -> str | None:
    """The signature's lock file, beside numba's cache of the kernel's module; None where the
    kernel has no on-disk cache."""
    directory = kernel.stats.cache_path  # numba's public stats; None: no on-disk cache
    if not directory:
        return None
    digest = hashlib.sha1(repr((name_of(kernel), signature)).encode()).hexdigest()[:20]
    return os.path.join(directory, f"poolfold-compile-{digest}.lock")


def open_lock(kernel, signature: tuple) -> int | None:
    """A descriptor of the signature's lock file (not yet locked), or None where there is
    nothing to lock with."""
    if fcntl is None:
        return None
    path = lock_path(kernel, signature)
    if path is None:
        return None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # a read-only cache: numba says so on its own
        return None


def try_lock(descriptor: int) -> bool:
    """Lock ``descriptor``'s file if no one holds it; whether it is locked now."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def compiling(kernel, signature: tuple):
    """Hold the signature's lock for the block, after waiting (at most :data:`WAIT_LIMIT_S`)
    for a process that holds it; the block runs unlocked where nothing can be locked."""
    descriptor = open_lock(kernel, signature)
    if descriptor is None:
        yield
        return
    try:
        if not try_lock(descriptor):
            from .notices import announce

            announce(f"poolfold: another process is compiling the "
                     f"{kernel.py_func.__name__} kernel; waiting to load it from numba's cache")
            deadline = time.monotonic() + WAIT_LIMIT_S
            pause = _POLL_S[0]
            while not try_lock(descriptor) and time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(2 * pause, _POLL_S[1])
        yield
    finally:
        os.close(descriptor)  # unlocks


def share_compiles(kernel):
    """``kernel`` (a numba dispatcher with its disk cache), each of its compiles from Python
    run under its signature's lock (see the module doc).  Returns ``kernel``."""
    numba_compile = kernel.compile

    def compile(sig):
        args = tuple(sigutils.normalize_signature(sig)[0])
        if args in kernel.overloads or global_compiler_lock.is_locked():
            return numba_compile(sig)
        with compiling(kernel, args):
            return numba_compile(sig)

    # numba's dispatcher calls self.compile for every compile: a call's first run, the
    # typing of a call from another kernel, and dispatcher.compile itself
    kernel.compile = compile
    return kernel
