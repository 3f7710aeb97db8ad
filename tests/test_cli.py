"""The ``poolfold`` command, driven as a user would: ``python -m poolfold.cli`` in a subprocess
for the Quickstart's run of the bundled model, without the extras and through the installed
console script, where the process itself is what is tested, and ``poolfold.cli.main`` in
this process for the rest (runs, conformance, errors and help), where a subprocess would only
add a second or two of imports each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import poolfold
import poolfold.backend
from command_line import cli_here
from poolfold import models

TIMEOUT = 240
BUNDLED_OUTPUTS = {"segmentation": (1, 2, 64, 64), "encoded": (1, 16, 16, 16)}


def cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "poolfold.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=TIMEOUT)


def assert_usage_error(result):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("poolfold run: error:"), result.stderr
    assert "Traceback" not in result.stderr + result.stdout


# ------------------------------------------------------------------------------ run

def test_run_bundled_model(tmp_path):
    result = cli("run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for name, shape in BUNDLED_OUTPUTS.items():
        line = next(line for line in out.splitlines() if name in line and "output" in line)
        assert str(shape) in line and "float32" in line, line
    assert "ran in" in out
    assert "Traceback" not in result.stderr


def test_run_poolfold_nodes_needed_says_what_runs_where(tmp_path):
    """--poolfold-nodes needed leaves onnxruntime the bundled model's MaxUnpools and Col2Im
    (it runs them right) and its MaxPools with Indices (too small to pay for a split: one
    onnxruntime session); both routes give the same outputs."""
    outputs = {}
    for choice in ("all", "needed"):
        path = tmp_path / f"{choice}.npz"
        result = cli_here("run", "--poolfold-nodes", choice, "--output", path, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"where it runs (--poolfold-nodes {choice}):" in result.stdout
        outputs[choice] = dict(np.load(path))
        if choice == "needed":
            assert "left to onnxruntime: a MaxPool node" in result.stdout
            assert "a MaxUnpool node" in result.stdout and "poolfold:" not in result.stdout
        else:
            assert "left to onnxruntime" not in result.stdout
    for name in BUNDLED_OUTPUTS:
        np.testing.assert_allclose(outputs["needed"][name], outputs["all"][name], rtol=1e-5,
                                   atol=1e-5)
    refused = cli_here("run", "--poolfold-nodes", "some", cwd=tmp_path)
    assert refused.returncode == 2 and "--poolfold-nodes" in refused.stderr


# What `pip install .` leaves out: the test extra and the dask extra.
NOT_INSTALLED_BY_DEFAULT = ("dask", "distributed", "zarr", "onnxruntime", "hypothesis",
                            "pytest")
WITHOUT_EXTRAS = f"""
import sys
for name in {NOT_INSTALLED_BY_DEFAULT!r}:
    sys.modules[name] = None  # importing it now raises ImportError, as if not installed
from poolfold.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("args", [["run"], ["bench", "--help"], ["conformance", "--help"]])
def test_command_line_works_without_the_extras(tmp_path, args):
    """The Quickstart's first command runs after a plain `pip install .`: the command line
    imports none of the optional packages to start (the bundled model's other ops then run
    on the reference evaluator)."""
    result = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, *args], capture_output=True,
                            text=True, cwd=tmp_path, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    if args == ["run"]:
        assert "ran in" in result.stdout and "segmentation" in result.stdout


