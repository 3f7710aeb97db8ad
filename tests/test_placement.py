"""prepare(model, poolfold_nodes="needed"): each rule of poolfold.placement checked against
what onnxruntime actually does with a one-node model of that kind.

A node the rules send to poolfold must be one onnxruntime refuses (when the session is built
or when it runs) or computes otherwise than tests/oracle.py; a node they leave to onnxruntime
must come out of onnxruntime exactly as the oracle says.  Then two small models in the shape
torch.onnx.export gives them: MaxPool with Indices -> MaxUnpool, and Unfold -> Fold.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import oracle
import poolfold
import poolfold.backend
from poolfold import placement

ort = pytest.importorskip("onnxruntime")

F32, F64, F16 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16
NHWC = "com.ms.internal.nhwc"
_NUMPY = {F32: np.float32, F64: np.float64, F16: np.float16, TensorProto.INT8: np.int8,
          TensorProto.UINT8: np.uint8, TensorProto.INT32: np.int32}


def _model(node, inputs, outputs, opset=18, initializers=(), nhwc_opset=None):
    graph = helper.make_graph([node], "one_node", inputs, outputs, list(initializers))
    imports = [helper.make_opsetid("", opset)]
    if nhwc_opset is not None:
        imports.append(helper.make_opsetid(NHWC, nhwc_opset))
    return helper.make_model(graph, opset_imports=imports, ir_version=9)


def _onnxruntime(model, feeds):
    """onnxruntime's outputs, or the string "refused" where it refuses the node (building the
    session or running it)."""
    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    except Exception:  # onnxruntime's errors are not one family
        return "refused"


def _placement(model, **options):
    """The reason the node runs on poolfold under "needed", or None: onnxruntime runs it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", poolfold.backend.FallbackWarning)
        rep = poolfold.backend.prepare(model, poolfold_nodes="needed", **options)
    reasons = [step.reason for step in rep.steps if step.runner == "poolfold"]
    assert len(reasons) <= 1
    return (reasons[0] if reasons else None), rep


def _same(got, want):
    return all(np.asarray(g).shape == np.asarray(w).shape
               and np.array_equal(np.asarray(g), np.asarray(w), equal_nan=True)
               for g, w in zip(got, want))


def _check(model, feeds, want, expected_reason, **options):
    """The decision, and that it is right about onnxruntime."""
    reason, rep = _placement(model, **options)
    found = _onnxruntime(model, feeds)
    if expected_reason is None:
        assert reason is None, reason
        assert found != "refused", "onnxruntime refuses a node the rules leave to it"
        assert _same(found, want), "onnxruntime differs from the oracle on a node left to it"
        assert [step.runner for step in rep.steps] == ["onnxruntime"]
    else:
        assert reason is not None and expected_reason in reason, reason
        assert found == "refused" or not _same(found, want), \
            "the rule sends to poolfold a node onnxruntime runs right"
    assert _same(rep.run(feeds), want)  # whichever runs it, the answer is the oracle's


# ------------------------------------------------------------------------------ MaxPool

def _pool_case(shape, elem=F32, opset=18, indices=False, fill=None, **attributes):
    rng = np.random.default_rng(0)
    dtype = _NUMPY[elem]
    if np.issubdtype(dtype, np.integer):
        x = rng.integers(-100 if dtype == np.int8 else 0, 100, shape).astype(dtype)
    else:
        x = (rng.standard_normal(shape) * 10).astype(dtype)
    if fill is not None:
        x[...] = fill
    outputs = [helper.make_tensor_value_info("y", elem, None)]
    if indices:
        outputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, None))
    node = helper.make_node("MaxPool", ["x"], [o.name for o in outputs], **attributes)
    model = _model(node, [helper.make_tensor_value_info("x", elem, shape)], outputs, opset)
    options = {k: v for k, v in attributes.items() if k != "kernel_shape"}
    y, i = oracle.max_pool(x, attributes["kernel_shape"], **options)
    return model, {"x": x}, [y, i] if indices else [y]


