"""poolfold.backend with onnxruntime for the other ops: the graph split into poolfold's nodes
and stretches of other nodes (one onnxruntime session each), against the reference-evaluator
path (``other_ops="reference"``, every other node on onnx's ReferenceEvaluator), against
onnxruntime alone where it can run the model, and against the oracle.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import asdict

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import oracle
import poolfold.backend
from poolfold import models

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT


def _model(graph_nodes, inputs, outputs, initializers=(), opset=18, extra_opsets=(), **kwargs):
    graph = helper.make_graph(graph_nodes, "g", inputs, outputs, list(initializers))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v)
                                                  for d, v in extra_opsets]
    return helper.make_model(graph, opset_imports=imports, ir_version=8, **kwargs)


def _both(model, feeds, **options):
    """The outputs of the onnxruntime path and of the reference path, and the prepared rep."""
    rep = poolfold.backend.prepare(model, **options)
    assert rep.other_ops == "onnxruntime"
    got = rep.run(feeds)
    want = poolfold.backend.prepare(model, other_ops="reference").run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
    return got, want, rep


def _runners(rep):
    return [(step.runner, [n.op_type for n in step.nodes]) for step in rep.steps]


def _weight(rng, shape, name):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)


# ------------------------------------------------------------------------- the bundled model

def test_bundled_model_split_and_matches_both_paths():
    model = onnx.load(str(models.path()))
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    got, want, rep = _both(model, {"image": x}, one_session=False)
    # Each Shape joins the stretch before the MaxPool: four sessions, five poolfold nodes.
    assert _runners(rep) == [
        ("onnxruntime", ["Conv", "Relu", "Shape"]), ("poolfold", ["MaxPool"]),
        ("onnxruntime", ["Conv", "Relu", "Shape"]), ("poolfold", ["MaxPool"]),
        ("poolfold", ["MaxUnpool"]), ("onnxruntime", ["Conv", "Relu"]),
        ("poolfold", ["MaxUnpool"]), ("onnxruntime", ["Reshape", "MatMul"]),
        ("poolfold", ["Col2Im"]),
    ]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    # onnxruntime alone runs this model too (MaxUnpool with output_shape): the same answer
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for g, w in zip(got, session.run(None, {"image": x})):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    # poolfold's own nodes give exactly the oracle's answer on what the sessions handed them
    values = {**rep.constants, "image": x}
    for step in rep.steps:
        step.run(values)
    y, indices = oracle.max_pool(values["enc1_act"], [2, 2], strides=[2, 2])
    np.testing.assert_array_equal(values["pool1"], y)
    np.testing.assert_array_equal(values["pool1_indices"], indices)


def test_cli_run_other_ops_flag(tmp_path, capsys):
    from poolfold import cli

    outputs = {}
    for choice in ("onnxruntime", "reference"):
        path = tmp_path / f"{choice}.npz"
        assert cli.main(["run", "--other-ops", choice, "--output", str(path)]) == 0
        assert "ran in" in capsys.readouterr().out
        outputs[choice] = np.load(path)
    for name in ("segmentation", "encoded"):
        np.testing.assert_allclose(outputs["onnxruntime"][name], outputs["reference"][name],
                                   rtol=1e-4, atol=1e-5)
    with pytest.raises(SystemExit):
        cli.main(["run", "--other-ops", "torch"])


# ------------------------------------------------------------------------- mixed models

def _mixed_model():
    """Conv -> MaxPool (Indices) -> MatMul on the flattened pool, Shape/Concat/Reshape, an If
    whose branches read outer values (one branch holds a MaxPool), MaxUnpool back."""
    rng = np.random.default_rng(20)
    then_graph = helper.make_graph(
        [helper.make_node("MaxPool", ["act"], ["t_out"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        "then", [], [helper.make_tensor_value_info("t_out", F, None)])
    else_graph = helper.make_graph(
        [helper.make_node("Mul", ["act", "two"], ["e_out"])],
        "else", [], [helper.make_tensor_value_info("e_out", F, None)])
    no_pool_then = helper.make_graph(
        [helper.make_node("Add", ["pooled", "two"], ["nt"])], "nthen", [],
        [helper.make_tensor_value_info("nt", F, None)])
    no_pool_else = helper.make_graph(
        [helper.make_node("Sub", ["pooled", "two"], ["ne"])], "nelse", [],
        [helper.make_tensor_value_info("ne", F, None)])
    graph_nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["act"]),
        helper.make_node("MaxPool", ["act"], ["pooled", "indices"], kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Shape", ["pooled"], ["pshape"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "m"], ["proj"]),
        helper.make_node("Shape", ["proj"], ["proj_shape"]),
        helper.make_node("Concat", ["proj_shape", "one"], ["proj_shape3"], axis=0),
        helper.make_node("Reshape", ["proj", "proj_shape3"], ["proj3"]),
        helper.make_node("ReduceSum", ["proj3"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["branch"], then_branch=then_graph,
                         else_branch=else_graph),
        helper.make_node("If", ["positive"], ["shifted"], then_branch=no_pool_then,
                         else_branch=no_pool_else),
        helper.make_node("Shape", ["act"], ["xshape"]),
        helper.make_node("MaxUnpool", ["shifted", "indices", "xshape"], ["unpooled"],
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["unpooled", "branch"], ["y"]),
    ]
    initializers = [
        _weight(rng, (4, 3, 3, 3), "w"), _weight(rng, (4 * 4 * 5, 6), "m"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array(0, np.float32), "zero"),
        numpy_helper.from_array(np.array(2, np.float32), "two"),
    ]
    return _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 3, 8, 10))],
                  [helper.make_tensor_value_info("y", F, None),
                   helper.make_tensor_value_info("proj3", F, None),
                   helper.make_tensor_value_info("pshape", TensorProto.INT64, None)],
                  initializers)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_mixed_model_with_if(seed):
    model = _mixed_model()
    x = np.random.default_rng(seed).standard_normal((1, 3, 8, 10)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no stretch falls back
        got, want, rep = _both(model, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    runners = _runners(rep)
    # the If holding a MaxPool runs alone, on the reference evaluator with poolfold's ops; the
    # other If is in a stretch of onnxruntime's; nothing else falls to the reference
    assert ("reference", ["If"]) in runners
    assert [r for r, _ in runners].count("reference") == 1
    assert any(r == "onnxruntime" and "If" in ops for r, ops in runners)
    assert [ops for r, ops in runners if r == "poolfold"] == [["MaxPool"], ["MaxUnpool"]]
    # an independent check of the values: the oracle's MaxPool of the convolution
    conv = ort.InferenceSession(
        _model(model.graph.node[:2], [helper.make_tensor_value_info("x", F, None)],
               [helper.make_tensor_value_info("act", F, None)],
               [model.graph.initializer[0]]).SerializeToString(),
        providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    pooled, indices = oracle.max_pool(conv, [2, 2], strides=[2, 2])
    assert got[2].tolist() == list(pooled.shape)
    flat = pooled.reshape(1, -1) @ numpy_helper.to_array(model.graph.initializer[1])
    np.testing.assert_allclose(got[1], flat.reshape(1, 6, 1), rtol=1e-4, atol=1e-5)
    positive = flat.sum() > 0
    branch = oracle.max_pool(conv, [3, 3], pads=[1, 1, 1, 1])[0] if positive else conv * 2
    shifted = pooled + 2 if positive else pooled - 2
    unpooled = oracle.max_unpool(shifted, indices, [2, 2], strides=[2, 2],
                                 output_shape=conv.shape)
    np.testing.assert_allclose(got[0], unpooled + branch, rtol=1e-4, atol=1e-5)


def test_loop_and_function_in_a_stretch():
    """A Loop whose body reads an outer value, and a model-local function, between MaxPools."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, None)])
    function = helper.make_function(
        "local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 18)])
    graph_nodes = [
        helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2]),
        helper.make_node("ReduceMean", ["p"], ["step"], keepdims=1),
        helper.make_node("Loop", ["trips", "true", "p"], ["looped"], body=body),
        helper.make_node("Twice", ["looped"], ["twice"], domain="local"),
        helper.make_node("MaxPool", ["twice"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (2, 3, 9, 9))],
                   [helper.make_tensor_value_info("y", F, None)],
                   # (with no condition, "", onnx's evaluator runs no trips: a given one)
                   [numpy_helper.from_array(np.array(3, np.int64), "trips"),
                    numpy_helper.from_array(np.array(True), "true")],
                   extra_opsets=[("local", 1)], functions=[function])
    x = np.random.default_rng(21).standard_normal((2, 3, 9, 9)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,), (want,), rep = _both(model, {"x": x})
    assert _runners(rep) == [("poolfold", ["MaxPool"]),
                             ("onnxruntime", ["ReduceMean", "Loop", "Twice"]),
                             ("poolfold", ["MaxPool"])]
    p = oracle.max_pool(x, [2, 2])[0]
    want_oracle = oracle.max_pool((p + 3 * p.mean(axis=(0, 1, 2, 3), keepdims=True)) * 2,
                                  [2, 2], strides=[2, 2])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want_oracle, rtol=1e-5, atol=1e-5)


