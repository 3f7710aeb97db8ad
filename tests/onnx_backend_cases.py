"""onnx's BackendTest test classes, cut to the tests that run.

``BackendTest.test_cases`` holds a method for every node and model test onnx ships (about
4,000), the ones its include / exclude patterns leave out marked skipped: collecting and
reporting those skips costs the suite time and fills its output with thousands of "s".
"""

from __future__ import annotations

import warnings

import pytest


def runnable_cases(backend_test) -> dict:
    """``backend_test``'s test classes (its include and exclude patterns applied) without the
    methods those patterns or the backend's devices skip."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)  # onnx's coverage mark
        cases = backend_test.enable_report().test_cases
    for case in cases.values():
        for name in [n for n in vars(case) if n.startswith("test_")]:
            if getattr(getattr(case, name), "__unittest_skip__", False):
                delattr(case, name)
    return cases
