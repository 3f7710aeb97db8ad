"""Output allocation that refuses, before any work starts, what the machine cannot hold."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading

import numpy as np

from .errors import PoolfoldError


@functools.lru_cache(maxsize=1)  # two system calls, once: every output allocation asks
def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: let numpy decide
        return 2**62


def check_size(label: str, what: str, shape: tuple[int, ...], dtype) -> None:
    """Refuse, with a PoolfoldError, an output ``what`` of ``shape`` larger than physical
    memory.  Linux overcommits, so numpy alone would often "succeed" and the process would be
    killed later while writing."""
    _refuse_beyond_memory(label, f"output '{what}'", shape, dtype)


def check_table(label: str, what: str, shape: tuple[int, ...], dtype) -> None:
    """:func:`check_size` for a table or scratch buffer a call builds besides its outputs.
    Tables are sized by the geometry (outputs per axis, window taps), not by the data: an
    empty batch with huge pads has an output of no element and a table of terabytes."""
    _refuse_beyond_memory(label, what, shape, dtype)


@contextlib.contextmanager
def building(label: str, what: str):
    """numpy's MemoryError while ``what`` (a table sized by the geometry) is built, as a
    PoolfoldError naming the op: :func:`check_table` bounds tables by the machine's memory,
    and a process under a lower limit (a container, ``ulimit -v``) may have less (a tap
    table of 44 million outputs under 2 GiB, found by the fuzz campaign)."""
    try:
        yield
    except MemoryError as error:
        raise PoolfoldError(f"{label}: cannot allocate {what}: {error}") from None


def _refuse_beyond_memory(label: str, description: str, shape, dtype) -> None:
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > _physical_memory():
        raise PoolfoldError(
            f"{label}: {description} of shape {tuple(shape)} ({dtype.name}) needs "
            f"{nbytes / 2**30:.1f} GiB, more than this machine's memory"
        )


# This thread's provider of output buffers (see :func:`allocate`), when one is set.
PLACES = threading.local()


def allocate(label: str, what: str, shape: tuple[int, ...], dtype, fill=None,
             size_checked: bool = False) -> np.ndarray:
    """``np.empty`` (or ``np.full``) of ``shape``, after :func:`check_size` unless the caller
    already ran it for this shape and type (``size_checked``).

    Where the calling thread has set ``PLACES.provide`` (poolfold's nodes inside an
    onnxruntime session, :mod:`poolfold.session_ops`), the output ``what`` comes from it when
    it has a buffer for it: the node then writes where onnxruntime reads, with no copy."""
    if not size_checked:
        check_size(label, what, shape, dtype)
    provide = getattr(PLACES, "provide", None)
    if provide is not None:
        given = provide(what, tuple(shape), np.dtype(dtype))
        if given is not None:
            if fill is not None:
                given.fill(fill)
            return given
    try:
        if fill is None:
            return np.empty(shape, dtype)
        return np.full(shape, fill, dtype)
    except (MemoryError, ValueError) as error:
        raise PoolfoldError(
            f"{label}: cannot allocate output '{what}' of shape {tuple(shape)}: {error}"
        ) from None


# Bytes in a cache line (x86-64 and most ARM cores).
LINE_BYTES = 64


def line_rows(rows: int, *row_shape: int) -> np.ndarray:
    """Uninitialised int64 scratch of shape ``(rows, *row_shape)`` for a kernel whose work
    items each keep a row of it (their counters), every row starting on a cache line of its
    own.  Rows packed end to end share lines, and two threads that write counters in one line
    take it from each other's cache on every write: Col2Im's fold over (1,16,64,64) took
    140-180 us on 2 threads where its counters' array happened to straddle a line between
    the threads' planes, 95-100 where it did not (one thread: 165-175)."""
    width = math.prod(row_shape)
    per_line = LINE_BYTES // 8
    pitch = -(-max(width, 1) // per_line) * per_line
    buffer = np.empty(rows * pitch + per_line, np.int64)
    skip = (-buffer.__array_interface__["data"][0] % LINE_BYTES) // 8
    lined = buffer[skip:skip + rows * pitch].reshape(rows, pitch)[:, :width]
    return lined.reshape((rows, *row_shape))
