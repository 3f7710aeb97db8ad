"""MaxUnpool and Col2Im against onnx and onnxruntime.

(a) Differential tests against onnxruntime (CPU), only where docs/semantics.md says it
    is right:
    * MaxUnpool, float32 and float16, spatial ranks 1-3, with I produced by a MaxPool (the
      oracle's) so that it is valid, with and without output_shape.  ORT refuses pads >= the
      kernel and an inferred output size < 1 even when output_shape is given, so neither is
      drawn here.
    * Col2Im float32: 2-D (ORT's dedicated path) bit for bit with any strides / pads /
      dilations / channels; 1-D (ORT's N-D path) only with C = 1 or no dilation, since that
      path is wrong when C > 1 and a dilation > 1; 3-D without dilation only, since there it
      is wrong even with C = 1 (see test_ort_nd_col2im_known_wrong).
(b) The onnx package's own node tests for MaxUnpool and Col2Im, run through poolfold.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import oracle
import poolfold

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
        np.dtype(np.int64): TensorProto.INT64}


def run_ort(op: str, inputs: list[np.ndarray], attrs: dict, opset: int) -> np.ndarray:
    names = [f"in{i}" for i in range(len(inputs))]
    node = helper.make_node(op, names, ["out"], **attrs)
    graph = helper.make_graph(
        [node], op.lower(),
        [helper.make_tensor_value_info(n, ELEM[a.dtype], a.shape) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("out", ELEM[inputs[0].dtype], None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8)  # the default IR version is newer than ORT reads
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip(names, inputs)))[0]


def assert_bits(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    width = np.dtype(f"u{expected.dtype.itemsize}")
    np.testing.assert_array_equal(np.ascontiguousarray(actual).view(width),
                                  np.ascontiguousarray(expected).view(width))


# --------------------------------------------------------------------------------------
# (a) MaxUnpool against onnxruntime
# --------------------------------------------------------------------------------------


@st.composite
def pooled(draw):
    """x, and a MaxPool of it (the oracle's) with pads < kernel: no empty window, valid I."""
    dtype = draw(st.sampled_from([np.dtype(np.float32), np.dtype(np.float16)]))
    rank = draw(st.integers(1, 3))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    spatial, kernel, strides, begins, ends = [], [], [], [], []
    for _ in range(rank):
        k = draw(st.integers(1, 3))
        pb, pe = draw(st.integers(0, k - 1)), draw(st.integers(0, k - 1))
        spatial.append(draw(st.integers(max(1, k - pb - pe), 5 if rank < 3 else 3)))
        kernel.append(k)
        strides.append(draw(st.integers(1, 3)))
        begins.append(pb)
        ends.append(pe)
    pads = begins + ends
    # small integers: many ties, so duplicate indices where windows overlap; no NaN, no -0.0
    x = draw(hnp.arrays(np.int8, (n, c, *spatial), elements=st.integers(-20, 20))).astype(dtype)
    y, ind = oracle.max_pool(x, kernel, strides=strides, pads=pads)
    return x, y, ind, kernel, strides, pads


def inferred_spatial(y_shape, kernel, strides, pads):
    r = len(kernel)
    return [(y_shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[r + i]
            for i in range(r)]


@settings(max_examples=60)
@given(case=pooled(), opset=st.sampled_from([9, 11, 22]), use_pads=st.booleans())
def test_max_unpool_with_output_shape_matches_onnxruntime(case, opset, use_pads):
    x, y, ind, kernel, strides, pads = case
    # ORT (and poolfold, see test_max_unpool.test_output_shape_ignores_pads) refuse an
    # inferred size < 1 even with output_shape; ORT also refuses an output_shape smaller than
    # the inferred shape ("output_shape is smaller than minimum required"), which docs/semantics.md
    # allows (test_max_unpool covers it against the oracle)
    inferred = inferred_spatial(y.shape, kernel, strides, pads if use_pads else [0] * len(pads))
    assume(min(inferred) >= 1)
    assume(all(i <= d for i, d in zip(inferred, x.shape[2:])))
    attrs = dict(kernel_shape=kernel, strides=strides)
    if use_pads:
        attrs["pads"] = pads
    output_shape = np.array(x.shape, np.int64)
    expected = run_ort("MaxUnpool", [y, ind, output_shape], attrs, opset)
    got = poolfold.max_unpool(y, ind, kernel, strides=strides, pads=attrs.get("pads"),
                              output_shape=output_shape, opset=opset)
    assert_bits(got, expected)
    assert_bits(got, oracle.max_unpool(y, ind, kernel, strides=strides, output_shape=x.shape))


@settings(max_examples=60)
@given(case=pooled(), opset=st.sampled_from([9, 11, 22]))
def test_max_unpool_without_output_shape_matches_onnxruntime(case, opset):
    x, y, ind, kernel, strides, pads = case
    spatial = inferred_spatial(y.shape, kernel, strides, pads)
    assume(min(spatial) >= 1)
    out_shape = y.shape[:2] + tuple(spatial)
    note(f"x {x.shape}, inferred {out_shape}")
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads)
    if ind.max() >= math.prod(out_shape):
        # I points past the inferred output (x was larger than it): both must refuse
        with pytest.raises(Exception):
            run_ort("MaxUnpool", [y, ind], attrs, opset)
        with pytest.raises(poolfold.PoolfoldError, match=f"MaxUnpool-{opset}"):
            poolfold.max_unpool(y, ind, kernel, strides=strides, pads=pads, opset=opset)
        return
    expected = run_ort("MaxUnpool", [y, ind], attrs, opset)
    got = poolfold.max_unpool(y, ind, kernel, strides=strides, pads=pads, opset=opset)
    assert_bits(got, expected)


def test_max_unpool_page_example_with_output_shape_matches_onnxruntime():
    """ORT reads I in the output shape, as docs/semantics.md (and poolfold's default) do."""
    xT = np.array([[[[5, 6], [7, 8]]]], dtype=np.float32)
    xI = np.array([[[[5, 7], [13, 15]]]], dtype=np.int64)
    output_shape = np.array((1, 1, 5, 5), np.int64)
    expected = run_ort("MaxUnpool", [xT, xI, output_shape],
                       dict(kernel_shape=[2, 2], strides=[2, 2]), 11)
    assert_bits(poolfold.max_unpool(xT, xI, [2, 2], strides=[2, 2], output_shape=output_shape),
                expected)


# --------------------------------------------------------------------------------------
# (a) Col2Im against onnxruntime
# --------------------------------------------------------------------------------------


@st.composite
def fold_case(draw, rank, restricted=None):
    """x, image, block, strides, dilations, pads; ``restricted`` "c1-or-undilated": C = 1 or
    no dilation; "undilated": no dilation."""
    dims = {1: (6, 3), 2: (5, 3), 3: (3, 2)}[rank]
    one_channel = restricted == "c1-or-undilated" and draw(st.booleans())
    max_dilation = 1 if restricted and not one_channel else 3
    image, block, strides, dilations, begins, ends = [], [], [], [], [], []
    for _ in range(rank):
        b = draw(st.integers(1, dims[1]))
        d = draw(st.integers(1, max_dilation))
        pb, pe = draw(st.integers(0, 2)), draw(st.integers(0, 2))
        span = (b - 1) * d + 1
        low = max(1, span - pb - pe)
        image.append(draw(st.integers(low, max(low, dims[0]))))
        block.append(b)
        strides.append(draw(st.integers(1, 3)))
        dilations.append(d)
        begins.append(pb)
        ends.append(pe)
    pads = begins + ends
    nblk = [(image[i] + pads[i] + pads[rank + i] - ((block[i] - 1) * dilations[i] + 1))
            // strides[i] + 1 for i in range(rank)]
    n, c = draw(st.integers(1, 2)), (1 if one_channel else draw(st.integers(1, 3)))
    shape = (n, c * math.prod(block), math.prod(nblk))
    # finite values of very different magnitudes: the summation order shows in the bits
    x = draw(st.one_of(
        hnp.arrays(np.float32, shape, elements=st.floats(-1e6, 1e6, width=32)),
        hnp.arrays(np.float32, shape, elements=st.sampled_from([1e8, -1e8, 1.0, 0.1, -3.0])),
    ))
    return x, image, block, strides, dilations, pads


def col2im_both(x, image, block, strides, dilations, pads):
    attrs = {}
    for name, value, default in (("strides", strides, 1), ("dilations", dilations, 1),
                                 ("pads", pads, 0)):
        if any(v != default for v in value):
            attrs[name] = value
    expected = run_ort("Col2Im", [x, np.array(image, np.int64), np.array(block, np.int64)],
                       attrs, 18)
    got = poolfold.col2im(x, image, block, **attrs)
    return got, expected


@settings(max_examples=80)
@given(case=fold_case(2))
def test_col2im_2d_matches_onnxruntime_bit_for_bit(case):
    got, expected = col2im_both(*case)
    assert_bits(got, expected)
    assert_bits(got, oracle.col2im(case[0], case[1], case[2], strides=case[3],
                                   dilations=case[4], pads=case[5]))


@settings(max_examples=60)
@given(case=fold_case(3, restricted="undilated"))
def test_col2im_3d_matches_onnxruntime(case):
    got, expected = col2im_both(*case)
    # bit-exact in practice; only ORT's 2-D path is promised to sum in poolfold's order
    np.testing.assert_allclose(got, expected, rtol=1e-6,
                               atol=1e-6 * float(np.abs(case[0]).max(initial=1)))


@settings(max_examples=40)
@given(case=fold_case(1, restricted="c1-or-undilated"))
def test_col2im_1d_matches_onnxruntime(case):
    got, expected = col2im_both(*case)
    np.testing.assert_allclose(got, expected, rtol=1e-6,
                               atol=1e-6 * float(np.abs(case[0]).max(initial=1)))


@pytest.mark.parametrize(
    "channels, image, block, dilations",
    [
        (2, [5, 4, 4], [2, 2, 2], [2, 1, 1]),  # C > 1 and a dilation (docs/semantics.md says so)
        (1, [2, 1, 3], [2, 1, 2], [1, 1, 2]),  # ... but C = 1 is wrong too in ORT 1.31
        (1, [3, 4, 2], [2, 2, 1], [1, 2, 1]),
    ],
)
def test_ort_nd_col2im_known_wrong(channels, image, block, dilations):
    """ORT's N-D Col2Im mishandles some dilations.  poolfold must follow the oracle there."""
    rng = np.random.default_rng(0)
    nblk = [image[i] - ((block[i] - 1) * dilations[i] + 1) + 1 for i in range(3)]
    x = rng.integers(1, 9, (1, channels * math.prod(block), math.prod(nblk))).astype(np.float32)
    got = poolfold.col2im(x, image, block, dilations=dilations)
    assert_bits(got, oracle.col2im(x, image, block, dilations=dilations))
    ort_result = run_ort("Col2Im", [x, np.array(image, np.int64), np.array(block, np.int64)],
                         {"dilations": dilations}, 18)
    # documents the ORT bug this file steers around (not a requirement on ORT)
    if np.array_equal(ort_result, got):
        warnings.warn(f"onnxruntime's N-D Col2Im now agrees with docs/semantics.md for C={channels}, "
                      f"dilations {dilations}: test_col2im_3d_matches_onnxruntime's "
                      "restriction could be relaxed")


# --------------------------------------------------------------------------------------
# (b) The onnx package's own node tests
# --------------------------------------------------------------------------------------


def _node_cases(op_type: str) -> list:
    """The onnx backend node tests of one op.

    ``collect_testcases(op_type)`` fills a module-level list the first time only, keeping
    only the op asked for then.  So ask for every op (None), which leaves the list complete
    for any later caller, and filter here; when an earlier caller in this process asked for
    another op (tests/test_max_pool_onnx_node_tests.py asks for MaxPool), the cases are
    missing: then run the op's export functions again, as onnx does on import, take what
    they add and restore onnx's state."""
    import importlib
    import inspect
    import pkgutil

    from onnx.backend.test.case import node as node_pkg
    from onnx.backend.test.case.base import Base

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node_pkg.collect_testcases(None)
    selected = [c for c in cases if c.model.graph.node[0].op_type == op_type]
    if selected:
        return sorted(selected, key=lambda c: c.name)
    saved_target = node_pkg._TargetOpType
    start = len(node_pkg._NodeTestCases)
    added_names = []
    try:
        node_pkg._TargetOpType = op_type
        for info in pkgutil.iter_modules(node_pkg.__path__):
            module = importlib.import_module(f"{node_pkg.__name__}.{info.name}")
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if not issubclass(cls, Base) or cls is Base or cls.__module__ != module.__name__:
                    continue
                if cls.__name__.lower() != op_type.lower():
                    continue
                for name, member in vars(cls).items():
                    if name.startswith("export") and isinstance(member, staticmethod):
                        np.random.seed(0)
                        before = set(node_pkg._existing_names)
                        getattr(cls, name)()
                        added_names += set(node_pkg._existing_names) - before
        selected = [c for c in node_pkg._NodeTestCases[start:]
                    if c.model.graph.node[0].op_type == op_type]
    finally:
        del node_pkg._NodeTestCases[start:]
        for name in added_names:
            node_pkg._existing_names.pop(name, None)
        node_pkg._TargetOpType = saved_target
    return sorted(selected, key=lambda c: c.name)


MAXUNPOOL_CASES = [c for c in _node_cases("MaxUnpool") if "maxunpool" in c.name]
COL2IM_CASES = [c for c in _node_cases("Col2Im") if "col2im" in c.name]


def test_the_onnx_node_cases_are_collected():
    assert {c.name for c in MAXUNPOOL_CASES} >= {
        "test_maxunpool_export_without_output_shape", "test_maxunpool_export_with_output_shape"}
    assert {c.name for c in COL2IM_CASES} >= {
        "test_col2im", "test_col2im_strides", "test_col2im_pads", "test_col2im_dilations",
        "test_col2im_5d"}


def _opset(model) -> int:
    (version,) = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return version


def _attributes(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _run_maxunpool_case(case, **extra):
    node = case.model.graph.node[0]
    attrs = _attributes(node)
    kernel = attrs.pop("kernel_shape")
    kwargs = {k: attrs.pop(k) for k in ("strides", "pads") if k in attrs}
    assert not attrs, f"attributes the test does not pass on: {attrs}"
    results = []
    for inputs, expected in case.data_sets:
        x, ind, *rest = inputs
        if rest:
            kwargs["output_shape"] = rest[0]
        got = poolfold.max_unpool(x, ind, kernel, opset=_opset(case.model), **kwargs, **extra)
        results.append((got, expected))
    return results


@pytest.mark.parametrize("case", MAXUNPOOL_CASES, ids=[c.name for c in MAXUNPOOL_CASES])
def test_onnx_maxunpool_node_test(case):
    # the page's with_output_shape example reads I in the inferred shape: poolfold's option
    extra = ({"inferred_shape_indices": True}
             if case.name == "test_maxunpool_export_with_output_shape" else {})
    for got, expected in _run_maxunpool_case(case, **extra):
        (expected,) = expected
        assert_bits(got, np.asarray(expected))


def test_onnx_maxunpool_with_output_shape_differs_by_default():
    """Without inferred_shape_indices, poolfold follows docs/semantics.md (I = positions in the
    5x5 output, as ORT and PyTorch read it), which is not the node test's expected output."""
    (case,) = [c for c in MAXUNPOOL_CASES if c.name == "test_maxunpool_export_with_output_shape"]
    for got, expected in _run_maxunpool_case(case):
        (expected,) = expected
        assert got.shape == expected.shape
        assert not np.array_equal(got, expected)
        (inputs, _), = case.data_sets
        x, ind, output_shape = inputs
        assert_bits(got, oracle.max_unpool(x, ind, [2, 2], strides=[2, 2],
                                           output_shape=output_shape))


@pytest.mark.parametrize("case", COL2IM_CASES, ids=[c.name for c in COL2IM_CASES])
def test_onnx_col2im_node_test(case):
    node = case.model.graph.node[0]
    attrs = _attributes(node)
    kwargs = {k: attrs.pop(k) for k in ("strides", "pads", "dilations") if k in attrs}
    assert not attrs, f"attributes the test does not pass on: {attrs}"
    for inputs, expected in case.data_sets:
        x, image_shape, block_shape = inputs
        got = poolfold.col2im(x, image_shape, block_shape, opset=_opset(case.model), **kwargs)
        (expected,) = expected
        assert_bits(got, np.asarray(expected))