LEFT_TO_ONNXRUNTIME = {
    "f32 2-D stride 2 pad 1": dict(shape=(1, 4, 9, 9), kernel_shape=[3, 3], strides=[2, 2],
                                   pads=[1, 1, 1, 1]),
    "f32 2-D ceil_mode": dict(shape=(1, 4, 8, 8), kernel_shape=[3, 3], strides=[2, 2],
                              ceil_mode=1),
    "f64 1-D dilated": dict(shape=(2, 3, 11), elem=F64, kernel_shape=[2], dilations=[2]),
    "f16 3-D": dict(shape=(1, 2, 5, 5, 5), elem=F16, kernel_shape=[2, 2, 2]),
    "int8 2-D (MaxPool-12)": dict(shape=(1, 2, 6, 6), elem=TensorProto.INT8,
                                  kernel_shape=[2, 2]),
    "uint8 3-D": dict(shape=(1, 2, 4, 4, 4), elem=TensorProto.UINT8, kernel_shape=[2, 2, 2]),
    "SAME_UPPER without dilation": dict(shape=(1, 2, 7, 7), kernel_shape=[3, 3],
                                        strides=[2, 2], auto_pad="SAME_UPPER"),
    "dilated with pads, axis larger than the dilation": dict(
        shape=(1, 2, 8, 8), kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1]),
}


@pytest.mark.parametrize("case", list(LEFT_TO_ONNXRUNTIME))
def test_maxpool_left_to_onnxruntime(case):
    model, feeds, want = _pool_case(**LEFT_TO_ONNXRUNTIME[case])
    _check(model, feeds, want, None)


ON_POOLFOLD = {
    "4 spatial axes": (dict(shape=(1, 2, 4, 4, 4, 4), kernel_shape=[2, 2, 2, 2]),
                       "stops at 3 spatial axes"),
    "SAME_UPPER with dilation": (dict(shape=(1, 2, 7, 7), kernel_shape=[3, 3],
                                      dilations=[2, 2], auto_pad="SAME_UPPER"),
                                 "SAME padding without the dilation"),
    "SAME_LOWER with dilation": (dict(shape=(1, 2, 7), kernel_shape=[3], dilations=[2],
                                      auto_pad="SAME_LOWER"),
                                 "SAME padding without the dilation"),
    "pads >= kernel": (dict(shape=(1, 2, 6, 6), kernel_shape=[2, 2], pads=[2, 0, 2, 0]),
                       "pads >= kernel_shape"),
    "a window wholly in the padding": (dict(shape=(1, 2, 2, 2), kernel_shape=[2, 2],
                                            dilations=[3, 3], pads=[1, 1, 1, 1]),
                                       "wholly in the padding"),
    "no channels": (dict(shape=(1, 0, 4, 4), kernel_shape=[2, 2]), "no channels"),
    "int8 before MaxPool-12": (dict(shape=(1, 2, 6, 6), elem=TensorProto.INT8, opset=11,
                                    kernel_shape=[2, 2]), "no MaxPool-11 kernel for int8"),
}


@pytest.mark.parametrize("case", list(ON_POOLFOLD))
def test_maxpool_on_poolfold(case):
    arguments, reason = ON_POOLFOLD[case]
    model, feeds, want = _pool_case(**arguments)
    if case == "int8 before MaxPool-12":  # MaxPool-11 has no int8: poolfold refuses it too
        got, rep = _placement(model)
        assert reason in got and _onnxruntime(model, feeds) == "refused"
        with pytest.raises(poolfold.PoolfoldTypeError, match="MaxPool-11"):
            rep.run(feeds)
        return
    _check(model, feeds, want, reason)


def test_maxpool_with_indices_runs_on_poolfold():
    """onnxruntime computes MaxPool with Indices right, but poolfold is faster there (about
    10x on (1, 64, 224, 224), 2x2 stride 2: 40 ms against 3.3 ms), so "needed" takes it from
    2^16 window taps (outputs times kernel taps)."""
    for shape, attributes in (((1, 16, 64, 64), dict(kernel_shape=[2, 2], strides=[2, 2])),
                              ((1, 12, 64, 64), dict(kernel_shape=[3, 3], strides=[2, 2],
                                                     pads=[1, 1, 1, 1]))):
        model, feeds, want = _pool_case(shape, indices=True, storage_order=1, **attributes)
        reason, rep = _placement(model)
        assert "faster" in reason
        assert _same(_onnxruntime(model, feeds), want)
        assert _same(rep.run(feeds), want)


# (shape, kernel): window taps (outputs times kernel taps) 192, 32768, 63488 (just under
# 2^16) and 36864
SMALL_POOLS_WITH_INDICES = [((1, 3, 8, 8), [2, 2]), ((1, 8, 64, 64), [2, 2]),
                            ((1, 16, 64, 63), [2, 2]), ((1, 4, 64, 64), [3, 3])]


@pytest.mark.parametrize("shape, kernel", SMALL_POOLS_WITH_INDICES)
def test_small_maxpool_with_indices_is_left_to_onnxruntime(shape, kernel):
    """Below 2^16 window taps the stretch boundaries cost more than poolfold saves on the
    node: onnxruntime keeps it (and computes it right)."""
    pads = [1] * 4 if kernel == [3, 3] else [0] * 4
    model, feeds, want = _pool_case(shape, kernel_shape=kernel, strides=[2, 2], pads=pads,
                                    indices=True)
    _check(model, feeds, want, None)


