"""The onnx package's own MaxPool node tests (onnx.backend.test.case.node), run on poolfold.

Each case carries a one-node model and its input / expected output data.  The node's
attributes and the model's opset import for the default domain are passed to
poolfold.max_pool as they are (opset = the model's opset; return_indices when the node has
two outputs), and the outputs must equal the expected data exactly.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import poolfold

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402


def _maxpool_cases():
    from onnx.backend.test.case import node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some unrelated generators overflow on purpose
        cases = node_cases.collect_testcases("MaxPool")
    selected = [
        c for c in cases
        if "maxpool" in c.name.lower() and c.model.graph.node[0].op_type == "MaxPool"
    ]
    return sorted(selected, key=lambda c: c.name)


CASES = _maxpool_cases()

# Every MaxPool node test onnx ships, as of onnx 1.23; a new one shows up as a new test id,
# a vanished one fails here.
KNOWN = {
    "test_maxpool_1d_default", "test_maxpool_2d_ceil",
    "test_maxpool_2d_ceil_output_size_reduce_by_one", "test_maxpool_2d_default",
    "test_maxpool_2d_dilations", "test_maxpool_2d_pads", "test_maxpool_2d_precomputed_pads",
    "test_maxpool_2d_precomputed_same_upper", "test_maxpool_2d_precomputed_strides",
    "test_maxpool_2d_same_lower", "test_maxpool_2d_same_upper", "test_maxpool_2d_strides",
    "test_maxpool_2d_uint8", "test_maxpool_3d_default", "test_maxpool_3d_dilations",
    "test_maxpool_3d_dilations_use_ref_impl", "test_maxpool_3d_dilations_use_ref_impl_large",
    "test_maxpool_with_argmax_2d_precomputed_pads",
    "test_maxpool_with_argmax_2d_precomputed_strides",
}


def test_the_onnx_maxpool_cases_are_collected():
    assert KNOWN <= {c.name for c in CASES}


def _opset(model) -> int:
    (version,) = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return version


def _attributes(node) -> dict:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if isinstance(attrs.get("auto_pad"), bytes):
        attrs["auto_pad"] = attrs["auto_pad"].decode()
    return attrs


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_node_test(case):
    node = case.model.graph.node[0]
    attrs = _attributes(node)
    opset = _opset(case.model)
    return_indices = len([o for o in node.output if o]) == 2
    kernel_shape = attrs.pop("kernel_shape")
    kwargs = {k: attrs.pop(k) for k in ("strides", "pads", "dilations", "auto_pad",
                                         "ceil_mode", "storage_order") if k in attrs}
    assert not attrs, f"attributes the test does not pass on: {attrs}"
    if "ceil_mode" in kwargs:
        kwargs["ceil_mode"] = bool(kwargs["ceil_mode"])
    assert case.data_sets, case.name
    for inputs, expected in case.data_sets:
        (x,) = inputs
        got = poolfold.max_pool(x, kernel_shape, return_indices=return_indices, opset=opset,
                                **kwargs)
        got = got if return_indices else (got,)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            e = np.asarray(e)
            assert g.dtype == e.dtype, (g.dtype, e.dtype)
            assert g.shape == e.shape, (g.shape, e.shape)
            width = np.dtype(f"u{e.dtype.itemsize}")
            np.testing.assert_array_equal(np.ascontiguousarray(g).view(width),
                                          np.ascontiguousarray(e).view(width))
        shape = poolfold.max_pool_shape(x.shape, kernel_shape, opset=opset,
                                        **{k: v for k, v in kwargs.items()
                                           if k != "storage_order"})
        assert shape == got[0].shape
