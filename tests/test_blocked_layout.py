"""poolfold's pools inside onnxruntime's blocked channel layout (poolfold.blocked): a pool
between Convs that onnxruntime takes into NCHWc still runs on poolfold, on the blocked
tensor as channels-last samples, with the oracle's values (padded channels included); the
plain way where the caller gives SessionOptions, the weights are large or a pool is not
found again in onnxruntime's graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import oracle
import poolfold.backend
from poolfold import blocked, session_ops

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT


@pytest.fixture(scope="module")
def blocks():
    lib, why = session_ops.library()
    assert lib is not None, f"the custom-op library cannot be built here: {why}"
    size = blocked.block_size()
    if not size:
        pytest.skip("onnxruntime has no blocked layout on this machine")
    return size


def _conv_pool_conv(pool: onnx.NodeProto, channels: int, size: int = 11, opset: int = 22):
    """x -> Conv 3x3 -> Relu ("a", an output) -> the pool ("p", an output) -> Conv 1x1 -> y:
    the pool between two Convs, as onnxruntime lays out a CNN's."""
    rng = np.random.default_rng(channels)
    w1 = (rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((8, channels, 1, 1)) * 0.3).astype(np.float32)
    graph_nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["a"]),
        pool,
        helper.make_node("Conv", ["p", "w2"], ["y"], kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        graph_nodes, "g", [helper.make_tensor_value_info("x", F, (2, 3, size, size))],
        [helper.make_tensor_value_info(name, F, None) for name in ("a", "p", "y")],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


POOLS = {
    "max-ceil": (helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[3, 3],
                                  strides=[2, 2], ceil_mode=1),
                 lambda a: oracle.max_pool(a, [3, 3], strides=[2, 2], ceil_mode=1)[0], "max"),
    "max-pads-dilated": (helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 3],
                                          pads=[1, 0, 1, 2], dilations=[2, 1]),
                         lambda a: oracle.max_pool(a, [2, 3], pads=[1, 0, 1, 2],
                                                   dilations=[2, 1])[0], "max"),
    "average-count-pads": (helper.make_node("AveragePool", ["a"], ["p"], kernel_shape=[3, 3],
                                            pads=[1, 1, 1, 1], count_include_pad=1),
                           lambda a: oracle.average_pool(a, [3, 3], pads=[1, 1, 1, 1],
                                                         count_include_pad=1), "average"),
    "average-ceil": (helper.make_node("AveragePool", ["a"], ["p"], kernel_shape=[2, 2],
                                      strides=[2, 2], ceil_mode=1),
                     lambda a: oracle.average_pool(a, [2, 2], strides=[2, 2], ceil_mode=1),
                     "average"),
    "global-average": (helper.make_node("GlobalAveragePool", ["a"], ["p"]),
                       oracle.global_average_pool, "average"),
    "global-max": (helper.make_node("GlobalMaxPool", ["a"], ["p"]),
                   lambda a: oracle.global_max_pool(a)[0], "max"),
}


def _check(rep, case, x):
    a, p, y = rep.run({"x": x})
    _, want, kind = POOLS[case]
    if kind == "max":
        np.testing.assert_array_equal(p, want(a))
    else:
        oracle.assert_within_bound(p, *want(a), np.float32, kind)
    return a, p, y


@pytest.mark.parametrize("channels", [16, 48])
@pytest.mark.parametrize("case", list(POOLS))
def test_pools_run_on_the_blocked_layout(blocks, case, channels):
    """The pool runs on poolfold inside the blocked layout (rep.describe says so), with the
    oracle's values on the Conv's output, and the model's answer is the plain way's."""
    model = _conv_pool_conv(POOLS[case][0], channels)
    rep = poolfold.backend.prepare(model)
    assert rep.one_session
    (step,) = [s for s in rep.steps if s.runner == "poolfold"]
    assert blocked.REASON in step.reason and blocked.REASON in rep.describe()
    x = np.random.default_rng(1).standard_normal((2, 3, 11, 11)).astype(np.float32)
    a, p, y = _check(rep, case, x)
    plain = poolfold.backend.prepare(model, session_options=ort.SessionOptions())
    assert blocked.REASON not in plain.describe()
    pa, pp, py = plain.run({"x": x})
    np.testing.assert_array_equal(a, pa)
    np.testing.assert_allclose(p, pp, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y, py, rtol=1e-5, atol=1e-5)


