"""poolfold's settings read from the environment on every call, at a fraction of the cost.

``os.environ.get`` of a name that is not set raises and catches two ``KeyError``s: 1.7 us,
measured, where the call it serves (a batch-1 MaxPool) runs in 40.  The C library's
``getenv`` answers in 0.5 us through ctypes, and holds the same values: ``os.environ``
writes every change through to the C environment (``putenv`` / ``unsetenv``).  It is
called without releasing the GIL (``PyDLL``), as ``os.environ``'s writes are made, so that
no Python thread changes the C environment while it is read.  Elsewhere than on POSIX
systems (whose ``os.environ`` writes another C runtime's copy) this is ``os.environ.get``.
"""

from __future__ import annotations

import os

_GETENV = None  # the C library's getenv, found on the first read; False: none here


def read(name: str) -> str | None:
    """The environment variable ``name``, or None where it is not set."""
    getenv = _GETENV if _GETENV is not None else _find_getenv()
    if not getenv:
        return os.environ.get(name)
    value = getenv(name.encode())
    return None if value is None else os.fsdecode(value)


def _find_getenv():
    """The C library's ``getenv`` (ctypes imported here, not at poolfold's import: it adds
    to every process's start-up), or False."""
    global _GETENV
    _GETENV = False
    if os.name == "posix":
        try:
            import ctypes

            getenv = ctypes.PyDLL(None).getenv
            getenv.restype = ctypes.c_char_p
            getenv.argtypes = (ctypes.c_char_p,)
            _GETENV = getenv
        except (OSError, AttributeError):  # no C library to open, or no getenv in it
            pass
    return _GETENV
