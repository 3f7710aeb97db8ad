"""The averaging family (AveragePool, LpPool, GlobalMaxPool, GlobalAveragePool, GlobalLpPool,
ai.onnx and com.ms.internal.nhwc) on every ONNX surface: poolfold.backend with
poolfold_nodes="all" and "needed", poolfold.reference.ops in onnx's ReferenceEvaluator, a
Conv -> AveragePool -> GlobalAveragePool model against onnxruntime, and onnx's own backend
node tests through poolfold.conformance.

The "needed" rules are checked as tests/test_placement.py checks MaxPool's: a node the rules
send to poolfold must be one onnxruntime refuses or computes outside the contract of
docs/semantics.md (tests/oracle.py's exact value within ``oracle.assert_within_bound``); a
node they leave to onnxruntime must come out of onnxruntime within that bound.  Sizes are
small: the oracle is pure Python.
"""

from __future__ import annotations

import re
import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import oracle
import poolfold
import poolfold.backend
import poolfold.reference
from poolfold import PoolfoldError, conformance, placement

ort = pytest.importorskip("onnxruntime")

F16, F32, F64, BF16 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, \
    TensorProto.BFLOAT16
NHWC = "com.ms.internal.nhwc"
_NUMPY = {F16: np.float16, F32: np.float32, F64: np.float64, BF16: ml_dtypes.bfloat16}
_ORACLE = {"AveragePool": (oracle.average_pool, "average"), "LpPool": (oracle.lp_pool, "lp"),
           "GlobalMaxPool": (oracle.global_max_pool, "max"),
           "GlobalAveragePool": (oracle.global_average_pool, "average"),
           "GlobalLpPool": (oracle.global_lp_pool, "lp")}


def _model(op, elem, shape, opset=19, domain="", **attributes):
    """A one-node model; ``shape`` None declares X without a shape, ``elem`` None without a
    type."""
    node = helper.make_node(op, ["x"], ["y"], domain=domain, **attributes)
    x = (helper.make_empty_tensor_value_info("x") if elem is None
         else helper.make_tensor_value_info("x", elem, shape))
    y = (helper.make_empty_tensor_value_info("y") if elem is None
         else helper.make_tensor_value_info("y", elem, None))
    imports = [helper.make_opsetid("", opset if not domain else 22)]
    if domain:
        imports.append(helper.make_opsetid(domain, opset))
    graph = helper.make_graph([node], "one_node", [x], [y])
    return helper.make_model(graph, opset_imports=imports, ir_version=9)


def _data(shape, elem=F32, fill=None, seed=0):
    x = (np.random.default_rng(seed).standard_normal(shape) * 10).astype(_NUMPY[elem])
    if fill is not None:
        x[...] = fill
    return x


def _onnxruntime(model, x):
    """onnxruntime's Y, or "refused" where it refuses the node (building or running it)."""
    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]
    except Exception:  # onnxruntime's errors are not one family
        return "refused"


def _exact(op, x, **attributes):
    function, kind = _ORACLE[op]
    attributes = dict(attributes)
    if "kernel_shape" in attributes:
        return (*function(x, attributes.pop("kernel_shape"), **attributes), kind)
    return (*function(x, **attributes), kind)


def _within(y, exact, info, kind) -> bool:
    try:
        oracle.assert_within_bound(np.asarray(y), exact, info, np.asarray(y).dtype, kind)
    except AssertionError:
        return False
    return True


def _needed(model):
    """The reason the node runs on poolfold under "needed" (None: onnxruntime runs it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", poolfold.backend.FallbackWarning)
        rep = poolfold.backend.prepare(model, poolfold_nodes="needed")
    reasons = [step.reason for step in rep.steps if step.runner == "poolfold"]
    assert len(reasons) <= 1
    return (reasons[0] if reasons else None), rep


def _check(op, x, expected_reason, opset=19, **attributes):
    """The decision under "needed", that it is right about onnxruntime, and that the model's
    answer is the contract's whichever runs it."""
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    model = _model(op, elem, x.shape, opset, **attributes)
    reason, rep = _needed(model)
    found = _onnxruntime(model, x)
    exact, info, kind = _exact(op, x, **attributes)
    if expected_reason is None:
        assert reason is None, reason
        assert not isinstance(found, str), "onnxruntime refuses a node the rules leave to it"
        assert _within(found, exact, info, kind), \
            "onnxruntime breaks the contract on a node left to it"
        assert [step.runner for step in rep.steps] == ["onnxruntime"]
        assert f"left to onnxruntime: a {op} node" in rep.describe()
    else:
        assert reason is not None and expected_reason in reason, reason
        assert isinstance(found, str) or not _within(found, exact, info, kind), \
            "the rule sends to poolfold a node onnxruntime runs right"
        assert f"poolfold: a {op} node (unnamed): {reason}" in rep.describe()
    (y,) = rep.run([x])
    oracle.assert_within_bound(y, exact, info, x.dtype, kind)


