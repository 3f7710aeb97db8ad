"""poolfold.backend and poolfold.reference: onnx's BackendTest, whole models, run_node, errors,
and poolfold's ops plugged into onnx's ReferenceEvaluator.

Constructing onnx's BackendTest takes several seconds (it builds every node test onnx ships);
it is built once, at import, as onnx's documentation shows.
"""

from __future__ import annotations

import importlib
import os
import re
import warnings

import ml_dtypes
import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import oracle
from onnx_backend_cases import runnable_cases
import poolfold
import poolfold.backend
import poolfold.reference

INCLUDE = (r"(test_maxpool|test_maxunpool|test_col2im|test_MaxPool|test_operator_maxpool"
           r"|test_averagepool|test_AvgPool|test_lppool|test_globalaveragepool|test_globalmaxpool"
           r"|test_globallppool).*")
# Documented divergence (README.md, "Divergences"; docs/semantics.md "MaxUnpool"): this test reads
# MaxUnpool's I in the shape inferred from kernel/strides/pads, pasted at the origin of the
# larger output; poolfold reads I as flat positions of the output tensor, like onnxruntime and
# PyTorch (onnxruntime excludes it too, onnx/onnx#2398).  It is checked below, with and without
# prepare(..., inferred_shape_indices=True).
DIVERGENT = "test_maxunpool_export_with_output_shape"
# 34 of MaxPool, MaxUnpool and Col2Im; 39 of the averaging family (32 node tests, 7
# PyTorch-converted AvgPool models; onnx 1.23 has no GlobalLpPool test).
EXPECTED_EXECUTED = 73

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # onnx's test generators overflow on purpose
    backend_test = onnx.backend.test.BackendTest(poolfold.backend, __name__)
backend_test.include(INCLUDE)
backend_test.exclude(DIVERGENT)
_TEST_CASES = runnable_cases(backend_test)
globals().update(_TEST_CASES)


def _executed_backend_tests() -> list[str]:
    """Names of the generated BackendTest methods that are not skipped (include pattern,
    exclude pattern and device support are applied as unittest skip markers)."""
    names = []
    for case in _TEST_CASES.values():
        for name in dir(case):
            if name.startswith("test_") and not getattr(getattr(case, name), "__unittest_skip__",
                                                        False):
                names.append(name)
    return sorted(names)


def test_backend_test_runs_73_tests():
    executed = _executed_backend_tests()
    assert all(name.endswith("_cpu") for name in executed), executed
    assert len(executed) == EXPECTED_EXECUTED, executed