def test_nhwc_max_unpool_between_convs():
    """onnxruntime has no nhwc MaxUnpool; the types after it (onnx's inference does not know
    the nhwc domain) come from poolfold's own rule, so the next stretch is still a session."""
    rng = np.random.default_rng(22)
    nhwc = "com.ms.internal.nhwc"
    graph_nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c1"], ["c1_nhwc"], perm=[0, 2, 3, 1]),
        helper.make_node("MaxPool", ["c1_nhwc"], ["p", "i"], domain=nhwc, kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("MaxUnpool", ["p", "i"], ["u"], domain=nhwc, kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Transpose", ["u"], ["u_nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["u_nchw", "w2"], ["y"], kernel_shape=[1, 1]),
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 2, 6, 8))],
                   [helper.make_tensor_value_info("y", F, None)],
                   [_weight(rng, (5, 2, 3, 3), "w1"), _weight(rng, (3, 5, 1, 1), "w2")],
                   extra_opsets=[(nhwc, 12)])
    x = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,), (want,), rep = _both(model, {"x": x})
    assert _runners(rep) == [("onnxruntime", ["Conv", "Transpose"]), ("poolfold", ["MaxPool"]),
                             ("poolfold", ["MaxUnpool"]),
                             ("onnxruntime", ["Transpose", "Conv"])]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_refused_stretch_falls_back_with_one_warning():
    """onnxruntime has no int16 Relu: that stretch runs on the reference evaluator, said once;
    the stretch after it stays on onnxruntime."""
    graph_nodes = [
        helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2]),
        helper.make_node("Cast", ["p"], ["p16"], to=TensorProto.INT16),
        helper.make_node("Relu", ["p16"], ["r16"]),
        helper.make_node("Cast", ["r16"], ["r"], to=F),
        helper.make_node("MaxPool", ["r"], ["q"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Sqrt", ["q"], ["y"]),
    ]
    model = _model(graph_nodes,
                   [helper.make_tensor_value_info("x", TensorProto.INT8, (1, 2, 7, 7))],
                   [helper.make_tensor_value_info("y", F, None)])
    x = np.random.default_rng(23).integers(-128, 127, (1, 2, 7, 7), endpoint=True).astype(np.int8)
    with pytest.warns(poolfold.backend.FallbackWarning, match="Relu") as record:
        rep = poolfold.backend.prepare(model)
    assert len(record) == 1
    assert _runners(rep) == [("poolfold", ["MaxPool"]), ("reference", ["Cast", "Relu", "Cast"]),
                             ("poolfold", ["MaxPool"]), ("onnxruntime", ["Sqrt"])]
    (got,) = rep.run([x])
    (want,) = poolfold.backend.prepare(model, other_ops="reference").run([x])
    np.testing.assert_array_equal(got, want)
    p = oracle.max_pool(x, [2, 2])[0]
    q = oracle.max_pool(np.maximum(p, 0).astype(np.float32), [2, 2], strides=[2, 2])[0]
    np.testing.assert_array_equal(got, np.sqrt(q))


def test_bfloat16_between_stretches_runs_on_the_reference():
    """numpy (and so onnxruntime's Python API) cannot hand over bfloat16: a stretch fed one
    runs on the reference evaluator, said in the warning."""
    graph_nodes = [
        helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2]),
        helper.make_node("Neg", ["p"], ["n"]),
        helper.make_node("MaxPool", ["n"], ["y"], kernel_shape=[2, 2]),
    ]
    bf16 = TensorProto.BFLOAT16
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", bf16, (1, 2, 6, 6))],
                   [helper.make_tensor_value_info("y", bf16, None)], opset=22)
    x = np.random.default_rng(23).standard_normal((1, 2, 6, 6)).astype(ml_dtypes.bfloat16)
    with pytest.warns(poolfold.backend.FallbackWarning, match="bfloat16"):
        rep = poolfold.backend.prepare(model)
    assert _runners(rep) == [("poolfold", ["MaxPool"]), ("reference", ["Neg"]),
                             ("poolfold", ["MaxPool"])]
    (got,) = rep.run([x])
    want = oracle.max_pool(-oracle.max_pool(x, [2, 2])[0], [2, 2])[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_graph_outputs_that_are_inputs_or_initializers_and_dead_nodes():
    graph_nodes = [
        helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2]),
        helper.make_node("Relu", ["x"], ["unused"]),  # nobody reads it: dropped
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 1, 3, 3))],
                   [helper.make_tensor_value_info("y", F, None),
                    helper.make_tensor_value_info("x", F, None),
                    helper.make_tensor_value_info("c", F, None)],
                   [numpy_helper.from_array(np.array([1.5], np.float32), "c")])
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    rep = poolfold.backend.prepare(model)
    assert _runners(rep) == [("poolfold", ["MaxPool"])]
    y, same, c = rep.run([x])
    np.testing.assert_array_equal(y, oracle.max_pool(x, [2, 2])[0])
    np.testing.assert_array_equal(same, x)
    np.testing.assert_array_equal(c, [1.5])