# --------------------------------------------------------------------- "needed": onnxruntime

LEFT_TO_ONNXRUNTIME = {
    "AveragePool f32 2-D pads, strides": ("AveragePool", (1, 2, 9, 9), F32, 19,
                                          dict(kernel_shape=[3, 3], strides=[2, 2],
                                               pads=[1, 1, 1, 1])),
    "AveragePool f32 ceil_mode, count_include_pad": (
        "AveragePool", (1, 2, 8, 8), F32, 19,
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
             count_include_pad=1)),
    "AveragePool-7 f32 count_include_pad": ("AveragePool", (1, 2, 7, 6), F32, 7,
                                            dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1],
                                                 count_include_pad=1)),
    "AveragePool f32 dilated, count_include_pad": (
        "AveragePool", (1, 2, 9, 9), F32, 19,
        dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[1, 1, 2, 2], count_include_pad=1)),
    "AveragePool f32 dilated wholly-padded windows, count_include_pad": (
        "AveragePool", (1, 2, 2, 2), F32, 19,
        dict(kernel_shape=[2, 2], dilations=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
    "AveragePool f16 3-D": ("AveragePool", (1, 2, 5, 4, 4), F16, 22,
                            dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2])),
    "AveragePool f32 1-D SAME_LOWER": ("AveragePool", (2, 3, 11), F32, 11,
                                       dict(kernel_shape=[4], auto_pad="SAME_LOWER",
                                            count_include_pad=1)),
    "LpPool f32 p=1": ("LpPool", (1, 2, 7, 7), F32, 18, dict(kernel_shape=[3, 3], p=1)),
    "LpPool f16 p=3": ("LpPool", (1, 2, 7, 7), F16, 18, dict(kernel_shape=[2, 2], p=3,
                                                             pads=[1, 1, 0, 0])),
    "GlobalAveragePool f32": ("GlobalAveragePool", (2, 3, 5, 6), F32, 22, {}),
    "GlobalMaxPool f16 3-D": ("GlobalMaxPool", (1, 3, 4, 3, 5), F16, 22, {}),
    "GlobalLpPool f16 p=2": ("GlobalLpPool", (1, 3, 6, 6), F16, 18, {}),
}


@pytest.mark.parametrize("case", list(LEFT_TO_ONNXRUNTIME))
def test_left_to_onnxruntime(case):
    op, shape, elem, opset, attributes = LEFT_TO_ONNXRUNTIME[case]
    _check(op, _data(shape, elem), None, opset, **attributes)


# -------------------------------------------------------------------------- "needed": poolfold

