"""onnx's node tests of ops poolfold does not implement, through poolfold.backend: each runs as
a stretch on onnxruntime (or, where onnxruntime refuses it, on onnx's ReferenceEvaluator), and
must give onnx's expected outputs.  The ops are those models mix with poolfold's: Conv, MatMul,
Gemm, Reshape, Shape, Concat, Flatten, Transpose, Relu, Add, If, Loop, Scan.
"""

from __future__ import annotations

import warnings

import onnx.backend.test
import pytest

import poolfold.backend
from onnx_backend_cases import runnable_cases

pytest.importorskip("onnxruntime")

INCLUDE = (r"^test_(conv_|matmul_|gemm_|reshape_|shape|concat_|flatten_|transpose_|relu|add|"
           r"if|loop|scan)")
# onnx's runner cannot compare this test's expected optional sequence with the list a backend
# returns ("len() of unsized object"), though both paths give its values.
EXCLUDE = r"test_loop16_seq_none"

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(poolfold.backend, __name__)
backend_test.include(INCLUDE)
backend_test.exclude(EXCLUDE)
globals().update(runnable_cases(backend_test))


def test_node_tests_run_on_onnxruntime():
    """The tests above go through onnxruntime's sessions, not the fallback: every Conv, MatMul
    and If test is one onnxruntime stretch."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in collect_testcases(None)
                 if c.name.startswith(("test_conv_", "test_matmul_", "test_if"))
                 and "_opt" not in c.name and not c.name.endswith("_expanded")]
    assert len(cases) >= 8
    for case in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback
            rep = poolfold.backend.prepare(case.model)
        assert [step.runner for step in rep.steps] == ["onnxruntime"], case.name