def test_blocked_outputs_are_written_in_onnxruntimes_buffers(blocks, monkeypatch):
    """A blocked node's kernel writes straight into onnxruntime's buffer from its second run
    on, as the plain custom ops do; another input shape is learnt again."""
    copies = []
    original = session_ops._copy
    monkeypatch.setattr(session_ops, "_copy",
                        lambda target, result: copies.append(result.shape) or
                        original(target, result))
    model = _conv_pool_conv(POOLS["max-ceil"][0], 16)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    rep = poolfold.backend.prepare(model)
    assert blocked.REASON in rep.describe()
    rng = np.random.default_rng(2)
    for size in (11, 14):
        x = rng.standard_normal((2, 3, size, size)).astype(np.float32)
        copies.clear()
        first = _check(rep, "max-ceil", x)
        assert len(copies) == 1  # the first run of a shape learns it
        copies.clear()
        for g, w in zip(_check(rep, "max-ceil", x), first):
            np.testing.assert_array_equal(g, w)
        assert copies == []


def test_the_plain_way_where_the_layout_does_not_pay_or_cannot_be_had(blocks, monkeypatch):
    """Large weights, or a pool not found again in onnxruntime's graph: the plain custom
    ops, with the same answers."""
    model = _conv_pool_conv(POOLS["average-ceil"][0], 16)
    x = np.random.default_rng(3).standard_normal((2, 3, 11, 11)).astype(np.float32)
    want = poolfold.backend.prepare(model).run({"x": x})
    monkeypatch.setattr(blocked, "WEIGHTS_LIMIT", blocked.weights_bytes(model) - 1)
    heavy = poolfold.backend.prepare(model)
    monkeypatch.undo()
    monkeypatch.setattr(blocked, "_original_output", lambda name, outputs: None)
    lost = poolfold.backend.prepare(model)
    for rep in (heavy, lost):
        assert rep.one_session and blocked.REASON not in rep.describe()
        for g, w in zip(rep.run({"x": x}), want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_a_blocked_nodes_error_is_poolfolds_own(blocks):
    """Fed a shape whose windows cannot be planned, the blocked node raises poolfold's own
    error (naming the op), as the plain custom op does."""
    pool = helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[5, 5])
    model = _conv_pool_conv(pool, 16)
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "w"
    rep = poolfold.backend.prepare(model)
    assert blocked.REASON in rep.describe()
    with pytest.raises(poolfold.PoolfoldError, match="MaxPool"):
        rep.run({"x": np.ones((2, 3, 11, 3), np.float32)})
    a, p, _ = rep.run({"x": np.ones((2, 3, 11, 6), np.float32)})
    np.testing.assert_array_equal(p, oracle.max_pool(a, [5, 5])[0])


def _value(name, elem, shape):
    return {name: helper.make_tensor_type_proto(elem, shape)}


@pytest.mark.parametrize("node, types, expected", [
    (helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2]),
     _value("a", F, (1, 8, 4, 4)), True),
    (helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2]),
     _value("a", F, None), True),  # rank not known before the run: onnxruntime decides
    (helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2]),
     _value("a", F, (1, 12, 4, 4)), False),  # channels that do not fill whole blocks
    (helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2]),
     _value("a", F, (1, "c", 4, 4)), True),
    (helper.make_node("MaxPool", ["a"], ["p", "i"], kernel_shape=[2, 2]),
     _value("a", F, (1, 8, 4, 4)), False),  # Indices
    (helper.make_node("MaxPool", ["a"], ["p", ""], kernel_shape=[2, 2]),
     _value("a", F, (1, 8, 4, 4)), True),  # Indices omitted
    (helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2, 2]),
     _value("a", F, (1, 8, 4, 4, 4)), False),  # 3-D
    (helper.make_node("AveragePool", ["a"], ["p"], kernel_shape=[2, 2]),
     _value("a", TensorProto.DOUBLE, (1, 8, 4, 4)), False),
    (helper.make_node("LpPool", ["a"], ["p"], kernel_shape=[2, 2]),
     _value("a", F, (1, 8, 4, 4)), False),  # onnxruntime has no blocked LpPool
    (helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2],
                      domain="com.ms.internal.nhwc"), _value("a", F, (1, 4, 4, 8)), False),
    (helper.make_node("GlobalAveragePool", ["a"], ["p"]), {}, False),  # untyped
])
def test_which_pools_onnxruntime_may_lay_out(node, types, expected):
    assert blocked.blockable(node, types, 8) is expected


@pytest.mark.parametrize("name, expected", [
    ("p_nchwc", "p"),
    ("/1/MaxPool_output_0_nchwc", "/1/MaxPool_output_0"),
    ("p_nchwc_token_3", "p"),  # the name was taken: onnxruntime numbers it
    ("q_nchwc", None),  # not one of the pools
    ("p", None),
])
def test_a_blocked_node_is_traced_to_the_pool_it_replaced(name, expected):
    outputs = {"p": object(), "/1/MaxPool_output_0": object()}
    assert blocked._original_output(name, outputs) == expected
