"""The onnx package's backend tests for poolfold's ops, run through :mod:`poolfold.backend`.

The MaxPool, MaxUnpool, Col2Im, AveragePool, LpPool, GlobalAveragePool and GlobalMaxPool node
tests come from onnx's test generators (``onnx.backend.test.case.node``; onnx ships none for
GlobalLpPool), the PyTorch-converted MaxPool and AvgPool models from the data onnx ships
(``onnx/backend/test/data``).  Outputs are compared as onnx's own ``BackendTest`` compares
them.  One test is a documented divergence (see the README):
``test_maxunpool_export_with_output_shape`` reads MaxUnpool indices in the inferred shape; it
fails by design under poolfold's semantics and passes with ``inferred_shape_indices=True``.
Every averaging-family test passes (onnx 1.23): its ceil-mode AveragePool data
(``test_averagepool_2d_ceil*``, ``..._ceil_mode_is_True``) count the taps as
docs/semantics.md does.  ``test_averagepool_2d_ceil_last_window_starts_on_pad`` stores its
expected values rounded to 4 digits (0.1511 for 0.15105555...): within the test's rtol of
1e-3, not within the contract's bound, so it checks the windows rather than the rounding.
"""

from __future__ import annotations

import glob
import os
import re
import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from . import backend

PATTERN = re.compile(r"^test_(maxpool|maxunpool|col2im|operator_maxpool|averagepool|avgpool|lppool"
                     r"|globalaveragepool|globalmaxpool|globallppool)", re.IGNORECASE)
MODEL_KINDS = ("pytorch-converted", "pytorch-operator")
# onnx's BackendTest tolerances for the stored models.
RTOL, ATOL = 1e-3, 1e-7

DIVERGENCES = {
    "test_maxunpool_export_with_output_shape": (
        "reads I in the inferred 4x4 shape pasted into the 5x5 output; poolfold reads I as flat "
        "positions of the output (as onnxruntime and PyTorch; onnx/onnx#2398)",
        {"inferred_shape_indices": True},
    ),
}


@dataclass
class Case:
    name: str
    kind: str
    model: onnx.ModelProto
    data_sets: list  # [(inputs, expected outputs)]
    rtol: float = RTOL
    atol: float = ATOL


@dataclass
class Outcome:
    case: Case
    status: str  # "pass", "fail", "divergence" (fails as documented, passes with its option)
    seconds: float
    detail: str = ""


def cases() -> list[Case]:
    from onnx.backend.test.case.node import collect_testcases

    found = [
        Case(c.name, "node", c.model, [(list(i), list(o)) for i, o in c.data_sets], c.rtol, c.atol)
        for c in collect_testcases(None)
        if PATTERN.search(c.name)
    ]
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    for kind in MODEL_KINDS:
        for directory in sorted(glob.glob(os.path.join(root, kind, "test_*"))):
            name = os.path.basename(directory)
            if PATTERN.search(name):
                found.append(Case(name, kind, onnx.load(os.path.join(directory, "model.onnx")),
                                  _stored_data_sets(directory)))
    return found


def _load(path: str) -> np.ndarray:
    tensor = onnx.TensorProto()
    with open(path, "rb") as f:
        tensor.ParseFromString(f.read())
    return numpy_helper.to_array(tensor)


def _stored_data_sets(directory: str) -> list:
    data_sets = []
    for data_set in sorted(glob.glob(os.path.join(directory, "test_data_set_*"))):
        inputs = [_load(p) for p in sorted(glob.glob(os.path.join(data_set, "input_*.pb")))]
        outputs = [_load(p) for p in sorted(glob.glob(os.path.join(data_set, "output_*.pb")))]
        data_sets.append((inputs, outputs))
    return data_sets


def _check(case: Case, **options) -> None:
    """Run every data set of the case; raise AssertionError on a mismatch."""
    rep = backend.prepare(case.model, **options)
    for inputs, expected in case.data_sets:
        outputs = rep.run(inputs)
        assert len(outputs) == len(expected), f"{len(outputs)} outputs, expected {len(expected)}"
        for got, want in zip(outputs, expected):
            assert got.dtype == want.dtype, f"dtype {got.dtype}, expected {want.dtype}"
            np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)


def run_case(case: Case) -> Outcome:
    start = time.perf_counter()
    try:
        _check(case)
        status, detail = "pass", ""
    except Exception as error:  # a failing test is a result, not a crash
        status, detail = "fail", f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    if case.name in DIVERGENCES:
        reason, options = DIVERGENCES[case.name]
        try:
            _check(case, **options)
            passes_with_option = True
        except Exception:
            passes_with_option = False
        if status == "fail" and passes_with_option:
            status = "divergence"
            option = ", ".join(f"{k}={v}" for k, v in options.items())
            detail = f"documented divergence: {reason}; passes with {option}"
        elif status == "pass":
            status, detail = "fail", "expected the documented divergence, but the test passed"
        else:
            detail += f"; also fails with {options}"
    return Outcome(case, status, time.perf_counter() - start, detail)
