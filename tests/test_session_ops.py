"""poolfold's nodes as custom ops inside one onnxruntime session (poolfold.session_ops, the
backend's default route): the same answers as the split route and as the oracle, every type
handed over as it is (bfloat16 and int8 included), a node's error raised as poolfold's own,
the library built once into its cache folder, and the split route where it cannot be had.
"""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import oracle
import poolfold.backend
from poolfold import models, session_ops

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT


def _model(graph_nodes, inputs, outputs, initializers=(), opset=22, extra_opsets=()):
    graph = helper.make_graph(graph_nodes, "g", inputs, outputs, list(initializers))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v)
                                                  for d, v in extra_opsets]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


@pytest.fixture(scope="module")
def available():
    lib, why = session_ops.library()
    assert lib is not None, f"the custom-op library cannot be built here: {why}"
    return lib


def test_bundled_model_runs_as_one_session(available):
    """The bundled model (MaxPool with Indices, MaxUnpool, Col2Im between Convs) is one
    session; its stretches all name that session; the answers are the split route's, and
    the reference evaluator's to float rounding."""
    model = onnx.load(str(models.path()))
    one = poolfold.backend.prepare(model)
    split = poolfold.backend.prepare(model, one_session=False)
    assert one.one_session and not split.one_session
    assert [(s.runner, [n.op_type for n in s.nodes]) for s in one.steps] == \
        [(s.runner, [n.op_type for n in s.nodes]) for s in split.steps]
    sessions = {id(s.session) for s in one.steps if s.runner == "onnxruntime"}
    assert len(sessions) == 1 and None not in {s.session for s in one.steps
                                               if s.runner == "onnxruntime"}
    x = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32)
    got, want = one.run([x]), split.run([x])
    reference = poolfold.backend.prepare(model, other_ops="reference").run([x])
    for g, w, r in zip(got, want, reference):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def _pool_unpool_model(elem, unpool=True):
    """x -> MaxPool (Y, Indices) -> Identity -> MaxUnpool (output_shape from Shape(x)); Y
    and the Indices are outputs too, so poolfold's outputs are seen as they leave the op.
    MaxUnpool takes floats only: without ``unpool``, the model stops at the MaxPool."""
    graph_nodes = [
        helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 3], strides=[2, 2],
                         pads=[0, 1, 1, 1]),
        helper.make_node("Identity", ["y"], ["y2"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("MaxUnpool", ["y2", "i", "s"], ["u"], kernel_shape=[2, 3],
                         strides=[2, 2], pads=[0, 1, 1, 1]),
    ]
    outputs = [helper.make_tensor_value_info("y", elem, None),
               helper.make_tensor_value_info("i", TensorProto.INT64, None),
               helper.make_tensor_value_info("u", elem, None)]
    if not unpool:
        graph_nodes, outputs = graph_nodes[:1], outputs[:2]
    return _model(graph_nodes, [helper.make_tensor_value_info("x", elem, (2, 3, 7, 9))],
                  outputs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8, np.uint8])
def test_values_cross_as_they_are(available, dtype):
    """Every type numpy and onnxruntime share crosses into and out of a node unchanged: the
    one session's outputs are the oracle's, bit for bit."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    floating = np.issubdtype(dtype, np.floating)
    model = _pool_unpool_model(elem, unpool=floating)
    rep = poolfold.backend.prepare(model)
    assert rep.one_session
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 3, 7, 9)) * 40).astype(dtype)
    y, i, *unpooled = rep.run({"x": x})
    want_y, want_i = oracle.max_pool(x, [2, 3], strides=[2, 2], pads=[0, 1, 1, 1])
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(i, want_i)
    assert (y.dtype, i.dtype) == (np.dtype(dtype), np.int64)
    if floating:
        want_u = oracle.max_unpool(want_y, want_i, [2, 3], strides=[2, 2], pads=[0, 1, 1, 1],
                                   output_shape=x.shape)
        np.testing.assert_array_equal(unpooled[0], want_u)
        assert unpooled[0].dtype == np.dtype(dtype)


def test_outputs_are_written_in_onnxruntimes_buffers(available, monkeypatch):
    """Once a node has run on inputs of a shape, its kernels write its outputs straight into
    the buffers onnxruntime allocates: nothing is copied on the later runs (the first run,
    which learns the outputs' shapes, copies)."""
    copies = []
    original = session_ops._copy
    monkeypatch.setattr(session_ops, "_copy",
                        lambda target, result: copies.append(result.shape) or
                        original(target, result))
    model = _pool_unpool_model(F)
    rep = poolfold.backend.prepare(model)
    x = np.random.default_rng(6).standard_normal((2, 3, 7, 9)).astype(np.float32)
    first = rep.run({"x": x})
    assert copies  # the first run copies
    copies.clear()
    for _ in range(2):
        again = rep.run({"x": x})
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)
    assert copies == []
    # another input shape: copied once more, then in place again
    x2 = np.random.default_rng(7).standard_normal((1, 3, 9, 9)).astype(np.float32)
    want = poolfold.backend.prepare(model, one_session=False).run({"x": x2})
    for _ in range(2):
        for g, w in zip(rep.run({"x": x2}), want):
            np.testing.assert_array_equal(g, w)
    assert len(copies) == 3  # Y, Indices and the MaxUnpool's output, on the first run only


