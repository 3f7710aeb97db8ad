"""Shared test setup: tests/ on sys.path (for ``import oracle``) and the hypothesis profile."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# The oracle is pure Python and numba compiles on first use: no per-example deadline.
settings.register_profile(
    "poolfold",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("poolfold")

# Every test runs the kernel it names, compiled in its own process: no direct scan standing in
# while a child process compiles the separable MaxPool kernel (test_background_compile.py
# turns that on where it tests it).  Child processes the tests start inherit this.
os.environ["POOLFOLD_BACKGROUND_COMPILE"] = "0"


@pytest.hookimpl(trylast=True)  # after -k and --deselect have left out what they leave out
def pytest_collection_modifyitems(config, items):
    """Start the bounds-checked run (test_fuzz_boundscheck.py) in the background as soon as
    it is known to be wanted, so that it compiles on the core the main run leaves idle, and
    move the test that waits for it to the end: the run compiles every kernel again (about
    6 minutes of one core at NUMBA_OPT=0, 12 at the default level), and waited for in its
    file's place the main run stood idle for most of that.

    The fuzz campaign (test_fuzz.py) goes just before it: its two worker processes compile,
    both at once, every kernel signature no test before them has put in numba's cache, and
    in its file's place, before the kernels' own tests, that was most of them (195 s of a
    19-minute run with an empty cache, 9-14 s with a full one; the whole run with a full
    cache went from 753 to 627 s with both moved)."""
    last = ("test_fixed_seed_cases_all_pass", "test_property_tests_pass_with_bounds_checking")
    moved = sorted((item for item in items if item.name in last),
                   key=lambda item: last.index(item.name))
    if any(item.name == last[1] for item in moved):
        from test_fuzz_boundscheck import start_checked_run

        config.poolfold_checked_run = start_checked_run()
    items[:] = [item for item in items if item not in moved] + moved


def pytest_unconfigure(config):
    """An interrupted session leaves no bounds-checked run behind."""
    started = getattr(config, "poolfold_checked_run", None)
    if started is not None and started[0].poll() is None:
        started[0].kill()
