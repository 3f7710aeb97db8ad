"""The fuzz harness's fixed-seed subset, and a regression test for each defect it found.

The subset runs the campaign (tests/fuzz/campaign.py) in a child process: its workers are
forked, which numba's OpenMP threads (alive in this process once any kernel has run) do not
survive.  Every case is judged against the oracle in a worker with a time and memory limit;
a failing case is printed as a line that ``python -m tests.fuzz.campaign --replay`` takes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import poolfold
import poolfold.nhwc
from poolfold import PoolfoldTypeError

ROOT = Path(__file__).resolve().parents[1]
CASES = 2000
SEED = 20261123


def test_fixed_seed_cases_all_pass():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH"))
                                        if p)
    result = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.campaign", "--cases", str(CASES), "--seed", str(SEED),
         "--workers", "2", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["tried"] == CASES and summary["fail"] == 0, output[-6000:]
    assert summary["value"] + summary["error"] + summary["unchecked"] == CASES
    # The cases must reach the kernels, not only the argument checks.
    assert summary["value"] >= CASES // 5, summary
    assert summary["error"] >= CASES // 5, summary


# ------------------------------------------------------------------ regression tests

def test_max_pool_shape_returns_plain_ints_for_an_array_shape():
    shape = poolfold.max_pool_shape(np.array([1, 3, 2, 3, 2]), [1, 2, 1],
                                    strides=np.array([1, 3, 2], np.int32))
    assert shape == (1, 3, 2, 1, 1)
    assert all(type(v) is int for v in shape), [type(v) for v in shape]


@pytest.mark.parametrize("bad", [7, None, "abc", b"\x01\x01\x04", 2.5])
def test_max_pool_shape_refuses_a_shape_that_is_not_a_sequence(bad):
    with pytest.raises(PoolfoldTypeError, match="MaxPool-22: input 'X' shape"):
        poolfold.max_pool_shape(bad, [2])


@pytest.mark.parametrize("shape", [(1, 1, 0, 1), (1, 1, 4, 0), (1, 1, 0, 0, 3), (2, 3, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_max_pool_zero_size_spatial_axis_with_pads_gives_empty_windows(shape, dtype):
    """A 0-size spatial axis with pads: every window is empty (it divided by the 0-size row
    when choosing a kernel)."""
    rank = len(shape) - 2
    lowest = -np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min
    y, i = poolfold.max_pool(np.zeros(shape, dtype), [1] * rank, pads=[2] * (2 * rank),
                             return_indices=True)
    want = shape[:2] + tuple(n + 4 for n in shape[2:])
    assert y.shape == want and y.dtype == dtype and (y == lowest).all() and (i == -1).all()
    nhwc = np.zeros((shape[0],) + shape[2:] + (shape[1],), dtype)
    y, i = poolfold.nhwc.max_pool(nhwc, [1] * rank, pads=[2] * (2 * rank), return_indices=True)
    assert y.shape == (shape[0],) + want[2:] + (shape[1],) and (y == lowest).all()
    assert i.shape == want and (i == -1).all()


# ------------------------------------------------------------------ the judge itself

VALID_POOL = {"op": "max_pool", "x": {"dtype": "float32", "shape": (1, 2, 5, 5), "layout": (),
                                      "values": "normal", "seed": 3},
              "kwargs": {"kernel_shape": [3, 3], "strides": [2, 2]}}


def _refusing(monkeypatch, message):
    from fuzz import judge

    def refuse(*args, **kwargs):
        raise poolfold.PoolfoldError(message)

    monkeypatch.setitem(judge.FUNCTIONS, "max_pool", refuse)
    return judge


def test_judge_fails_a_refusal_of_a_valid_call(monkeypatch):
    """A regression that refuses valid calls must fail the campaign, not pass "by error"."""
    judge = _refusing(monkeypatch, "MaxPool-22: attribute 'strides' is not allowed")
    status, detail = judge.judge(VALID_POOL)
    assert status == "fail" and "contract says is valid" in detail, detail


@pytest.mark.parametrize("kwargs, reason", [
    ({"kernel_shape": [3, 3], "strides": [0, 2]}, "below 1"),
    ({"kernel_shape": [9, 9]}, "no window fits"),
    ({"kernel_shape": [3, 3], "dilations": [2, 2], "opset": 8}, "which lacks it"),
    ({"kernel_shape": [3, 3], "auto_pad": "VALID", "pads": [1, 1, 1, 1]}, "with auto_pad"),
])
def test_judge_passes_a_refusal_of_an_invalid_call(monkeypatch, kwargs, reason):
    judge = _refusing(monkeypatch, "MaxPool-22: refused")
    status, detail = judge.judge(dict(VALID_POOL, kwargs=kwargs))
    assert status == "error" and reason in detail, detail


def test_judge_wants_a_size_refusal_to_say_so(monkeypatch):
    huge = dict(VALID_POOL, kwargs={"kernel_shape": [1, 1], "pads": [0, 0, 2**38, 2**38]})
    judge = _refusing(monkeypatch, "MaxPool-22: refused")
    assert judge.judge(huge)[0] == "fail"
    judge = _refusing(monkeypatch, "MaxPool-22: needs 9 TiB, more than this machine's memory")
    assert judge.judge(huge)[0] == "error"


def test_judge_still_passes_a_right_value():
    from fuzz import judge

    assert judge.judge(VALID_POOL) == ("value", "")


def test_judge_lets_a_node_name_an_attribute_its_version_lacks_at_its_default():
    """Found by the 100,000-case campaign: a MaxPool-1 node carrying storage_order=0 (the
    node names it; a Python keyword at its default cannot be told from none) was judged a
    wrong refusal.  SEMANTICS.md makes it an error; at the default either answer is fair."""
    from fuzz import judge

    spec = {"op": "max_pool", "x": {"dtype": "float32", "shape": (5, 4, 3, 2), "layout": (),
                                    "values": "special", "seed": 2},
            "kwargs": {"kernel_shape": (2, 3), "pads": (2, 0, 1, 1), "storage_order": 0,
                       "opset": 1, "return_indices": False}, "via": "run_node"}
    assert judge.judge(spec)[0] in ("value", "error")