# ------------------------------------------------------------------------- options

def test_session_options_pass_through():
    model = onnx.load(str(models.path()))
    rep = poolfold.backend.prepare(model, intra_op_num_threads=1, inter_op_num_threads=1,
                                   providers=["CPUExecutionProvider"],
                                   one_session=False)
    sessions = [step.session for step in rep.steps if step.runner == "onnxruntime"]
    assert len(sessions) == 4
    for session in sessions:
        # idle threads stop spinning when a stretch returns: poolfold's kernels run next
        stop = poolfold.backend.STOP_SPINNING
        assert session.get_session_options().get_session_config_entry(stop) == "1"
        assert session.get_session_options().intra_op_num_threads == 1
        assert session.get_session_options().inter_op_num_threads == 1
        assert session.get_providers() == ["CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    rep = poolfold.backend.prepare(model, session_options=options, one_session=False)
    for step in rep.steps:
        if step.runner == "onnxruntime":
            given = step.session.get_session_options()
            assert given.intra_op_num_threads == 2
            assert given.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.raises(poolfold.PoolfoldError, match="not both"):
        poolfold.backend.prepare(model, session_options=options, intra_op_num_threads=1)


def test_bad_options():
    model = onnx.load(str(models.path()))
    with pytest.raises(poolfold.PoolfoldError, match="other_ops"):
        poolfold.backend.prepare(model, other_ops="torch")
    with pytest.raises(poolfold.PoolfoldError, match="intra_op_threads"):
        poolfold.backend.prepare(model, intra_op_threads=2)


def test_without_onnxruntime_behaves_as_before(monkeypatch):
    model = onnx.load(str(models.path()))
    x = np.random.default_rng(24).standard_normal((1, 3, 64, 64)).astype(np.float32)
    with_ort = poolfold.backend.prepare(model).run([x])
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # "import onnxruntime" fails
    assert not poolfold.backend.onnxruntime_available()
    rep = poolfold.backend.prepare(model)
    assert rep.other_ops == "reference"
    assert _runners(rep) == [("reference", [n.op_type for n in model.graph.node])]
    for g, w in zip(rep.run([x]), with_ort):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    with pytest.raises(poolfold.PoolfoldError, match="needs onnxruntime"):
        poolfold.backend.prepare(model, other_ops="onnxruntime")


# ------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("other_ops", ["onnxruntime", "reference"])
def test_unknown_op_is_one_error_at_prepare(other_ops):
    graph_nodes = [
        helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2]),
        helper.make_node("Relu", ["p"], ["r"]),
        helper.make_node("Frobnicate", ["r"], ["y"], name="mystery"),
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 1, 4, 4))],
                   [helper.make_tensor_value_info("y", F, None)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", poolfold.backend.FallbackWarning)
        with pytest.raises(poolfold.PoolfoldError) as info:
            poolfold.backend.prepare(model, other_ops=other_ops)
    message = str(info.value)
    assert "'mystery'" in message and "Frobnicate" in message and "knows" in message


@pytest.mark.parametrize("other_ops", ["onnxruntime", "reference"])
def test_unknown_op_inside_a_subgraph_is_named(other_ops):
    inner = helper.make_graph([helper.make_node("Zap", ["p"], ["z"], domain="nowhere")], "b", [],
                              [helper.make_tensor_value_info("z", F, None)])
    graph_nodes = [
        helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2]),
        helper.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=inner),
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 1, 4, 4)),
                                 helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                   [helper.make_tensor_value_info("y", F, None)],
                   extra_opsets=[("nowhere", 1)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", poolfold.backend.FallbackWarning)
        with pytest.raises(poolfold.PoolfoldError, match="nowhere.Zap"):
            poolfold.backend.prepare(model, other_ops=other_ops)


def test_value_nobody_gives_is_an_error_at_prepare():
    model = _model([helper.make_node("MaxPool", ["ghost"], ["y"], kernel_shape=[2, 2])],
                   [helper.make_tensor_value_info("x", F, (1, 1, 4, 4))],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(poolfold.PoolfoldError, match="ghost"):
        poolfold.backend.prepare(model)


# ------------------------------------------------------------------------- the benchmark

TICK = 2.0 ** -10


class _TickingClock:
    """A stand-in for the bench's ``time`` module whose clock moves ``TICK`` a reading (2^-10
    s, so that the floor's division is exact): a run then seems to last one tick, whatever
    else the machine is doing."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += TICK
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_bench_models_blocks_last_the_floor(monkeypatch):
    """Short runs get more of them a block, so that a block lasts ``block_s``; without a
    floor each block keeps ``repeat`` runs."""
    from poolfold.bench import models as backend_bench

    with monkeypatch.context() as patch:
        patch.setattr(backend_bench, "time", _TickingClock())
        floored = backend_bench.run(repeat=2, warmup=1, reference=False, zoo=False, rounds=1,
                                    block_s=20 * TICK)
    plain = backend_bench.run(repeat=2, warmup=1, reference=False, zoo=False, rounds=1)
    for rows in (floored, plain):
        assert {r.model for r in rows} == set(backend_bench.MODELS)
    # runs of one tick: a block of 20 ticks takes 20 of them
    timed = [r for r in floored if r.median_ms is not None]
    assert timed and all(r.runs == 20 for r in timed), [(r.implementation, r.runs)
                                                        for r in timed]
    assert all(r.runs == 2 for r in plain if r.median_ms is not None)


def test_bench_models_rows_and_table():
    from poolfold.bench import models as backend_bench

    rows = backend_bench.run(repeat=2, warmup=1, reference=False, zoo=False, rounds=3)
    by = {(r.model, r.implementation.split(" ")[0]): r for r in rows}
    needed = [r for r in rows if "needed" in r.implementation]
    assert {r.model for r in needed} == set(backend_bench.MODELS)
    assert all(r.prepare_s is not None for r in rows if r.median_ms is not None)
    assert set(by) == {(m, i) for m in backend_bench.MODELS
                       for i in ("onnxruntime", "poolfold.backend")}
    assert by["segnet (bundled)", "onnxruntime"].median_ms > 0
    assert by["segnet (bundled)", "poolfold.backend"].median_ms > 0
    # onnxruntime alone refuses the 4-D pool; poolfold.backend runs it
    refused = by["conv-pool4d-conv", "onnxruntime"]
    assert refused.median_ms is None and "cannot run it" in refused.note
    assert by["conv-pool4d-conv", "poolfold.backend"].median_ms > 0
    table = backend_bench.format_rows(rows)
    assert "vs onnxruntime" in table and "conv-pool4d-conv" in table

    meta = {"date": "2026-01-01", "processor": "cpu", "cpu_count": 2,
            "versions": {"poolfold": "x"}, "load_average_start": [0.1, 0.2, 0.3],
            "load_average_end": [0.4, 0.5, 0.6]}
    page = backend_bench.markdown([asdict(r) for r in rows], meta, "poolfold bench --models")
    lines = {line.split(" | ")[0][2:]: line for line in page.splitlines()
             if line.startswith("| ")}
    assert lines["model"] == ("| model | onnxruntime ms | poolfold `all` ms | "
                              "poolfold `all`, cut into sessions ms | "
                              "poolfold `needed` ms | prepare s |")
    segnet = lines["segnet (bundled)"].split(" | ")
    ort, pf_all = (next(r for r in rows if r.model == "segnet (bundled)"
                        and r.implementation == implementation)
                   for implementation in ("onnxruntime",
                                          "poolfold.backend (other ops: onnxruntime)"))
    assert segnet[1] == f"{ort.median_ms:.3g}"
    paired = backend_bench.ratio(pf_all, ort)
    assert segnet[2] == f"{pf_all.median_ms:.3g} (**{paired:.2f}x**)"
    assert len(pf_all.block_ms) == len(ort.block_ms) == 3  # a block a round
    assert len(segnet[5].split(" / ")) == 4  # a prepare time for each implementation
    assert lines["conv-pool4d-conv"].split(" | ")[5].startswith("- / ")  # none: refused
    assert lines["conv-pool4d-conv"].split(" | ")[1] == "cannot run it"
    assert "- conv-pool4d-conv, onnxruntime: cannot run it:" in page
    assert "`poolfold bench --models` on 2026-01-01" in page and "[0.4, 0.5, 0.6] at the end" in page


def test_bench_models_ratio_pairs_each_round_with_onnxruntimes():
    """A route's ratio is the median of its blocks over onnxruntime's blocks of the same
    rounds, so that a slow stretch of the host that falls on both cancels out."""
    from poolfold.bench.models import Row, ratio

    ort = Row("m", "onnxruntime", 2.0, 3, block_ms=[1.0, 2.0, 6.0])
    route = Row("m", "poolfold", 2.0, 3, block_ms=[1.1, 2.2, 3.0])
    # per round 1.1, 1.1, 0.5: the median 1.1, where the medians' ratio is 1.0
    assert ratio(route, ort) == pytest.approx(1.1)
    assert ratio(Row("m", "poolfold", 3.0, 1), ort) == pytest.approx(1.5)  # unpaired
    assert ratio(Row("m", "poolfold", None, 0), ort) is None
    assert ratio(route, None) is None


def test_bench_models_rounds_start_one_implementation_further_on(monkeypatch):
    """No implementation's blocks always follow the same other implementation's."""
    from poolfold.bench import models as backend_bench

    monkeypatch.setattr(backend_bench, "MODELS",
                        {"segnet (bundled)": backend_bench.MODELS["segnet (bundled)"]})
    monkeypatch.setattr(backend_bench.time, "sleep", lambda seconds: None)
    order = []
    calls = {}

    def timed(call, warmup, runs):
        order.append(calls.setdefault(call, len(calls)))
        return 1.0 + len(order)

    monkeypatch.setattr(backend_bench, "_median_ms", timed)
    rows = backend_bench.run(repeat=1, warmup=0, reference=False, zoo=False, rounds=4)
    n = len(calls)
    assert n == 4  # onnxruntime, the two routes and the "all" route cut into sessions
    assert order == [(r + k) % n for r in range(4) for k in range(n)]
    assert [len(r.block_ms) for r in rows] == [4] * n


def test_poolfold_threads_are_parked_before_each_stretch(monkeypatch):
    """poolfold's idle threads stop spinning before each stretch runs, not after their spin:
    spinning on, they took half of onnxruntime's cores."""
    from poolfold.bench import models as backend_bench

    model, feeds = backend_bench.pool4d_model()
    rep = poolfold.backend.prepare(model, one_session=False)
    parked = []
    monkeypatch.setattr(poolfold.backend, "park_spinning_threads", lambda: parked.append(1))
    rep.run(feeds)
    assert len(parked) == sum(step.runner == "onnxruntime" for step in rep.steps) == 2


def test_pool4d_model_against_the_oracle():
    from poolfold.bench import models as backend_bench

    model, feeds = backend_bench.pool4d_model()
    rep = poolfold.backend.prepare(model, one_session=False)
    assert _runners(rep) == [("onnxruntime", ["Conv", "Reshape"]), ("poolfold", ["MaxPool"]),
                             ("onnxruntime", ["Reshape", "Relu", "Conv"])]
    values = {**rep.constants, **feeds}
    for step in rep.steps:
        step.run(values)
    want = oracle.max_pool(values["c1_6d"], [2, 2, 2, 2], strides=[2, 2, 2, 2])[0]
    np.testing.assert_array_equal(values["p"], want)
    (y,) = rep.run(feeds)
    np.testing.assert_array_equal(y, values["y"])
    assert y.shape == (1, 4, 8, 8)


def test_stretch_typed_from_the_first_run():
    """With no type for x (nor for what comes of it), the stretches get their sessions on the
    first run, from the arrays they are fed; one onnxruntime refuses falls back then."""
    graph_nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2]),
        helper.make_node("Neg", ["p"], ["y"]),
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", TensorProto.UNDEFINED, None)],
                   [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    rep = poolfold.backend.prepare(model)
    assert [step.session for step in rep.steps] == [None, None, None]
    x = np.random.default_rng(25).standard_normal((1, 2, 5, 5)).astype(np.float32)
    (y,) = rep.run([x])
    assert _runners(rep) == [("onnxruntime", ["Relu"]), ("poolfold", ["MaxPool"]),
                             ("onnxruntime", ["Neg"])]
    assert all(step.session is not None for step in rep.steps if step.runner != "poolfold")
    np.testing.assert_array_equal(y, -oracle.max_pool(np.maximum(x, 0), [2, 2])[0])
    np.testing.assert_array_equal(rep.run([x])[0], y)
    # onnxruntime has no int16 Relu: known only at the first run, which falls back then
    relu = _model(graph_nodes[:1], [helper.make_tensor_value_info("x", TensorProto.UNDEFINED,
                                                                  None)],
                  [helper.make_tensor_value_info("r", TensorProto.UNDEFINED, None)])
    x16 = np.arange(-6, 6, dtype=np.int16).reshape(3, 4)
    rep = poolfold.backend.prepare(relu)
    with pytest.warns(poolfold.backend.FallbackWarning, match="Relu"):
        (r16,) = rep.run([x16])
    assert _runners(rep) == [("reference", ["Relu"])]
    assert r16.dtype == np.int16
    np.testing.assert_array_equal(r16, np.maximum(x16, 0))


def test_max_pool_with_only_its_indices_kept():
    node = helper.make_node("MaxPool", ["x"], ["", "i"], kernel_shape=[2, 2], strides=[2, 2])
    model = _model([node, helper.make_node("Cast", ["i"], ["y"], to=F)],
                   [helper.make_tensor_value_info("x", F, (1, 2, 4, 6))],
                   [helper.make_tensor_value_info("y", F, None)])
    x = np.random.default_rng(27).standard_normal((1, 2, 4, 6)).astype(np.float32)
    (got,) = poolfold.backend.prepare(model).run([x])
    np.testing.assert_array_equal(got, oracle.max_pool(x, [2, 2], strides=[2, 2])[1])


# ------------------------------------------------------------------------- random chains

_CHAIN_OPS = ["pool", "unpool", "relu", "neg", "mul", "transpose"]


def _chain_model(ops):
    """x -> the ops in order; "pool" grows H and W by one (kernel 2, pads 1), "unpool" pools
    with Indices and restores the shape with MaxUnpool and Shape; the rest are other ops."""
    graph_nodes, value = [], "x"
    for position, op in enumerate(ops):
        out = f"v{position}"
        if op == "pool":
            graph_nodes.append(helper.make_node("MaxPool", [value], [out], kernel_shape=[2, 2],
                                                pads=[1, 1, 1, 1]))
        elif op == "unpool":
            graph_nodes += [
                helper.make_node("MaxPool", [value], [f"{out}_p", f"{out}_i"], kernel_shape=[2, 2],
                                 strides=[2, 2]),
                helper.make_node("Shape", [value], [f"{out}_s"]),
                helper.make_node("MaxUnpool", [f"{out}_p", f"{out}_i", f"{out}_s"], [out],
                                 kernel_shape=[2, 2], strides=[2, 2]),
            ]
        elif op == "relu":
            graph_nodes.append(helper.make_node("Relu", [value], [out]))
        elif op == "neg":
            graph_nodes.append(helper.make_node("Neg", [value], [out]))
        elif op == "mul":
            graph_nodes.append(helper.make_node("Mul", [value, "half"], [out]))
        else:
            graph_nodes.append(helper.make_node("Transpose", [value], [out], perm=[0, 1, 3, 2]))
        value = out
    graph_nodes.append(helper.make_node("Identity", [value], ["y"]))
    return _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 2, 5, 6))],
                  [helper.make_tensor_value_info("y", F, None)],
                  [numpy_helper.from_array(np.array(0.5, np.float32), "half")])