def test_backend_test_count_from_onnx_sources():
    """The same number, counted independently from onnx's node test generators and the model
    directories it ships."""
    from onnx.backend.test.case.node import collect_testcases

    pattern = re.compile(INCLUDE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names = {c.name for c in collect_testcases(None)}
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    for kind in ("pytorch-converted", "pytorch-operator"):
        names |= set(os.listdir(os.path.join(root, kind)))
    selected = sorted(n for n in names if pattern.search(n) and not re.search(DIVERGENT, n))
    assert len(selected) == EXPECTED_EXECUTED, selected
    assert sorted(n + "_cpu" for n in selected) == _executed_backend_tests()


def _node_case(name):
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (case,) = [c for c in collect_testcases("MaxUnpool") if c.name == name]
    return case


def test_divergent_test_passes_only_with_inferred_shape_indices():
    case = _node_case(DIVERGENT)
    (inputs, (expected,)), = case.data_sets
    # the option gives the test's answer
    (got,) = poolfold.backend.prepare(case.model, inferred_shape_indices=True).run(list(inputs))
    np.testing.assert_allclose(got, expected, rtol=case.rtol, atol=case.atol)
    assert got.dtype == expected.dtype
    # the default reads I as flat positions of the 5x5 output: a different answer
    (default,) = poolfold.backend.prepare(case.model).run(list(inputs))
    assert default.shape == expected.shape
    assert not np.allclose(default, expected)
    x, indices, output_shape = inputs
    np.testing.assert_array_equal(
        default, oracle.max_unpool(x, indices, [2, 2], strides=[2, 2], output_shape=output_shape))


# ------------------------------------------------------------------------------ whole models

def _conv_pool_unpool_model():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    bias = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["X", "W", "B"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("MaxPool", ["relu"], ["pooled", "indices"], kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Shape", ["relu"], ["shape"]),
        helper.make_node("MaxUnpool", ["pooled", "indices", "shape"], ["unpooled"],
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["unpooled", "bias"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes, "conv_pool_unpool",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 7, 9])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3, 7, 9]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 3, 3, 4])],
        initializer=[onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(b, "B"),
                     onnx.numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def test_whole_model_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    model = _conv_pool_unpool_model()
    x = np.random.default_rng(1).standard_normal((1, 2, 7, 9)).astype(np.float32)
    rep = poolfold.backend.prepare(model)
    assert rep.input_names == ["X"]  # initializers excluded
    y, indices = rep.run([x])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want_y, want_i = session.run(None, {"X": x})
    assert y.shape == want_y.shape == (1, 3, 7, 9) and y.dtype == np.float32
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(indices, want_i)
    # the dict form and run_model give the same
    y2, i2 = rep.run({"X": x})
    np.testing.assert_array_equal(y2, y)
    y3, i3 = poolfold.backend.run_model(model, [x])
    np.testing.assert_array_equal(y3, y)
    np.testing.assert_array_equal(i3, indices)
    # outputs come in graph order, also by name
    outputs = rep.run([x])
    np.testing.assert_array_equal(outputs.indices, indices)


def test_prepare_accepts_bytes_and_path(tmp_path):
    model = _conv_pool_unpool_model()
    x = np.random.default_rng(2).standard_normal((1, 2, 7, 9)).astype(np.float32)
    want = poolfold.backend.prepare(model).run([x])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    for source in (model.SerializeToString(), str(path)):
        got = poolfold.backend.prepare(source).run([x])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_supports_device():
    assert poolfold.backend.supports_device("CPU")
    assert not poolfold.backend.supports_device("CUDA")
    with pytest.raises(ValueError):
        poolfold.backend.prepare(_conv_pool_unpool_model(), device="CUDA")


def test_run_rejects_unknown_input_and_wrong_count():
    rep = poolfold.backend.prepare(_conv_pool_unpool_model())
    x = np.zeros((1, 2, 7, 9), np.float32)
    with pytest.raises(ValueError, match="input"):
        rep.run({"nope": x})
    with pytest.raises(ValueError, match="input"):
        rep.run([x, x])


# ------------------------------------------------------------------------------ run_node

def _max_pool_node(**attrs):
    return helper.make_node("MaxPool", ["X"], ["Y", "I"], kernel_shape=[3, 3], **attrs)


@pytest.mark.parametrize("opset", [8, None])
def test_run_node_max_pool_two_outputs(opset):
    x = np.random.default_rng(3).standard_normal((2, 2, 6, 5)).astype(np.float32)
    node = _max_pool_node(strides=[2, 2], pads=[1, 1, 1, 1], storage_order=1)
    kwargs = {} if opset is None else {"opset_version": opset}
    y, indices = poolfold.backend.run_node(node, [x], **kwargs)
    want_y, want_i = oracle.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                     storage_order=1)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(indices, want_i)


def test_run_node_latest_version_accepts_bfloat16_and_dilations():
    x = np.random.default_rng(4).standard_normal((1, 1, 7, 7)).astype(ml_dtypes.bfloat16)
    node = _max_pool_node(dilations=[2, 2], ceil_mode=1, strides=[2, 2])
    y, indices = poolfold.backend.run_node(node, [x])  # the latest version: 22
    want_y, want_i = oracle.max_pool(x, [3, 3], dilations=[2, 2], ceil_mode=True, strides=[2, 2])
    assert y.dtype == want_y.dtype
    np.testing.assert_array_equal(y.view(np.uint16), want_y.view(np.uint16))
    np.testing.assert_array_equal(indices, want_i)
    with pytest.raises(TypeError, match="MaxPool-12"):
        poolfold.backend.run_node(node, [x], opset_version=12)


def test_run_node_max_pool_one_output_at_version_1():
    x = np.random.default_rng(5).standard_normal((1, 2, 5, 5)).astype(np.float64)
    node = helper.make_node("MaxPool", ["X"], ["Y"], kernel_shape=[2, 2])
    (y,) = poolfold.backend.run_node(node, [x], opset_version=1)
    np.testing.assert_array_equal(y, oracle.max_pool(x, [2, 2])[0])
    with pytest.raises(ValueError, match="MaxPool-1"):
        poolfold.backend.run_node(_max_pool_node(), [x], opset_version=1)


