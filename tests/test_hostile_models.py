"""Hostile models, through ``poolfold.backend.prepare`` / ``run`` and ``poolfold run``.

Bytes that are not ONNX, wrong attribute types, missing or extra inputs, negative, symbolic
or enormous dims, an output_shape or image_shape that would need terabytes: the backend
raises a PoolfoldError / PoolfoldTypeError with a one-line message (nothing allocated beyond
a small bound for the refusals), and the command (``poolfold.cli.main``, in this process)
prints one line and exits with status 2, never a traceback.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import poolfold.backend
from command_line import cli_here
from poolfold import PoolfoldError, PoolfoldTypeError, models
from refusal import assert_refused_quickly

TERA = 2**20  # a spatial dim: 2**40 elements in a 2-D plane, 4 TiB of float32


def model(nodes, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name, dims, elem_type=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem_type, dims)


def max_pool_model(inputs=("X",), outputs=("Y",), dims=(1, 1, 4, 4), extra=(), **attributes):
    attributes.setdefault("kernel_shape", [2, 2])
    node = helper.make_node("MaxPool", list(inputs), list(outputs), **attributes)
    return model([node], [tensor("X", dims)] + [tensor(n, (1,)) for n in extra],
                 [tensor(o, None) for o in outputs])


def unpool_terabytes():
    node = helper.make_node("MaxUnpool", ["X", "I", "shape"], ["Y"], kernel_shape=[2, 2])
    shape = numpy_helper.from_array(np.array([1, 1, TERA, TERA], np.int64), "shape")
    index = numpy_helper.from_array(np.zeros((1, 1, 2, 2), np.int64), "I")
    return model([node], [tensor("X", (1, 1, 2, 2))], [tensor("Y", None)], [shape, index])


def col2im_terabytes():
    node = helper.make_node("Col2Im", ["X", "image", "block"], ["Y"], strides=[TERA, TERA])
    image = numpy_helper.from_array(np.array([TERA, TERA], np.int64), "image")
    block = numpy_helper.from_array(np.array([1, 1], np.int64), "block")
    return model([node], [tensor("X", (1, 1, 1))], [tensor("Y", None)], [image, block])


def bundled_bytes():
    return models.path().read_bytes()


HOSTILE_BYTES = {
    "truncated": lambda: bundled_bytes()[: len(bundled_bytes()) // 2],
    "garbage": lambda: bytes(np.random.default_rng(0).integers(0, 256, 4096, np.uint8)),
    "empty": lambda: b"",
    "text": lambda: b"<html><body>not a model</body></html>\n" * 20,
}

# name -> (model, the error type, words the message must hold)
HOSTILE_MODELS = {
    "float kernel_shape": (lambda: max_pool_model(kernel_shape=[2.0, 2.0]), PoolfoldTypeError,
                           ["MaxPool-12", "kernel_shape"]),
    "string kernel_shape": (lambda: max_pool_model(kernel_shape="22"), PoolfoldTypeError,
                            ["MaxPool-12", "kernel_shape"]),
    "string strides": (lambda: max_pool_model(strides="ab"), PoolfoldTypeError,
                       ["MaxPool-12", "strides"]),
    "negative pads": (lambda: max_pool_model(pads=[-1, 0, 0, 0]), PoolfoldError,
                      ["MaxPool-12", "pads"]),
    "huge kernel": (lambda: max_pool_model(kernel_shape=[2**62, 2]), PoolfoldError,
                    ["MaxPool-12", "kernel_shape"]),
    "missing input": (lambda: max_pool_model(inputs=("",)), PoolfoldError,
                      ["MaxPool-12", "'X' is missing"]),
    "extra input": (lambda: max_pool_model(inputs=("X", "Z"), extra=("Z",)), PoolfoldError,
                    ["MaxPool-12", "2 inputs"]),
    "too many outputs": (lambda: max_pool_model(outputs=("Y", "I", "J")), PoolfoldError,
                         ["MaxPool-12", "3 outputs"]),
    "unknown attribute": (lambda: max_pool_model(colour=3), PoolfoldError,
                          ["MaxPool-12", "colour"]),
}


def feeds_for(m):
    initializers = {i.name for i in m.graph.initializer}
    feeds = {}
    for value in m.graph.input:
        if value.name in initializers:
            continue
        dims = [max(d.dim_value, 1) for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = np.zeros(dims, np.float32)
    return feeds


# ---------------------------------------------------------------------------- backend

@pytest.mark.parametrize("name", HOSTILE_BYTES)
def test_prepare_refuses_bytes_that_are_not_onnx(name):
    with pytest.raises(PoolfoldError) as error:
        poolfold.backend.prepare(HOSTILE_BYTES[name]())
    assert "\n" not in str(error.value)
    assert "model" in str(error.value)


@pytest.mark.parametrize("name", HOSTILE_MODELS)
def test_backend_refuses_hostile_models(name):
    make, kind, words = HOSTILE_MODELS[name]
    m = make()
    with pytest.raises(kind) as error:
        poolfold.backend.prepare(m.SerializeToString()).run(feeds_for(m))
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("make", [unpool_terabytes, col2im_terabytes],
                         ids=["MaxUnpool output_shape", "Col2Im image_shape"])
def test_backend_refuses_terabyte_outputs_before_allocating(make):
    m = make()
    rep = poolfold.backend.prepare(m)
    feeds = feeds_for(m)
    assert_refused_quickly(lambda: rep.run(feeds), "GiB", "output")


def test_backend_runs_symbolic_and_declared_negative_dims_with_real_inputs():
    """Declared dims are only declarations: the inputs given decide."""
    node = helper.make_node("MaxPool", ["X"], ["Y"], kernel_shape=[2, 2])
    m = model([node], [tensor("X", ("N", 1, -1, 4))], [tensor("Y", None)])
    y, = poolfold.backend.prepare(m).run([np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)])
    assert y.tolist() == [[[[5, 6, 7], [9, 10, 11], [13, 14, 15]]]]


# ------------------------------------------------------------------------- poolfold run

def run_command(*args, cwd):
    return cli_here("run", *args, cwd=cwd)


def assert_one_line_usage_error(result, *words):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("poolfold run: error:"), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.SerializeToString())
    return path


@pytest.mark.parametrize("name", ["truncated", "garbage", "empty"])
def test_run_command_refuses_bytes_that_are_not_onnx(tmp_path, name):
    path = write(tmp_path, "m.onnx", HOSTILE_BYTES[name]())
    assert_one_line_usage_error(run_command(path, cwd=tmp_path))


@pytest.mark.parametrize("name", ["float kernel_shape", "missing input", "extra input",
                                  "huge kernel"])
def test_run_command_refuses_hostile_models(tmp_path, name):
    make, _, words = HOSTILE_MODELS[name]
    path = write(tmp_path, "m.onnx", make())
    assert_one_line_usage_error(run_command(path, cwd=tmp_path), *words)


@pytest.mark.parametrize("make", [unpool_terabytes, col2im_terabytes],
                         ids=["MaxUnpool output_shape", "Col2Im image_shape"])
def test_run_command_refuses_terabyte_outputs(tmp_path, make):
    path = write(tmp_path, "m.onnx", make())
    assert_one_line_usage_error(run_command(path, cwd=tmp_path), "GiB")


@pytest.mark.parametrize("dims, words", [((1, 1, -3, 4), ["negative dim"]),
                                         ((1, 1, 2**40, 2**40), ["MiB", "--input"])])
def test_run_command_refuses_to_generate_impossible_inputs(tmp_path, dims, words):
    path = write(tmp_path, "m.onnx", max_pool_model(dims=dims))
    assert_one_line_usage_error(run_command(path, cwd=tmp_path), *words)


def test_run_command_refuses_an_unknown_element_type(tmp_path):
    m = max_pool_model()
    m.graph.input[0].type.tensor_type.elem_type = 0
    path = write(tmp_path, "m.onnx", m)
    assert_one_line_usage_error(run_command(path, cwd=tmp_path), "element type")


def test_run_command_takes_symbolic_dims_as_one(tmp_path):
    path = write(tmp_path, "m.onnx", max_pool_model(dims=("N", 1, 4, 4)))
    result = run_command(path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "shape (1, 1, 4, 4)" in result.stdout and "shape (1, 1, 3, 3)" in result.stdout