def test_bfloat16_inside_the_session(available):
    """A bfloat16 value between onnxruntime's nodes (which numpy could not hand over between
    sessions) reaches poolfold's node in place, and is pooled in bfloat16."""
    graph_nodes = [
        helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
        helper.make_node("AveragePool", ["xb"], ["pb"], kernel_shape=[3, 3], pads=[1] * 4,
                         count_include_pad=0),
        helper.make_node("Cast", ["pb"], ["y"], to=F),
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 2, 6, 5))],
                   [helper.make_tensor_value_info("y", F, None)])
    rep = poolfold.backend.prepare(model)
    assert rep.one_session
    x = np.random.default_rng(9).standard_normal((1, 2, 6, 5)).astype(np.float32)
    (y,) = rep.run({"x": x})
    xb = x.astype(ml_dtypes.bfloat16)
    want = poolfold.average_pool(xb, [3, 3], pads=[1] * 4, count_include_pad=0)
    np.testing.assert_array_equal(y, want.astype(np.float32))


def test_a_bfloat16_graph_input_takes_the_split_route(available):
    """numpy cannot feed onnxruntime a bfloat16 input: the model is split, and poolfold's node
    takes the input itself."""
    graph_nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])]
    bf = TensorProto.BFLOAT16
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", bf, (1, 1, 4, 4))],
                   [helper.make_tensor_value_info("y", bf, None)])
    rep = poolfold.backend.prepare(model)
    assert not rep.one_session
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(rep.run({"x": x})[0], oracle.max_pool(x, [2, 2])[0])


def test_a_split_kernel_runs_on_onnxruntimes_threads(available, monkeypatch):
    """A node large enough to split runs its pieces on onnxruntime's threads (through the
    kernel context's parallel-for), and gives the oracle's answer."""
    from poolfold.kernels import threads

    hosted = []
    original = threads._run_hosted
    monkeypatch.setattr(threads, "_run_hosted",
                        lambda *args: hosted.append(args[0]) or original(*args))
    graph_nodes = [helper.make_node("Relu", ["x"], ["r"]),
                   helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[3, 3],
                                    strides=[2, 2], pads=[1] * 4)]
    shape = (2, 32, 64, 64)
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, shape)],
                   [helper.make_tensor_value_info("y", F, None)])
    rep = poolfold.backend.prepare(model, intra_op_num_threads=2)
    x = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
    for _ in range(3):  # the first call compiles through Python; the next ones go native
        (y,) = rep.run({"x": x})
        want = oracle.max_pool(np.maximum(x, 0), [3, 3], strides=[2, 2], pads=[1] * 4)[0]
        np.testing.assert_array_equal(y, want)
    if threads.kernel_threads() > 1:
        assert hosted and all(host[1] != 0 for host in hosted)  # a kernel context each
    assert getattr(threads.HOSTED, "host", None) is None  # not left set after the node


def test_a_nodes_error_is_poolfolds_own(available):
    """An index out of range, found by poolfold's node inside onnxruntime's run, is raised as
    the same PoolfoldError the split route raises, not as onnxruntime's failure."""
    graph_nodes = [helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2, 2],
                                    strides=[2, 2])]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 1, 2, 2)),
                                 helper.make_tensor_value_info("i", TensorProto.INT64,
                                                               (1, 1, 2, 2))],
                   [helper.make_tensor_value_info("y", F, None)])
    x = np.ones((1, 1, 2, 2), np.float32)
    bad = np.array([0, 1, 2, 99], np.int64).reshape(1, 1, 2, 2)
    messages = []
    for one_session in (True, False):
        rep = poolfold.backend.prepare(model, one_session=one_session)
        assert rep.one_session == one_session
        with pytest.raises(poolfold.PoolfoldError, match="MaxUnpool") as raised:
            rep.run({"x": x, "i": bad})
        messages.append(str(raised.value))
        # the session is still good after the failure
        good = np.array([0, 3, 8, 15], np.int64).reshape(1, 1, 2, 2)
        (y,) = rep.run({"x": x, "i": good})
        assert y.shape == (1, 1, 4, 4) and y.sum() == 4
    assert messages[0] == messages[1]


