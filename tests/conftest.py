"""Shared test setup: tests/ on sys.path (for ``import oracle``) and the hypothesis profile."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
