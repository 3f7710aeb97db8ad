"""The kernels' helpers are compiled to be linked only (poolfold.kernels.linking): their code
reaches Python through the kernels that call them, with the same results and errors, and
they are never turned into machine code of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit

from poolfold.kernels import helper, linking


def test_the_installed_numba_takes_the_link_only_path():
    """A numba whose internals moved would silently compile every helper in full again
    (correct, and slower to compile): the suite says so instead."""
    assert linking.AVAILABLE


@helper
def _weighted_total(a, weight):
    total = 0.0
    for v in a:
        total += v * weight
    return total


@helper
def _checked_item(a, i):
    if i >= a.size:  # an exception holding run-time values reads the helper's environment
        raise ValueError("item", i, "of", a.size)
    return a[i]


@njit
def _total_kernel(a, weight):
    return _weighted_total(a, weight)


@njit
def _item_kernel(a, i):
    return _checked_item(a, i)


def test_a_helper_runs_inside_its_caller_and_has_no_machine_code_of_its_own():
    a = np.arange(10.0)
    assert _total_kernel(a, 2.0) == 90.0
    [compiled] = _weighted_total.overloads.values()
    assert isinstance(compiled.library, linking.LinkOnlyLibrary)
    # Compiled as numba compiles any function, the helper's symbol would be in the JIT
    # engine, from its own machine code; inlined into the kernel, no copy of it is left.
    engine = compiled.library.codegen._engine
    assert not engine.is_symbol_defined(compiled.fndesc.mangled_name)


def test_an_exception_with_run_time_values_raised_in_a_helper_reaches_python():
    a = np.arange(4.0)
    assert _item_kernel(a, 3) == 3.0
    with pytest.raises(ValueError) as raised:
        _item_kernel(a, 7)
    assert raised.value.args == ("item", 7, "of", 4)


def test_a_bounds_checked_read_in_a_helper_raises_index_error(tmp_path):
    """Under NUMBA_BOUNDSCHECK=1 (as the bounds-checked run compiles the kernels) a read past
    an array's end inside a helper raises IndexError from the kernel that called it."""
    script = textwrap.dedent("""
        import numpy as np
        from numba import njit
        from poolfold.kernels import helper

        @helper
        def item(a, i):
            return a[i]

        @njit
        def kernel(a, i):
            return item(a, i)

        assert kernel(np.arange(4.0), 2) == 2.0
        try:
            kernel(np.arange(4.0), 9)
        except IndexError:
            print("IndexError")
    """)
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["IndexError"]
