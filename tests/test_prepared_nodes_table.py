"""Every op a node runs goes through its prepare and the node's kept launches
(poolfold.nodes._OPS): the nhwc ops (fused activations included) and the averaging family
give the functional API's values and errors on kept launches as on the first call."""

import numpy as np
import pytest

import poolfold
from poolfold import nodes, schema
from poolfold.errors import PoolfoldError

RNG = np.random.default_rng(29)


def _bind(domain, op_type, attributes, outputs=("Y",), opset=None, inputs=1):
    opset = opset if opset is not None else schema.versions(op_type, domain)[-1].version
    return nodes.bind(domain, op_type, opset, attributes, list(outputs), input_count=inputs)


def _kept(node) -> int:
    return len(node._launches)


def _same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(f"u{got.dtype.itemsize}"),
                                  want.view(f"u{want.dtype.itemsize}"))


def test_the_table_covers_every_op_of_the_schema():
    assert all(nodes.implements(domain, op) for domain, op in schema.TABLE)
    assert not nodes.implements(schema.AI_ONNX, "Relu")


def _inputs(channels_last):
    shapes = [(1, 3, 9, 8), (2, 2, 6, 7), (1, 3, 9, 8)]
    cases = [RNG.standard_normal(s).astype(t) for s, t in zip(shapes, (np.float32, np.float32,
                                                                       np.float16))]
    return [np.ascontiguousarray(np.moveaxis(x, 1, -1)) for x in cases] if channels_last \
        else cases


AVERAGING = [
    ("AveragePool", {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1],
                     "count_include_pad": 1}),
    ("LpPool", {"kernel_shape": [2, 2], "p": 3}),
    ("GlobalMaxPool", {}),
    ("GlobalAveragePool", {}),
    ("GlobalLpPool", {"p": 1}),
]


@pytest.mark.parametrize("domain", [schema.AI_ONNX, schema.NHWC])
@pytest.mark.parametrize("op_type, attributes", AVERAGING, ids=[a[0] for a in AVERAGING])
def test_averaging_nodes_keep_launches(domain, op_type, attributes):
    module = poolfold.nhwc if domain == schema.NHWC else poolfold
    function = getattr(module, {"AveragePool": "average_pool", "LpPool": "lp_pool",
                                "GlobalMaxPool": "global_max_pool",
                                "GlobalAveragePool": "global_average_pool",
                                "GlobalLpPool": "global_lp_pool"}[op_type])
    node = _bind(domain, op_type, attributes)
    cases = _inputs(domain == schema.NHWC)
    keywords = dict(attributes)
    kernel = [keywords.pop("kernel_shape")] if "kernel_shape" in keywords else []
    for _ in range(2):  # the first round prepares, the second runs kept launches
        for x in cases:
            (y,) = node([x])
            _same_bits(y, function(x, *kernel, **keywords))
    assert _kept(node) == len(cases)


@pytest.mark.parametrize("activation, params, formula", [
    ("Relu", [], lambda v: np.maximum(v, 0)),
    ("Clip", [-0.5, 0.25], lambda v: np.clip(v, -0.5, 0.25)),
])
def test_nhwc_fused_activations_on_kept_launches(activation, params, formula):
    attributes = {"kernel_shape": [2, 2], "strides": [2, 2], "activation": activation,
                  "activation_params": params}
    pool = _bind(schema.NHWC, "MaxPool", attributes, outputs=("Y", "Indices"))
    average = _bind(schema.NHWC, "AveragePool", attributes)
    unpool = _bind(schema.NHWC, "MaxUnpool", attributes, inputs=3)
    for x in _inputs(True) * 2:
        nchw = np.ascontiguousarray(np.moveaxis(x, -1, 1))
        want_y, want_i = poolfold.max_pool(nchw, [2, 2], strides=[2, 2], return_indices=True)
        y, indices = pool([x])
        _same_bits(y, np.ascontiguousarray(np.moveaxis(formula(want_y), 1, -1)))
        np.testing.assert_array_equal(indices, want_i)
        want_average = poolfold.average_pool(nchw, [2, 2], strides=[2, 2])
        _same_bits(average([x])[0],
                   np.ascontiguousarray(np.moveaxis(formula(want_average), 1, -1)))
        shape = np.array(nchw.shape, np.int64)
        want_unpooled = poolfold.max_unpool(want_y, want_i, [2, 2], strides=[2, 2],
                                            output_shape=shape)
        (unpooled,) = unpool([y, indices, shape])
        _same_bits(unpooled, np.ascontiguousarray(np.moveaxis(formula(want_unpooled), 1, -1)))
    assert _kept(pool) == _kept(average) == _kept(unpool) == 3


