"""The check shared by the "too large to allocate" tests: the call is refused with a
PoolfoldError quickly, without allocating the output it refuses."""

from __future__ import annotations

import re
import time
import tracemalloc

import pytest

from poolfold import PoolfoldError


def assert_refused_quickly(call, *words, seconds: float = 5.0) -> None:
    """``call()`` raises PoolfoldError naming every one of ``words``, within ``seconds``
    and with under 64 MiB allocated (numpy's buffers, as tracemalloc sees them)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(PoolfoldError) as error:
            call()
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for word in words:
        assert re.search(re.escape(word), str(error.value)), (word, str(error.value))
    assert elapsed < seconds, elapsed
    assert peak < 64 * 2**20, f"{peak} bytes traced before the refusal"