@settings(max_examples=15, deadline=None)
@given(ops=st.lists(st.sampled_from(_CHAIN_OPS), min_size=1, max_size=6),
       seed=st.integers(0, 2**16))
def test_random_chains_match_the_reference_path(ops, seed):
    model = _chain_model(ops)
    x = np.random.default_rng(seed).standard_normal((1, 2, 5, 6)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,), (want,), rep = _both(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # one session per maximal run of other ops (the Shape of an unpool joins the run before it)
    runs, previous = 0, None
    for op in ops + ["identity"]:
        other = op not in ("pool", "unpool")
        runs += other and previous is not True and op != "unpool"
        runs += op == "unpool" and previous is not True
        previous = other
    assert [step.runner for step in rep.steps].count("onnxruntime") == runs


def test_local_function_holding_a_poolfold_op_runs_on_the_reference():
    """A model-local function whose body has a 4-D MaxPool (onnxruntime would run its own
    MaxPool, and has none for four spatial axes) runs alone, with poolfold's ops plugged in."""
    function = helper.make_function(
        "local", "Pool4", ["a"], ["b"],
        [helper.make_node("MaxPool", ["a"], ["b"], kernel_shape=[2, 2, 2, 2])],
        [helper.make_opsetid("", 18)])
    graph_nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Pool4", ["r"], ["p"], domain="local"),
        helper.make_node("Neg", ["p"], ["y"]),
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 1, 3, 3, 3, 4))],
                   [helper.make_tensor_value_info("y", F, None)],
                   extra_opsets=[("local", 1)], functions=[function])
    x = np.random.default_rng(28).standard_normal((1, 1, 3, 3, 3, 4)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,), (want,), rep = _both(model, {"x": x})
    assert _runners(rep) == [("onnxruntime", ["Relu"]), ("reference", ["Pool4"]),
                             ("onnxruntime", ["Neg"])]
    np.testing.assert_array_equal(got, -oracle.max_pool(np.maximum(x, 0), [2, 2, 2, 2])[0])
    np.testing.assert_array_equal(got, want)