def _raises_alike(function, node_call):
    with pytest.raises((PoolfoldError, TypeError)) as expected:
        function()
    with pytest.raises(type(expected.value)) as got:
        node_call()
    assert str(got.value) == str(expected.value)


def test_kept_nodes_give_the_functional_errors():
    x = np.zeros((1, 4, 4, 2), np.float32)
    average = _bind(schema.NHWC, "AveragePool", {"kernel_shape": [2, 2], "activation": "Relu"})
    average([x])
    assert _kept(average) == 1
    wide = np.zeros((1, 4, 4, 2), np.int64)  # no version takes it
    _raises_alike(lambda: poolfold.nhwc.average_pool(wide, [2, 2], activation="Relu"),
                  lambda: average([wide]))
    _raises_alike(lambda: poolfold.nhwc.average_pool(x[0, 0], [2, 2], activation="Relu"),
                  lambda: average([x[0, 0]]))
    # both faults: the nhwc domain checks X before count_include_pad, ai.onnx after
    for domain, module in ((schema.NHWC, poolfold.nhwc), (schema.AI_ONNX, poolfold)):
        node = _bind(domain, "AveragePool", {"kernel_shape": [2, 2], "count_include_pad": 5})
        _raises_alike(lambda: module.average_pool(wide, [2, 2], count_include_pad=5),
                      lambda: node([wide]))
    unpool = _bind(schema.NHWC, "MaxUnpool", {"kernel_shape": [2], "strides": [2],
                                              "activation": "Tanh"}, inputs=2)
    y = np.array([[[1.0, 2.0]]], np.float32)  # N, W, C: one position, two channels
    indices = np.array([[[1], [2]]], np.int64)
    unpool([y, indices])
    bad = np.array([[[1], [4]]], np.int64)  # one past the output's 4 positions
    _raises_alike(lambda: poolfold.nhwc.max_unpool(y, bad, [2], strides=[2], activation="Tanh"),
                  lambda: unpool([y, bad]))
    _raises_alike(lambda: poolfold.nhwc.max_pool(np.zeros((1, 4, 2), np.int8), [2],
                                                 activation="Relu"),
                  lambda: _bind(schema.NHWC, "MaxPool", {"kernel_shape": [2],
                                                         "activation": "Relu"})(
                      [np.zeros((1, 4, 2), np.int8)]))


def test_a_node_with_more_outputs_than_its_version_is_refused():
    with pytest.raises(PoolfoldError, match=r"GlobalLpPool-2: the node has 2 outputs; "
                                            r"this version has 1 \(Y\)"):
        _bind(schema.NHWC, "GlobalLpPool", {}, outputs=("Y", "Z"))
    with pytest.raises(PoolfoldError, match=r"MaxPool-1: the node has 2 outputs"):
        _bind(schema.AI_ONNX, "MaxPool", {"kernel_shape": [2]}, outputs=("Y", "I"), opset=1)


def test_missing_inputs_are_named_by_the_schema():
    node = _bind(schema.NHWC, "MaxUnpool", {"kernel_shape": [2]}, inputs=2)
    with pytest.raises(PoolfoldError, match=r"MaxUnpool-11: input 'I' is missing"):
        node([np.zeros((1, 2, 1), np.float32), None])
    node = _bind(schema.AI_ONNX, "Col2Im", {}, inputs=3)
    with pytest.raises(PoolfoldError, match=r"Col2Im-18: input 'block_shape' is missing"):
        node([np.zeros((1, 2, 1), np.float32), np.array([1, 2], np.int64)])