def test_run_output_npz_same_seed_same_arrays(tmp_path):
    a, b, c = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"
    for path, seed in ((a, 5), (b, 5), (c, 6)):
        result = cli_here("run", "--seed", seed, "--output", path, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert path.exists()
    with np.load(a) as fa, np.load(b) as fb, np.load(c) as fc:
        assert sorted(fa.files) == sorted(BUNDLED_OUTPUTS)
        for name, shape in BUNDLED_OUTPUTS.items():
            assert fa[name].shape == shape and fa[name].dtype == np.float32
            np.testing.assert_array_equal(fa[name], fb[name])
        assert not np.array_equal(fa["segmentation"], fc["segmentation"])


def test_run_output_equals_backend_on_given_input(tmp_path):
    """The bundled model fed from a file: the .npz holds what poolfold.backend computes."""
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "image.npy", x)
    result = cli_here("run", "--input", "image=image.npy", "--output", "out.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(models.path()))
    want = poolfold.backend.prepare(model).run({"image": x})
    names = [o.name for o in model.graph.output]
    with np.load(tmp_path / "out.npz") as got:
        assert sorted(got.files) == sorted(names)
        for name, value in zip(names, want):
            np.testing.assert_array_equal(got[name], value)


def _pool_relu_unpool_model(path: Path):
    nodes = [
        helper.make_node("MaxPool", ["X"], ["pooled", "indices"], kernel_shape=[3, 3],
                         strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["pooled"], ["relu"]),
        helper.make_node("Shape", ["X"], ["shape"]),
        helper.make_node("MaxUnpool", ["relu", "indices", "shape"], ["Y"], kernel_shape=[3, 3],
                         strides=[2, 2], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "pool_relu_unpool",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 7, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3, 7, 6]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, [2, 3, 4, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_run_own_model_matches_functional_api(tmp_path):
    _pool_relu_unpool_model(tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = cli_here("run", "m.onnx", "--input", "X=x.npy", "--output", "o.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Y" in result.stdout and "(2, 3, 7, 6)" in result.stdout
    kw = dict(strides=[2, 2], pads=[1, 1, 1, 1])
    pooled, indices = poolfold.max_pool(x, [3, 3], return_indices=True, **kw)
    want = poolfold.max_unpool(np.maximum(pooled, 0), indices, [3, 3], output_shape=x.shape, **kw)
    with np.load(tmp_path / "o.npz") as got:
        assert sorted(got.files) == ["Y", "indices"]
        np.testing.assert_array_equal(got["Y"], want)
        np.testing.assert_array_equal(got["indices"], indices)


def test_run_averaging_model_in_process(tmp_path):
    """A model of the averaging family runs through the backend like any other: Conv ->
    AveragePool -> GlobalAveragePool, the pools on poolfold, the rest on whatever runs the
    other ops; the outputs are the functional API's."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["c"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], count_include_pad=1),
        helper.make_node("GlobalAveragePool", ["p"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes, "conv_average",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 9, 9])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 1, 1])],
        initializer=[onnx.numpy_helper.from_array(w, "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)],
                                ir_version=8), str(tmp_path / "m.onnx"))
    x = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = cli_here("run", "m.onnx", "--input", "X=x.npy", "--output", "o.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "output Y: shape (1, 4, 1, 1), float32" in result.stdout
    if "where it runs" in result.stdout:  # the other ops on onnxruntime
        assert "poolfold: a AveragePool node" in result.stdout
        assert "poolfold: a GlobalAveragePool node" in result.stdout
    padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    conv = np.einsum("nchwij,kcij->nkhw", windows, w).astype(np.float32)
    want = poolfold.global_average_pool(poolfold.average_pool(
        conv, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1))
    with np.load(tmp_path / "o.npz") as got:
        assert got["Y"].dtype == np.float32
        np.testing.assert_allclose(got["Y"], want, rtol=1e-5, atol=1e-6)


def test_installed_console_script(tmp_path):
    script = Path(sys.executable).parent / ("poolfold.exe" if os.name == "nt" else "poolfold")
    if not script.exists():
        pytest.skip("console script not installed next to this interpreter")
    result = subprocess.run([str(script), "run", "--help"], capture_output=True, text=True,
                            timeout=TIMEOUT, cwd=tmp_path)
    assert result.returncode == 0
    assert "--input" in result.stdout


# ------------------------------------------------------------------------------ run: errors

def test_error_missing_model(tmp_path):
    assert_usage_error(cli_here("run", tmp_path / "absent.onnx", cwd=tmp_path))


@pytest.mark.parametrize("content", [b"this is not an onnx model\n", bytes(range(256)) * 3,
                                     b"\x93NUMPY garbage"], ids=["text", "binary", "npy-like"])
def test_error_not_onnx(tmp_path, content):
    (tmp_path / "bad.onnx").write_bytes(content)
    assert_usage_error(cli_here("run", "bad.onnx", cwd=tmp_path))


def test_error_empty_model_file(tmp_path):
    """An empty file is no ONNX model (no graph, no opset): a bad file, not a successful run."""
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert_usage_error(cli_here("run", "empty.onnx", cwd=tmp_path))


def test_error_unknown_input_name(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 64, 64), np.float32))
    result = cli_here("run", "--input", "nope=x.npy", cwd=tmp_path)
    assert_usage_error(result)
    assert "nope" in result.stderr and "image" in result.stderr


@pytest.mark.parametrize("spec", ["image", "image.npy", "=x.npy", "image="])
def test_error_input_without_name_or_file(tmp_path, spec):
    assert_usage_error(cli_here("run", "--input", spec, cwd=tmp_path))


def test_error_missing_npy(tmp_path):
    result = cli_here("run", "--input", "image=absent.npy", cwd=tmp_path)
    assert_usage_error(result)
    assert "absent.npy" in result.stderr


def test_error_wrong_dtype(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 64, 64), np.float64))
    result = cli_here("run", "--input", "image=x.npy", cwd=tmp_path)
    assert_usage_error(result)
    assert "float32" in result.stderr and "float64" in result.stderr


@pytest.mark.parametrize("shape", [(1, 3, 64, 63), (3, 64, 64), (2, 3, 64, 64)])
def test_error_wrong_shape(tmp_path, shape):
    np.save(tmp_path / "x.npy", np.zeros(shape, np.float32))
    result = cli_here("run", "--input", "image=x.npy", cwd=tmp_path)
    assert_usage_error(result)
    assert "shape" in result.stderr


@pytest.mark.parametrize("kind", ["text", "npz", "pickle"])
def test_error_not_an_array_file(tmp_path, kind):
    path = tmp_path / "x.npy"
    if kind == "text":
        path.write_text("1 2 3\n")
    elif kind == "npz":
        with open(path, "wb") as f:
            np.savez(f, image=np.zeros((1, 3, 64, 64), np.float32))
    else:
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert_usage_error(cli_here("run", "--input", "image=x.npy", cwd=tmp_path))


def test_run_help(tmp_path):
    result = cli_here("run", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for word in ("--input", "--output", "bundled"):
        assert word in result.stdout, word


# ------------------------------------------------------------------------------ other commands

def test_conformance_filter_maxunpool():
    result = cli_here("conformance", "--filter", "maxunpool", cwd=".")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "documented divergence" in result.stdout
    assert "1 passed" in result.stdout
    assert "0 failed" in result.stdout
    assert "test_maxunpool_export_with_output_shape" in result.stdout


def test_no_command_prints_usage(tmp_path):
    result = cli_here(cwd=tmp_path)
    assert result.returncode == 2
    assert "usage" in (result.stdout + result.stderr).lower()
    assert "Traceback" not in result.stderr


def test_the_command_hides_onnx_warnings_only(tmp_path, monkeypatch):
    """A bad POOLFOLD_NUM_THREADS warns through the command too: the command hides only the
    RuntimeWarnings of onnx's test generators, not every one."""
    monkeypatch.setenv("POOLFOLD_NUM_THREADS", "lots")
    with pytest.warns(RuntimeWarning, match="POOLFOLD_NUM_THREADS"):
        result = cli_here("run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