ON_POOLFOLD = {
    "AveragePool f64": ("AveragePool", _data((1, 2, 5, 5), F64), 19, dict(kernel_shape=[2, 2]),
                        "no AveragePool-19 kernel for double"),
    "AveragePool-1 (opset 6)": ("AveragePool", _data((1, 2, 5, 5)), 6, dict(kernel_shape=[2, 2]),
                                "no AveragePool-6 kernel for float"),
    "GlobalMaxPool f16 before opset 6": ("GlobalMaxPool", _data((1, 2, 4, 4), F16), 5, {},
                                         "no GlobalMaxPool-5 kernel for float16"),
    "GlobalLpPool-22": ("GlobalLpPool", _data((1, 2, 4, 4)), 22, dict(p=1),
                        "no GlobalLpPool-22 kernel for float"),
    "AveragePool 4 spatial axes": ("AveragePool", _data((1, 2, 3, 3, 3, 3)), 19,
                                   dict(kernel_shape=[2, 2, 2, 2]), "stops at 3 spatial axes"),
    "GlobalAveragePool 4 spatial axes": ("GlobalAveragePool", _data((1, 2, 2, 3, 2, 2)), 22, {},
                                         "stops at 3 spatial axes"),
    "AveragePool SAME_UPPER with dilation": ("AveragePool", _data((1, 2, 7, 7)), 19,
                                             dict(kernel_shape=[3, 3], dilations=[2, 2],
                                                  auto_pad="SAME_UPPER"),
                                             "SAME padding without the dilation"),
    "LpPool SAME_LOWER with dilation": ("LpPool", _data((1, 2, 7, 7)), 18,
                                        dict(kernel_shape=[3, 3], dilations=[2, 2], p=1,
                                             auto_pad="SAME_LOWER"),
                                        "SAME padding without the dilation"),
    "AveragePool pads >= kernel": ("AveragePool", _data((1, 2, 6, 6)), 19,
                                   dict(kernel_shape=[2, 2], pads=[2, 0, 2, 0],
                                        count_include_pad=1), "pads >= kernel_shape"),
    "LpPool pads >= kernel": ("LpPool", _data((1, 2, 6, 6)), 18,
                              dict(kernel_shape=[2, 2], pads=[0, 2, 0, 2], p=1),
                              "pads >= kernel_shape"),
    "AveragePool wholly-padded window": ("AveragePool", _data((1, 2, 2, 2)), 19,
                                         dict(kernel_shape=[2, 2], dilations=[3, 3],
                                              pads=[1, 1, 1, 1]), "not NaN"),
    "GlobalAveragePool no channels": ("GlobalAveragePool", _data((1, 0, 4, 4)), 22, {},
                                      "no channels"),
    "AveragePool no channels": ("AveragePool", _data((1, 0, 4, 4)), 19,
                                dict(kernel_shape=[2, 2]), "no channels"),
    "GlobalMaxPool empty plane": ("GlobalMaxPool", _data((1, 2, 0, 3)), 22, {},
                                  "spatial axis of size 0"),
    "GlobalLpPool empty plane": ("GlobalLpPool", _data((1, 2, 3, 0)), 18, {},
                                 "spatial axis of size 0"),
    "LpPool f32 p=2 overflow": ("LpPool", _data((1, 1, 2, 2), fill=1e20), 18,
                                dict(kernel_shape=[2, 2]), "overflows or underflows"),
    "LpPool f32 p=2 underflow": ("LpPool", _data((1, 1, 2, 2), fill=1e-25), 18,
                                 dict(kernel_shape=[2, 2], p=2), "overflows or underflows"),
    "LpPool f16 p=7 underflow": ("LpPool", _data((1, 1, 16, 16), F16, fill=2.0**-24), 18,
                                 dict(kernel_shape=[16, 16], p=7), "overflows or underflows"),
    "GlobalLpPool f32 p=2 overflow": ("GlobalLpPool", _data((1, 1, 2, 2), fill=1e20), 18, {},
                                      "overflows or underflows"),
}


@pytest.mark.parametrize("case", list(ON_POOLFOLD))
def test_on_poolfold(case):
    op, x, opset, attributes, reason = ON_POOLFOLD[case]
    _check(op, x, reason, opset, **attributes)


def test_bfloat16_runs_on_poolfold():
    x = _data((1, 2, 4, 4), BF16)
    model = _model("GlobalAveragePool", BF16, x.shape, 22)
    reason, rep = _needed(model)
    assert "no GlobalAveragePool-22 kernel for bfloat16" in reason
    with pytest.raises(Exception):  # onnxruntime has no bfloat16 kernel for any of these ops
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = rep.run([x])
    oracle.assert_within_bound(y, *oracle.global_average_pool(x), x.dtype, "average")


def test_unknown_type_and_rank_run_on_poolfold():
    """A doubt never hands a node to onnxruntime."""
    reason, _ = _needed(_model("AveragePool", None, None, kernel_shape=[2, 2]))
    assert "data type is unknown" in reason
    reason, _ = _needed(_model("GlobalMaxPool", F32, None, 22))
    assert "spatial rank is unknown" in reason


def test_no_window_fits_is_poolfolds_error():
    """onnxruntime returns an empty Y where no window fits; the spec makes it an error."""
    x = _data((1, 2, 2, 5))
    model = _model("AveragePool", F32, x.shape, 19, kernel_shape=[3, 2])
    reason, rep = _needed(model)
    assert "no window fits" in reason
    assert _onnxruntime(model, x).shape == (1, 2, 0, 4)
    with pytest.raises(PoolfoldError, match="AveragePool-19: no window fits"):
        rep.run([x])