def test_intermediates_are_freed_after_their_last_reader():
    """run keeps only what later steps or the outputs need: on the bundled model, enc1_act goes
    once its last reader (the first MaxPool) has run; the outputs stay."""
    model = onnx.load(str(models.path()))
    rep = poolfold.backend.prepare(model, one_session=False)
    x = np.random.default_rng(29).standard_normal((1, 3, 64, 64)).astype(np.float32)
    held = []
    for step in rep.steps:
        original = step.run

        def spy(values, original=original):
            original(values)
            held.append(set(values))

        step.run = spy
    got = rep.run([x])
    assert "enc1_act" in held[0] and "enc1_act" not in held[-1]
    assert held[-1] >= {"segmentation", "encoded"}
    # every value a step reads was still there when it ran (the results are right)
    want = poolfold.backend.prepare(model, other_ops="reference").run([x])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------- stretches as fast as a hand split

def _conv_pool_conv(bias_through_identity=False, big=False):
    """Conv -> MaxPool -> Conv; the second Conv's bias reached through an Identity of an
    initializer (as torch.onnx.export shares equal tensors), its weights big enough
    (``big``) to be shared with the session rather than copied into its model."""
    rng = np.random.default_rng(7)
    channels = 64 if big else 8
    initializers = [_weight(rng, (channels, 3, 3, 3), "w1"),
                    _weight(rng, (8, channels, 3, 3), "w2"),
                    numpy_helper.from_array(np.zeros(8, np.float32), "b")]
    graph_nodes = [
        helper.make_node("Identity", ["b"], ["b2"]),
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w2", "b2" if bias_through_identity else "b"], ["y"],
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 3, 16, 16))],
                   [helper.make_tensor_value_info("y", F, None)], initializers)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    return model, {"x": x}


