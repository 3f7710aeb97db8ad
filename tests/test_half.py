"""float16 bits widened to float32 and float32 narrowed to float16 bits inside kernels
(poolfold.kernels.half) against numpy's conversions, for every float16 and the float32
values around and between them: on this host's target, and on one without F16C, where LLVM
turns the conversions into library calls that poolfold links to the C runtime's."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from poolfold.kernels.half import as_float32, narrow_to


@njit
def _widen_all(bits, out):
    for i in range(bits.size):
        out[i] = as_float32(bits[i])


@njit
def _narrow_all(values, bits):
    for i in range(values.size):
        bits[i] = narrow_to(np.float64(values[i]), bits)


def check_conversions() -> None:
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    widened = np.empty(every.size, np.float32)
    _widen_all(every, widened)
    want = every.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(widened), nan)
    assert np.array_equal(widened[~nan].view(np.uint32), want[~nan].view(np.uint32))
    # float32 values: each float16, the points halfway between neighbours (ties to even),
    # a little either side of them, and past the largest float16 (to inf)
    finite = np.sort(want[np.isfinite(want)].astype(np.float64))
    halfway = (finite[:-1] + finite[1:]) / 2
    values = np.concatenate([finite, halfway, np.nextafter(halfway, np.inf),
                             np.nextafter(halfway, -np.inf), [65520.0, 1e6, -1e6, np.inf,
                                                              -np.inf]]).astype(np.float32)
    narrowed = np.empty(values.size, np.uint16)
    _narrow_all(values, narrowed)
    with np.errstate(over="ignore"):  # past the largest float16: inf, as intended
        want_bits = values.astype(np.float16).view(np.uint16)
    assert np.array_equal(narrowed, want_bits)


def test_half_conversions_match_numpy():
    check_conversions()


def test_bfloat16_narrowing_rounds_to_nearest_even_and_keeps_nans_quiet():
    """float32 values narrowed to bfloat16 bits in kernels against ml_dtypes: every
    bfloat16, the points halfway between neighbours (ties to even), a little either side of
    them, past the largest (to inf); a NaN of any payload as its top half made quiet."""
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    wide = every.astype(np.float32)
    finite = np.sort(wide[np.isfinite(wide)].astype(np.float64))
    halfway = (finite[:-1] + finite[1:]) / 2
    values = np.concatenate([finite, halfway, np.nextafter(halfway, np.inf),
                             np.nextafter(halfway, -np.inf), [3.4e38, -3.4e38, np.inf,
                                                              -np.inf]]).astype(np.float32)
    narrowed = np.empty(values.size, np.int16)
    _narrow_all(values, narrowed)
    assert narrowed.tobytes() == values.astype(ml_dtypes.bfloat16).tobytes()
    nans = np.array([0x7F800001, 0x7FC00000, 0xFFC00123, 0x7FBFFFFF], np.uint32)
    narrowed = np.empty(nans.size, np.int16)
    _narrow_all(nans.view(np.float32), narrowed)
    # through float64 and back, a NaN's float32 payload is kept; its top half, made quiet
    assert narrowed.view(np.uint16).tolist() == [0x7FC0, 0x7FC0, 0xFFC0, 0x7FFF]


def test_half_conversions_on_a_target_without_f16c(tmp_path):
    """numba told to compile for a generic x86-64 (no F16C): before poolfold linked the
    runtime's conversions, the first float16 kernel aborted the process."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the generic target without F16C is x86-64's")
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path))
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import test_half; "
              "test_half.check_conversions(); print('converted')")
    done = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "converted" in done.stdout, done.stderr[-2000:]