def test_the_differences_needed_leaves_are_in_the_data():
    """Documented in poolfold.placement: where a GlobalMaxPool plane holds a NaN or only -inf,
    and where a float32 average's sum passes float32's range, onnxruntime's answer is not the
    contract's, and prepare cannot see it coming."""
    x = _data((1, 1, 4, 4))
    x[0, 0, 0, 0] = np.nan
    model = _model("GlobalMaxPool", F32, x.shape, 22)
    assert _needed(model)[0] is None
    (every,) = poolfold.backend.prepare(model, poolfold_nodes="all").run([x])
    (needed,) = poolfold.backend.prepare(model, poolfold_nodes="needed").run([x])
    assert np.isnan(every).all() and not np.isnan(needed).any()
    x = np.full((1, 1, 4, 4), -np.inf, np.float32)
    assert poolfold.backend.prepare(model, poolfold_nodes="needed").run([x])[0].item() \
        == np.finfo(np.float32).min
    x = np.full((1, 1, 2, 2), 3e38, np.float32)
    model = _model("AveragePool", F32, x.shape, kernel_shape=[2, 2])
    assert _needed(model)[0] is None
    assert np.isinf(poolfold.backend.prepare(model, poolfold_nodes="needed").run([x])[0]).all()
    np.testing.assert_array_equal(poolfold.backend.prepare(model).run([x])[0],
                                  np.float32(3e38).reshape(1, 1, 1, 1))


def test_the_rules_cover_every_averaging_op():
    for op in ("AveragePool", "LpPool", "GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"):
        assert any(op in rule.ops for rule in placement.RULES if "nhwc" in rule.reason), op
        assert not placement.onnxruntime_types(op, 22) & {F64, BF16}


# ------------------------------------------------------------------ both routes, both domains

def _nhwc(x):
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))


# (domain, op, opset, attributes, the in-memory call)
OPS = [
    ("", "AveragePool", 19,
     dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], count_include_pad=1),
     lambda x: poolfold.average_pool(x, [3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
                                     count_include_pad=1)),
    ("", "AveragePool", 10, dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
     lambda x: poolfold.average_pool(x, [3, 3], strides=[2, 2], ceil_mode=1, opset=10)),
    ("", "LpPool", 18, dict(kernel_shape=[2, 2], p=3, dilations=[2, 1]),
     lambda x: poolfold.lp_pool(x, [2, 2], p=3, dilations=[2, 1])),
    ("", "LpPool", 11, dict(kernel_shape=[2, 2], p=1, auto_pad="SAME_UPPER"),
     lambda x: poolfold.lp_pool(x, [2, 2], p=1, auto_pad="SAME_UPPER", opset=11)),
    ("", "GlobalMaxPool", 22, {}, poolfold.global_max_pool),
    ("", "GlobalAveragePool", 22, {}, poolfold.global_average_pool),
    ("", "GlobalLpPool", 2, dict(p=1), lambda x: poolfold.global_lp_pool(x, p=1, opset=2)),
    (NHWC, "AveragePool", 19,
     dict(kernel_shape=[2, 2], pads=[1, 1, 0, 0], activation="LeakyRelu",
          activation_params=[0.25]),
     lambda x: poolfold.nhwc.average_pool(_nhwc(x), [2, 2], pads=[1, 1, 0, 0],
                                          activation="LeakyRelu", activation_params=[0.25])),
    (NHWC, "LpPool", 18, dict(kernel_shape=[2, 3], strides=[2, 1]),
     lambda x: poolfold.nhwc.lp_pool(_nhwc(x), [2, 3], strides=[2, 1])),
    (NHWC, "GlobalMaxPool", 1, {}, lambda x: poolfold.nhwc.global_max_pool(_nhwc(x))),
    (NHWC, "GlobalAveragePool", 1, {}, lambda x: poolfold.nhwc.global_average_pool(_nhwc(x))),
    (NHWC, "GlobalLpPool", 2, dict(p=3), lambda x: poolfold.nhwc.global_lp_pool(_nhwc(x), p=3)),
]
OP_IDS = [f"{domain or 'ai.onnx'}.{op}-{opset}" for domain, op, opset, _, _ in OPS]
X = _data((2, 3, 7, 6), seed=3)


def _op_model(domain, op, opset, attributes):
    x = _nhwc(X) if domain else X
    return _model(op, F32, x.shape, opset, domain, **attributes), x


@pytest.mark.parametrize("domain, op, opset, attributes, call", OPS, ids=OP_IDS)
def test_both_routes(domain, op, opset, attributes, call):
    """"all": the node on poolfold, its Y the in-memory function's, bit for bit; "needed":
    the same where it runs on poolfold, within the contract's bound where onnxruntime runs
    it."""
    model, x = _op_model(domain, op, opset, attributes)
    want = call(X)
    every = poolfold.backend.prepare(model, poolfold_nodes="all")
    assert [(s.runner, s.reason) for s in every.steps] == [("poolfold", placement.ALL_REASON)]
    (y,) = every.run([x])
    assert y.dtype == want.dtype and y.shape == want.shape
    np.testing.assert_array_equal(y, want)
    needed = poolfold.backend.prepare(model, poolfold_nodes="needed")
    runners = [s.runner for s in needed.steps]
    # onnxruntime runs no nhwc node, and no float32 Lp-pooling with p >= 2 right
    on_poolfold = bool(domain) or ("Lp" in op and attributes.get("p", 2) >= 2)
    assert runners == (["poolfold"] if on_poolfold else ["onnxruntime"]), needed.describe()
    (y,) = needed.run([x])
    if runners == ["poolfold"]:
        np.testing.assert_array_equal(y, want)
    else:
        oracle.assert_within_bound(y, *_exact(op, X, **attributes)[:2], X.dtype,
                                   _ORACLE[op][1])