def test_constant_nodes_fold_into_the_stretch_that_reads_them():
    """An Identity of an initializer runs in the stretch that reads it, where onnxruntime
    folds it into a constant (a Conv's bias it can prepack), not as an input from the
    stretch before the MaxPool."""
    model, feeds = _conv_pool_conv(bias_through_identity=True)
    rep = poolfold.backend.prepare(model, one_session=False)
    assert _runners(rep) == [("onnxruntime", ["Conv"]), ("poolfold", ["MaxPool"]),
                             ("onnxruntime", ["Identity", "Conv"])]
    after = rep.steps[-1]
    assert [i.name for i in after.session.get_inputs()] == ["p"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(rep.run(feeds)[0], session.run(None, feeds)[0], rtol=1e-5,
                               atol=1e-5)


def test_stretches_are_told_the_shapes_they_are_fed():
    """The stretch after a MaxPool sees its input's exact shape, from poolfold's geometry."""
    model, feeds = _conv_pool_conv()
    rep = poolfold.backend.prepare(model, one_session=False)
    (given,) = rep.steps[-1].session.get_inputs()
    assert given.shape == [1, 8, 8, 8]


@pytest.mark.parametrize("one_session", [True, False])
def test_a_feed_of_another_shape_than_declared_still_runs(one_session):
    """Declared shapes are a hint: a model fed other shapes runs as before (its session built
    again without them)."""
    model, _ = _conv_pool_conv()
    rep = poolfold.backend.prepare(model, one_session=one_session)
    assert rep.one_session == one_session
    x = np.random.default_rng(8).standard_normal((2, 3, 12, 12)).astype(np.float32)
    (y,) = rep.run({"x": x})
    want = poolfold.backend.prepare(model, other_ops="reference").run({"x": x})[0]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    assert y.shape == (2, 8, 6, 6)


def test_external_data_weights_are_mapped_not_copied(tmp_path):
    """A model whose weights sit in an external-data file: prepare reads none of them into
    memory (the model it keeps holds references only, the sessions read theirs from the
    file), and where poolfold needs one it maps it from the file."""
    model, feeds = _conv_pool_conv(big=True)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data",
              size_threshold=1024)
    rep = poolfold.backend.prepare(str(path))
    stored = {t.name: t for t in rep.model.graph.initializer}
    assert stored["w2"].data_location == TensorProto.EXTERNAL
    assert not stored["w2"].raw_data  # never read into the model
    assert not rep._weights._arrays  # nor into an array
    assert isinstance(rep._weights.array("w2"), np.memmap)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(rep.run(feeds)[0], session.run(None, feeds)[0], rtol=1e-5,
                               atol=1e-5)
    (reference,) = poolfold.backend.prepare(str(path), other_ops="reference").run(feeds)
    np.testing.assert_allclose(reference, session.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_one_session_alone_keeps_onnxruntime_spinning():
    """Where no poolfold node runs between sessions, the one session keeps onnxruntime's
    default (its threads spin between runs); with poolfold's kernels between, they stop
    when a stretch returns."""
    model, _ = _conv_pool_conv()
    spinning = poolfold.backend.STOP_SPINNING
    alone = poolfold.backend.prepare(model, poolfold_nodes="needed")
    assert [s.runner for s in alone.steps] == ["onnxruntime"]
    with pytest.raises(RuntimeError):  # not set: onnxruntime's default
        alone.steps[0].session.get_session_options().get_session_config_entry(spinning)
    split = poolfold.backend.prepare(model, one_session=False)
    for step in split.steps:
        if step.runner == "onnxruntime":
            assert step.session.get_session_options().get_session_config_entry(spinning) == "1"