def test_run_node_other_ops():
    x = np.array([[-1.0, 0.5], [2.0, -3.0]], np.float32)
    (y,) = poolfold.backend.run_node(helper.make_node("Relu", ["X"], ["Y"]), [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    (z,) = poolfold.backend.run_node(helper.make_node("Add", ["A", "B"], ["C"]), [x, x],
                                     opset_version=14)
    np.testing.assert_array_equal(z, x + x)


def test_run_node_max_unpool_and_col2im():
    x = np.random.default_rng(6).standard_normal((1, 2, 4, 5)).astype(np.float32)
    y, i = oracle.max_pool(x, [2, 2], strides=[2, 2])
    node = helper.make_node("MaxUnpool", ["X", "I", "S"], ["Y"], kernel_shape=[2, 2],
                            strides=[2, 2])
    shape = np.array(x.shape, np.int64)
    (got,) = poolfold.backend.run_node(node, [y, i, shape])
    np.testing.assert_array_equal(got, oracle.max_unpool(y, i, [2, 2], strides=[2, 2],
                                                         output_shape=x.shape))
    cols = np.arange(2 * 4 * 6, dtype=np.int32).reshape(1, 8, 6)
    node = helper.make_node("Col2Im", ["x", "img", "blk"], ["y"], strides=[1, 2])
    (folded,) = poolfold.backend.run_node(node, [cols, np.array([3, 6], np.int64),
                                                 np.array([2, 2], np.int64)])
    np.testing.assert_array_equal(folded, oracle.col2im(cols, [3, 6], [2, 2], strides=[1, 2]))


# ------------------------------------------------------------------------------ version errors

def _one_node_model(node, opset, inputs, outputs, domain_opsets=()):
    graph = helper.make_graph([node], "g", inputs, outputs)
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in
                                                  domain_opsets]
    return helper.make_model(graph, opset_imports=imports, ir_version=8)  # no checker


def test_attribute_the_version_lacks_is_an_error():
    node = helper.make_node("MaxPool", ["X"], ["Y"], kernel_shape=[2, 2], dilations=[2, 2])
    model = _one_node_model(
        node, 8, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    x = np.zeros((1, 1, 5, 5), np.float32)
    with pytest.raises(ValueError) as info:
        poolfold.backend.prepare(model).run([x])
    assert "MaxPool-8" in str(info.value) and "dilations" in str(info.value)
    with pytest.raises(ValueError) as info:
        poolfold.backend.run_node(node, [x], opset_version=8)
    assert "MaxPool-8" in str(info.value) and "dilations" in str(info.value)
    # at opset 10 the same node is fine
    (y,) = poolfold.backend.prepare(_one_node_model(
        node, 10, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])).run([x])
    assert y.shape == (1, 1, 3, 3)


def test_storage_order_on_version_1_is_an_error():
    node = helper.make_node("MaxPool", ["X"], ["Y"], kernel_shape=[2, 2], storage_order=1)
    with pytest.raises(ValueError) as info:
        poolfold.backend.run_node(node, [np.zeros((1, 1, 4, 4), np.float32)], opset_version=7)
    assert "MaxPool-1" in str(info.value) and "storage_order" in str(info.value)


# ------------------------------------------------------------------------------ reference ops

def _evaluate(model, feeds, ops=True):
    session = ReferenceEvaluator(model, new_ops=poolfold.reference.ops) if ops \
        else ReferenceEvaluator(model)
    return session.run(None, feeds)


def _max_pool_model(opset, elem_type, attrs, with_indices=True):
    outputs = ["Y", "I"] if with_indices else ["Y"]
    node = helper.make_node("MaxPool", ["X"], outputs, kernel_shape=[2, 2], **attrs)
    out_info = [helper.make_tensor_value_info("Y", elem_type, None)]
    if with_indices:
        out_info.append(helper.make_tensor_value_info("I", TensorProto.INT64, None))
    return _one_node_model(node, opset, [helper.make_tensor_value_info("X", elem_type, None)],
                           out_info)


@pytest.mark.parametrize("opset", [12, 22])
@pytest.mark.parametrize("attrs", [
    dict(storage_order=1),
    dict(storage_order=1, strides=[2, 1], pads=[1, 0, 1, 1]),
    dict(auto_pad="SAME_LOWER", strides=[2, 2]),
    dict(auto_pad="SAME_UPPER", dilations=[2, 1]),
    dict(ceil_mode=1, strides=[2, 2], pads=[0, 0, 1, 1]),
])
def test_reference_ops_max_pool(opset, attrs):
    x = np.random.default_rng(8).standard_normal((2, 3, 5, 6)).astype(np.float32)
    x[0, 1, 2, 2] = np.nan
    x[1, 0] = 1.0  # ties
    y, indices = _evaluate(_max_pool_model(opset, TensorProto.FLOAT, attrs), {"X": x})
    want_y, want_i = oracle.max_pool(x, [2, 2], **attrs)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(indices, want_i)


def test_reference_ops_max_pool_int8_and_bfloat16():
    rng = np.random.default_rng(9)
    x8 = rng.integers(-128, 127, (1, 2, 5, 5), endpoint=True).astype(np.int8)
    y, i = _evaluate(_max_pool_model(12, TensorProto.INT8, dict(strides=[2, 2])), {"X": x8})
    want_y, want_i = oracle.max_pool(x8, [2, 2], strides=[2, 2])
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(i, want_i)
    xb = rng.standard_normal((1, 2, 5, 5)).astype(ml_dtypes.bfloat16)
    y, i = _evaluate(_max_pool_model(22, TensorProto.BFLOAT16, dict(storage_order=1)), {"X": xb})
    want_y, want_i = oracle.max_pool(xb, [2, 2], storage_order=1)
    np.testing.assert_array_equal(np.asarray(y).astype(np.float32), want_y.astype(np.float32))
    np.testing.assert_array_equal(i, want_i)


@pytest.mark.parametrize("attrs", [dict(storage_order=1), dict(auto_pad="SAME_LOWER",
                                                                strides=[2, 2])])
def test_reference_ops_replace_the_evaluators_own(attrs):
    """On the cases docs/semantics.md names as the evaluator's own MaxPool's weak spots
    (SAME_LOWER; the plane offset with storage_order 1, here with C = 2), the evaluator with
    the plugged-in ops gives the oracle's answer.  (Nothing is asserted about onnx's own
    MaxPool: whether it is still wrong there is onnx's business.)"""
    x = np.random.default_rng(10).standard_normal((1, 2, 5, 5)).astype(np.float32)
    model = _max_pool_model(12, TensorProto.FLOAT, attrs)
    want_y, want_i = oracle.max_pool(x, [2, 2], **attrs)
    y, indices = _evaluate(model, {"X": x})
    assert y.dtype == np.float32 and indices.dtype == np.int64
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(indices, want_i)


def test_reference_ops_use_poolfolds_kernels(monkeypatch):
    """The evaluator runs poolfold's planes (not its own Python loops) for MaxPool.  (The
    speed-up itself is measured by the benchmark, not asserted in a unit test.)"""
    module = importlib.import_module("poolfold.ops.max_pool")
    original = module._PoolLaunch.__call__
    calls = []

    def counting(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module._PoolLaunch, "__call__", counting)
    x = np.random.default_rng(11).standard_normal((1, 16, 12, 12)).astype(np.float32)
    model = _max_pool_model(18, TensorProto.FLOAT, dict(strides=[2, 2], pads=[0, 0, 1, 1]),
                            with_indices=False)
    (y,) = _evaluate(model, {"X": x})
    assert len(calls) == 1
    np.testing.assert_array_equal(y, oracle.max_pool(x, [2, 2], strides=[2, 2],
                                                     pads=[0, 0, 1, 1])[0])
    calls.clear()
    _evaluate(model, {"X": x}, ops=False)
    assert calls == []


def test_reference_ops_max_unpool():
    x = np.random.default_rng(12).standard_normal((1, 2, 5, 7)).astype(np.float32)
    y, i = oracle.max_pool(x, [2, 2], strides=[2, 2])
    node = helper.make_node("MaxUnpool", ["X", "I", "S"], ["Y"], kernel_shape=[2, 2],
                            strides=[2, 2])
    model = _one_node_model(
        node, 11,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("I", TensorProto.INT64, None),
         helper.make_tensor_value_info("S", TensorProto.INT64, None)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    (got,) = _evaluate(model, {"X": y, "I": i, "S": np.array(x.shape, np.int64)})
    want = oracle.max_unpool(y, i, [2, 2], strides=[2, 2], output_shape=x.shape)
    np.testing.assert_array_equal(got, want)
    # every maximum is back in its place (5 and 7 are odd: not the inferred 4x6)
    assert got.shape == x.shape
    np.testing.assert_array_equal(got.reshape(-1)[i.reshape(-1)], y.reshape(-1))


def test_reference_ops_col2im():
    x = np.random.default_rng(13).standard_normal((2, 2 * 6, 6)).astype(np.float32)
    node = helper.make_node("Col2Im", ["x", "img", "blk"], ["y"], dilations=[1, 2], pads=[0, 1, 1, 0])
    model = _one_node_model(
        node, 18,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("img", TensorProto.INT64, None),
         helper.make_tensor_value_info("blk", TensorProto.INT64, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    image, block = np.array([3, 5], np.int64), np.array([2, 3], np.int64)
    (got,) = _evaluate(model, {"x": x, "img": image, "blk": block})
    want = oracle.col2im(x, [3, 5], [2, 3], dilations=[1, 2], pads=[0, 1, 1, 0])
    np.testing.assert_array_equal(got, want)


def test_reference_ops_nhwc_max_pool_with_activation():
    x = np.random.default_rng(14).standard_normal((1, 5, 6, 3)).astype(np.float32)  # N, H, W, C
    node = helper.make_node("MaxPool", ["X"], ["Y", "I"], domain="com.ms.internal.nhwc",
                            kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                            activation="Relu")
    model = _one_node_model(
        node, 18, [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("I", TensorProto.INT64, None)],
        domain_opsets=[("com.ms.internal.nhwc", 12)])
    y, indices = _evaluate(model, {"X": x})
    nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    want_y, want_i = oracle.max_pool(nchw, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(y, np.maximum(want_y, 0).transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(indices, want_i)
    # and through the backend as well
    y2, i2 = poolfold.backend.prepare(model).run([x])
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(i2, indices)
