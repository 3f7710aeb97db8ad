"""poolfold's settings read from the environment on every call, at a fraction of the cost.

``os.environ.get`` of a name that is not set raises and catches two ``KeyError``s: 1.7 us,
measured, where the call it serves (a batch-1 MaxPool) runs in 25; of a name that is set,
it encodes the name and decodes the value, 0.4 us.  ``os.environ`` keeps its values in a
plain dict of bytes on POSIX systems (CPython's ``os._Environ._data``, which every write
through ``os.environ`` updates): one lookup there answers in 0.03 us, and the decoded text
is kept per value.  Where that dict is not there as expected (another Python, or Windows,
whose keys are upper-cased text), this is ``os.environ.get``.
"""

from __future__ import annotations

import functools
import os


def _bytes_environ() -> dict | None:
    """The dict of bytes behind ``os.environ``, where it is one."""
    data = getattr(os.environ, "_data", None)
    if os.name != "posix" or type(data) is not dict:
        return None
    probe = next(iter(data), b"")
    return data if type(probe) is bytes else None


_DATA = _bytes_environ()


@functools.lru_cache(maxsize=32)
def _encoded(name: str) -> bytes:
    return os.fsencode(name)


@functools.lru_cache(maxsize=32)
def _decoded(value: bytes) -> str:
    return os.fsdecode(value)


def read(name: str) -> str | None:
    """The environment variable ``name``, or None where it is not set."""
    if _DATA is None:
        return os.environ.get(name)
    value = _DATA.get(_encoded(name))
    return None if value is None else _decoded(value)