def test_maxpool_with_indices_of_unknown_size_runs_on_poolfold():
    """A batch only known at run time may be large: poolfold takes the node."""
    model, feeds, want = _pool_case((1, 3, 8, 8), kernel_shape=[2, 2], strides=[2, 2],
                                    indices=True)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param = "batch"
    reason, rep = _placement(model)
    assert "faster" in reason and "unknown" in reason
    assert _same(rep.run(feeds), want)


def test_maxpool_bfloat16_runs_on_poolfold():
    model, _, _ = _pool_case((1, 2, 4, 4), kernel_shape=[2, 2])
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.BFLOAT16
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.BFLOAT16
    model.opset_import[0].version = 22
    reason, _ = _placement(model)
    assert "no MaxPool-22 kernel for bfloat16" in reason
    with pytest.raises(Exception):  # onnxruntime has no bfloat16 MaxPool
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_maxpool_of_unknown_type_runs_on_poolfold():
    """Where nothing tells the type before the run, the node runs on poolfold: a doubt never
    hands a node to an implementation that may compute it otherwise."""
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])
    model = _model(node, [helper.make_empty_tensor_value_info("x")],
                   [helper.make_empty_tensor_value_info("y")])
    reason, _ = _placement(model)
    assert "unknown" in reason


def test_nan_in_a_window_is_the_difference_needed_leaves():
    """The one difference "needed" leaves, as documented: onnxruntime's MaxPool answer for a
    window holding a NaN depends on where the NaN sits; poolfold's is NaN."""
    model, feeds, want = _pool_case((1, 1, 4, 4), kernel_shape=[2, 2])
    feeds["x"][0, 0, 0, 1] = np.nan
    (want,) = [oracle.max_pool(feeds["x"], [2, 2])[0]]
    assert np.isnan(want[0, 0, 0, 0])
    (needed,) = poolfold.backend.prepare(model, poolfold_nodes="needed").run(feeds)
    (every,) = poolfold.backend.prepare(model, poolfold_nodes="all").run(feeds)
    np.testing.assert_array_equal(every, want)
    (alone,) = _onnxruntime(model, feeds)
    np.testing.assert_array_equal(needed, alone)  # "needed" gives onnxruntime's answer
    assert not np.isnan(alone[0, 0, 0, 0])  # a NaN after the window's maximum is dropped


def test_nhwc_maxpool_runs_on_poolfold():
    x = np.random.default_rng(0).standard_normal((1, 5, 5, 3)).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y"], domain=NHWC, kernel_shape=[2, 2])
    model = _model(node, [helper.make_tensor_value_info("x", F32, x.shape)],
                   [helper.make_tensor_value_info("y", F32, None)], nhwc_opset=12)
    want = [np.moveaxis(oracle.max_pool(np.moveaxis(x, -1, 1), [2, 2])[0], 1, -1)]
    _check(model, {"x": x}, want, "com.ms.internal.nhwc")


# ---------------------------------------------------------------------------- MaxUnpool

def _unpool_case(spatial, elem=F32, kernel=2, domain="", channels=2):
    rng = np.random.default_rng(1)
    dtype = _NUMPY[elem]
    rank = len(spatial)
    source = rng.standard_normal((1, channels) + tuple(spatial)).astype(dtype)
    x, indices = oracle.max_pool(source, [kernel] * rank, strides=[kernel] * rank)
    want = [oracle.max_unpool(x, indices, [kernel] * rank, strides=[kernel] * rank)]
    node = helper.make_node("MaxUnpool", ["x", "i"], ["y"], domain=domain,
                            kernel_shape=[kernel] * rank, strides=[kernel] * rank)
    feeds = {"x": x, "i": indices}
    if domain:
        feeds["x"] = np.ascontiguousarray(np.moveaxis(x, 1, -1))
        want = [np.moveaxis(want[0], 1, -1)]
    model = _model(node, [helper.make_tensor_value_info("x", elem, feeds["x"].shape),
                          helper.make_tensor_value_info("i", TensorProto.INT64, x.shape)],
                   [helper.make_tensor_value_info("y", elem, None)],
                   nhwc_opset=11 if domain else None)
    return model, feeds, want


@pytest.mark.parametrize("spatial, elem", [((6, 6), F32), ((8,), F16), ((4, 4, 4), F32)])
def test_maxunpool_left_to_onnxruntime(spatial, elem):
    _check(*_unpool_case(spatial, elem), None)