def test_threads_share_a_session(available):
    """Runs of one prepared model from several threads at once give each its own answer."""
    model = _pool_unpool_model(F)
    rep = poolfold.backend.prepare(model)
    rng = np.random.default_rng(11)
    feeds = [rng.standard_normal((2, 3, 7, 9)).astype(np.float32) for _ in range(4)]
    wants = [poolfold.backend.prepare(model, one_session=False).run({"x": x}) for x in feeds]
    results: dict[int, list] = {}

    def work(k):
        for _ in range(20):
            results.setdefault(k, []).append(rep.run({"x": feeds[k]}))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k, want in enumerate(wants):
        for got in results[k]:
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)


def test_caller_session_options_are_kept(available):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    rep = poolfold.backend.prepare(onnx.load(str(models.path())), session_options=options)
    assert rep.one_session
    (session,) = {id(s.session): s.session for s in rep.steps if s.session}.values()
    assert session.get_session_options().intra_op_num_threads == 1


def test_without_the_library_the_model_is_split(monkeypatch):
    monkeypatch.setattr(session_ops, "library", lambda: (None, "no compiler"))
    model = onnx.load(str(models.path()))
    rep = poolfold.backend.prepare(model)
    assert not rep.one_session
    assert sum(s.runner == "onnxruntime" and s.session is not None for s in rep.steps) == 4
    x = np.random.default_rng(4).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = poolfold.backend.prepare(model, other_ops="reference").run([x])
    for g, w in zip(rep.run([x]), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_library_is_built_once_into_its_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLFOLD_CACHE_DIR", str(tmp_path))
    built = session_ops._built()
    assert built.parent == tmp_path and built.exists()
    stamp = built.stat().st_mtime_ns
    assert session_ops._built() == built and built.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no partial file left


def test_no_compiler_is_a_reason_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLFOLD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(RuntimeError, match="no C compiler.*CC"):
        session_ops._built()


def test_one_session_must_be_a_bool():
    with pytest.raises(poolfold.PoolfoldError, match="one_session"):
        poolfold.backend.prepare(onnx.load(str(models.path())), one_session="yes")


def test_arrays_over_onnxruntimes_buffers_serve_again_only_over_the_same_buffers(
        available, monkeypatch):
    """A node keeps the arrays over the buffers onnxruntime handed it last: fed the same
    array again (changed in place) it reads the new values through them, without building
    new ones; fed another array (another buffer) it reads that one."""
    built = []
    original = session_ops._over
    monkeypatch.setattr(session_ops, "_over",
                        lambda *args: built.append(args[0]) or original(*args))
    model = _pool_unpool_model(F, unpool=False)
    rep = poolfold.backend.prepare(model)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    for _ in range(3):
        y, i = rep.run({"x": x})
        want_y, want_i = oracle.max_pool(x, [2, 3], strides=[2, 2], pads=[0, 1, 1, 1])
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(i, want_i)
        x[...] = rng.standard_normal(x.shape)  # the same buffer, new values
    assert built.count(x.ctypes.data) == 1  # onnxruntime reads a graph input in place
    other = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    y, _ = rep.run({"x": other})
    np.testing.assert_array_equal(y, oracle.max_pool(other, [2, 3], strides=[2, 2],
                                                     pads=[0, 1, 1, 1])[0])
    assert other.ctypes.data in built


def test_a_maxpool_runs_its_last_launch_again_over_the_same_buffers(available, monkeypatch):
    """Handed the same buffers again, a MaxPool node runs the launch its last call made on
    them, without the op's checks and allocations: the new values in those buffers pooled
    right; other buffers, or another thread count, run the op in full.  An AveragePool
    (whose float32 sums may be redone in float64, depending on the values) always runs in
    full."""
    graph_nodes = [
        helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[2, 2]),
    ]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (2, 8, 33, 33))],
                   [helper.make_tensor_value_info("y", F, None),
                    helper.make_tensor_value_info("a", F, None)])
    rep = poolfold.backend.prepare(model)
    assert rep.one_session
    ran = []
    for number, node in session_ops._NODES.items():
        inner = node._run
        monkeypatch.setattr(node, "_run", lambda inputs, inner=inner, number=number:
                            ran.append(number) or inner(inputs))
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 8, 33, 33)).astype(np.float32)

    def check():
        y, a = rep.run({"x": x})
        np.testing.assert_array_equal(y, oracle.max_pool(x, [3, 3], strides=[2, 2],
                                                         pads=[1, 1, 1, 1])[0])
        oracle.assert_within_bound(a, *oracle.average_pool(x, [2, 2]), np.float32, "average")

    for _ in range(4):
        check()
        x[...] = rng.standard_normal(x.shape)  # the same buffer, new values
    max_pool, average_pool = sorted(set(ran))
    assert ran.count(average_pool) == 4
    # the first run learns the output's shape, the second records its launch and arms the
    # library with it; from the third on the library runs it without calling back
    assert ran.count(max_pool) == 2
    assert session_ops._NODES[max_pool]._armed is not None
    ran.clear()
    x = rng.standard_normal((2, 8, 33, 33)).astype(np.float32)  # another input buffer
    check()
    assert ran.count(max_pool) == 1
    ran.clear()
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "1")
    check()
    assert ran.count(max_pool) == 1