@pytest.mark.parametrize("domain, op, opset, attributes, call", OPS, ids=OP_IDS)
def test_reference_evaluator_runs_poolfolds_op(domain, op, opset, attributes, call):
    model, x = _op_model(domain, op, opset, attributes)
    (y,) = ReferenceEvaluator(model, new_ops=poolfold.reference.ops).run(None, {"x": x})
    np.testing.assert_array_equal(y, call(X))
    (y,) = poolfold.backend.prepare(model, other_ops="reference").run([x])
    np.testing.assert_array_equal(y, call(X))


def test_reference_ops_hold_every_averaging_op():
    held = {(cls.op_domain, cls.__name__) for cls in poolfold.reference.ops}
    assert {(domain, op) for domain, op, _, _, _ in OPS} <= held


# --------------------------------------------------------------------------- a whole model

def conv_average_model():
    """Conv -> Relu -> AveragePool (3x3 stride 2, pads, count_include_pad 0) -> Conv ->
    GlobalAveragePool -> Flatten: a small classifier's tail, random weights."""
    rng = np.random.default_rng(11)
    weights = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
               for n, s in (("w1", (8, 3, 3, 3)), ("b1", (8,)), ("w2", (4, 8, 1, 1)))]
    graph_nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("AveragePool", ["r1"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "w2"], ["c2"]),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"]),
    ]
    graph = helper.make_graph(graph_nodes, "conv_average",
                              [helper.make_tensor_value_info("x", F32, (2, 3, 15, 15))],
                              [helper.make_tensor_value_info("y", F32, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    return model, rng.standard_normal((2, 3, 15, 15)).astype(np.float32)


def test_conv_average_model_matches_onnxruntime():
    model, x = conv_average_model()
    (alone,) = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})
    every = poolfold.backend.prepare(model)
    assert [(s.runner, [n.op_type for n in s.nodes]) for s in every.steps] == [
        ("onnxruntime", ["Conv", "Relu"]), ("poolfold", ["AveragePool"]),
        ("onnxruntime", ["Conv"]), ("poolfold", ["GlobalAveragePool"]),
        ("onnxruntime", ["Flatten"])]
    needed = poolfold.backend.prepare(model, poolfold_nodes="needed")
    assert [s.runner for s in needed.steps] == ["onnxruntime"]
    for rep in (every, needed):
        (y,) = rep.run([x])
        assert y.shape == (2, 4) and y.dtype == np.float32
        np.testing.assert_allclose(y, alone, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------- onnx's node tests

AVERAGING_TESTS = re.compile(
    r"^test_(averagepool|avgpool|lppool|globalaveragepool|globalmaxpool|globallppool)", re.I)


def _averaging_cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnx's test generators overflow on purpose
        return [c for c in conformance.cases() if AVERAGING_TESTS.search(c.name)]


# Collected at import: onnx registers its node tests once per process, for the op type the
# first collect_testcases names (test_max_pool_onnx_node_tests.py names MaxPool), so a
# collection at run time could find MaxPool's alone.
CASES = _averaging_cases()


def test_onnx_backend_tests_of_the_averaging_family_all_pass():
    """poolfold conformance over the family: onnx 1.23 ships 20 AveragePool, 8 LpPool, 2
    GlobalAveragePool and 2 GlobalMaxPool node tests (none for GlobalLpPool) and 7
    PyTorch-converted AvgPool models; every one passes, none is a divergence."""
    ops = [c.model.graph.node[0].op_type if c.kind == "node" else c.kind for c in CASES]
    assert {op: ops.count(op) for op in set(ops)} == {
        "AveragePool": 20, "LpPool": 8, "GlobalAveragePool": 2, "GlobalMaxPool": 2,
        "pytorch-converted": 7}
    outcomes = [conformance.run_case(case) for case in CASES]
    failed = [(o.case.name, o.status, o.detail) for o in outcomes if o.status != "pass"]
    assert not failed
    assert not set(conformance.DIVERGENCES) & {c.name for c in CASES}