@pytest.mark.parametrize("spatial, elem, reason", [
    ((6, 6), F64, "no MaxUnpool-18 kernel for double"),
    ((4, 4, 4, 4), F32, "stops at 3 spatial axes"),
])
def test_maxunpool_on_poolfold(spatial, elem, reason):
    _check(*_unpool_case(spatial, elem), reason)


def test_nhwc_maxunpool_runs_on_poolfold():
    _check(*_unpool_case((6, 6), domain=NHWC), "com.ms.internal.nhwc")


def test_maxunpool_inferred_shape_indices_runs_on_poolfold():
    model, feeds, _ = _unpool_case((6, 6))
    reason, _ = _placement(model, inferred_shape_indices=True)
    assert "inferred_shape_indices" in reason


# ------------------------------------------------------------------------------- Col2Im

def _col2im_case(channels, image, block, elem=F32, **attributes):
    rng = np.random.default_rng(2)
    rank = len(image)
    dilations = attributes.get("dilations", [1] * rank)
    pads = attributes.get("pads", [0] * 2 * rank)
    strides = attributes.get("strides", [1] * rank)
    blocks = [(image[a] + pads[a] + pads[a + rank] - ((block[a] - 1) * dilations[a] + 1))
              // strides[a] + 1 for a in range(rank)]
    x = (rng.standard_normal((1, channels * int(np.prod(block)), int(np.prod(blocks)))) * 10
         ).astype(_NUMPY[elem])
    constants = [numpy_helper.from_array(np.array(image, np.int64), "image_shape"),
                 numpy_helper.from_array(np.array(block, np.int64), "block_shape")]
    node = helper.make_node("Col2Im", ["x", "image_shape", "block_shape"], ["y"], **attributes)
    model = _model(node, [helper.make_tensor_value_info("x", elem, x.shape)],
                   [helper.make_tensor_value_info("y", elem, None)], initializers=constants)
    return model, {"x": x}, [oracle.col2im(x, image, block, **attributes)]


@pytest.mark.parametrize("case", [
    dict(channels=3, image=[7, 6], block=[2, 3], dilations=[2, 2]),
    dict(channels=3, image=[7, 6], block=[2, 3], dilations=[1, 2], strides=[2, 1],
         pads=[1, 0, 1, 1]),
    dict(channels=3, image=[4, 5, 3], block=[2, 2, 2]),
])
def test_col2im_left_to_onnxruntime(case):
    _check(*_col2im_case(**case), None)


@pytest.mark.parametrize("case, reason", [
    (dict(channels=3, image=[7], block=[2], dilations=[2]), "outside 2-D"),
    (dict(channels=3, image=[5, 5, 4], block=[2, 2, 2], dilations=[2, 2, 1]), "outside 2-D"),
    (dict(channels=1, image=[5, 5, 4], block=[2, 2, 2], dilations=[2, 2, 1]), "outside 2-D"),
    (dict(channels=2, image=[5, 5], block=[2, 2], elem=F64), "no Col2Im-18 kernel for double"),
    (dict(channels=2, image=[5, 5], block=[2, 2], elem=TensorProto.INT32),
     "no Col2Im-18 kernel for int32"),
])
def test_col2im_on_poolfold(case, reason):
    _check(*_col2im_case(**case), reason)


# ------------------------------------------------------------------- the option itself

@pytest.mark.parametrize("value", ["some", "ALL", None, 1])
def test_poolfold_nodes_must_be_all_or_needed(value):
    model, _, _ = _pool_case((1, 1, 4, 4), kernel_shape=[2, 2])
    with pytest.raises(ValueError, match="poolfold_nodes"):
        poolfold.backend.prepare(model, poolfold_nodes=value)


def test_rules_are_one_table():
    """Every reason is a rule of placement.RULES, and "all" names itself."""
    assert len(placement.RULES) >= 10
    model, _, _ = _pool_case((1, 1, 4, 4), kernel_shape=[2, 2])
    rep = poolfold.backend.prepare(model)
    assert [step.reason for step in rep.steps] == [placement.ALL_REASON]
    assert "poolfold: " in rep.describe()


# ------------------------------------------------------------- exported-style models

def _segnet_like(side=16):
    """Conv -> MaxPool with Indices -> Conv -> MaxUnpool (output_shape from a Shape) -> Conv,
    as torch.onnx.export writes MaxPool2d(return_indices=True) and MaxUnpool2d, on a
    (1, 3, side, side) image (the pool's input: 8 channels)."""
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.2, n)
               for n, s in (("w1", (8, 3, 3, 3)), ("w2", (8, 8, 3, 3)), ("w3", (3, 8, 3, 3)))]
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    graph_nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], **conv),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p", "idx"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Shape", ["r1"], ["size"]),
        helper.make_node("Conv", ["p", "w2"], ["c2"], **conv),
        helper.make_node("MaxUnpool", ["c2", "idx", "size"], ["u"], kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["u", "w3"], ["y"], **conv),
    ]
    graph = helper.make_graph(graph_nodes, "segnet_like",
                              [helper.make_tensor_value_info("x", F32, (1, 3, side, side))],
                              [helper.make_tensor_value_info("y", F32, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    return model, {"x": rng.standard_normal((1, 3, side, side)).astype(np.float32)}


def _unfold_fold():
    """nn.Unfold -> scale -> nn.Fold: the unfold as a Conv with one-hot filters (each output
    channel picks one channel and offset) and a Reshape, the fold a Col2Im."""
    channels, kernel, image = 2, 2, 8
    filters = np.zeros((channels * kernel * kernel, channels, kernel, kernel), np.float32)
    for c in range(channels):
        for offset in range(kernel * kernel):
            filters[c * kernel * kernel + offset, c, offset // kernel, offset % kernel] = 1
    constants = [
        numpy_helper.from_array(filters, "one_hot"),
        numpy_helper.from_array(np.array([1, channels * kernel * kernel, -1], np.int64), "cols"),
        numpy_helper.from_array(np.array(0.25, np.float32), "quarter"),
        numpy_helper.from_array(np.array([image, image], np.int64), "image_shape"),
        numpy_helper.from_array(np.array([kernel, kernel], np.int64), "block_shape"),
    ]
    graph_nodes = [
        helper.make_node("Conv", ["x", "one_hot"], ["patches"], kernel_shape=[kernel, kernel],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["patches", "cols"], ["columns"]),
        helper.make_node("Mul", ["columns", "quarter"], ["scaled"]),
        helper.make_node("Col2Im", ["scaled", "image_shape", "block_shape"], ["y"],
                         pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(graph_nodes, "unfold_fold",
                              [helper.make_tensor_value_info("x", F32, (1, channels, image,
                                                                        image))],
                              [helper.make_tensor_value_info("y", F32, None)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    x = np.random.default_rng(4).standard_normal((1, channels, image, image)).astype(np.float32)
    return model, {"x": x}


def test_segnet_like_model_needed_runs_the_pool_on_poolfold_and_the_unpool_on_onnxruntime():
    model, feeds = _segnet_like(side=96)  # the pool's taps: 8 * 48 * 48 * 4, >= 2^16
    needed = poolfold.backend.prepare(model, poolfold_nodes="needed")
    every = poolfold.backend.prepare(model)
    assert [(s.runner, [n.op_type for n in s.nodes]) for s in needed.steps] == [
        ("onnxruntime", ["Conv", "Relu", "Shape"]), ("poolfold", ["MaxPool"]),
        ("onnxruntime", ["Conv", "MaxUnpool", "Conv"])]
    assert "left to onnxruntime: a MaxUnpool node" in needed.describe()
    assert sum(s.runner == "poolfold" for s in every.steps) == 2
    alone = _onnxruntime(model, feeds)
    for got in (needed.run(feeds), every.run(feeds)):
        np.testing.assert_allclose(got[0], alone[0], rtol=1e-5, atol=1e-5)


def test_small_segnet_like_model_needed_is_one_onnxruntime_session():
    """Its pool's input, (1, 8, 16, 16), is too small to pay for the split."""
    model, feeds = _segnet_like()
    needed = poolfold.backend.prepare(model, poolfold_nodes="needed")
    assert [s.runner for s in needed.steps] == ["onnxruntime"]
    np.testing.assert_allclose(needed.run(feeds)[0], _onnxruntime(model, feeds)[0],
                               rtol=1e-6, atol=1e-6)


def test_unfold_fold_model_needed_is_one_onnxruntime_session():
    model, feeds = _unfold_fold()
    needed = poolfold.backend.prepare(model, poolfold_nodes="needed")
    assert [s.runner for s in needed.steps] == ["onnxruntime"]
    every = poolfold.backend.prepare(model)
    assert [s.runner for s in every.steps] == ["onnxruntime", "poolfold"]
    # every pixel is covered by kernel*kernel = 4 blocks, each a quarter of it: x comes back
    for rep in (needed, every):
        np.testing.assert_allclose(rep.run(feeds)[0], feeds["x"], rtol=1e-6, atol=1e-6)