def test_a_finished_background_compile_is_taken_up_before_a_call_records(monkeypatch):
    """background.settled() moves a compile whose child is done to the ready set, so that a
    call may record its launch again (a launch stands in only while its compile is pending,
    which settled() still reports)."""
    from poolfold.kernels import background

    class Child:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    class Job:
        def __init__(self, code):
            self.process, self.failed, self.elsewhere = Child(code), False, False
            self.started = 0.0

    jobs = {("kernel", "done"): Job(0)}
    monkeypatch.setattr(background, "_JOBS", jobs)
    monkeypatch.setattr(background, "_READY", set())
    monkeypatch.setattr(background, "_advance", lambda: None)
    assert not background.idle()
    assert background.settled() and background.idle()
    assert ("kernel", "done") in background._READY
    jobs[("kernel", "running")] = Job(None)
    assert not background.settled()


@pytest.mark.parametrize("shapes_constant", [True, "Constant", False])
def test_col2im_replays_only_with_constant_shapes(available, monkeypatch, shapes_constant):
    """A Col2Im whose image_shape and block_shape are initializers (or Constant nodes' outputs,
    as torch exports them) runs its kept launch over the same buffers; fed as graph inputs,
    whose values may change in the same buffer, it runs in full every time, and each call
    has its own output shape."""
    image, block = np.array([5, 6], np.int64), np.array([2, 3], np.int64)
    nodes = [helper.make_node("Col2Im", ["x", "image", "block"], ["y"])]
    if shapes_constant:
        inputs = [helper.make_tensor_value_info("x", F, (2, 6, 16))]
        initializers = [numpy_helper.from_array(image, "image"),
                        numpy_helper.from_array(block, "block")]
        if shapes_constant == "Constant":
            nodes = [helper.make_node("Constant", [], [t.name], value=t)
                     for t in initializers] + nodes
            initializers = []
    else:
        inputs = [helper.make_tensor_value_info("x", F, (2, 6, None)),
                  helper.make_tensor_value_info("image", TensorProto.INT64, (2,)),
                  helper.make_tensor_value_info("block", TensorProto.INT64, (2,))]
        initializers = []
    model = _model(nodes, inputs, [helper.make_tensor_value_info("y", F, None)],
                   initializers)
    rep = poolfold.backend.prepare(model)
    assert rep.one_session
    ran = []
    number = max(session_ops._NODES)  # the model's one node, the last declared
    inner = session_ops._NODES[number]._run
    monkeypatch.setattr(session_ops._NODES[number], "_run",
                        lambda inputs: ran.append(1) or inner(inputs))
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 6, 16)).astype(np.float32)
    feeds = {"x": x} if shapes_constant else {"x": x, "image": image, "block": block}
    for k in range(4):
        if not shapes_constant and k == 3:  # the same buffer, another image
            image[...] = (3, 10)  # 16 blocks again, the output another shape
        (y,) = rep.run(feeds)
        np.testing.assert_allclose(y, oracle.col2im(x, image, block), rtol=1e-6, atol=1e-6)
        del y  # a graph output still held takes its buffer out of onnxruntime's reach
        x[...] = rng.standard_normal(x.shape)
    assert len(ran) == (2 if shapes_constant else 4)


def test_a_dropped_model_disarms_its_nodes(available):
    """Once a prepared model is gone, its nodes' kept launches are taken out of the library
    (their arrays are freed with the model): the node numbers are no longer known, and a new
    model's nodes arm afresh."""
    import gc

    graph_nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])]
    model = _model(graph_nodes, [helper.make_tensor_value_info("x", F, (1, 4, 8, 8))],
                   [helper.make_tensor_value_info("y", F, None)])
    x = np.random.default_rng(15).standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = oracle.max_pool(x, [2, 2])[0]
    rep = poolfold.backend.prepare(model)
    for _ in range(3):
        np.testing.assert_array_equal(rep.run({"x": x})[0], want)
    number = max(session_ops._NODES)
    assert session_ops._NODES[number]._armed is not None
    del rep
    gc.collect()
    assert number not in session_ops._NODES
    again = poolfold.backend.prepare(model)
    for _ in range(3):
        np.testing.assert_array_equal(again.run({"x": x})[0], want)
    assert session_ops._NODES[max(session_ops._NODES)]._armed is not None
